//! The `platform` variant: a platform's year, compressed. Likes and views
//! of a Zipf-drawn universe of reels (`zipf.rs`: s = 1.1 over 100,000
//! reels, a viral reel on top taking a fixed share), through stream mode
//! with [`PLATFORM_STREAM_SHARDS`] virtual stream shards, each aggregated
//! by an instance of its own and rolling over into a child every
//! `BENCH_PLATFORM_ROLL_RECORDS` records, the proxy's conflict model on,
//! and the views through [`PLATFORM_KINESIS_SHARDS`] Kinesis shards split
//! and merged while the load runs (`age.rs` says how that compresses a
//! year). Its stack's environment is `variant::platform_env`.
//!
//! A run, step by step: start the stack (the viral reel at its default
//! shard count: stream mode counts in writer items); seed the probe reels
//! from [`SEED_USERS`] users each and drain; read each probe reel (cold, warm, viral;
//! likes and views apart) uncached, alone, counted by the proxy (the
//! start); reset the proxy and drive the traffic (`traffic.rs`) with the
//! splits and merges on their clock; send the refused requests again;
//! drain; read what the proxy counted; read the probes again (the end);
//! compare every reel's served likes and views with the truth
//! (`probe.rs`). `report.rs` makes its section of BENCHMARKS.md.

mod age;
mod probe;
pub(super) mod report;
#[cfg(test)]
mod tests;
pub(super) mod traffic;
pub(super) mod zipf;

use super::BenchOptions;
use super::variant::{PLATFORM_KINESIS_SHARDS, PLATFORM_STREAM_SHARDS, Variant};
use super::watch::freshness;
use crate::stack::{Stack, StackOptions};
use age::Age;
use anyhow::{Context, Result, anyhow};
use probe::{Exactness, ReadCost};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use traffic::{Client, Sent};
use zipf::{Reel, Zipf};

/// `BENCH_PLATFORM_RATE`'s default: likes a second (view requests are
/// half as many, of about 10 views each). What a 2-core machine runs
/// alongside 128 stream shards' aggregation and kinesis-mock.
pub(super) const RATE: f64 = 200.0;
/// `BENCH_PLATFORM_SECONDS`' default.
pub(super) const SECONDS: f64 = 15.0;
/// `BENCH_PLATFORM_ROLL_RECORDS`' default: with the defaults above, about
/// 12 generations of each of the 128 lineages in a run (3 runs of about
/// 100 s each on a 2-core machine; 20 s of load made it 7 minutes).
pub(super) const ROLL_RECORDS: u64 = 2;
/// `BENCH_PLATFORM_ROLL_RECORDS`, a whole number of records (at least 1).
pub(super) fn roll_records_env() -> Result<u64> {
    let n = super::positive_env("BENCH_PLATFORM_ROLL_RECORDS", ROLL_RECORDS as f64)?;
    Ok(n.round().max(1.0) as u64)
}
/// The cold reel: liked and viewed once a second, off the Zipf universe.
pub(super) const COLD: &str = "cold";
/// The warm reel: the universe's rank ([`WARM_RANK`]), as drawn.
pub(super) const WARM_RANK: u32 = 10;
/// The freshness reel: its likes are timed to their showing in a read;
/// the bench's reads of it are left out of the units per like.
pub(super) const FRESH: &str = "freshprobe";

/// The probe reels' uncached reads, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Probes {
    pub cold_likes: ReadCost,
    pub cold_views: ReadCost,
    pub warm_likes: ReadCost,
    pub warm_views: ReadCost,
    pub viral_likes: ReadCost,
    pub viral_views: ReadCost,
}

/// One run of the variant.
#[derive(Clone, Debug, Serialize)]
pub struct PlatformResult {
    pub variant: Variant,
    pub stream_shards: u32,
    pub kinesis_shards: u32,
    pub roll_records: u64,
    pub offered_likes_per_sec: f64,
    pub load_seconds: f64,
    /// Likes and views taken in the end (retries included).
    pub likes: u64,
    pub views: u64,
    /// Requests never taken after their retries.
    pub unsettled: u64,
    /// Reels touched (with a like row or a view).
    pub reels_touched: u64,
    /// The age planned from the settings, and the one the stream shows
    /// (virtual shards seen ÷ lanes).
    pub planned: Age,
    pub generations_seen: f64,
    /// Split-and-merge pairs done.
    pub reshards: u32,
    /// The aggregators' transactions (likes and views) sent, and refused
    /// by the conflict model or the capacity model.
    pub transactions: u64,
    pub transactions_refused: u64,
    pub refused_pct: f64,
    /// Batches handed back to the event sources (delivered again), and
    /// records sent to `OnFailure`.
    pub batches_handed_back: u64,
    pub records_discarded: u64,
    /// Units per like (Counters and Likes tables) and per view (Views).
    pub wu_per_like: f64,
    pub ru_per_like: f64,
    pub wu_per_view: f64,
    pub ru_per_view: f64,
    pub start: Probes,
    pub end: Probes,
    pub freshness_p50_ms: f64,
    pub freshness_p99_ms: f64,
    pub exactness: Exactness,
}

/// The run's one progress line.
pub(super) fn summary_line(r: &PlatformResult) -> String {
    format!(
        "platform: {} likes, {} views on {} reels; {:.1} generations, {} split+merge; {:.2}% of {} aggregator transactions refused, {} batches handed back; {:.3} WU/like, {:.3} WU/view; viral likes read {:.1} → {:.1} RU; freshness p50 {:.0} ms p99 {:.0} ms; exact {}",
        r.likes,
        r.views,
        r.reels_touched,
        r.generations_seen,
        r.reshards,
        r.refused_pct,
        r.transactions,
        r.batches_handed_back,
        r.wu_per_like,
        r.wu_per_view,
        r.start.viral_likes.read_units,
        r.end.viral_likes.read_units,
        r.freshness_p50_ms,
        r.freshness_p99_ms,
        r.exactness.exact()
    )
}

/// The aggregators' transactions sent and refused (every attempt): in
/// stream mode every `TransactWriteItems` is an aggregator's (likes are
/// one `PutItem`, views go to Kinesis). Refused: by the conflict model
/// (an item held, or the token in flight) or over a key's capacity.
pub(super) fn refused_transactions(stats: &faultproxy::Stats) -> (u64, u64) {
    const OP: &str = "TransactWriteItems";
    let sent = stats.requests.get(OP).copied().unwrap_or(0);
    let conflicts = stats
        .modeled_conflicts
        .refused
        .get(OP)
        .copied()
        .unwrap_or(0)
        + stats.modeled_conflicts.in_progress;
    let throttled = stats
        .injected
        .get("capacity_throttle")
        .and_then(|m| m.get(OP))
        .copied()
        .unwrap_or(0);
    (sent, conflicts + throttled)
}

/// Where the refused transactions queued, on stderr: the items the
/// conflict model refused most, the tokens in flight and the capacity
/// throttles by operation (what to spread, if the target is missed).
fn report_refusals(stats: &faultproxy::Stats) {
    let c = &stats.modeled_conflicts;
    let mut on: Vec<(&String, &u64)> = c.refused_on.iter().collect();
    on.sort_by(|a, b| b.1.cmp(a.1));
    crate::errln!(
        "  platform: refused by the model {:?}, in progress {}, throttled {:?}",
        c.refused,
        c.in_progress,
        stats.injected.get("capacity_throttle")
    );
    for (item, n) in on.iter().take(8) {
        crate::errln!("    {n} refused on {item}");
    }
}

/// Units over a run, the likes' apart from the views'.
#[derive(Debug, PartialEq)]
pub(super) struct Units {
    pub like_wu: f64,
    pub like_ru: f64,
    pub view_wu: f64,
    pub view_ru: f64,
}

impl Units {
    /// Splits `loads` (`table/…` partitions): the likes' are the
    /// `counters` tables' and the likes' writer items (partitions of
    /// `views_table` starting with `writers`, the writer partition key's
    /// prefix); the views' are the rest of `views_table`'s. Writes all in;
    /// the likes' reads without the freshness reel's partitions, which the
    /// bench's polls read.
    pub(super) fn split(
        loads: &[faultproxy::KeyLoad],
        counters: &[&str],
        views_table: &str,
        writers: &str,
    ) -> Units {
        let writers = format!("{views_table}/{writers}");
        let likes_side = |l: &faultproxy::KeyLoad| {
            l.partition.starts_with(&writers)
                || counters
                    .iter()
                    .any(|t| l.partition.starts_with(&format!("{t}/")))
        };
        let views_side = |l: &faultproxy::KeyLoad| {
            l.partition.starts_with(&format!("{views_table}/"))
                && !l.partition.starts_with(&writers)
        };
        let (like_wu, _) = units_where(loads, likes_side, NOTHING);
        let (_, like_ru) = units_where(loads, likes_side, FRESH);
        let (view_wu, view_ru) = units_where(loads, views_side, NOTHING);
        Units {
            like_wu,
            like_ru,
            view_wu,
            view_ru,
        }
    }
}

/// Units of the `loads` that `on` takes, the partitions naming `skip` left
/// out: (write, read).
fn units_where(
    loads: &[faultproxy::KeyLoad],
    on: impl Fn(&faultproxy::KeyLoad) -> bool,
    skip: &str,
) -> (f64, f64) {
    loads
        .iter()
        .filter(|l| on(l))
        .filter(|l| !l.partition.contains(skip))
        .fold((0.0, 0.0), |(w, r), l| {
            (w + l.write_units, r + l.read_units)
        })
}

pub(super) async fn run_platform(opts: &BenchOptions, run: u32) -> Result<PlatformResult> {
    let mut so = StackOptions::isolated(opts.template.clone());
    so.views = true;
    so.env.extend(Variant::Platform.stack_env(opts));
    let views_table = crate::template::Template::load(&opts.template)?
        .table_env
        .get("VIEWS_TABLE")
        .cloned()
        .context("the template wires no VIEWS_TABLE")?;
    let stack = Stack::start(so).await.context("starting the stack")?;
    let result = measure(opts, run, &stack, &views_table).await;
    stack.shutdown().await;
    result
}

/// Waits until both streams are drained (5 minutes at most).
async fn drain(stack: &Stack) -> Result<()> {
    let start = Instant::now();
    while !(stack.streams_caught_up().await? && stack.views_drained().await?) {
        if start.elapsed() > Duration::from_secs(300) {
            return Err(anyhow!(
                "platform: the streams were not drained in 5 minutes"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Every probe reel read alone, uncached, its likes then its views.
async fn probes(proxy: &faultproxy::Proxy, client: &Client) -> Result<Probes> {
    let [cold, warm, viral] = [
        COLD.to_owned(),
        Reel::Rank(WARM_RANK).id(),
        Reel::Viral.id(),
    ];
    let (cold_likes, cold_views) = probe::probe(proxy, client, &cold).await?;
    let (warm_likes, warm_views) = probe::probe(proxy, client, &warm).await?;
    let (viral_likes, viral_views) = probe::probe(proxy, client, &viral).await?;
    Ok(Probes {
        cold_likes,
        cold_views,
        warm_likes,
        warm_views,
        viral_likes,
        viral_views,
    })
}

/// Users who like and view each probe reel before the start is read: as
/// many as make every open stream shard and Kinesis shard carry it (64
/// partition keys miss one of 8 Kinesis shards with odds of 2 in 10,000),
/// so that the start is a reel every live writer carries, and the end
/// differs from it by age alone, not by spread.
pub(super) const SEED_USERS: usize = 64;

/// Viewers who view the viral reel before the start is read, besides
/// [`SEED_USERS`]: enough that each live writer's unique-viewers sketch
/// of it is at its full (dense) size, as a viral reel's are, so that the
/// start differs from the end by age, not by the sketches filling up
/// (2,088 bytes each, dense, at `lg_k` 12: shared/src/views/sketch.rs).
pub(super) const VIRAL_SEED_VIEWERS: usize = 8_192;

/// The probe reels' first likes and views (each reel's items exist on
/// every live writer when the start is read, see [`SEED_USERS`]), and
/// kinesis-mock's slow first puts out of the way; the views, as sent, for
/// the truth.
async fn seed(client: &Client, prefix: &str) -> Result<Vec<traffic::ViewRequest>> {
    let reels = [
        COLD.to_owned(),
        Reel::Rank(WARM_RANK).id(),
        Reel::Viral.id(),
        FRESH.to_owned(),
    ];
    // (reel, user, idempotency key, whether the user also likes it).
    let viral = Reel::Viral.id();
    let seeds: Vec<(String, String, String, bool)> = reels
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            (0..SEED_USERS).map(move |u| {
                (
                    r.clone(),
                    format!("{prefix}s{i}u{u}"),
                    format!("{prefix}seed{i}u{u}"),
                    true,
                )
            })
        })
        .chain((0..VIRAL_SEED_VIEWERS).map(|u| {
            (
                viral.clone(),
                format!("{prefix}sv{u}"),
                format!("{prefix}seedv{u}"),
                false,
            )
        }))
        .collect();
    let mut sent = Vec::with_capacity(seeds.len());
    for chunk in seeds.chunks(64) {
        let done = futures::future::join_all(chunk.iter().map(|(r, user, key, like)| async move {
            for _ in 0..50 {
                if (!like || client.like(r, user).await)
                    && client.views(user, key, &[(r.clone(), 1)]).await
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            false
        }))
        .await;
        for ((r, user, key, _), ok) in chunk.iter().zip(done) {
            if !ok {
                return Err(anyhow!(
                    "platform: the seed like or view of {r} by {user} was refused"
                ));
            }
            sent.push(traffic::ViewRequest {
                user: user.clone(),
                key: key.clone(),
                entries: vec![(r.clone(), 1)],
                ok,
            });
        }
    }
    Ok(sent)
}

async fn measure(
    opts: &BenchOptions,
    run: u32,
    stack: &Stack,
    views_table: &str,
) -> Result<PlatformResult> {
    let proxy = stack.proxy.clone().context("the stack has a proxy")?;
    let client = Arc::new(Client {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(512)
            .build()?,
        base: stack.base_url.clone(),
    });
    let prefix = format!("r{run}");
    let seeded = seed(&client, &prefix).await?;
    drain(stack).await?;
    let start = probes(&proxy, &client).await?;
    let planned = Age::planned(
        opts.platform_rate,
        opts.platform_seconds,
        PLATFORM_STREAM_SHARDS,
        opts.platform_roll_records,
    );
    let source = stack.streams.first().context("stream mode has a source")?;
    let views_source = stack
        .views
        .as_ref()
        .and_then(|v| v.source.as_ref())
        .context("the views source runs")?;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::SeqCst);
    let handed_back = || n(&source.stats.retries) + n(&views_source.stats.retries);
    let discarded = || n(&source.stats.discarded) + n(&views_source.stats.discarded);
    let (back_before, discarded_before) = (handed_back(), discarded());
    proxy.reset_stats();
    let t0 = Instant::now();
    // The splits and merges, on their clock, beside the traffic.
    let times = planned.reshard_times(opts.platform_seconds);
    let reshards = async {
        let mut done = 0u32;
        for at in times {
            tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
            match probe::split_and_merge(stack).await {
                Ok(()) => done += 1,
                Err(e) => crate::errln!("  platform: split and merge failed: {e:#}"),
            }
        }
        done
    };
    let traffic = traffic::drive(
        client.clone(),
        Arc::new(Zipf::platform()),
        opts.platform_rate,
        opts.platform_seconds,
        &prefix,
        u64::from(run) << 40,
        t0,
    );
    let (mut sent, reshards): (Sent, u32) = tokio::join!(traffic, reshards);
    let load_seconds = t0.elapsed().as_secs_f64();
    crate::errln!("  platform: load done in {load_seconds:.1} s; settling and draining");
    let unsettled = traffic::settle(&client, &mut sent).await as u64;
    sent.views.extend(seeded);
    drain(stack).await?;
    let stats = proxy.stats();
    let loads = proxy.key_loads();
    let end = probes(&proxy, &client).await?;
    let rows = probe::like_rows(stack).await?;
    let views_by_reel = sent.views_by_reel();
    let exactness = probe::compare(&client, &rows, &views_by_reel).await?;
    let likes = exactness.like_rows;
    let views: u64 = views_by_reel.values().sum();
    let (transactions, refused) = refused_transactions(&stats);
    report_refusals(&stats);
    let counters = [
        stack.config.counters_table.as_str(),
        stack.config.likes_table.as_str(),
    ];
    // The writer partitions' prefix, from the one key format (`l#{reel}`).
    let probe = likes::keys::ReelId::parse("r").map_err(|e| anyhow!("{e:?}"))?;
    let writer_pk = likes::keys::likes_writers_key(&probe);
    let Units {
        like_wu,
        like_ru,
        view_wu,
        view_ru,
    } = Units::split(
        &loads,
        &counters,
        views_table,
        writer_pk.trim_end_matches('r'),
    );
    let per = |u: f64, n: u64| u / n.max(1) as f64;
    let seen_shards = source.stats.shards.lock().map(|s| s.len()).unwrap_or(0);
    let (freshness_p50_ms, freshness_p99_ms) = freshness(&sent.fresh, &sent.sums);
    Ok(PlatformResult {
        variant: Variant::Platform,
        stream_shards: PLATFORM_STREAM_SHARDS,
        kinesis_shards: PLATFORM_KINESIS_SHARDS,
        roll_records: opts.platform_roll_records,
        offered_likes_per_sec: opts.platform_rate,
        load_seconds,
        likes,
        views,
        unsettled,
        reels_touched: exactness.reels,
        planned,
        generations_seen: seen_shards as f64 / f64::from(PLATFORM_STREAM_SHARDS),
        reshards,
        transactions,
        transactions_refused: refused,
        refused_pct: 100.0 * per(refused as f64, transactions),
        batches_handed_back: handed_back() - back_before,
        records_discarded: discarded() - discarded_before,
        wu_per_like: per(like_wu, likes),
        ru_per_like: per(like_ru, likes),
        wu_per_view: per(view_wu, views),
        ru_per_view: per(view_ru, views),
        start,
        end,
        freshness_p50_ms,
        freshness_p99_ms,
        exactness,
    })
}

/// A [`units_where`] `skip` no partition key contains.
const NOTHING: &str = "\u{0}";
