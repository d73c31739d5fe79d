//! The stream-at-scale variants' own part: the resize of the viral reel halfway through
//! the load, and the figures that say whether stream mode holds at scale:
//! how many of the aggregator's transactions the conflict model refused,
//! what the event source handed back or gave up on, and when the resize
//! completed. The rest of the run is any stream variant's (`measure.rs`).

use super::VIRAL;
use super::variant::SCALE_TO;
use crate::streams::StreamSourceStats;
use anyhow::{Result, anyhow};
use likes::App;
use likes::store::Phase;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Asks, `after` the load started, for the viral reel to grow to
/// [`SCALE_TO`] shards, as an operator would through the admin route
/// (`POST /admin/reels/{id}/shards`, the same call); the scheduled
/// resharder (`LOCAL_SCHEDULE_SECS`) then finishes it while the load and
/// the aggregation go on. A refused request (the route's 503, should its
/// settings write meet the schedule's; the aggregator's chunks never touch
/// that item) is asked again, as the operator would, for up to
/// `patience`; the task answers how many were refused, and whether one
/// got through.
pub(super) fn resize_midway(
    app: Arc<App>,
    after: Duration,
    patience: Duration,
) -> JoinHandle<Result<(u32, bool)>> {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let viral = likes::keys::ReelId::parse(VIRAL).map_err(|e| anyhow!(e.0))?;
        let start = std::time::Instant::now();
        let mut refused = 0;
        loop {
            match app.reshard.begin(&viral, SCALE_TO).await {
                Ok((outcome, _)) => {
                    crate::errln!(
                        "  resize of the viral reel to {SCALE_TO}: {outcome:?} after {refused} refused"
                    );
                    return Ok((refused, true));
                }
                Err(e) if start.elapsed() < patience => {
                    refused += 1;
                    tracing::debug!(error = %e, "resize request refused; asking again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    crate::errln!(
                        "  resize of the viral reel to {SCALE_TO}: still refused after {refused} requests ({e})"
                    );
                    return Ok((refused, false));
                }
            }
        }
    })
}

/// Waits, up to `limit`, for the viral reel to be stable at [`SCALE_TO`]
/// shards: a resize that has not completed by the end of the load is
/// waited for, so that "completed" means it completed, not that the run
/// was short; one still under way after `limit` is stuck, which the table
/// shows as a missing time.
pub(super) async fn wait_resized(app: &App, limit: Duration) -> Result<()> {
    let viral = likes::keys::ReelId::parse(VIRAL).map_err(|e| anyhow!(e.0))?;
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        let s = app
            .reshard
            .state(&viral)
            .await
            .map_err(|e| anyhow!("the viral reel's settings: {e}"))?;
        if s.phase == Phase::Stable && s.write_shards == SCALE_TO {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    crate::errln!("  the resize to {SCALE_TO} did not complete within {limit:?}");
    Ok(())
}

/// The stream-at-scale variants' figures; NaN for the other variants (the table's —).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ScaleFigures {
    /// See [`conflicted_pct`].
    pub conflicted_pct: f64,
    /// See [`viral_conflicted_pct`].
    pub viral_conflicted_pct: f64,
    /// Batches delivered again (`StreamSourceStats::retries`).
    pub retried: f64,
    /// ... of which partly applied first (`partial`).
    pub partial: f64,
    /// Records sent to `OnFailure` (`discarded`).
    pub discarded: f64,
    /// Resize requests refused before one got through (or all of them).
    pub resize_refused: f64,
    /// See [`done_at`].
    pub resize_done_s: f64,
}

impl ScaleFigures {
    /// For the variants that have none.
    pub const NONE: ScaleFigures = ScaleFigures {
        conflicted_pct: f64::NAN,
        viral_conflicted_pct: f64::NAN,
        retried: f64::NAN,
        partial: f64::NAN,
        discarded: f64::NAN,
        resize_refused: f64::NAN,
        resize_done_s: f64::NAN,
    };

    /// From the proxy's counts and the event source's, both taken after
    /// the drain (the aggregation goes on after the load), the resize
    /// requests refused, and the shard counts the watcher saw.
    pub fn of(
        proxy: &faultproxy::Stats,
        source: &StreamSourceStats,
        resize_refused: u32,
        shards_seen: &[(f64, u32)],
    ) -> Self {
        let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64;
        let mut held: Vec<(&String, &u64)> = proxy.modeled_conflicts.refused_on.iter().collect();
        held.sort_by(|a, b| b.1.cmp(a.1));
        let (sent, refused) = transactions(proxy);
        crate::errln!(
            "  transactions sent {sent}, refused {refused}; most refused on: {}",
            held.iter()
                .take(5)
                .map(|(item, n)| format!("{item} ×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        ScaleFigures {
            conflicted_pct: conflicted_pct(proxy),
            viral_conflicted_pct: viral_conflicted_pct(proxy),
            retried: n(&source.retries),
            partial: n(&source.partial),
            discarded: n(&source.discarded),
            resize_refused: f64::from(resize_refused),
            resize_done_s: done_at(shards_seen, SCALE_TO),
        }
    }
}

/// The aggregator's transactions refused by the conflict model, % of those
/// sent. In stream mode every `TransactWriteItems` is the aggregator's: the
/// bench's likes are unkeyed (one `PutItem` each) and a grow folds nothing
/// (only a shrink, or a stray item, writes a transaction). A refusal is an
/// item held by another transaction (`refused`) or the transaction's own
/// token still in flight (`in_progress`); requests include every attempt,
/// the SDK's retries and the aggregator's. 0 if none were sent.
pub(super) fn conflicted_pct(stats: &faultproxy::Stats) -> f64 {
    match transactions(stats) {
        (0, _) => 0.0,
        (sent, refused) => 100.0 * refused as f64 / sent as f64,
    }
}

/// The aggregator's transactions sent and refused, as [`conflicted_pct`]
/// counts them.
fn transactions(stats: &faultproxy::Stats) -> (u64, u64) {
    const OP: &str = "TransactWriteItems";
    let sent = stats.requests.get(OP).copied().unwrap_or(0);
    let refused = stats
        .modeled_conflicts
        .refused
        .get(OP)
        .copied()
        .unwrap_or(0)
        + stats.modeled_conflicts.in_progress;
    (sent, refused)
}

/// The aggregator's transactions refused because an item of the viral
/// reel's shards was held, % of those sent (see [`conflicted_pct`]): what
/// the stream shards aggregating one reel cost each other. The rest (in `stream-scale-mixed`) are
/// the background reels', whose one shard each takes chunks from
/// whichever stream shards carry their likes.
pub(super) fn viral_conflicted_pct(stats: &faultproxy::Stats) -> f64 {
    let sent = stats
        .requests
        .get("TransactWriteItems")
        .copied()
        .unwrap_or(0);
    if sent == 0 {
        return 0.0;
    }
    let viral = likes::keys::ReelId::parse(VIRAL).expect("a valid id");
    // The model names an item by its table and key, as JSON.
    let mut shards: std::collections::HashSet<String> = (0..likes::keys::MAX_SHARDS)
        .map(|i| format!("\"{}\"", likes::keys::shard_key(&viral, i)))
        .collect();
    // Stream mode: its writer items (one item per stream shard, in each
    // part the reel may be spread over).
    shards.extend(
        (0..likes::keys::MAX_WRITER_PARTS)
            .map(|p| format!("\"{}\"", likes::keys::likes_writers_part_key(&viral, p))),
    );
    let refused: u64 = stats
        .modeled_conflicts
        .refused_on
        .iter()
        .filter(|(item, _)| shards.iter().any(|k| item.contains(k.as_str())))
        .map(|(_, n)| n)
        .sum();
    100.0 * refused as f64 / sent as f64
}

/// When (seconds since the load started) the writers' shard count was
/// first seen at `target`: a grow's last step raises it, so that is when
/// the resize completed. NaN if it never was.
pub(super) fn done_at(shards_seen: &[(f64, u32)], target: u32) -> f64 {
    shards_seen
        .iter()
        .find(|(_, n)| *n == target)
        .map_or(f64::NAN, |(at, _)| *at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(requests: u64, refused: u64, in_progress: u64) -> faultproxy::Stats {
        let mut s = faultproxy::Stats::default();
        s.requests.insert("TransactWriteItems".into(), requests);
        // Refusals of other operations are not the aggregator's.
        s.requests.insert("PutItem".into(), 1000);
        s.modeled_conflicts.refused.insert("PutItem".into(), 7);
        s.modeled_conflicts
            .refused
            .insert("TransactWriteItems".into(), refused);
        s.modeled_conflicts.in_progress = in_progress;
        s
    }

    #[test]
    fn the_viral_share_counts_refusals_on_its_shards_only() {
        let mut s = stats(200, 4, 0);
        let item = |pk: &str| format!(r#"["counters",[["pk",{{"S":"{pk}"}}]]]"#);
        let on = &mut s.modeled_conflicts.refused_on;
        on.insert(item(&format!("003#reel#{VIRAL}#likes")), 2);
        on.insert(item(&format!("012#reel#{VIRAL}#likes")), 1);
        on.insert(item("000#reel#bg1#likes"), 1);
        on.insert(item(&format!("000#reel#x{VIRAL}#likes")), 5);
        assert_eq!(viral_conflicted_pct(&s), 1.5);
        assert_eq!(viral_conflicted_pct(&faultproxy::Stats::default()), 0.0);
    }

    #[test]
    fn conflicted_is_the_refused_share_of_transactions_sent() {
        assert_eq!(conflicted_pct(&stats(200, 3, 1)), 2.0);
        assert_eq!(conflicted_pct(&stats(50, 0, 0)), 0.0);
        assert_eq!(conflicted_pct(&faultproxy::Stats::default()), 0.0);
    }

    #[test]
    fn the_resize_is_done_when_the_writers_count_reaches_the_target() {
        let seen = [(0.1, 32), (5.0, 32), (9.75, 64), (10.0, 64)];
        assert_eq!(done_at(&seen, 64), 9.75);
        assert!(done_at(&seen[..2], 64).is_nan());
        let f = ScaleFigures::of(&stats(100, 1, 0), &StreamSourceStats::default(), 2, &seen);
        assert_eq!(
            (
                f.conflicted_pct,
                f.discarded,
                f.resize_refused,
                f.resize_done_s
            ),
            (1.0, 0.0, 2.0, 9.75)
        );
        assert!(ScaleFigures::NONE.conflicted_pct.is_nan());
    }
}
