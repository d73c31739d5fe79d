//! The viral reel over time: a poller that records its shard count (and in
//! stream mode its aggregated count) while the load runs, and what follows
//! from those records and the samples: the onset timeline and stream
//! mode's freshness. Polled from outside the product, so that what is
//! drawn is what the table held, not what the product believed.

use super::load::Sample;
use super::rank::percentile;
use super::store::Item;
use super::{Second, VIRAL};
use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What the watcher saw, times in seconds since the load started: the
/// viral reel's shard count, and (stream mode) its shards' summed count.
pub(super) struct Seen {
    /// `(at, write_shards)` every 250 ms.
    pub shards: Vec<(f64, u32)>,
    /// `(at, n)` every 20 ms, `n` summed over the watched shards; empty
    /// unless stream mode.
    pub sums: Vec<(f64, i64)>,
}

/// The running poller; [`Watcher::stop`] ends it.
pub(super) struct Watcher {
    watching: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Seen>,
}

impl Watcher {
    /// Starts polling the viral reel's items in `counters`, summing its
    /// first `sum_shards` shards (0: none) and, in stream mode, its writer
    /// items in `writers` (where the aggregator adds its likes).
    pub fn start(
        client: aws_sdk_dynamodb::Client,
        counters: String,
        writers: Option<String>,
        t0: Instant,
        sum_shards: u32,
    ) -> Self {
        let watching = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(watch_viral(
            client,
            counters,
            writers,
            watching.clone(),
            t0,
            sum_shards,
        ));
        Watcher { watching, task }
    }

    /// Stops polling and hands back what was seen.
    pub async fn stop(self) -> Result<Seen> {
        self.watching.store(false, Ordering::Relaxed);
        self.task.await.context("the watcher")
    }
}

/// Polls the viral reel's settings (every 250 ms: its shard count) and, in
/// stream mode, its shards `0..sum_shards` (every 20 ms: the aggregated
/// count) until `watching` is cleared. Times are seconds since `t0`.
async fn watch_viral(
    client: aws_sdk_dynamodb::Client,
    counters: String,
    writers: Option<String>,
    watching: Arc<AtomicBool>,
    t0: Instant,
    sum_shards: u32,
) -> Seen {
    let (mut shards, mut sums) = (Vec::new(), Vec::new());
    let viral = likes::keys::ReelId::parse(VIRAL).expect("a valid reel id");
    let get = |pk: String| {
        client
            .get_item()
            .table_name(&counters)
            .key("pk", AttributeValue::S(pk))
            .consistent_read(true)
            .send()
    };
    let number = |item: &Option<Item>, attr: &str| -> Option<i64> {
        item.as_ref()?.get(attr)?.as_n().ok()?.parse().ok()
    };
    let mut tick = 0u64;
    while watching.load(Ordering::Relaxed) {
        if tick.is_multiple_of(12)
            && let Ok(out) = get(likes::keys::settings_key(&viral)).await
        {
            let n = number(&out.item, "write_shards").unwrap_or(1);
            shards.push((t0.elapsed().as_secs_f64(), n as u32));
        }
        if sum_shards > 0
            && let Some(n) = shard_sum(&client, &counters, &viral, sum_shards).await
            && let Some(w) = writer_sum(&client, writers.as_deref(), &viral).await
        {
            sums.push((t0.elapsed().as_secs_f64(), n + w));
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Seen { shards, sums }
}

/// The viral reel's writer items in `writers` (stream mode), summed from
/// one consistent query of each part its base names; `Some(0)` without a
/// table. `None` if a read failed or was cut short.
async fn writer_sum(
    client: &aws_sdk_dynamodb::Client,
    writers: Option<&str>,
    viral: &likes::keys::ReelId,
) -> Option<i64> {
    let Some(table) = writers else {
        return Some(0);
    };
    let (mut sum, mut parts, mut part) = (0, 1, 0);
    while part < parts {
        let out = client
            .query()
            .table_name(table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(
                ":pk",
                AttributeValue::S(likes::keys::likes_writers_part_key(viral, part)),
            )
            .consistent_read(true)
            .send()
            .await
            .ok()?;
        if out.last_evaluated_key().is_some_and(|k| !k.is_empty()) {
            return None;
        }
        let int = |i: &std::collections::HashMap<String, AttributeValue>, name: &str| {
            i.get(name)?.as_n().ok()?.parse::<i64>().ok()
        };
        for item in out.items() {
            sum += int(item, "n").unwrap_or(0);
            if part == 0 {
                parts = parts.max(
                    int(item, likes::keys::LIKES_WRITER_PARTS_ATTR)
                        .unwrap_or(1)
                        .clamp(1, i64::from(likes::keys::MAX_WRITER_PARTS))
                        as u32,
                );
            }
        }
        part += 1;
    }
    Some(sum)
}

/// The sum of the viral reel's shards `0..shards`, read consistently in
/// one request: every shard the aggregator writes, before and after a
/// grow (which folds nothing, so the sum only grows). `None` if the read
/// failed or came back partial: a short sum would look like a late like.
async fn shard_sum(
    client: &aws_sdk_dynamodb::Client,
    counters: &str,
    viral: &likes::keys::ReelId,
    shards: u32,
) -> Option<i64> {
    let keys = (0..shards)
        .map(|i| {
            std::collections::HashMap::from([(
                "pk".to_owned(),
                AttributeValue::S(likes::keys::shard_key(viral, i)),
            )])
        })
        .collect();
    let ka = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
        .set_keys(Some(keys))
        .consistent_read(true)
        .build()
        .ok()?;
    let out = client
        .batch_get_item()
        .request_items(counters, ka)
        .send()
        .await
        .ok()?;
    if out.unprocessed_keys().is_some_and(|u| !u.is_empty()) {
        return None;
    }
    let items = out.responses()?.get(counters)?;
    Some(
        items
            .iter()
            .filter_map(|i| i.get("n")?.as_n().ok()?.parse::<i64>().ok())
            .sum(),
    )
}

/// Acknowledged → visible, p50 and p99 in ms: the k-th accepted like (by
/// the time its answer came) is visible at the first poll that shows at
/// least k likes in the shard. Likes only, so the sum only grows.
pub(super) fn freshness(viral: &[Sample], sums: &[(f64, i64)]) -> (f64, f64) {
    if sums.is_empty() {
        return (0.0, 0.0);
    }
    let mut acks: Vec<f64> = viral
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.at.as_secs_f64())
        .collect();
    acks.sort_by(f64::total_cmp);
    let mut lags = Vec::with_capacity(acks.len());
    let mut j = 0;
    for (k, ack) in acks.iter().enumerate() {
        while j < sums.len() && sums[j].1 < (k + 1) as i64 {
            j += 1;
        }
        let Some((seen, _)) = sums.get(j) else { break };
        lags.push(((seen - ack) * 1000.0).max(0.0));
    }
    lags.sort_by(f64::total_cmp);
    (percentile(&lags, 0.5), percentile(&lags, 0.99))
}

/// Per second of the load: viral likes accepted and refused (by when their
/// answer came) and the shard count last seen.
pub(super) fn timeline(viral: &[Sample], shards: &[(f64, u32)], seconds: f64) -> Vec<Second> {
    let n = seconds.ceil().max(1.0) as usize;
    let mut out: Vec<Second> = (0..n)
        .map(|t| Second {
            t: t as u32,
            ..Second::default()
        })
        .collect();
    for s in viral {
        let i = (s.at.as_secs_f64() as usize).min(n - 1);
        if s.ok {
            out[i].accepted += 1;
        } else {
            out[i].refused += 1;
        }
    }
    for second in &mut out {
        second.shards = shards
            .iter()
            .take_while(|(at, _)| *at <= f64::from(second.t) + 1.0)
            .last()
            .map_or(1, |(_, n)| *n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, ok: bool) -> Sample {
        Sample {
            user: String::new(),
            at: Duration::from_millis(at_ms),
            ok,
            latency: Duration::ZERO,
        }
    }

    #[test]
    fn the_timeline_counts_answers_by_second_and_carries_the_shards() {
        let viral = [
            sample(100, true),
            sample(900, false),
            sample(1500, true),
            sample(9000, true),
        ];
        let t = timeline(&viral, &[(0.2, 1), (1.5, 4)], 2.0);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].accepted, t[0].refused, t[0].shards), (1, 1, 1));
        // The late answer counts in the last second; 4 shards by its end.
        assert_eq!((t[1].accepted, t[1].refused, t[1].shards), (2, 0, 4));
    }

    #[test]
    fn freshness_is_from_the_answer_to_the_first_poll_that_holds_it() {
        let viral = [sample(1000, true), sample(1100, false), sample(1200, true)];
        let sums = [(1.0, 0), (1.5, 1), (2.0, 2)];
        // Lags of 500 and 800 ms; the nearest rank of the median is the
        // upper one.
        let (p50, p99) = freshness(&viral, &sums);
        assert_eq!((p50.round(), p99.round()), (800.0, 800.0));
        assert_eq!(freshness(&viral, &[]), (0.0, 0.0));
    }
}
