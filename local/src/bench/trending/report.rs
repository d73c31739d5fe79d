//! The `trending` variant's section of BENCHMARKS.md: what it ran, then
//! one row per figure with its min–max over the runs, its target and
//! whether every run met it. A verdict is computed from the runs, never
//! written down.

use super::{PROBE_EVERY, PROBE_LIKES, PROBE_POLL, READ_REELS, TOP, TrendingResult};
use crate::bench::BenchOptions;
use crate::bench::platform::report::range;
use crate::bench::platform::zipf::{REELS, S, VIRAL_SHARE};
use crate::bench::variant::{
    TRENDING_KINESIS_SHARDS as KINESIS_SHARDS, TRENDING_STREAM_SHARDS as STREAM_SHARDS,
};

/// The section's heading.
pub(in crate::bench) const TRENDING_HEADING: &str =
    "## Trending: the top 100, how fresh, what it costs";

/// Precision and recall of the top 100, above the sketch's error, at least.
pub(super) const ACCURACY_TARGET: f64 = 0.99;
/// Write units trending and windowing add per like and per view, at most.
pub(super) const EXTRA_WU_TARGET: f64 = 0.1;

/// One row: figure, value, target, verdict (`None`: a figure to read).
pub(super) fn rows(rs: &[TrendingResult]) -> Vec<(String, String, String, Option<bool>)> {
    let all = |ok: &dyn Fn(&TrendingResult) -> bool| Some(!rs.is_empty() && rs.iter().all(ok));
    let at_least = format!("≥ {ACCURACY_TARGET}");
    let at_most = format!("≤ {EXTRA_WU_TARGET}");
    vec![
        (
            "likes, top 100: precision / recall (reels above the error)".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.accuracy_likes.precision, 3),
                range(rs, |r| r.accuracy_likes.recall, 3)
            ),
            at_least.clone(),
            all(&|r| {
                r.accuracy_likes.precision >= ACCURACY_TARGET
                    && r.accuracy_likes.recall >= ACCURACY_TARGET
            }),
        ),
        (
            "... reels above the error (stated error)".into(),
            format!(
                "{} ({})",
                range(rs, |r| r.accuracy_likes.eligible as f64, 0),
                range(rs, |r| r.accuracy_likes.max_error as f64, 0)
            ),
            "—".into(),
            None,
        ),
        (
            "... precision / recall over all 100".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.accuracy_likes.precision_all, 3),
                range(rs, |r| r.accuracy_likes.recall_all, 3)
            ),
            "—".into(),
            None,
        ),
        (
            "views, top 100: precision / recall (reels above the error)".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.accuracy_views.precision, 3),
                range(rs, |r| r.accuracy_views.recall, 3)
            ),
            at_least,
            all(&|r| {
                r.accuracy_views.precision >= ACCURACY_TARGET
                    && r.accuracy_views.recall >= ACCURACY_TARGET
            }),
        ),
        (
            "... reels above the error (stated error)".into(),
            format!(
                "{} ({})",
                range(rs, |r| r.accuracy_views.eligible as f64, 0),
                range(rs, |r| r.accuracy_views.max_error as f64, 0)
            ),
            "—".into(),
            None,
        ),
        (
            "... precision / recall over all 100".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.accuracy_views.precision_all, 3),
                range(rs, |r| r.accuracy_views.recall_all, 3)
            ),
            "—".into(),
            None,
        ),
        (
            "every listed count is the reel's true count".into(),
            if rs
                .iter()
                .all(|r| r.accuracy_likes.counts_exact && r.accuracy_views.counts_exact)
            {
                "yes".into()
            } else {
                "no".into()
            },
            "yes".into(),
            all(&|r| r.accuracy_likes.counts_exact && r.accuracy_views.counts_exact),
        ),
        (
            "freshness: a probe's last like to its place in the list, p50 / p99 (ms)".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.freshness_p50_ms, 0),
                range(rs, |r| r.freshness_p99_ms, 0)
            ),
            "—".into(),
            None,
        ),
        (
            "... probes seen in the list / sent".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.probes_seen as f64, 0),
                range(rs, |r| r.probes as f64, 0)
            ),
            "all".into(),
            all(&|r| r.probes_seen == r.probes),
        ),
        (
            "extra write units per like: sketches + window buckets".into(),
            format!(
                "{} ({} + {})",
                range(rs, |r| r.sketch_wu_per_like + r.window_wu_per_like, 4),
                range(rs, |r| r.sketch_wu_per_like, 4),
                range(rs, |r| r.window_wu_per_like, 4)
            ),
            at_most.clone(),
            all(&|r| r.sketch_wu_per_like + r.window_wu_per_like <= EXTRA_WU_TARGET),
        ),
        (
            "extra write units per view: sketches + window buckets".into(),
            format!(
                "{} ({} + {})",
                range(rs, |r| r.sketch_wu_per_view + r.window_wu_per_view, 4),
                range(rs, |r| r.sketch_wu_per_view, 4),
                range(rs, |r| r.window_wu_per_view, 4)
            ),
            at_most,
            all(&|r| r.sketch_wu_per_view + r.window_wu_per_view <= EXTRA_WU_TARGET),
        ),
        (
            "read units per trending-reel read (likes + views), summed".into(),
            range(rs, |r| r.ru_per_read_summed, 2),
            "—".into(),
            None,
        ),
        (
            "... served from the warmer's figures".into(),
            range(rs, |r| r.ru_per_read_warm, 2),
            "below summed".into(),
            all(&|r| r.ru_per_read_warm < r.ru_per_read_summed),
        ),
        (
            "... reads served warm / made".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.warm_hits as f64, 0),
                range(rs, |r| 2.0 * r.reads as f64, 0)
            ),
            "all".into(),
            all(&|r| r.warm_hits == 2 * r.reads as u64),
        ),
        (
            "read units of a list: ranked on an instance / the warmer's".into(),
            format!(
                "{} / {}",
                range(rs, |r| r.ru_list_ranked, 1),
                range(rs, |r| r.ru_list_warm, 1)
            ),
            "—".into(),
            None,
        ),
    ]
}

/// The section: what ran, then the rows, for each counting mode run.
pub(in crate::bench) fn section(opts: &BenchOptions, all: &[TrendingResult]) -> String {
    let mut out = format!("\n{TRENDING_HEADING}\n\n");
    for counting in ["stream", "transactional"] {
        let rs: Vec<TrendingResult> = all
            .iter()
            .filter(|r| r.counting == counting)
            .cloned()
            .collect();
        if !rs.is_empty() {
            out.push_str(&mode_section(opts, counting, &rs));
        }
    }
    out
}

/// What runs in `counting` mode, and the rows of its runs.
fn mode_section(opts: &BenchOptions, counting: &str, rs: &[TrendingResult]) -> String {
    let (mut out, through) = match counting {
        "stream" => (
            "\n### Stream mode\n\n".to_owned(),
            format!("stream mode with {STREAM_SHARDS} stream shards (an instance each)"),
        ),
        _ => (
            "\n### Transactional mode\n\n".to_owned(),
            "transactional mode (likes counted by their transactions, their window buckets on the shard items; the likes' sketches the like function instance's own, put with a like at most every 10 s: one instance here, as the local stack runs one per function, where Lambda runs many, each putting its own)".to_owned(),
        ),
    };
    let (likes, views, reels) = (
        range(rs, |r| r.likes as f64, 0),
        range(rs, |r| r.views as f64, 0),
        range(rs, |r| r.reels as f64, 0),
    );
    out.push_str(&format!(
        "`trending` variant, {} runs in {counting} mode: the platform's traffic (Zipf s = {S} over {REELS} reels, a viral reel taking {:.0} % on top) at {} likes/s and half as many view requests, for {} s, through {through} and {KINESIS_SHARDS} Kinesis shards, the cache warmer running beside it; {likes} likes and {views} views taken over {reels} reels. The window is the last hour, which holds a run whole. Every {} s a probe reel takes {PROBE_LIKES} likes at once, and `GET /trending` is polled every {} ms until it lists the probe with all of them. After the load, a tail of likes and views past the sketches' flush time and the streams drained, a fresh instance ranks each list, compared with the true top {TOP} (ties by id, as the API breaks them); precision and recall are over the reels above the merged sketch's stated error (\"no false negatives\" holds there), and over all 100 as well. The extra write units are the sketches' puts (every `top#` write the fault proxy counted) and the window buckets' share of the items that carry them (each writer or view partition's item writes, as counted, times the units its items' buckets add by DynamoDB's 1 KB rule, from their final sizes, twice: transactional). The reads: the likes list's first {READ_REELS} reels, each read (likes, then views) on a fresh instance, before and after one round of the warmer; the read units are the fault proxy's.\n\n",
        rs.len(),
        VIRAL_SHARE * 100.0,
        opts.trending_rate,
        opts.trending_seconds,
        PROBE_EVERY.as_secs(),
        PROBE_POLL.as_millis(),
    ));
    out.push_str("| figure | runs (min–max) | target | met |\n| --- | --- | --- | --- |\n");
    for (name, value, target, met) in rows(rs) {
        let met = match met {
            None => "—",
            Some(true) => "yes",
            Some(false) => "**no**",
        };
        out.push_str(&format!("| {name} | {value} | {target} | {met} |\n"));
    }
    out
}
