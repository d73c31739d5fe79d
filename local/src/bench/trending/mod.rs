//! The `trending` variant (issue 37): the lists against a known truth.
//! The platform's traffic (`platform/traffic.rs`: likes and views of a
//! Zipf-drawn universe of 100,000 reels, a viral reel on top) through
//! stream mode with `TRENDING_STREAM_SHARDS` stream shards and
//! `TRENDING_KINESIS_SHARDS` Kinesis shards (`variant.rs`), the cache
//! warmer running beside it
//! as its schedule would, and a probe reel liked in a burst every
//! [`PROBE_EVERY`]. The window is the hour: a run fits in it whole.
//!
//! What it measures, step by step:
//!
//! * **freshness**: from a probe's last like taken to the probe in the
//!   likes list that `GET /trending` serves (the warmer's, or the
//!   instance's), polled every [`PROBE_POLL`];
//! * **precision and recall of the top 100**, likes and views, once the
//!   streams are drained and every writer has put its sketch again (a
//!   tail of likes past the sketches' flush time): a
//!   fresh instance ranks each list, compared with the top 100 of what
//!   was taken (the truth, ties by id as the API breaks them), over the
//!   reels above the merged sketch's stated error and over all;
//! * **the extra write units** of trending and windowing: the sketches'
//!   puts (every `top#` write the proxy counted, exactly), and the window
//!   buckets' share of the items that carry them (writer items, view
//!   items: each partition's item writes, as the proxy counted them, times
//!   the write units its items' buckets add by DynamoDB's size rule,
//!   from their final sizes), per like and per view taken;
//! * **read units per trending-reel read** (its likes and its views, on a
//!   fresh instance) without the warmer's figures and with them, and per
//!   list (ranked on an instance, or the warmer's read).

mod probe;
pub(super) mod report;
#[cfg(test)]
mod tests;
mod units;

use super::BenchOptions;
use super::platform::traffic::{self, Client};
use super::platform::zipf::Zipf;
use super::variant::Variant;
use crate::stack::{Stack, StackOptions};
use anyhow::{Context, Result, anyhow};
use likes::keys::ReelId;
use likes::keys::window::Window;
use likes::trending::Metric;
use probe::{drain, probe_all, tail};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use units::extra_units;

/// `BENCH_TRENDING_RATE`'s default: likes a second (view requests at half
/// of it, of a few reels each), as the platform variant offers.
pub(super) const RATE: f64 = 200.0;
/// `BENCH_TRENDING_SECONDS`' default.
pub(super) const SECONDS: f64 = 30.0;
/// The lists' length compared.
pub(super) const TOP: usize = 100;
/// A probe: this many likes of a reel of its own, in a burst.
pub(super) const PROBE_LIKES: usize = 150;
/// ... one every this long while the load runs.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How often a probe polls the list, and how long it waits at most.
pub(super) const PROBE_POLL: Duration = Duration::from_millis(250);
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(90);
/// After the load: likes and views of a reel of their own (`tail`) over
/// [`TAIL_SECONDS`], while the last probes wait, so that every stream
/// shard and Kinesis shard applies a chunk after its writer's last sketch
/// put is due
/// (`trending::live::FLUSH_MS`), as a flowing stream would: the sketches
/// stored hold the whole load.
pub(super) const TAIL_LIKES: usize = 64;
pub(super) const TAIL_SECONDS: f64 = 15.0;
/// The longest one request of the variant may take.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest the tail may take: past it, a stack that refuses its likes
/// or views fails the run now, not after every retry of every one.
pub(super) const TAIL_DEADLINE: Duration = Duration::from_secs(120);
/// The reels whose reads are measured with and without the warmer: the
/// likes list's first.
pub(super) const READ_REELS: usize = 20;

/// How one list compares with the truth.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Accuracy {
    /// Reels listed.
    pub listed: usize,
    /// The merged sketch's stated error.
    pub max_error: u64,
    /// Reels of the true top [`TOP`] above that error.
    pub eligible: usize,
    /// Of the listed reels above the error, the share in the true top.
    pub precision: f64,
    /// Of the true top's reels above the error, the share listed.
    pub recall: f64,
    /// The same over every reel, whatever its count.
    pub precision_all: f64,
    pub recall_all: f64,
    /// Whether every listed count is the reel's true count.
    pub counts_exact: bool,
}

/// One run of the variant.
#[derive(Clone, Debug, Serialize)]
pub struct TrendingResult {
    pub variant: Variant,
    pub run: u32,
    /// The counting mode (`COUNTING`) it ran in.
    pub counting: &'static str,
    /// Likes and views taken (the truth's totals).
    pub likes: u64,
    pub views: u64,
    /// Reels liked or viewed.
    pub reels: usize,
    pub accuracy_likes: Accuracy,
    pub accuracy_views: Accuracy,
    /// Probes sent, and seen in the list.
    pub probes: usize,
    pub probes_seen: usize,
    pub freshness_p50_ms: f64,
    pub freshness_p99_ms: f64,
    /// Write units per like taken: the sketches' puts, the window buckets.
    pub sketch_wu_per_like: f64,
    pub window_wu_per_like: f64,
    /// ... per view taken.
    pub sketch_wu_per_view: f64,
    pub window_wu_per_view: f64,
    /// Read units per trending-reel read (likes and views), without and
    /// with the warmer's figures; reads served warm of the latter.
    pub ru_per_read_summed: f64,
    pub ru_per_read_warm: f64,
    pub warm_hits: u64,
    pub reads: usize,
    /// Read units of one list: ranked on an instance, or the warmer's.
    pub ru_list_ranked: f64,
    pub ru_list_warm: f64,
}

/// One run in each counting mode: their likes' sketches come from
/// different writers (stream shards' aggregators, like function
/// instances).
pub(super) async fn run_both_modes(opts: &BenchOptions, run: u32) -> Result<Vec<TrendingResult>> {
    let mut out = Vec::new();
    for counting in [likes::Counting::Stream, likes::Counting::Transactional] {
        let r = run_trending(opts, run, counting).await?;
        crate::errln!("  {}", summary_line(&r));
        out.push(r);
    }
    Ok(out)
}

async fn run_trending(
    opts: &BenchOptions,
    run: u32,
    counting: likes::Counting,
) -> Result<TrendingResult> {
    let mut so = StackOptions::isolated(opts.template.clone());
    so.views = true;
    so.env.extend(Variant::Trending.stack_env(opts));
    so.env.insert("COUNTING".into(), counting.as_str().into());
    let stack = Stack::start(so).await.context("starting the stack")?;
    let result = measure(opts, run, &stack).await;
    stack.shutdown().await;
    result
}

/// Another function instance over the stack's tables and its proxy,
/// caches empty.
fn instance(stack: &Stack) -> likes::App {
    let config = stack.config.clone();
    let client = stack.app.service.store().client().clone();
    likes::App::new(
        config.clone(),
        likes::store::dynamodb::DynamoStore::new(client, &config),
    )
    .with_views_of(&stack.app)
}

async fn measure(opts: &BenchOptions, run: u32, stack: &Stack) -> Result<TrendingResult> {
    let proxy = stack
        .proxy
        .clone()
        .ok_or_else(|| anyhow!("trending: the stack has no proxy"))?;
    let client = Arc::new(Client {
        // A request that never answers (an emulator stuck) fails the run
        // within minutes instead of holding it for ever.
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .timeout(REQUEST_TIMEOUT)
            .build()?,
        base: stack.base_url.clone(),
    });
    let prefix = format!("t{run}-");
    proxy.reset_stats();
    let t0 = Instant::now();
    // The warmer, as its schedule runs it, for as long as the load and the
    // probes go on.
    let app = stack.app.clone();
    let warmer = tokio::spawn(async move {
        loop {
            let deadline = Instant::now() + Duration::from_secs(62);
            if let Err(e) = likes::warmer::keep_warm(&app, Some(deadline), None).await {
                crate::errln!("trending: a warm run failed: {}", e.code());
            }
        }
    });
    let probes = tokio::spawn(probe_all(
        client.clone(),
        prefix.clone(),
        opts.trending_seconds,
    ));
    let zipf = Arc::new(Zipf::platform());
    let mut sent = traffic::drive(
        client.clone(),
        zipf,
        opts.trending_rate,
        opts.trending_seconds,
        &prefix,
        0x7e4d ^ u64::from(run),
        t0,
    )
    .await;
    let unsettled = traffic::settle(&client, &mut sent).await;
    // The freshness reel's refused likes too: taken, or the truth is not
    // known.
    for f in sent.fresh.iter_mut().filter(|f| !f.ok) {
        for _ in 0..50 {
            if client.like(super::platform::FRESH, &f.user).await {
                f.ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if unsettled > 0 || sent.fresh.iter().any(|f| !f.ok) {
        return Err(anyhow!("trending: requests never taken"));
    }
    // The tail keeps the stream flowing while the last probes wait, as a
    // platform's would: a writer puts its sketch with a chunk.
    let (tail, probes) = tokio::join!(tail(&client, &prefix), probes);
    let (tail, probes) = (tail?, probes?);
    warmer.abort();
    drain(stack).await?;
    let loads = proxy.key_loads();
    // Without the warmer from here: its figures too old to serve, its set
    // gone, so that what follows reads the items themselves.
    tokio::time::sleep(stack.config.cache_ttl + Duration::from_millis(500)).await;
    stack
        .client
        .delete_item()
        .table_name(&stack.config.counters_table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(likes::keys::top::WARM_SET_KEY.to_owned()),
        )
        .send()
        .await
        .context("deleting the warm set")?;

    // The truth.
    let mut likes: HashMap<String, i64> = HashMap::new();
    for l in sent.likes.iter().filter(|l| l.ok) {
        *likes.entry(l.reel.clone()).or_default() += 1;
    }
    *likes.entry(super::platform::FRESH.to_owned()).or_default() += sent.fresh.len() as i64;
    for (reel, n) in probes
        .iter()
        .map(|p| (&p.reel, p.taken))
        .chain([(&tail.0, tail.1)])
    {
        *likes.entry(reel.clone()).or_default() += n as i64;
    }
    let mut views: HashMap<String, i64> = sent
        .views_by_reel()
        .into_iter()
        .map(|(r, n)| (r, n as i64))
        .collect();
    *views.entry(tail.0.clone()).or_default() += tail.1 as i64;
    let (likes_taken, views_taken) = (
        likes.values().sum::<i64>() as u64,
        views.values().sum::<i64>() as u64,
    );
    let reels = likes
        .keys()
        .chain(views.keys())
        .collect::<HashSet<_>>()
        .len();

    // The lists, ranked by a fresh instance now.
    let fresh = instance(stack);
    let ranked_likes = likes::warmer::rank::rank(&fresh, Metric::Likes, Window::Hour).await?;
    let ranked_views = likes::warmer::rank::rank(&fresh, Metric::Views, Window::Hour).await?;
    let accuracy_likes = accuracy(&ranked_likes, &likes);
    let accuracy_views = accuracy(&ranked_views, &views);
    for (what, ranked, truth) in [
        ("likes", &ranked_likes, &likes),
        ("views", &ranked_views, &views),
    ] {
        for e in ranked
            .reels
            .iter()
            .filter(|e| truth.get(e.reel.as_str()).copied().unwrap_or(0) != e.count)
            .take(5)
        {
            crate::errln!(
                "  trending: {what} of {} listed {}, taken {}",
                e.reel.as_str(),
                e.count,
                truth.get(e.reel.as_str()).copied().unwrap_or(0)
            );
        }
    }
    for p in probes.iter().filter(|p| p.freshness_ms.is_none()) {
        crate::errln!(
            "  trending: probe {} ({} likes taken) never listed",
            p.reel,
            p.taken
        );
    }

    // What trending and windowing add to the writes.
    let views_table = stack
        .config
        .writers_table
        .clone()
        .context("the template names WRITERS_TABLE")?;
    let counters_table = stack.config.counters_table.clone();
    let extra = extra_units(
        &views_table,
        &loads,
        &super::store::scan_all(stack, &views_table).await?,
    ) + extra_units(
        &counters_table,
        &loads,
        &super::store::scan_all(stack, &counters_table).await?,
    );

    // Reads of the trending reels, without and with the warmer's figures.
    let top: Vec<ReelId> = ranked_likes
        .reels
        .iter()
        .take(READ_REELS)
        .map(|e| e.reel.clone())
        .collect();
    let ru = || proxy.stats().total_read_units();
    let summed = instance(stack);
    let before = ru();
    read_each(&summed, &top).await?;
    let ru_per_read_summed = (ru() - before) / top.len().max(1) as f64;
    likes::triggers::handle_warm_event(&stack.app, &serde_json::json!({"rounds": 1}), None)
        .await
        .map_err(|e| anyhow!("trending: the warm round failed: {}", e.code()))?;
    let warm = instance(stack);
    let before = ru();
    read_each(&warm, &top).await?;
    let ru_per_read_warm = (ru() - before) / top.len().max(1) as f64;
    let warm_hits =
        warm.service.warm_hits() + warm.views.reader.as_ref().map_or(0, |r| r.warm_hits());
    // A list: ranked on an instance, or the warmer's read.
    let ranker = instance(stack);
    let before = ru();
    likes::warmer::rank::rank(&ranker, Metric::Likes, Window::Hour).await?;
    let ru_list_ranked = ru() - before;
    let before = ru();
    {
        use likes::store::WarmStore;
        ranker
            .service
            .store()
            .trending_list(Metric::Likes.name(), Window::Hour.name())
            .await?
            .context("the warmer's list")?;
    }
    let ru_list_warm = ru() - before;

    let mut seen: Vec<f64> = probes.iter().filter_map(|p| p.freshness_ms).collect();
    seen.sort_by(f64::total_cmp);
    let per = |n: f64, d: u64| if d == 0 { 0.0 } else { n / d as f64 };
    Ok(TrendingResult {
        variant: Variant::Trending,
        run,
        counting: stack.config.counting.as_str(),
        likes: likes_taken,
        views: views_taken,
        reels,
        accuracy_likes,
        accuracy_views,
        probes: probes.len(),
        probes_seen: seen.len(),
        freshness_p50_ms: super::rank::percentile(&seen, 0.5),
        freshness_p99_ms: super::rank::percentile(&seen, 0.99),
        sketch_wu_per_like: per(extra.sketch_likes, likes_taken),
        window_wu_per_like: per(extra.window_likes, likes_taken),
        sketch_wu_per_view: per(extra.sketch_views, views_taken),
        window_wu_per_view: per(extra.window_views, views_taken),
        ru_per_read_summed,
        ru_per_read_warm,
        warm_hits,
        reads: top.len(),
        ru_list_ranked,
        ru_list_warm,
    })
}

/// Each reel's likes then its views, on `app`, one at a time.
async fn read_each(app: &likes::App, reels: &[ReelId]) -> Result<()> {
    let reader = app.views.reader.as_ref().context("views")?;
    for r in reels {
        app.service.count(r).await?;
        reader.counts(r).await?;
    }
    Ok(())
}

/// `ranked` against `truth` (every reel's count).
pub(super) fn accuracy(ranked: &likes::trending::Ranked, truth: &HashMap<String, i64>) -> Accuracy {
    let mut exact: Vec<(&String, i64)> = truth
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| (r, *n))
        .collect();
    exact.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    exact.truncate(TOP);
    let err = ranked.max_error as i64;
    let listed: Vec<(&str, i64)> = ranked
        .reels
        .iter()
        .take(TOP)
        .map(|e| (e.reel.as_str(), e.count))
        .collect();
    let top_all: HashSet<&str> = exact.iter().map(|(r, _)| r.as_str()).collect();
    let top_above: HashSet<&str> = exact
        .iter()
        .filter(|(_, n)| *n > err)
        .map(|(r, _)| r.as_str())
        .collect();
    let listed_all: HashSet<&str> = listed.iter().map(|(r, _)| *r).collect();
    let listed_above: HashSet<&str> = listed
        .iter()
        .filter(|(_, n)| *n > err)
        .map(|(r, _)| *r)
        .collect();
    let share = |num: usize, den: usize| {
        if den == 0 {
            1.0
        } else {
            num as f64 / den as f64
        }
    };
    Accuracy {
        listed: listed.len(),
        max_error: ranked.max_error,
        eligible: top_above.len(),
        precision: share(
            listed_above.intersection(&top_above).count(),
            listed_above.len(),
        ),
        recall: share(
            listed_above.intersection(&top_above).count(),
            top_above.len(),
        ),
        precision_all: share(listed_all.intersection(&top_all).count(), listed_all.len()),
        recall_all: share(listed_all.intersection(&top_all).count(), top_all.len()),
        counts_exact: listed
            .iter()
            .all(|(r, n)| truth.get(*r).copied().unwrap_or(0) == *n),
    }
}

/// One line for the log.
pub(super) fn summary_line(r: &TrendingResult) -> String {
    format!(
        "{}: {} likes, {} views over {} reels; likes top {}: precision {:.3} recall {:.3} (error {}), views: {:.3} {:.3} (error {}); freshness p50 {:.0} ms p99 {:.0} ms ({}/{} probes); extra WU/like {:.4}, /view {:.4}; RU per trending read {:.2} summed, {:.2} warm ({} warm hits)",
        r.counting,
        r.likes,
        r.views,
        r.reels,
        TOP,
        r.accuracy_likes.precision,
        r.accuracy_likes.recall,
        r.accuracy_likes.max_error,
        r.accuracy_views.precision,
        r.accuracy_views.recall,
        r.accuracy_views.max_error,
        r.freshness_p50_ms,
        r.freshness_p99_ms,
        r.probes_seen,
        r.probes,
        r.sketch_wu_per_like + r.window_wu_per_like,
        r.sketch_wu_per_view + r.window_wu_per_view,
        r.ru_per_read_summed,
        r.ru_per_read_warm,
        r.warm_hits,
    )
}
