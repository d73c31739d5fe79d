//! The viral-load benchmark: one viral reel under an open-loop load of likes
//! from distinct users, plus background likes on other reels and feed reads,
//! against the real handlers and embedded dynoxide behind the fault proxy's
//! per-key capacity model, side by side for every [`Variant`]:
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
//!    (acknowledged → in the shards) measured;
//! 6. `stream-scale`: stream mode at scale as issue 21 sets it: one viral
//!    reel (no background likes), the stream read as 32 shards, the fault
//!    proxy's conflict model on, the reel grown 32 → 64 halfway through,
//!    offered at `BENCH_STREAM_SCALE_RATE`; with how many of the
//!    aggregator's transactions conflicted, the batches handed back and
//!    the records sent to `OnFailure` (`scale.rs`);
//! 7. `stream-scale-mixed`: the same with the background likes, whose
//!    reels of one shard each take chunks from whichever stream shards
//!    carry their likes (conflicted: all, and on the viral reel's shards);
//! 8. `views`: not likes but views, through the views pipeline (`POST
//!    /views` → Kinesis → the views aggregator → the views table), one
//!    viral reel closed-loop at the rate this machine sustains, with its
//!    freshness, write units per view, unique-viewer error and exactness
//!    (`views/`, its own figures and table);
//! 9. `costs`: not a load but a bill: DynamoDB units per like, keyed like,
//!    unlike and keyed unlike in both counting modes, and per view, at
//!    breadth and on one reel, request path and aggregation apart
//!    (`costs/`, its own cells and table); and from them the whole bill,
//!    dollars per million likes and views line by line (`bill/`);
//! 10. `platform`: a platform's year, compressed, likes and views of a
//!     Zipf universe with stream shards rolling over and Kinesis shards
//!     split and merged (`platform/`, its own figures and section).
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
//!
//! # Layout
//!
//! * this file: the options ([`BenchOptions`]), the results
//!   ([`RunResult`]) and [`run`], which runs every variant and writes them;
//! * [`Variant`] (`variant.rs`): the variants and their stacks' settings;
//! * `measure.rs`: one variant's run, step by step;
//! * `load.rs`: the open-loop load and the retries of refused likes;
//! * `rank.rs`: percentiles of samples;
//! * `watch.rs`: the viral reel polled over time: the onset timeline and
//!   stream mode's freshness;
//! * `units.rs`: write units by whose likes they served;
//! * `scale.rs`: the stream-at-scale variants' resize and figures;
//! * `views/`: the `views` variant, run and measured on its own (the run, what it reads back, its arithmetic);
//! * `costs/`: the `costs` variant, run and measured on its own;
//! * `bill/`: the whole bill made of the `costs` cells, the template and
//!   one table of prices (`BENCH_REGION`);
//! * `platform/`: the `platform` variant, run and measured on its own;
//! * `store.rs`: pre-sizing, and the stored count read back;
//! * `report.rs`: the Markdown table; `svg.rs`: the onset chart.
//! * [`ratio`]: a second benchmark, `likes-local bench ratio`: the like
//!   endpoint's rate against the bare SDK call under it, per counting mode.

#![warn(missing_docs)]

mod bill;
mod costs;
mod load;
mod measure;
mod platform;
mod rank;
pub mod ratio;
mod report;
mod scale;
mod store;
mod svg;
mod trending;
mod units;
mod variant;
mod views;
mod watch;

pub use variant::Variant;
pub use views::ViewsResult;

use anyhow::{Result, anyhow};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What to run; every field but the template has a `BENCH_*` variable.
#[derive(Clone, Debug, Serialize)]
pub struct BenchOptions {
    /// Likes a second offered on the viral reel (`BENCH_RATE`).
    pub viral_rate: f64,
    /// ... by the `stream` variant (`BENCH_STREAM_RATE`; default 5× the
    /// `fixed` variant's ceiling, `BENCH_SHARDS` × cap ÷ 2).
    pub stream_rate: f64,
    /// ... by `stream-scale` and `stream-scale-mixed`
    /// (`BENCH_STREAM_SCALE_RATE`; default 2,000: `STREAM_SCALE_RATE`
    /// says how that was found).
    pub stream_scale_rate: f64,
    /// Likes a second on the background reels (`BENCH_BACKGROUND_RATE`;
    /// none in `stream-scale`).
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
    /// Closed-loop workers of the `views` variant (`BENCH_VIEWS_WORKERS`).
    pub views_workers: u32,
    /// Distinct viewers the `views` variant draws from
    /// (`BENCH_VIEWS_VIEWERS`).
    pub views_viewers: u32,
    /// Likes a second offered by `platform` (`BENCH_PLATFORM_RATE`).
    pub platform_rate: f64,
    /// Seconds of the `platform` variant's load (`BENCH_PLATFORM_SECONDS`).
    pub platform_seconds: f64,
    /// Records a virtual stream shard of `platform` takes before it rolls
    /// over (`BENCH_PLATFORM_ROLL_RECORDS`): its compression of time.
    pub platform_roll_records: u64,
    /// Likes a second offered by `trending` (`BENCH_TRENDING_RATE`).
    pub trending_rate: f64,
    /// Seconds of the `trending` variant's load (`BENCH_TRENDING_SECONDS`).
    pub trending_seconds: f64,
    /// Variants to run (`BENCH_VARIANTS`, comma-separated names).
    pub variants: Vec<Variant>,
    /// The region whose prices the bill uses (`BENCH_REGION`: a region of
    /// `bill/prices.rs`, `us-east-1` by default).
    pub region: String,
    /// On-demand price, dollars per million write request units
    /// (`BENCH_WRU_PRICE`; the region's by default).
    pub wru_price: f64,
    /// ... per million read request units (`BENCH_RRU_PRICE`).
    pub rru_price: f64,
    /// Where the JSON results go (`BENCH_OUT`).
    pub out: PathBuf,
    /// Where the onset chart goes (`BENCH_SVG`).
    pub svg: PathBuf,
    /// The SAM template every stack is started from.
    #[serde(skip)]
    pub template: PathBuf,
}

/// The positive number in the variable `name`, or `default` when it is
/// unset or blank; anything else is an error naming the variable. Every
/// `BENCH_*` number is read this way.
pub(super) fn positive_env(name: &str, default: f64) -> Result<f64> {
    match std::env::var(name).ok().filter(|v| !v.trim().is_empty()) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| anyhow!("{name}={v:?}: expected a positive number")),
    }
}

impl BenchOptions {
    /// The options from the `BENCH_*` variables; unset or blank ones take
    /// their defaults, and a number must be positive.
    pub fn from_env(template: PathBuf) -> Result<Self> {
        let num = positive_env;
        let variants = match std::env::var("BENCH_VARIANTS")
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            None => Variant::ALL.to_vec(),
            Some(list) => list
                .split(',')
                .map(|s| {
                    let s = s.trim();
                    Variant::parse(s)
                        .ok_or_else(|| anyhow!("BENCH_VARIANTS: unknown variant {s:?}"))
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let region = std::env::var("BENCH_REGION")
            .ok()
            .map(|r| r.trim().to_owned())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "us-east-1".into());
        let prices = bill::Prices::of(&region)?;
        let write_cap = num("BENCH_WRITE_CAP", 30.0)?;
        let fixed_shards = num("BENCH_SHARDS", 10.0)? as u32;
        let stream_rate = num(
            "BENCH_STREAM_RATE",
            5.0 * f64::from(fixed_shards) * write_cap / 2.0,
        )?;
        Ok(BenchOptions {
            viral_rate: num("BENCH_RATE", 75.0)?,
            stream_rate,
            stream_scale_rate: num("BENCH_STREAM_SCALE_RATE", STREAM_SCALE_RATE)?,
            background_rate: num("BENCH_BACKGROUND_RATE", 20.0)?,
            read_rate: num("BENCH_READ_RATE", 20.0)?,
            seconds: num("BENCH_SECONDS", 20.0)?,
            write_cap,
            fixed_shards,
            runs: num("BENCH_RUNS", 3.0)? as u32,
            views_workers: num("BENCH_VIEWS_WORKERS", 16.0)? as u32,
            views_viewers: num("BENCH_VIEWS_VIEWERS", 200_000.0)? as u32,
            platform_rate: num("BENCH_PLATFORM_RATE", platform::RATE)?,
            platform_seconds: num("BENCH_PLATFORM_SECONDS", platform::SECONDS)?,
            platform_roll_records: platform::roll_records_env()?,
            trending_rate: num("BENCH_TRENDING_RATE", trending::RATE)?,
            trending_seconds: num("BENCH_TRENDING_SECONDS", trending::SECONDS)?,
            variants,
            wru_price: num("BENCH_WRU_PRICE", prices.get(bill::Item::WruMillion))?,
            rru_price: num("BENCH_RRU_PRICE", prices.get(bill::Item::RruMillion))?,
            region,
            out: PathBuf::from(
                std::env::var("BENCH_OUT").unwrap_or_else(|_| "target/bench/viral.json".into()),
            ),
            svg: PathBuf::from(
                std::env::var("BENCH_SVG").unwrap_or_else(|_| "target/bench/onset.svg".into()),
            ),
            template,
        })
    }

    /// The settings in effect as `(variable, value)`: every `BENCH_*`
    /// variable that [`BenchOptions::from_env`] reads but the output paths,
    /// defaults included, so that a run's record (`settings` in the JSON)
    /// says what it ran with, not only what was set.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let variants: Vec<&str> = self.variants.iter().map(|v| v.as_str()).collect();
        vec![
            ("BENCH_RATE", self.viral_rate.to_string()),
            ("BENCH_STREAM_RATE", self.stream_rate.to_string()),
            (
                "BENCH_STREAM_SCALE_RATE",
                self.stream_scale_rate.to_string(),
            ),
            ("BENCH_BACKGROUND_RATE", self.background_rate.to_string()),
            ("BENCH_READ_RATE", self.read_rate.to_string()),
            ("BENCH_SECONDS", self.seconds.to_string()),
            ("BENCH_WRITE_CAP", self.write_cap.to_string()),
            ("BENCH_SHARDS", self.fixed_shards.to_string()),
            ("BENCH_RUNS", self.runs.to_string()),
            ("BENCH_VIEWS_WORKERS", self.views_workers.to_string()),
            ("BENCH_VIEWS_VIEWERS", self.views_viewers.to_string()),
            ("BENCH_PLATFORM_RATE", self.platform_rate.to_string()),
            ("BENCH_PLATFORM_SECONDS", self.platform_seconds.to_string()),
            (
                "BENCH_PLATFORM_ROLL_RECORDS",
                self.platform_roll_records.to_string(),
            ),
            ("BENCH_TRENDING_RATE", self.trending_rate.to_string()),
            ("BENCH_TRENDING_SECONDS", self.trending_seconds.to_string()),
            ("BENCH_VARIANTS", variants.join(",")),
            ("BENCH_WRU_PRICE", self.wru_price.to_string()),
            ("BENCH_RRU_PRICE", self.rru_price.to_string()),
            ("BENCH_REGION", self.region.clone()),
        ]
    }
}

/// One variant's measurements in one run.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// The variant measured.
    pub variant: Variant,
    /// Viral likes a second sent (`BENCH_RATE`, or `BENCH_STREAM_RATE`).
    pub offered_likes_per_sec: f64,
    /// ... and acknowledged, over the load's seconds.
    pub accepted_likes_per_sec: f64,
    /// Viral likes refused (429/503, or an SDK error for `naive`), %.
    pub refused_pct: f64,
    /// ... in the second half of the run (after any growth).
    pub refused_pct_second_half: f64,
    /// Latency of the acknowledged viral likes, median, ms.
    pub latency_p50_ms: f64,
    /// ... 99th percentile, ms.
    pub latency_p99_ms: f64,
    /// The busiest partition key's most write units in one second.
    pub busiest_key_wcu_per_sec: f64,
    /// That key, as the proxy names it (`table/key`).
    pub busiest_key: String,
    /// The write cap per key per second (`BENCH_WRITE_CAP`).
    pub cap: f64,
    /// Shards of the viral reel when the load ends (before the refused
    /// likes are retried).
    pub shards: u32,
    /// shards × cap ÷ write units per like on the hot key.
    pub ceiling_likes_per_sec: f64,
    /// Offered rate ÷ that ceiling: above 1, refusals are certain.
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
    /// Viral likes acknowledged, the retries after the load included.
    pub acknowledged: i64,
    /// The stored count equals the acknowledged likes.
    pub exact: bool,
    /// From `wcu_per_viral_like`.
    pub dollars_per_million_likes: f64,
    /// From `wcu_per_background_like`.
    pub dollars_per_million_background_likes: f64,
    /// From `rcu_per_read`.
    pub dollars_per_million_reads: f64,
    /// Write units of the aggregator's checkpoints (stream mode), shared
    /// out over every like in the per-like figures above.
    pub wcu_checkpoints: f64,
    /// Stream mode: from a like's acknowledgement to the shards holding it
    /// (the stream, the batching window, the aggregation; readers add up
    /// to `CACHE_TTL_MS`). 0 for the transactional variants: the shard is
    /// written before the answer.
    pub freshness_p50_ms: f64,
    /// ... 99th percentile.
    pub freshness_p99_ms: f64,
    /// The stream-at-scale variants' own figures (NaN for the other variants): the
    /// aggregator's transactions refused by the conflict model, %.
    pub aggregator_conflicted_pct: f64,
    /// ... of which refused on the viral reel's shards, % of all sent.
    pub viral_conflicted_pct: f64,
    /// Batches the event source delivered again (after a failure report
    /// or a function error).
    pub batches_retried: f64,
    /// ... of which the function had applied a first part.
    pub batches_partial: f64,
    /// Records sent to the `OnFailure` destination: never counted.
    pub records_discarded: f64,
    /// Requests to resize refused before one got through (or all of them,
    /// for a minute).
    pub resize_refused: f64,
    /// Seconds from the start of the load to the resize's completion, as
    /// the watcher saw the writers' shard count reach the target; NaN if
    /// not by the end of the watch (after the drain).
    pub resize_done_s: f64,
    /// Per second of the load: likes accepted and refused, and the viral
    /// reel's shard count (the onset chart).
    pub timeline: Vec<Second>,
}

/// One second of a run, for the onset chart.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Second {
    /// Seconds since the load started.
    pub t: u32,
    /// Viral likes answered with an acknowledgement in this second.
    pub accepted: u32,
    /// ... with a refusal.
    pub refused: u32,
    /// The viral reel's shard count last seen by the end of this second.
    pub shards: u32,
}

/// The viral reel's id.
const VIRAL: &str = "viral";
/// Background reels (`bg0`…), each feed read asking for all of them.
const BACKGROUND_REELS: usize = 9;

/// The stream-at-scale variants' default rate: the highest that the
/// 2-core machine BENCHMARKS.md was measured on sustains. Probed with
/// `BENCH_VARIANTS=stream-scale` at 3b11cf8 and 8d9db1f: 1,500 and 2,000
/// likes/s were all accepted (latency p99 4 and 6 ms; 2,000 also in the
/// three runs of BENCHMARKS.md); 2,500 was all accepted once (p99 45 ms,
/// already queueing) and then, in three runs, 29–36 % refused (p99 3.1 s);
/// 3,000 was 60 % refused. The limit is the machine running the emulator,
/// the gateway, 32 stream shards' aggregation and the load at once; the
/// aggregator's conflicts stay under 1 % until it saturates (2.5 % at
/// 2,500, its transactions slowed).
const STREAM_SCALE_RATE: f64 = 2000.0;

/// Runs every variant `runs` times (interleaved, so drift of the machine
/// spreads over all of them), writes the JSON (the options, the settings
/// and every run) and the onset chart, and returns the Markdown table of
/// medians with min–max.
pub async fn run(opts: BenchOptions) -> Result<String> {
    // Keyed by name, so the table's columns and the JSON are in name order.
    let mut results: BTreeMap<String, Vec<RunResult>> = BTreeMap::new();
    // The views variant's runs: figures of their own.
    let mut views: Vec<ViewsResult> = Vec::new();
    // The costs variant's cells: counts, not timings, so one run only.
    let mut costs: Vec<costs::CostCell> = Vec::new();
    let mut platform: Vec<platform::PlatformResult> = Vec::new();
    let mut trending: Vec<trending::TrendingResult> = Vec::new();
    for run in 0..opts.runs {
        for &v in &opts.variants {
            if v.is_costs() {
                if run == 0 {
                    crate::errln!("bench: variant {v} (once: its figures are counts)");
                    costs = bill::measure(&opts).await?;
                }
                continue;
            }
            crate::errln!("bench: run {}/{} variant {v}", run + 1, opts.runs);
            if v.is_platform() {
                let r = platform::run_platform(&opts, run).await?;
                crate::errln!("  {}", platform::summary_line(&r));
                platform.push(r);
                continue;
            }
            if v.is_trending() {
                trending.extend(trending::run_both_modes(&opts, run).await?);
                continue;
            }
            if v.is_views() {
                let r = views::run_views(&opts, run).await?;
                crate::errln!(
                    "  accepted {:.0} requests/s, {:.0} views/s ({:.1}% 202), freshness p50 {:.0} ms p99 {:.0} ms, {:.4} WCU/view (proxy) {:.4} (sized), unique {} vs {} ({:+.2}%), exact {}",
                    r.requests_per_sec,
                    r.views_per_sec,
                    r.accepted_pct,
                    r.freshness_p50_ms,
                    r.freshness_p99_ms,
                    r.wcu_per_view_proxy,
                    r.wcu_per_view_sized,
                    r.unique_viewers_estimate,
                    r.unique_viewers_true,
                    r.unique_viewers_error_pct,
                    r.exact
                );
                views.push(r);
                continue;
            }
            let r = measure::run_variant(&opts, v, run).await?;
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
            results.entry(v.as_str().to_owned()).or_default().push(r);
        }
    }
    let mut table = if results.is_empty() {
        String::new()
    } else {
        report::markdown(&opts, &results)
    };
    if !views.is_empty() {
        table.push_str(&report::views_table(&opts, &views));
    }
    if !costs.is_empty() {
        table.push_str(&report::costs_table(&costs));
        table.push_str(&bill::section(&opts, &costs)?);
    }
    if !platform.is_empty() {
        table.push_str(&platform::report::section(&opts, &platform));
    }
    if !trending.is_empty() {
        table.push_str(&trending::report::section(&opts, &trending));
    }
    if let Some(dir) = opts.svg.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.svg, svg::onset_svg(&opts, &results))?;
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Keyed by variant as the others; the variants run on their own
    // (views, costs, platform) with their own fields.
    let mut runs = serde_json::to_value(&results)?;
    let own = [
        (Variant::Views, serde_json::to_value(&views)?),
        (Variant::Costs, serde_json::to_value(&costs)?),
        (Variant::Platform, serde_json::to_value(&platform)?),
        (Variant::Trending, serde_json::to_value(&trending)?),
    ];
    if let Some(map) = runs.as_object_mut() {
        for (v, value) in own {
            if value.as_array().is_some_and(|runs| !runs.is_empty()) {
                map.insert(v.as_str().to_owned(), value);
            }
        }
    }
    std::fs::write(
        &opts.out,
        serde_json::to_string_pretty(&json!({
            "options": opts,
            "settings": opts.settings(),
            "runs": runs,
        }))?,
    )?;
    Ok(table)
}

/// The defaults of [`BenchOptions::from_env`], for tests that need options
/// without touching the process's environment.
#[cfg(test)]
pub(crate) fn test_options() -> BenchOptions {
    BenchOptions {
        viral_rate: 75.0,
        stream_rate: 750.0,
        stream_scale_rate: 2000.0,
        background_rate: 20.0,
        read_rate: 20.0,
        seconds: 20.0,
        write_cap: 30.0,
        fixed_shards: 10,
        runs: 3,
        views_workers: 16,
        views_viewers: 200_000,
        platform_rate: platform::RATE,
        platform_seconds: platform::SECONDS,
        platform_roll_records: platform::ROLL_RECORDS,
        trending_rate: trending::RATE,
        trending_seconds: trending::SECONDS,
        variants: Variant::ALL.to_vec(),
        region: "us-east-1".into(),
        wru_price: 0.625,
        rru_price: 0.125,
        out: "target/bench/viral.json".into(),
        svg: "target/bench/onset.svg".into(),
        template: "template.yaml".into(),
    }
}

/// A run of `variant` with plain figures, exact, no `stream-scale`
/// figures: for tests of what is made of results.
#[cfg(test)]
pub(crate) fn test_result(variant: Variant) -> RunResult {
    let scale = scale::ScaleFigures::NONE;
    RunResult {
        variant,
        offered_likes_per_sec: 750.0,
        accepted_likes_per_sec: 750.0,
        refused_pct: 0.0,
        refused_pct_second_half: 0.0,
        latency_p50_ms: 5.0,
        latency_p99_ms: 20.0,
        busiest_key_wcu_per_sec: 10.0,
        busiest_key: String::new(),
        cap: 30.0,
        shards: 1,
        ceiling_likes_per_sec: f64::NAN,
        offered_to_ceiling: f64::NAN,
        wcu_per_viral_like: 2.0,
        wcu_per_background_like: 4.0,
        wcu_unattributed: 0.0,
        rcu_per_read: 5.0,
        shard_reads_per_sec: 10.0,
        shard_reads_per_sec_uncached_equiv: 100.0,
        final_count: 10,
        acknowledged: 10,
        exact: true,
        dollars_per_million_likes: 1.25,
        dollars_per_million_background_likes: 2.5,
        dollars_per_million_reads: 0.6,
        wcu_checkpoints: 0.0,
        freshness_p50_ms: 1000.0,
        freshness_p99_ms: 2000.0,
        aggregator_conflicted_pct: scale.conflicted_pct,
        viral_conflicted_pct: scale.viral_conflicted_pct,
        batches_retried: scale.retried,
        batches_partial: scale.partial,
        records_discarded: scale.discarded,
        resize_refused: scale.resize_refused,
        resize_done_s: scale.resize_done_s,
        timeline: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
