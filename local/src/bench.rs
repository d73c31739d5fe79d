//! The viral-load benchmark: one viral reel under an open-loop load of likes
//! from distinct users, plus background likes on other reels and feed reads,
//! against the real handlers and embedded dynoxide behind the fault proxy's
//! per-key capacity model, side by side for:
//!
//! 1. `naive`: one counter item, `UpdateItem ADD n :1` per like (what one
//!    would write without this project), through the same SDK settings;
//! 2. `fixed`: this project with the viral reel pre-sized to a fixed shard
//!    count, cache on;
//! 3. `fixed-nocache`: the same with the read cache off (`CACHE_TTL_MS=0`),
//!    to show what the cache saves;
//! 4. `auto`: this project from 1 shard, growing automatically;
//! 5. `stream`: stream-aggregated counting (`COUNTING=stream`): likes write
//!    their row only, the aggregate function (fed by the local event
//!    source) adds them to one shard; offered at `BENCH_STREAM_RATE`
//!    (default 5× the `fixed` variant's ceiling), with its freshness
//!    (acknowledged → in the shards) measured.
//!
//! The bench also draws, per variant, the likes accepted and refused each
//! second and the viral reel's shard count over time (`BENCH_SVG`).
//!
//! The capacity cap is scaled down (`write_cap` units per key per second)
//! so that this machine can reach it; everything else (the sizing rule's
//! safe rate per shard, the hot-reel threshold, the resize waits) is scaled
//! with it. The load is open-loop: requests are sent on schedule whether or
//! not earlier ones have been answered, and a refused like is not retried,
//! so throttling shows as refusals, not as a slower client.

use crate::stack::{Stack, StackOptions};
use anyhow::{Context, Result, anyhow};
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What to run; every field has a `BENCH_*` variable.
#[derive(Clone, Debug, Serialize)]
pub struct BenchOptions {
    /// Likes a second offered on the viral reel (`BENCH_RATE`).
    pub viral_rate: f64,
    /// ... by the `stream` variant (`BENCH_STREAM_RATE`; default 5× the
    /// `fixed` variant's ceiling, `BENCH_SHARDS` × cap ÷ 2).
    pub stream_rate: f64,
    /// Likes a second on the background reels (`BENCH_BACKGROUND_RATE`).
    pub background_rate: f64,
    /// Feed reads a second, each of the viral reel and the background
    /// reels (`BENCH_READ_RATE`).
    pub read_rate: f64,
    /// Seconds of load per variant (`BENCH_SECONDS`).
    pub seconds: f64,
    /// Write units one partition key takes per second (`BENCH_WRITE_CAP`;
    /// DynamoDB: 1,000).
    pub write_cap: f64,
    /// Shards of the `fixed` variants (`BENCH_SHARDS`).
    pub fixed_shards: u32,
    /// Repetitions of every variant (`BENCH_RUNS`); medians are reported.
    pub runs: u32,
    /// Variants to run (`BENCH_VARIANTS`, comma-separated).
    pub variants: Vec<String>,
    /// On-demand prices, dollars per million write / read request units
    /// (`BENCH_WRU_PRICE`, `BENCH_RRU_PRICE`; us-east-1 defaults).
    pub wru_price: f64,
    pub rru_price: f64,
    /// Where the JSON results go (`BENCH_OUT`).
    pub out: PathBuf,
    /// Where the onset chart goes (`BENCH_SVG`).
    pub svg: PathBuf,
    #[serde(skip)]
    pub template: PathBuf,
}

impl BenchOptions {
    pub fn from_env(template: PathBuf) -> Result<Self> {
        let num = |name: &str, default: f64| -> Result<f64> {
            match std::env::var(name).ok().filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| anyhow!("{name}={v:?}: expected a positive number")),
            }
        };
        let variants = std::env::var("BENCH_VARIANTS")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| "naive,fixed,fixed-nocache,auto,stream".into())
            .split(',')
            .map(|s| s.trim().to_owned())
            .collect::<Vec<_>>();
        for v in &variants {
            if !["naive", "fixed", "fixed-nocache", "auto", "stream"].contains(&v.as_str()) {
                return Err(anyhow!("BENCH_VARIANTS: unknown variant {v:?}"));
            }
        }
        let write_cap = num("BENCH_WRITE_CAP", 30.0)?;
        let fixed_shards = num("BENCH_SHARDS", 10.0)? as u32;
        Ok(BenchOptions {
            viral_rate: num("BENCH_RATE", 75.0)?,
            stream_rate: num(
                "BENCH_STREAM_RATE",
                5.0 * f64::from(fixed_shards) * write_cap / 2.0,
            )?,
            background_rate: num("BENCH_BACKGROUND_RATE", 20.0)?,
            read_rate: num("BENCH_READ_RATE", 20.0)?,
            seconds: num("BENCH_SECONDS", 20.0)?,
            write_cap,
            fixed_shards,
            runs: num("BENCH_RUNS", 3.0)? as u32,
            variants,
            wru_price: num("BENCH_WRU_PRICE", 0.625)?,
            rru_price: num("BENCH_RRU_PRICE", 0.125)?,
            out: PathBuf::from(
                std::env::var("BENCH_OUT").unwrap_or_else(|_| "target/bench/viral.json".into()),
            ),
            svg: PathBuf::from(
                std::env::var("BENCH_SVG").unwrap_or_else(|_| "target/bench/onset.svg".into()),
            ),
            template,
        })
    }
}

/// One variant's measurements in one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunResult {
    pub variant: String,
    pub offered_likes_per_sec: f64,
    pub accepted_likes_per_sec: f64,
    /// Viral likes refused (429/503, or an SDK error for `naive`), %.
    pub refused_pct: f64,
    /// ... in the second half of the run (after any growth).
    pub refused_pct_second_half: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// The busiest partition key's most write units in one second.
    pub busiest_key_wcu_per_sec: f64,
    pub busiest_key: String,
    pub cap: f64,
    /// Shards of the viral reel when the load ends (before the refused
    /// likes are retried).
    pub shards: u32,
    /// shards × cap ÷ write units per like on the hot key.
    pub ceiling_likes_per_sec: f64,
    pub offered_to_ceiling: f64,
    /// Write units on the viral reel's keys (its shards, settings and like
    /// rows, and the `Idempotency-Key` records, which only viral likes
    /// carry) per accepted viral like; for `naive`, its counter item's.
    pub wcu_per_viral_like: f64,
    /// Write units on the background reels' keys per accepted background
    /// like (the product's like without an `Idempotency-Key`, in every
    /// variant).
    pub wcu_per_background_like: f64,
    /// Write units on keys neither of the above (expected 0).
    pub wcu_unattributed: f64,
    /// Read units per answered feed read (of 1 + background reels).
    pub rcu_per_read: f64,
    /// Shard items read a second (by the product's reads).
    pub shard_reads_per_sec: f64,
    /// What those reads would be without the cache: every read sums every
    /// shard of every reel it asks for.
    pub shard_reads_per_sec_uncached_equiv: f64,
    /// The stored count, and the likes acknowledged in the end (all of
    /// them, unless a retry never got through).
    pub final_count: i64,
    pub acknowledged: i64,
    pub exact: bool,
    /// From `wcu_per_viral_like`.
    pub dollars_per_million_likes: f64,
    /// From `wcu_per_background_like`.
    pub dollars_per_million_background_likes: f64,
    pub dollars_per_million_reads: f64,
    /// Write units of the aggregator's checkpoints (stream mode), shared
    /// out over every like in the per-like figures above.
    pub wcu_checkpoints: f64,
    /// Stream mode: from a like's acknowledgement to the shards holding it
    /// (the stream, the batching window, the aggregation; readers add up
    /// to `CACHE_TTL_MS`). 0 for the transactional variants: the shard is
    /// written before the answer.
    pub freshness_p50_ms: f64,
    pub freshness_p99_ms: f64,
    /// Per second of the load: likes accepted and refused, and the viral
    /// reel's shard count (the onset chart).
    pub timeline: Vec<Second>,
}

/// One second of a run, for the onset chart.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Second {
    pub t: u32,
    pub accepted: u32,
    pub refused: u32,
    pub shards: u32,
}

const VIRAL: &str = "viral";
const BACKGROUND_REELS: usize = 9;

fn stack_env(opts: &BenchOptions, variant: &str) -> Vec<(String, String)> {
    let cap = opts.write_cap;
    let mut env = vec![
        ("FAULTS".into(), format!("seed=1,write_cap={cap}")),
        // The local reshard schedule, every second.
        ("LOCAL_SCHEDULE_SECS".into(), "1".into()),
        // The sizing rule scaled with the cap: production runs 400 likes a
        // second per shard against 1,000 units (2 units a like).
        ("SHARD_WRITES_PER_SEC".into(), format!("{}", cap * 0.4)),
        ("HOT_LIKES_PER_SEC".into(), format!("{}", cap * 0.3)),
        ("COOL_LIKES_PER_SEC".into(), "0.1".into()),
        // Resize waits scaled down with the bounds they cover.
        ("SETTINGS_TTL_MS".into(), "500".into()),
        ("REQUEST_TIMEOUT_MS".into(), "3000".into()),
        ("REQUEST_BUDGET_MS".into(), "2500".into()),
        ("DDB_OPERATION_TIMEOUT_MS".into(), "1000".into()),
        ("DDB_ATTEMPT_TIMEOUT_MS".into(), "800".into()),
        ("RESIZE_MARGIN_MS".into(), "200".into()),
        ("RESHARD_MAX_WAIT_MS".into(), "0".into()),
    ];
    let (auto, cache) = match variant {
        "auto" => ("on", "2000"),
        "fixed-nocache" => ("off", "0"),
        _ => ("off", "2000"),
    };
    if variant == "stream" {
        env.push(("COUNTING".into(), "stream".into()));
    }
    env.push(("AUTO_RESHARD".into(), auto.into()));
    env.push(("CACHE_TTL_MS".into(), cache.into()));
    env
}

struct Sample {
    user: String,
    at: Duration,
    ok: bool,
    latency: Duration,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Sends `count` requests at `rate` a second on schedule (open loop); each
/// is `make(i)`, run as its own task.
async fn open_loop<F, Fut, T>(rate: f64, seconds: f64, make: F) -> Vec<T>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let count = (rate * seconds).round() as u64;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(count as usize);
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        tasks.push(tokio::spawn(make(i)));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(v) = t.await {
            out.push(v);
        }
    }
    out
}

async fn run_variant(opts: &BenchOptions, variant: &str, run: u32) -> Result<RunResult> {
    let mut so = StackOptions::isolated(opts.template.clone());
    for (k, v) in stack_env(opts, variant) {
        so.env.insert(k, v);
    }
    let stack = Stack::start(so).await.context("starting the stack")?;
    let proxy = stack.proxy.clone().context("the stack has a proxy")?;
    let viral_id = likes::keys::ReelId::parse(VIRAL).map_err(|e| anyhow!(e.0))?;
    if variant.starts_with("fixed") {
        stack
            .client
            .put_item()
            .table_name(&stack.config.counters_table)
            .item(
                "pk",
                AttributeValue::S(likes::keys::settings_key(&viral_id)),
            )
            .item(
                "write_shards",
                AttributeValue::N(opts.fixed_shards.to_string()),
            )
            .item(
                "read_shards",
                AttributeValue::N(opts.fixed_shards.to_string()),
            )
            .send()
            .await
            .context("pre-sizing the viral reel")?;
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let base = stack.base_url.clone();
    // The naive counter writes through the same proxy with the product's
    // own SDK settings (retries and timeouts).
    let naive_client = crate::stack::client_for(
        &stack.config,
        &proxy.url,
        &StackOptions::isolated(opts.template.clone()),
    )
    .await;
    let counters = stack.config.counters_table.clone();
    proxy.reset_stats();
    let reads_before = stack
        .app
        .reshard
        .store()
        .stats()
        .shard_reads_batch
        .load(Ordering::Relaxed);
    let t0 = Instant::now();
    let prefix = format!("r{run}");
    let stream = variant == "stream";
    let rate = if stream {
        opts.stream_rate
    } else {
        opts.viral_rate
    };
    // The viral reel's shard count, and in stream mode its shard, over time.
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = tokio::spawn(watch_viral(
        stack.client.clone(),
        counters.clone(),
        watching.clone(),
        t0,
        stream,
    ));

    let viral = {
        let (http, base, naive, counters, prefix) = (
            http.clone(),
            base.clone(),
            naive_client.clone(),
            counters.clone(),
            prefix.clone(),
        );
        let naive_variant = variant == "naive";
        open_loop(rate, opts.seconds, move |i| {
            let (http, base, naive, counters) =
                (http.clone(), base.clone(), naive.clone(), counters.clone());
            let user = format!("{prefix}v{i}");
            async move {
                let sent = Instant::now();
                let ok = viral_like(
                    naive_variant,
                    !stream,
                    &naive,
                    &counters,
                    &http,
                    &base,
                    &user,
                )
                .await;
                Sample {
                    user,
                    at: t0.elapsed(),
                    ok,
                    latency: sent.elapsed(),
                }
            }
        })
    };
    let background = {
        let (http, base, prefix) = (http.clone(), base.clone(), prefix.clone());
        open_loop(opts.background_rate, opts.seconds, move |i| {
            let (http, base) = (http.clone(), base.clone());
            let reel = format!("bg{}", i as usize % BACKGROUND_REELS);
            let user = format!("{prefix}b{i}");
            async move {
                http.put(format!("{base}/reels/{reel}/like"))
                    .header("x-user-id", &user)
                    .send()
                    .await
                    .map(|r| r.status().is_success())
                    .unwrap_or(false)
            }
        })
    };
    let ids = std::iter::once(VIRAL.to_owned())
        .chain((0..BACKGROUND_REELS).map(|i| format!("bg{i}")))
        .collect::<Vec<_>>()
        .join(",");
    let reads = {
        let (http, base) = (http.clone(), base.clone());
        open_loop(opts.read_rate, opts.seconds, move |_| {
            let (http, base, ids) = (http.clone(), base.clone(), ids.clone());
            async move {
                http.get(format!("{base}/likes?reel_ids={ids}"))
                    .send()
                    .await
                    .map(|r| r.status().is_success())
                    .unwrap_or(false)
            }
        })
    };
    let (viral, background, reads) = tokio::join!(viral, background, reads);
    let elapsed = t0.elapsed().as_secs_f64();
    let stats = proxy.stats();
    let units = attribute(
        &proxy.key_loads(),
        &counters,
        &stack.config.likes_table,
        &prefix,
    );
    // The viral reel's size when the load ends: the retries below come in
    // a burst far above the offered rate and may grow it further, which is
    // no part of what is measured here.
    let shards = if variant == "naive" {
        1
    } else {
        stack
            .app
            .service
            .settings(&viral_id)
            .await
            .map_err(|e| anyhow!("{e}"))?
            .write_shards
    };
    // Every refused like is retried after the load (as its client would),
    // until acknowledged: then every offered like must be counted exactly
    // once. Not part of the rates above.
    let refused_users: Vec<String> = viral
        .iter()
        .filter(|s| !s.ok)
        .map(|s| s.user.clone())
        .collect();
    let naive_variant = variant == "naive";
    let mut unsettled = 0usize;
    for chunk in refused_users.chunks(16) {
        let settled = futures::future::join_all(chunk.iter().map(|user| async {
            for attempt in 0..50u64 {
                if viral_like(
                    naive_variant,
                    !stream,
                    &naive_client,
                    &counters,
                    &http,
                    &base,
                    user,
                )
                .await
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20 * attempt.min(10))).await;
            }
            false
        }))
        .await;
        unsettled += settled.iter().filter(|ok| !**ok).count();
    }
    let shard_reads = stack
        .app
        .reshard
        .store()
        .stats()
        .shard_reads_batch
        .load(Ordering::Relaxed)
        - reads_before;
    // Stream mode: the counts are exact once the stream is drained.
    if stream {
        let drain_start = Instant::now();
        while !stack.streams_caught_up().await? {
            if drain_start.elapsed() > Duration::from_secs(300) {
                return Err(anyhow!("the stream was not drained within 5 minutes"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    watching.store(false, Ordering::Relaxed);
    let (shard_counts, sums) = watcher.await.context("the watcher")?;

    // Exactness: every offered like was acknowledged in the end; the store
    // must hold exactly one per user.
    let acknowledged = (viral.len() - unsettled) as i64;
    let final_count = if variant == "naive" {
        let item = stack
            .client
            .get_item()
            .table_name(&counters)
            .key("pk", AttributeValue::S(format!("naive#{VIRAL}")))
            .consistent_read(true)
            .send()
            .await?
            .item
            .unwrap_or_default();
        item.get("n")
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    } else {
        let rows = count_rows(&stack, VIRAL).await?;
        let sum = shard_sum(&stack, VIRAL).await?;
        // The shards must hold exactly the like rows; a difference shows as
        // a mismatch against the acknowledged likes.
        if sum == rows { rows } else { sum }
    };

    let accepted = viral.iter().filter(|s| s.ok).count();
    let mut lat: Vec<f64> = viral
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.latency.as_secs_f64() * 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    let half = Duration::from_secs_f64(opts.seconds / 2.0);
    let second_half: Vec<&Sample> = viral.iter().filter(|s| s.at >= half).collect();
    let refused = |v: &[&Sample]| {
        if v.is_empty() {
            0.0
        } else {
            100.0 * v.iter().filter(|s| !s.ok).count() as f64 / v.len() as f64
        }
    };
    let all: Vec<&Sample> = viral.iter().collect();
    let background_accepted = background.iter().filter(|ok| **ok).count();
    let reads_ok = reads.iter().filter(|ok| **ok).count().max(1);
    // The checkpoints serve every like of a batch: shared out by likes.
    let all_accepted = (accepted + background_accepted).max(1) as f64;
    let checkpoint_share = units.checkpoints / all_accepted;
    let wcu_per_viral_like = units.viral / accepted.max(1) as f64 + checkpoint_share;
    let wcu_per_background_like =
        units.background / background_accepted.max(1) as f64 + checkpoint_share;
    let (freshness_p50_ms, freshness_p99_ms) = freshness(&viral, &sums);
    let timeline = timeline(&viral, &shard_counts, opts.seconds);
    let rcu_per_read = stats.total_read_units() / reads_ok as f64;
    let units_per_like_on_hot_key = if variant == "naive" { 1.0 } else { 2.0 };
    // Stream mode has no per-reel ceiling: no like writes a counter item.
    let ceiling = if stream {
        f64::NAN
    } else {
        shards as f64 * opts.write_cap / units_per_like_on_hot_key
    };
    let busiest = stats.hot_keys.iter().max_by(|a, b| {
        a.max_write_units_per_sec
            .total_cmp(&b.max_write_units_per_sec)
    });
    // Every feed read sums every shard of the 10 reels without a cache.
    let uncached = reads_ok as f64 * (shards as f64 + BACKGROUND_REELS as f64) / elapsed;
    let result = RunResult {
        variant: variant.to_owned(),
        offered_likes_per_sec: rate,
        accepted_likes_per_sec: accepted as f64 / opts.seconds,
        refused_pct: refused(&all),
        refused_pct_second_half: refused(&second_half),
        latency_p50_ms: percentile(&lat, 0.5),
        latency_p99_ms: percentile(&lat, 0.99),
        busiest_key_wcu_per_sec: busiest.map_or(0.0, |k| k.max_write_units_per_sec),
        busiest_key: busiest.map(|k| k.partition.clone()).unwrap_or_default(),
        cap: opts.write_cap,
        shards,
        ceiling_likes_per_sec: ceiling,
        offered_to_ceiling: rate / ceiling,
        wcu_per_viral_like,
        wcu_per_background_like,
        wcu_unattributed: units.other,
        rcu_per_read,
        shard_reads_per_sec: shard_reads as f64 / elapsed,
        shard_reads_per_sec_uncached_equiv: uncached,
        final_count,
        acknowledged,
        exact: final_count == acknowledged,
        dollars_per_million_likes: wcu_per_viral_like * opts.wru_price,
        dollars_per_million_background_likes: wcu_per_background_like * opts.wru_price,
        dollars_per_million_reads: rcu_per_read * opts.rru_price,
        wcu_checkpoints: units.checkpoints,
        freshness_p50_ms,
        freshness_p99_ms,
        timeline,
    };
    stack.shutdown().await;
    Ok(result)
}

/// Write units the proxy counted, by whose likes they served.
#[derive(Debug, Default, PartialEq)]
struct Units {
    viral: f64,
    background: f64,
    /// The aggregator's checkpoints (stream mode): every like's.
    checkpoints: f64,
    other: f64,
}

/// Attributes every partition key's write units (`table/key` as the proxy
/// names them) to the viral reel's likes or the background likes: counter
/// items by the reel they belong to, like rows by their user (viral users
/// are `{prefix}v…`, background users `{prefix}b…`), `Idempotency-Key`
/// records to the viral likes (the only ones that carry a key), and the
/// naive counter item to the viral likes.
fn attribute(loads: &[faultproxy::KeyLoad], counters: &str, likes: &str, prefix: &str) -> Units {
    let mut u = Units::default();
    for load in loads {
        let (table, key) = load
            .partition
            .split_once('/')
            .unwrap_or(("", &load.partition));
        if table == counters && key.starts_with("agg#") {
            u.checkpoints += load.write_units;
            continue;
        }
        let viral = if table == counters {
            if key == format!("naive#{VIRAL}") || key.starts_with("idem#") {
                Some(true)
            } else {
                likes::keys::reel_of_counter_key(key).map(|r| r.as_str() == VIRAL)
            }
        } else if table == likes {
            match key.strip_prefix(prefix).and_then(|k| k.chars().next()) {
                Some('v') => Some(true),
                Some('b') => Some(false),
                _ => None,
            }
        } else {
            None
        };
        match viral {
            Some(true) => u.viral += load.write_units,
            Some(false) => u.background += load.write_units,
            None => u.other += load.write_units,
        }
    }
    u
}

type Item = std::collections::HashMap<String, AttributeValue>;

async fn scan_all(stack: &Stack, table: &str) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let out = stack
            .client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await?;
        items.extend(out.items.unwrap_or_default());
        start = out.last_evaluated_key;
        if start.is_none() {
            return Ok(items);
        }
    }
}

fn text<'a>(item: &'a Item, attr: &str) -> &'a str {
    item.get(attr).and_then(|v| v.as_s().ok()).map_or("", |s| s)
}

/// One like of the viral reel by `user`: whether it was acknowledged. The
/// product's like carries an `Idempotency-Key`, as a careful client's
/// would, so that its retry after a refusal counts once; the naive counter
/// has nothing of the kind.
async fn viral_like(
    naive_variant: bool,
    keyed: bool,
    naive: &aws_sdk_dynamodb::Client,
    counters: &str,
    http: &reqwest::Client,
    base: &str,
    user: &str,
) -> bool {
    if naive_variant {
        let r = naive
            .update_item()
            .table_name(counters)
            .key("pk", AttributeValue::S(format!("naive#{VIRAL}")))
            .update_expression("ADD n :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await;
        return r.is_ok();
    }
    let mut req = http
        .put(format!("{base}/reels/{VIRAL}/like"))
        .header("x-user-id", user);
    if keyed {
        req = req.header("idempotency-key", format!("bench-{user}"));
    }
    req.send().await.is_ok_and(|r| r.status().is_success())
}

/// Polls the viral reel's settings (every 250 ms: its shard count) and, in
/// stream mode, its one shard (every 20 ms: the aggregated count) until
/// `watching` is cleared. Times are seconds since `t0`.
async fn watch_viral(
    client: aws_sdk_dynamodb::Client,
    counters: String,
    watching: Arc<AtomicBool>,
    t0: Instant,
    stream: bool,
) -> (Vec<(f64, u32)>, Vec<(f64, i64)>) {
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
        // With one shard (stream mode never grows it), the aggregator
        // writes shard 0.
        if stream && let Ok(out) = get(likes::keys::shard_key(&viral, 0)).await {
            sums.push((
                t0.elapsed().as_secs_f64(),
                number(&out.item, "n").unwrap_or(0),
            ));
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (shards, sums)
}

/// Acknowledged → visible, p50 and p99 in ms: the k-th accepted like (by
/// the time its answer came) is visible at the first poll that shows at
/// least k likes in the shard. Likes only, so the sum only grows.
fn freshness(viral: &[Sample], sums: &[(f64, i64)]) -> (f64, f64) {
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
fn timeline(viral: &[Sample], shards: &[(f64, u32)], seconds: f64) -> Vec<Second> {
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

/// Like rows of `reel`, counted with a scan (the truth).
async fn count_rows(stack: &Stack, reel: &str) -> Result<i64> {
    let items = scan_all(stack, &stack.config.likes_table).await?;
    Ok(items.iter().filter(|i| text(i, "reel_id") == reel).count() as i64)
}

/// The sum of every shard item and the base item of `reel`.
async fn shard_sum(stack: &Stack, reel: &str) -> Result<i64> {
    let suffix = format!("#reel#{reel}#likes");
    let items = scan_all(stack, &stack.config.counters_table).await?;
    Ok(items
        .iter()
        .filter(|i| text(i, "pk").ends_with(&suffix))
        .filter_map(|i| {
            i.get("n")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<i64>().ok())
        })
        .sum())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    }
}

/// Runs every variant `runs` times (interleaved, so drift of the machine
/// spreads over all of them), writes the JSON and returns the Markdown
/// table of medians with min–max.
pub async fn run(opts: BenchOptions) -> Result<String> {
    let mut results: BTreeMap<String, Vec<RunResult>> = BTreeMap::new();
    for run in 0..opts.runs {
        for v in &opts.variants {
            crate::errln!("bench: run {}/{} variant {v}", run + 1, opts.runs);
            let r = run_variant(&opts, v, run).await?;
            crate::errln!(
                "  accepted {:.1}/s of {:.0}/s, refused {:.1}%, p99 {:.0} ms, busiest key {:.0} WCU/s (cap {:.0}), shards {}, exact {}",
                r.accepted_likes_per_sec,
                r.offered_likes_per_sec,
                r.refused_pct,
                r.latency_p99_ms,
                r.busiest_key_wcu_per_sec,
                r.cap,
                r.shards,
                r.exact
            );
            results.entry(v.clone()).or_default().push(r);
        }
    }
    let table = markdown(&opts, &results);
    if let Some(dir) = opts.svg.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.svg, onset_svg(&opts, &results))?;
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &opts.out,
        serde_json::to_string_pretty(&json!({ "options": opts, "runs": results }))?,
    )?;
    Ok(table)
}

fn markdown(opts: &BenchOptions, results: &BTreeMap<String, Vec<RunResult>>) -> String {
    type Get = fn(&RunResult) -> f64;
    let rows: [(&str, Get, usize); 20] = [
        (
            "accepted likes/s (offered)",
            |r| r.accepted_likes_per_sec,
            1,
        ),
        ("refused % (whole run)", |r| r.refused_pct, 1),
        ("refused % (second half)", |r| r.refused_pct_second_half, 1),
        ("latency p50 ms", |r| r.latency_p50_ms, 1),
        ("latency p99 ms", |r| r.latency_p99_ms, 1),
        ("busiest key WCU/s", |r| r.busiest_key_wcu_per_sec, 0),
        ("shards when the load ends", |r| r.shards as f64, 0),
        (
            "ceiling likes/s (shards × cap ÷ units)",
            |r| r.ceiling_likes_per_sec,
            0,
        ),
        ("offered ÷ ceiling", |r| r.offered_to_ceiling, 2),
        (
            "WCU per viral like (keyed, but stream: none)",
            |r| r.wcu_per_viral_like,
            2,
        ),
        (
            "WCU per background like (no key)",
            |r| r.wcu_per_background_like,
            2,
        ),
        ("RCU per feed read (10 reels)", |r| r.rcu_per_read, 2),
        (
            "freshness p50 ms (answer → in the shards)",
            |r| r.freshness_p50_ms,
            0,
        ),
        ("freshness p99 ms", |r| r.freshness_p99_ms, 0),
        ("shard reads/s", |r| r.shard_reads_per_sec, 0),
        (
            "shard reads/s without a cache (equiv.)",
            |r| r.shard_reads_per_sec_uncached_equiv,
            0,
        ),
        (
            "stored − offered, after client retries",
            |r| (r.final_count - r.acknowledged) as f64,
            0,
        ),
        (
            "$ per million viral likes",
            |r| r.dollars_per_million_likes,
            3,
        ),
        (
            "$ per million background likes",
            |r| r.dollars_per_million_background_likes,
            3,
        ),
        (
            "$ per million feed reads",
            |r| r.dollars_per_million_reads,
            3,
        ),
    ];
    let mut out = String::new();
    out.push_str(&format!(
        "Offered: {:.0} likes/s on one reel from distinct users ({:.0}/s for `stream`), {:.0} likes/s on {} background reels, {:.0} feed reads/s (10 reels each); {:.0} s per variant, {} runs; write cap {:.0} units per key per second; fixed variants {} shards. Medians, with min–max over the runs; — where a figure does not apply.\n\n",
        opts.viral_rate,
        opts.stream_rate,
        opts.background_rate,
        BACKGROUND_REELS,
        opts.read_rate,
        opts.seconds,
        opts.runs,
        opts.write_cap,
        opts.fixed_shards
    ));
    out.push_str("| metric |");
    for v in results.keys() {
        out.push_str(&format!(" {v} |"));
    }
    out.push_str("\n| --- |");
    for _ in results.keys() {
        out.push_str(" --- |");
    }
    out.push('\n');
    for (name, get, prec) in rows {
        out.push_str(&format!("| {name} |"));
        for rs in results.values() {
            let vals: Vec<f64> = rs.iter().map(get).collect();
            let (lo, hi) = vals
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                    (a.min(*x), b.max(*x))
                });
            let m = median(vals.clone());
            if vals.iter().any(|v| !v.is_finite()) {
                out.push_str(" — |");
            } else if (hi - lo).abs() < 1e-9 {
                out.push_str(&format!(" {m:.prec$} |"));
            } else {
                out.push_str(&format!(" {m:.prec$} ({lo:.prec$}–{hi:.prec$}) |"));
            }
        }
        out.push('\n');
    }
    let exact = results.values().flatten().all(|r| r.exact);
    out.push_str(&format!(
        "\nEvery run exact (stored count = acknowledged likes): {}.\n",
        if exact { "yes" } else { "NO" }
    ));
    out
}

/// The onset chart: per variant (its first run), the viral likes accepted
/// (green) and refused (red) each second, against the offered rate
/// (dashed), and the viral reel's shard count (blue, right-hand scale).
/// Plain SVG, no fonts or crates needed to draw it.
fn onset_svg(opts: &BenchOptions, results: &BTreeMap<String, Vec<RunResult>>) -> String {
    const W: f64 = 860.0;
    const H: f64 = 190.0;
    const LEFT: f64 = 64.0;
    const RIGHT: f64 = 56.0;
    const TOP: f64 = 26.0;
    const BOTTOM: f64 = 30.0;
    let panels: Vec<(&String, &RunResult)> = results
        .iter()
        .filter_map(|(v, rs)| rs.first().map(|r| (v, r)))
        .collect();
    let height = H * panels.len().max(1) as f64 + 30.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"18\" font-size=\"13\">Viral reel: likes accepted (green) and refused (red) per second, offered rate (dashed), shards (blue, right scale)</text>\n"
    );
    for (i, (variant, r)) in panels.iter().enumerate() {
        // Each panel on its own scale: the stream variant is offered ten
        // times the others' rate.
        let y_max = r
            .timeline
            .iter()
            .map(|p| f64::from(p.accepted.max(p.refused)))
            .fold(r.offered_likes_per_sec, f64::max)
            .max(1.0)
            * 1.1;
        let y0 = 30.0 + H * i as f64;
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let secs = opts.seconds.max(1.0);
        let shards_max = r
            .timeline
            .iter()
            .map(|p| p.shards)
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * 1.2;
        let x = |t: f64| LEFT + pw * (t / secs);
        let y = |v: f64| y0 + TOP + ph * (1.0 - (v / y_max).min(1.0));
        let ys = |v: f64| y0 + TOP + ph * (1.0 - v / shards_max);
        s.push_str(&format!(
            "<text x=\"{LEFT}\" y=\"{:.1}\" font-size=\"12\" font-weight=\"bold\">{variant}</text>\n<rect x=\"{LEFT}\" y=\"{:.1}\" width=\"{pw:.1}\" height=\"{ph:.1}\" fill=\"none\" stroke=\"#999\"/>\n",
            y0 + TOP - 6.0,
            y0 + TOP
        ));
        for k in 0..=4 {
            let v = y_max * f64::from(k) / 4.0;
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>\n",
                LEFT - 4.0,
                y(v) + 4.0
            ));
        }
        for k in 0..=4 {
            let v = shards_max * f64::from(k) / 4.0;
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#1f4fbf\">{v:.0}</text>\n",
                W - RIGHT + 4.0,
                ys(v) + 4.0
            ));
        }
        let step = (secs / 10.0).ceil().max(1.0);
        let mut t = 0.0;
        while t <= secs {
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t:.0} s</text>\n",
                x(t),
                y0 + H - BOTTOM + 14.0
            ));
            t += step;
        }
        let line = |pts: Vec<(f64, f64)>, color: &str, dash: bool| -> String {
            let d: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
            format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\"{} points=\"{}\"/>\n",
                if dash {
                    " stroke-dasharray=\"4 3\""
                } else {
                    ""
                },
                d.join(" ")
            )
        };
        let mid = |p: &Second| f64::from(p.t) + 0.5;
        s.push_str(&line(
            vec![
                (x(0.0), y(r.offered_likes_per_sec)),
                (x(secs), y(r.offered_likes_per_sec)),
            ],
            "#777",
            true,
        ));
        s.push_str(&line(
            r.timeline
                .iter()
                .map(|p| (x(mid(p)), y(f64::from(p.accepted))))
                .collect(),
            "#2a9d3a",
            false,
        ));
        s.push_str(&line(
            r.timeline
                .iter()
                .map(|p| (x(mid(p)), y(f64::from(p.refused))))
                .collect(),
            "#d62728",
            false,
        ));
        let mut steps = Vec::new();
        for p in &r.timeline {
            steps.push((x(f64::from(p.t)), ys(f64::from(p.shards))));
            steps.push((x(f64::from(p.t) + 1.0), ys(f64::from(p.shards))));
        }
        s.push_str(&line(steps, "#1f4fbf", false));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(partition: &str, write_units: f64) -> faultproxy::KeyLoad {
        faultproxy::KeyLoad {
            partition: partition.into(),
            write_units,
            ..Default::default()
        }
    }

    #[test]
    fn units_are_attributed_by_whose_like_they_served() {
        let loads = [
            load("C/004#reel#viral#likes", 2.0),
            load("C/reel#viral#settings", 1.0),
            load("C/idem#abc", 2.0),
            load("C/naive#viral", 1.0),
            load("L/r1v17", 2.0),
            load("C/003#reel#bg4#likes", 2.0),
            load("C/reel#bg4#settings", 1.0),
            load("L/r1b3", 2.0),
            // A user of another run (r10 is not r1's), another table, a
            // bookkeeping key: none of the two.
            load("L/r10v1", 2.0),
            load("X/r1v1", 4.0),
            load("C/recon#run", 1.0),
            load("C/agg#0123", 2.0),
        ];
        assert_eq!(
            attribute(&loads, "C", "L", "r1"),
            Units {
                viral: 8.0,
                background: 5.0,
                checkpoints: 2.0,
                other: 7.0
            }
        );
    }
}
