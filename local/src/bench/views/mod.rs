//! The `views` variant: one viral reel's views through the views pipeline
//! (`POST /views` → the Kinesis stream → the views aggregator → the views
//! table), at the highest rate this machine sustains.
//!
//! The load is closed-loop, unlike the likes variants': `BENCH_VIEWS_WORKERS`
//! workers each send a request, wait for its answer and send the next, for
//! `BENCH_SECONDS`. Each request is one viewer's batch (a client sending a
//! few seconds of watching at once): [`VIEWS_PER_REQUEST`] views of the viral
//! reel, from a viewer drawn at random from `BENCH_VIEWS_VIEWERS`, so that
//! unique viewers is a figure worth estimating. Every request carries an
//! `Idempotency-Key`; a request not answered `202` is sent again after the
//! load with its key, so that every view is counted exactly once in the end.
//!
//! What it measures:
//!
//! * requests and views accepted a second, the share answered `202`, and
//!   the answers' latency;
//! * freshness: from a request's `202` to the viral reel's views summed in
//!   the table (its writers' all-time items, read consistently every
//!   [`POLL`]) reaching the views accepted up to that answer ([`freshness`]);
//! * DynamoDB write units per view, two ways: as the fault proxy counted
//!   them on the views table's keys (it charges a transactional update 2
//!   units whatever the item's size), and from the items' sizes as
//!   DynamoDB would charge them ([`sized_units`]): 2 units per started KB
//!   of every item of every chunk's transaction;
//! * the chunks the aggregator applied (one seen item each: their records)
//!   and the batches the event source handed it;
//! * the unique-viewer estimate (`GET /reels/viral/views`, uncached)
//!   against the true distinct count, and exactness after the drain.

use super::rank::percentile;
use super::store::Item;
use super::variant::{VIEWS_SHARDS, Variant};
use super::{BenchOptions, VIRAL};
use crate::stack::{Stack, StackOptions};
use anyhow::{Context, Result, anyhow};
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod reads;
mod sizes;
#[cfg(test)]
mod tests;

use reads::*;
use sizes::*;
#[cfg(test)]
pub(super) use tests::test_views_result;

/// Views of the viral reel in one request, drawn uniformly in this range.
pub(super) const VIEWS_PER_REQUEST: (u32, u32) = (10, 20);
/// How often the table's sum is read for freshness.
const POLL: Duration = Duration::from_millis(100);
/// How long the drain may take.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// One run of the `views` variant.
#[derive(Clone, Debug, Serialize)]
pub struct ViewsResult {
    /// Always `views`.
    pub variant: Variant,
    /// Closed-loop workers (`BENCH_VIEWS_WORKERS`).
    pub workers: u32,
    /// The viewer population (`BENCH_VIEWS_VIEWERS`).
    pub viewers: u32,
    /// Shards of the views stream.
    pub stream_shards: u32,
    /// Seconds from the start of the load to its last answer.
    pub load_seconds: f64,
    /// Requests sent during the load.
    pub requests: u64,
    /// ... answered `202`.
    pub accepted_requests: u64,
    /// `202`s, % of the requests.
    pub accepted_pct: f64,
    /// The answers by status (`error`: no answer at all).
    pub answers: BTreeMap<String, u64>,
    /// Requests accepted a second, over the load.
    pub requests_per_sec: f64,
    /// Views accepted a second, over the load.
    pub views_per_sec: f64,
    /// Latency of the `202`s, median, ms.
    pub latency_p50_ms: f64,
    /// ... 99th percentile.
    pub latency_p99_ms: f64,
    /// From a `202` to the table's sum holding the views accepted up to
    /// it, median, ms.
    pub freshness_p50_ms: f64,
    /// ... 99th percentile.
    pub freshness_p99_ms: f64,
    /// Seconds from the load's end to the stream drained.
    pub drain_seconds: f64,
    /// Requests sent again after the load until answered `202`.
    pub retried_requests: u64,
    /// ... of which never answered `202` (exactness is then unclear).
    pub unsettled_requests: u64,
    /// Views answered `202`, retries included.
    pub accepted_views: u64,
    /// The viral reel's views summed in the table after the drain.
    pub stored_views: u64,
    /// ... as `GET /reels/viral/views` answers (uncached).
    pub read_views: u64,
    /// `stored_views == accepted_views == read_views`.
    pub exact: bool,
    /// Distinct viewers of the accepted requests.
    pub unique_viewers_true: u64,
    /// `unique_viewers` of `GET /reels/viral/views`.
    pub unique_viewers_estimate: u64,
    /// (estimate − true) ÷ true, %.
    pub unique_viewers_error_pct: f64,
    /// Write units the fault proxy counted on the views table.
    pub wcu_proxy: f64,
    /// ... per accepted view.
    pub wcu_per_view_proxy: f64,
    /// Write units from the items' sizes (see `sized_units`).
    pub wcu_sized: f64,
    /// ... per accepted view.
    pub wcu_per_view_sized: f64,
    /// ... per chunk.
    pub wcu_sized_per_chunk: f64,
    /// The viral reel's partition: the most write units in one second
    /// (the proxy's count).
    pub viral_key_max_wcu_per_sec: f64,
    /// Transactions the aggregator sent (`TransactWriteItems` the proxy
    /// received, every attempt).
    pub transactions: u64,
    /// Chunks applied (seen items written).
    pub chunks: u64,
    /// Records per chunk: mean.
    pub records_per_chunk_mean: f64,
    /// ... median.
    pub records_per_chunk_p50: f64,
    /// ... most.
    pub records_per_chunk_max: f64,
    /// The largest seen item, bytes.
    pub seen_item_bytes_max: u64,
    /// The largest view item of the viral reel (sketch and all), bytes.
    pub view_item_bytes_max: u64,
    /// Invocations of the aggregator by the event source.
    pub invocations: u64,
    /// Records handed to it per invocation, mean.
    pub records_per_invocation: f64,
    /// Batches delivered again.
    pub batches_retried: u64,
    /// Records sent to `OnFailure` (lost views).
    pub records_discarded: u64,
    /// Kinesis requests through the proxy (the producer's and the event
    /// source's), by operation.
    pub kinesis_requests: BTreeMap<String, u64>,
    /// Records put in the stream (the proxy forwarded): above the requests
    /// accepted by the producer's retries of answers it did not get.
    pub records_put: u64,
    /// Records the producer put again (refused, or the answer lost).
    pub producer_retries: u64,
}

/// One request as its worker saw it.
#[derive(Clone, Debug)]
struct Sample {
    /// The worker and its request number: the `Idempotency-Key`.
    key: String,
    /// The viewer's number in the population.
    viewer: u32,
    /// Views of the viral reel it carried.
    count: u32,
    /// When its answer came, since the load started.
    at: Duration,
    /// Its status, or `None` without an answer.
    status: Option<u16>,
    /// From sending it to its answer.
    latency: Duration,
}

impl Sample {
    fn ok(&self) -> bool {
        self.status == Some(202)
    }
}

/// The HTTP side of the load.
struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// One viewer's batch: `count` views of `reel`.
    async fn post(&self, reel: &str, user: &str, count: u32, key: &str) -> Option<u16> {
        let body = format!(r#"{{"views":[{{"reel_id":"{reel}","count":{count}}}]}}"#);
        self.http
            .post(format!("{}/views", self.base))
            .header("x-user-id", user)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }
}

/// The user id of viewer `n` of run `prefix`.
fn user(prefix: &str, n: u32) -> String {
    format!("{prefix}u{n}")
}

/// Runs the `views` variant once (`run` names its viewers and keys).
pub(super) async fn run_views(opts: &BenchOptions, run: u32) -> Result<ViewsResult> {
    let mut so = StackOptions::isolated(opts.template.clone());
    so.views = true;
    so.env.extend(Variant::Views.stack_env(opts));
    let template = crate::template::Template::load(&opts.template)?;
    let table = template
        .table_env
        .get("VIEWS_TABLE")
        .cloned()
        .context("the template wires no VIEWS_TABLE")?;
    let stack = Stack::start(so).await.context("starting the stack")?;
    let result = measure(opts, run, &stack, &table).await;
    stack.shutdown().await;
    result
}

async fn measure(opts: &BenchOptions, run: u32, stack: &Stack, table: &str) -> Result<ViewsResult> {
    let proxy = stack.proxy.clone().context("the stack has a proxy")?;
    let views = stack.views.as_ref().context("the views stream runs")?;
    let client = Arc::new(Client {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()?,
        base: stack.base_url.clone(),
    });
    let prefix = format!("r{run}");
    // The warm-up: kinesis-mock (Node) answers its first puts in seconds;
    // another reel's views, drained before anything is counted.
    let warm = Load {
        client: client.clone(),
        workers: opts.views_workers,
        viewers: opts.views_viewers,
        reel: WARMUP_REEL,
        keys: format!("{prefix}w"),
        users: prefix.clone(),
        seed: u64::from(run) << 40,
    };
    let warmup = warm.run(Instant::now(), Instant::now() + WARMUP).await?;
    drain(stack).await?;
    crate::errln!(
        "  views: warm-up done ({} requests, {} answered 202)",
        warmup.len(),
        warmup.iter().filter(|s| s.ok()).count()
    );
    // Chunks applied so far are the warm-up's.
    let warm_chunks: HashSet<(String, String)> = scan(&stack.client, table)
        .await?
        .iter()
        .filter_map(|i| Some((s_attr(i, "pk")?, s_attr(i, "sk")?)))
        .collect();
    let producer_retries = || stack.app.views.producer.as_ref().map_or(0, |p| p.retries());
    let retries_before = producer_retries();
    let source = views.source.as_ref().context("the views source runs")?;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::SeqCst);
    let source_counts = || {
        let st = &source.stats;
        [
            n(&st.invocations),
            n(&st.delivered),
            n(&st.retries),
            n(&st.discarded),
        ]
    };
    let source_before = source_counts();
    proxy.reset_stats();
    if let Some(k) = &stack.kinesis_proxy {
        k.reset_stats();
    }
    let t0 = Instant::now();
    let watching = Arc::new(AtomicBool::new(true));
    let poller = tokio::spawn(poll_sums(
        stack.client.clone(),
        table.to_owned(),
        watching.clone(),
        t0,
    ));
    // The load.
    let load = Load {
        reel: VIRAL,
        keys: prefix.clone(),
        seed: u64::from(run) << 40 | 1 << 32,
        ..warm
    };
    let samples = load
        .run(t0, t0 + Duration::from_secs_f64(opts.seconds))
        .await?;
    let load_seconds = t0.elapsed().as_secs_f64();
    crate::errln!("  views: load done ({} requests); draining", samples.len());
    // The drain, with the poller still on: the last requests' freshness.
    let drain_start = Instant::now();
    drain(stack).await?;
    let drain_seconds = drain_start.elapsed().as_secs_f64();
    watching.store(false, Ordering::Relaxed);
    let sums = poller.await.context("the poller")?;
    // The requests not answered 202, again with their keys, then drained
    // again: every view counted once in the end.
    let failed: Vec<&Sample> = samples.iter().filter(|s| !s.ok()).collect();
    let settled = retry(&client, &prefix, &failed).await;
    drain(stack).await?;
    let source_after = source_counts();
    let [invocations, delivered, batches_retried, records_discarded]: [u64; 4] =
        std::array::from_fn(|i| source_after[i] - source_before[i]);
    let stats = proxy.stats();
    let loads = proxy.key_loads();
    let kinesis = stack.kinesis_proxy.as_ref().map(|k| k.stats());
    let kinesis_requests = kinesis
        .as_ref()
        .map(|k| k.requests.clone())
        .unwrap_or_default();
    let records_put = kinesis.as_ref().map_or(0, |k| k.kinesis.records_forwarded);
    let shards = shard_ids(&views.client, &views.def.stream).await?;
    let arn = crate::kinesis::stream_arn(&views.def.stream);
    let items = scan(&stack.client, table).await?;
    let sized = sized_units(&items, &arn, &shards, &warm_chunks);
    let stored_views = stored_sum(&stack.client, table).await?;
    let (read_views, unique_viewers_estimate) = read_back(&client).await?;

    // The figures.
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok()).collect();
    let mut answers: BTreeMap<String, u64> = BTreeMap::new();
    for s in &samples {
        let k = s.status.map_or("error".to_owned(), |c| c.to_string());
        *answers.entry(k).or_default() += 1;
    }
    let load_views: u64 = ok.iter().map(|s| u64::from(s.count)).sum();
    let accepted_views = load_views + settled.iter().map(|s| u64::from(s.count)).sum::<u64>();
    let distinct: HashSet<u32> = ok
        .iter()
        .map(|s| s.viewer)
        .chain(settled.iter().map(|s| s.viewer))
        .collect();
    let unique_true = distinct.len() as u64;
    let mut lat: Vec<f64> = ok
        .iter()
        .map(|s| s.latency.as_secs_f64() * 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    let acks: Vec<(f64, u64)> = ok
        .iter()
        .map(|s| (s.at.as_secs_f64(), u64::from(s.count)))
        .collect();
    let (freshness_p50_ms, freshness_p99_ms) = freshness(&acks, &sums);
    let table_prefix = format!("{table}/");
    let wcu_proxy: f64 = loads
        .iter()
        .filter(|l| l.partition.starts_with(&table_prefix))
        .map(|l| l.write_units)
        .sum();
    let viral_key = format!("{table}/{}", viral_pk());
    let viral_key_max = loads
        .iter()
        .find(|l| l.partition == viral_key)
        .map_or(0.0, |l| l.max_write_units_per_sec);
    let per_view = |u: f64| u / accepted_views.max(1) as f64;
    let mut records = sized.records_per_chunk.clone();
    records.sort_by(f64::total_cmp);
    let chunks = records.len() as u64;
    Ok(ViewsResult {
        variant: Variant::Views,
        workers: opts.views_workers,
        viewers: opts.views_viewers,
        stream_shards: VIEWS_SHARDS,
        load_seconds,
        requests: samples.len() as u64,
        accepted_requests: ok.len() as u64,
        accepted_pct: 100.0 * ok.len() as f64 / samples.len().max(1) as f64,
        answers,
        requests_per_sec: ok.len() as f64 / load_seconds,
        views_per_sec: load_views as f64 / load_seconds,
        latency_p50_ms: percentile(&lat, 0.5),
        latency_p99_ms: percentile(&lat, 0.99),
        freshness_p50_ms,
        freshness_p99_ms,
        drain_seconds,
        retried_requests: failed.len() as u64,
        unsettled_requests: (failed.len() - settled.len()) as u64,
        accepted_views,
        stored_views,
        read_views,
        exact: stored_views == accepted_views && read_views == accepted_views,
        unique_viewers_true: unique_true,
        unique_viewers_estimate,
        unique_viewers_error_pct: error_pct(unique_viewers_estimate, unique_true),
        wcu_proxy,
        wcu_per_view_proxy: per_view(wcu_proxy),
        wcu_sized: sized.units,
        wcu_per_view_sized: per_view(sized.units),
        wcu_sized_per_chunk: sized.units / chunks.max(1) as f64,
        viral_key_max_wcu_per_sec: viral_key_max,
        transactions: stats
            .requests
            .get("TransactWriteItems")
            .copied()
            .unwrap_or(0),
        chunks,
        records_per_chunk_mean: records.iter().sum::<f64>() / chunks.max(1) as f64,
        records_per_chunk_p50: percentile(&records, 0.5),
        records_per_chunk_max: records.last().copied().unwrap_or(0.0),
        seen_item_bytes_max: sized.seen_bytes_max,
        view_item_bytes_max: sized.view_bytes_max,
        invocations,
        records_per_invocation: delivered as f64 / invocations.max(1) as f64,
        batches_retried,
        records_discarded,
        kinesis_requests,
        records_put,
        producer_retries: producer_retries() - retries_before,
    })
}

/// A reel of the warm-up's own.
const WARMUP_REEL: &str = "warmup";
/// How long the warm-up runs.
pub(super) const WARMUP: Duration = Duration::from_secs(3);

/// A closed-loop load on one reel.
struct Load {
    client: Arc<Client>,
    workers: u32,
    viewers: u32,
    reel: &'static str,
    /// What the `Idempotency-Key`s start with.
    keys: String,
    /// What the user ids start with.
    users: String,
    /// The workers' random draws, worker by worker from here.
    seed: u64,
}

impl Load {
    /// Runs the workers from `t0` (their answers' times are since then)
    /// until `deadline`; every request's sample.
    async fn run(&self, t0: Instant, deadline: Instant) -> Result<Vec<Sample>> {
        let workers: Vec<_> = (0..self.workers)
            .map(|w| {
                let client = self.client.clone();
                let (viewers, reel) = (self.viewers, self.reel);
                let (keys, users) = (self.keys.clone(), self.users.clone());
                let mut rng = fastrand::Rng::with_seed(self.seed + u64::from(w));
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let viewer = rng.u32(0..viewers);
                        let count = rng.u32(VIEWS_PER_REQUEST.0..=VIEWS_PER_REQUEST.1);
                        let key = format!("{keys}-{w}-{i}");
                        let sent = Instant::now();
                        let status = client.post(reel, &user(&users, viewer), count, &key).await;
                        out.push(Sample {
                            key,
                            viewer,
                            count,
                            at: t0.elapsed(),
                            status,
                            latency: sent.elapsed(),
                        });
                        i += 1;
                    }
                    out
                })
            })
            .collect();
        let mut samples = Vec::new();
        for w in workers {
            samples.extend(w.await.context("a load worker")?);
        }
        Ok(samples)
    }
}
