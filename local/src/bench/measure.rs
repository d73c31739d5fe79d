//! One variant in one run, as a sequence of named steps: start its stack,
//! pre-size the viral reel, drive the load, read what it cost, retry the
//! refused likes, drain, check exactness, and sum it all up (with
//! the stream-at-scale variants' resize halfway and their figures). The order is
//! part of what is measured (units and shard count before the retries,
//! the stored count after the drain), so [`run_variant`] spells it out.

use super::load::{self, Load, Sample, Target};
use super::rank::percentile;
use super::scale::{ScaleFigures, resize_midway, wait_resized};
use super::store::{presize_viral, stored_count, stream_writers};
use super::units::{Units, attribute};
use super::variant::Variant;
use super::watch::{Seen, Watcher, freshness, timeline};
use super::{BACKGROUND_REELS, BenchOptions, RunResult, VIRAL};
use crate::stack::{Stack, StackOptions};
use anyhow::{Context, Result, anyhow};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Runs `variant` once (`run` numbers its users) and measures it.
pub(super) async fn run_variant(
    opts: &BenchOptions,
    variant: Variant,
    run: u32,
) -> Result<RunResult> {
    let stack = start_stack(opts, variant).await?;
    let proxy = stack.proxy.clone().context("the stack has a proxy")?;
    if let Some(shards) = variant.presized_shards(opts) {
        presize_viral(&stack, shards).await?;
    }
    let target = Arc::new(connect(opts, variant, &stack, &proxy.url).await?);
    // Everything counted from here on is the load's.
    proxy.reset_stats();
    let reads_before = shard_reads_so_far(&stack);
    let t0 = Instant::now();
    let prefix = format!("r{run}");
    let watcher = Watcher::start(
        stack.client.clone(),
        target.counters.clone(),
        stream_writers(&stack),
        t0,
        variant.watched_shards(),
    );
    let resize = variant.is_scale().then(|| {
        resize_midway(
            stack.app.clone(),
            Duration::from_secs_f64(opts.seconds / 2.0),
            Duration::from_secs(60),
        )
    });
    let load = load::drive(opts, &target, &prefix, t0).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let (stats, units) = load_cost(&proxy, &stack, &prefix);
    let shards = shards_at_end(&stack, variant).await?;
    let unsettled = load::retry_refused(&target, &load.viral).await;
    let shard_reads = shard_reads_so_far(&stack) - reads_before;
    let mut resize_refused = 0;
    if let Some(resize) = resize {
        let (refused, begun) = resize.await.context("the resize")??;
        resize_refused = refused;
        // Two resize waits (about 5 s each here) and the schedule's runs
        // are all a grow takes; a minute is a stuck resize.
        if begun {
            wait_resized(&stack.app, Duration::from_secs(60)).await?;
        }
    }
    if variant.is_stream() {
        drain_stream(&stack).await?;
    }
    let seen = watcher.stop().await?;
    let scale = if variant.is_scale() {
        let source = stack.streams.first().context("stream mode has a source")?;
        ScaleFigures::of(&proxy.stats(), &source.stats, resize_refused, &seen.shards)
    } else {
        ScaleFigures::NONE
    };
    // Exactness: every offered like was acknowledged in the end; the store
    // must hold exactly one per user.
    let acknowledged = (load.viral.len() - unsettled) as i64;
    let final_count = stored_count(&stack, variant).await?;
    let result = summarise(
        opts,
        variant,
        Measured {
            load,
            elapsed,
            stats,
            units,
            shards,
            shard_reads,
            seen,
            acknowledged,
            final_count,
            scale,
        },
    );
    stack.shutdown().await;
    Ok(result)
}

/// The stack with the variant's environment ([`Variant::stack_env`]),
/// isolated from every other run's.
async fn start_stack(opts: &BenchOptions, variant: Variant) -> Result<Stack> {
    let mut so = StackOptions::isolated(opts.template.clone());
    for (k, v) in variant.stack_env(opts) {
        so.env.insert(k, v);
    }
    Stack::start(so).await.context("starting the stack")
}

/// The load's clients: HTTP to the gateway and, for the naive counter, an
/// SDK client writing through the same proxy with the product's own SDK
/// settings (retries and timeouts).
async fn connect(
    opts: &BenchOptions,
    variant: Variant,
    stack: &Stack,
    proxy_url: &str,
) -> Result<Target> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let naive = crate::stack::client_for(
        &stack.config,
        proxy_url,
        &StackOptions::isolated(opts.template.clone()),
    )
    .await;
    Ok(Target {
        http,
        base: stack.base_url.clone(),
        naive,
        counters: stack.config.counters_table.clone(),
        variant,
    })
}

/// Shard items the product's batch reads have fetched so far.
fn shard_reads_so_far(stack: &Stack) -> u64 {
    stack
        .app
        .reshard
        .store()
        .stats()
        .shard_reads_batch
        .load(Ordering::Relaxed)
}

/// What the load cost, as the proxy counted it: its stats, and the write
/// units by whose likes they served (users of this run are `{prefix}…`).
/// Taken as soon as the load ends, before the retries add their own.
fn load_cost(proxy: &faultproxy::Proxy, stack: &Stack, prefix: &str) -> (faultproxy::Stats, Units) {
    let stats = proxy.stats();
    let units = attribute(
        &proxy.key_loads(),
        &stack.config.counters_table,
        &stack.config.likes_table,
        stream_writers(stack).as_deref(),
        prefix,
    );
    (stats, units)
}

/// The viral reel's size when the load ends: the retries after it come in
/// a burst far above the offered rate and may grow it further, which is no
/// part of what is measured. The naive counter is one item.
async fn shards_at_end(stack: &Stack, variant: Variant) -> Result<u32> {
    if variant.is_naive() {
        return Ok(1);
    }
    let viral_id = likes::keys::ReelId::parse(VIRAL).map_err(|e| anyhow!(e.0))?;
    Ok(stack
        .app
        .service
        .settings(&viral_id)
        .await
        .map_err(|e| anyhow!("{e}"))?
        .write_shards)
}

/// Stream mode: the counts are exact once the stream is drained, which
/// must happen within 5 minutes.
async fn drain_stream(stack: &Stack) -> Result<()> {
    let drain_start = Instant::now();
    while !stack.streams_caught_up().await? {
        if drain_start.elapsed() > Duration::from_secs(300) {
            return Err(anyhow!("the stream was not drained within 5 minutes"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// What one run measured, before it is summed up.
struct Measured {
    load: Load,
    /// Seconds from the start of the load to its last answer.
    elapsed: f64,
    /// The proxy's counts over the load.
    stats: faultproxy::Stats,
    units: Units,
    shards: u32,
    /// Shard items read by the product during the load and the retries.
    shard_reads: u64,
    seen: Seen,
    acknowledged: i64,
    final_count: i64,
    scale: ScaleFigures,
}

/// Share of refused samples, %; 0 if there are none.
fn refused_pct(v: &[&Sample]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        100.0 * v.iter().filter(|s| !s.ok).count() as f64 / v.len() as f64
    }
}

/// The run's figures, from what it measured.
fn summarise(opts: &BenchOptions, variant: Variant, m: Measured) -> RunResult {
    let viral = &m.load.viral;
    let rate = variant.offered_rate(opts);
    let accepted = viral.iter().filter(|s| s.ok).count();
    let mut lat: Vec<f64> = viral
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.latency.as_secs_f64() * 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    let half = Duration::from_secs_f64(opts.seconds / 2.0);
    let second_half: Vec<&Sample> = viral.iter().filter(|s| s.at >= half).collect();
    let all: Vec<&Sample> = viral.iter().collect();
    let background_accepted = m.load.background.iter().filter(|ok| **ok).count();
    let reads_ok = m.load.reads.iter().filter(|ok| **ok).count().max(1);
    // The checkpoints serve every like of a batch: shared out by likes.
    let all_accepted = (accepted + background_accepted).max(1) as f64;
    let checkpoint_share = m.units.checkpoints / all_accepted;
    let wcu_per_viral_like = m.units.viral / accepted.max(1) as f64 + checkpoint_share;
    // None offered (`stream-scale`): no such figure, not the checkpoints'
    // share alone.
    let wcu_per_background_like = if m.load.background.is_empty() {
        f64::NAN
    } else {
        m.units.background / background_accepted.max(1) as f64 + checkpoint_share
    };
    let (freshness_p50_ms, freshness_p99_ms) = freshness(viral, &m.seen.sums);
    let timeline = timeline(viral, &m.seen.shards, opts.seconds);
    let rcu_per_read = m.stats.total_read_units() / reads_ok as f64;
    // Stream mode has no per-reel ceiling: no like writes a counter item.
    let ceiling = if variant.is_stream() {
        f64::NAN
    } else {
        m.shards as f64 * opts.write_cap / variant.units_per_like_on_hot_key()
    };
    let busiest = m.stats.hot_keys.iter().max_by(|a, b| {
        a.max_write_units_per_sec
            .total_cmp(&b.max_write_units_per_sec)
    });
    // Every feed read sums every shard of the 10 reels without a cache.
    let uncached = reads_ok as f64 * (m.shards as f64 + BACKGROUND_REELS as f64) / m.elapsed;
    RunResult {
        variant,
        offered_likes_per_sec: rate,
        accepted_likes_per_sec: accepted as f64 / opts.seconds,
        refused_pct: refused_pct(&all),
        refused_pct_second_half: refused_pct(&second_half),
        latency_p50_ms: percentile(&lat, 0.5),
        latency_p99_ms: percentile(&lat, 0.99),
        busiest_key_wcu_per_sec: busiest.map_or(0.0, |k| k.max_write_units_per_sec),
        busiest_key: busiest.map(|k| k.partition.clone()).unwrap_or_default(),
        cap: opts.write_cap,
        shards: m.shards,
        ceiling_likes_per_sec: ceiling,
        offered_to_ceiling: rate / ceiling,
        wcu_per_viral_like,
        wcu_per_background_like,
        wcu_unattributed: m.units.other,
        rcu_per_read,
        shard_reads_per_sec: m.shard_reads as f64 / m.elapsed,
        shard_reads_per_sec_uncached_equiv: uncached,
        final_count: m.final_count,
        acknowledged: m.acknowledged,
        exact: m.final_count == m.acknowledged,
        dollars_per_million_likes: wcu_per_viral_like * opts.wru_price,
        dollars_per_million_background_likes: wcu_per_background_like * opts.wru_price,
        dollars_per_million_reads: rcu_per_read * opts.rru_price,
        wcu_checkpoints: m.units.checkpoints,
        freshness_p50_ms,
        freshness_p99_ms,
        aggregator_conflicted_pct: m.scale.conflicted_pct,
        viral_conflicted_pct: m.scale.viral_conflicted_pct,
        batches_retried: m.scale.retried,
        batches_partial: m.scale.partial,
        records_discarded: m.scale.discarded,
        resize_refused: m.scale.resize_refused,
        resize_done_s: m.scale.resize_done_s,
        timeline,
    }
}
