//! A viral burst against a running local stack: thousands of likes from
//! distinct users on one reel, with double taps and client retries, then the
//! total, the spread over the shards, and the duplicates that were absorbed.

use crate::template::Template;
use anyhow::{Context, Result, bail};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub base_url: String,
    pub users: usize,
    pub shards: u32,
    pub concurrency: usize,
    /// How long the stack caches sums; the demo waits it out before reading.
    pub cache_ttl: Duration,
}

#[derive(Default)]
struct Tally {
    sent: usize,
    /// First taps that changed the state.
    applied: usize,
    /// Retries with the same Idempotency-Key, answered like the original
    /// (`changed: true`) without counting again.
    retries_replayed: usize,
    /// Double taps (new requests) answered `changed: false`.
    duplicates_absorbed: usize,
    /// Answers that were neither: errors, or a state change where none
    /// was expected.
    errors: usize,
}

/// What the burst did, for callers that check it.
#[derive(Clone, Debug)]
pub struct DemoReport {
    pub reel: String,
    pub count: i64,
    pub shards: Vec<i64>,
    pub sent: usize,
    pub duplicates_absorbed: usize,
    pub retries_replayed: usize,
}

/// Runs the demo; fails if the final count is not exactly the number of
/// distinct users or any answer was not the expected one.
pub async fn run(opts: &DemoOptions, client: &Client, counters_table: &str) -> Result<DemoReport> {
    let http = reqwest::Client::new();
    let health = http.get(format!("{}/healthz", opts.base_url)).send().await;
    if !health.as_ref().is_ok_and(|r| r.status().is_success()) {
        bail!(
            "the local stack does not answer at {} (start it with `make serve`)",
            opts.base_url
        );
    }
    // A reel of its own each run: two runs within one second (a script,
    // a test) must not like each other's reel, whose users already liked.
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let reel = format!("demo-{ms}-{}", std::process::id());
    // Size the reel up front, the way the resharding function grows a hot
    // reel, so the spread over shards shows.
    client
        .put_item()
        .table_name(counters_table)
        .item("pk", AttributeValue::S(format!("reel#{reel}#settings")))
        .item("write_shards", AttributeValue::N(opts.shards.to_string()))
        .item("read_shards", AttributeValue::N(opts.shards.to_string()))
        .send()
        .await
        .context("writing the demo reel's settings")?;

    crate::outln!(
        "viral burst: {} users like reel {reel} ({} shards, {} in flight)",
        opts.users,
        opts.shards,
        opts.concurrency
    );
    let started = Instant::now();
    let url = format!("{}/reels/{reel}/like", opts.base_url);
    let tallies: Vec<Tally> = futures::stream::iter(0..opts.users)
        .map(|i| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let mut t = Tally::default();
                let user = format!("demo-user-{i}");
                // Every 7th user's app sends an Idempotency-Key and retries
                // the same request; every 5th user double-taps.
                let key = (i % 7 == 0).then(|| format!("tap-{i}"));
                // (idempotency key, expected `changed`, kind)
                let mut sends = vec![(key.clone(), true, 0u8)];
                if key.is_some() {
                    sends.push((key.clone(), true, 1));
                }
                if i % 5 == 0 {
                    sends.push((None, false, 2));
                }
                for (key, expect_changed, kind) in sends {
                    let mut req = http.put(&url).header("x-user-id", &user);
                    if let Some(k) = &key {
                        req = req.header("idempotency-key", k);
                    }
                    t.sent += 1;
                    let changed = match req.send().await {
                        Ok(r) if r.status().is_success() => r
                            .json::<serde_json::Value>()
                            .await
                            .ok()
                            .and_then(|v| v["changed"].as_bool()),
                        _ => None,
                    };
                    match (changed, kind) {
                        (Some(c), 0) if c == expect_changed => t.applied += 1,
                        (Some(c), 1) if c == expect_changed => t.retries_replayed += 1,
                        (Some(c), 2) if c == expect_changed => t.duplicates_absorbed += 1,
                        _ => t.errors += 1,
                    }
                }
                t
            }
        })
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut total = Tally::default();
    for t in tallies {
        total.sent += t.sent;
        total.applied += t.applied;
        total.retries_replayed += t.retries_replayed;
        total.duplicates_absorbed += t.duplicates_absorbed;
        total.errors += t.errors;
    }

    tokio::time::sleep(opts.cache_ttl + Duration::from_millis(100)).await;
    let read: serde_json::Value = http
        .get(format!("{}/reels/{reel}/likes", opts.base_url))
        .send()
        .await?
        .json()
        .await?;
    let count = read["count"].as_i64().unwrap_or(-1);

    let shards = shard_values(client, counters_table, &reel, opts.shards).await?;
    let (min, max) = (
        shards.iter().min().copied().unwrap_or(0),
        shards.iter().max().copied().unwrap_or(0),
    );
    let mean = shards.iter().sum::<i64>() as f64 / shards.len().max(1) as f64;

    crate::outln!(
        "requests: {} sent in {:.2}s ({:.0}/s)",
        total.sent,
        elapsed.as_secs_f64(),
        total.sent as f64 / elapsed.as_secs_f64().max(1e-9),
    );
    crate::outln!("  likes applied:                 {}", total.applied);
    crate::outln!(
        "  double taps rejected:          {} (answered changed=false)",
        total.duplicates_absorbed
    );
    crate::outln!(
        "  Idempotency-Key retries:       {} (answered like the original, counted once)",
        total.retries_replayed
    );
    crate::outln!("  errors or unexpected answers:  {}", total.errors);
    crate::outln!("total: {count} (expected {})", opts.users);
    crate::outln!("shard spread: min {min}, max {max}, mean {mean:.1}");
    for (i, n) in shards.iter().enumerate() {
        let bar = "#".repeat(((*n as f64 / max.max(1) as f64) * 40.0).round() as usize);
        crate::outln!("  {i:03} {n:>6} {bar}");
    }
    if count != opts.users as i64 || total.errors > 0 || shards.iter().sum::<i64>() != count {
        bail!(
            "count {count} with {} errors; expected exactly {}",
            total.errors,
            opts.users
        );
    }
    Ok(DemoReport {
        reel,
        count,
        shards,
        sent: total.sent,
        duplicates_absorbed: total.duplicates_absorbed,
        retries_replayed: total.retries_replayed,
    })
}

async fn shard_values(client: &Client, table: &str, reel: &str, shards: u32) -> Result<Vec<i64>> {
    let keys: Vec<String> = (0..shards)
        .map(|s| format!("{s:03}#reel#{reel}#likes"))
        .collect();
    let mut values: HashMap<String, i64> = HashMap::new();
    for chunk in keys.chunks(100) {
        let mut pending: Vec<HashMap<String, AttributeValue>> = chunk
            .iter()
            .map(|k| HashMap::from([("pk".to_owned(), AttributeValue::S(k.clone()))]))
            .collect();
        while !pending.is_empty() {
            let ka = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut pending)))
                .consistent_read(true)
                .build()?;
            let out = client
                .batch_get_item()
                .request_items(table, ka)
                .send()
                .await?;
            for item in out
                .responses
                .and_then(|mut r| r.remove(table))
                .unwrap_or_default()
            {
                let pk = item
                    .get("pk")
                    .and_then(|v| v.as_s().ok())
                    .cloned()
                    .unwrap_or_default();
                let n = item
                    .get("n")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                values.insert(pk, n);
            }
            pending = out
                .unprocessed_keys
                .and_then(|mut u| u.remove(table))
                .map(|k| k.keys)
                .unwrap_or_default();
        }
    }
    Ok(keys
        .iter()
        .map(|k| values.get(k).copied().unwrap_or(0))
        .collect())
}

/// The counters table's name, resolved the way the stack resolves it.
pub fn counters_table(template: &Template) -> String {
    template
        .table_env
        .iter()
        .find(|(var, _)| var.as_str() == "COUNTERS_TABLE")
        .map(|(var, id)| std::env::var(var).unwrap_or_else(|_| id.clone()))
        .unwrap_or_else(|| "CountersTable".into())
}
