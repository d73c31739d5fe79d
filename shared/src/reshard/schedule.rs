//! The scheduled run: every reel in the resize index has its due steps taken,
//! and stable ones are sampled for the automatic grow and shrink.

use super::plan::{Plan, plan};
use super::{
    DEADLINE_SAFETY, Progress, Resharder, Stop, Tally, UNOBSERVED, clear_strays, read_settings,
};
use crate::clock::now_ms;
use crate::error::Error;
use crate::keys::{self, ReelId};
use crate::store::{Phase, ResizeStore, Settings, WriteSample};
use futures::StreamExt;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Scheduled runs tend this many reels at once.
const RUN_CONCURRENCY: usize = 16;

/// What one scheduled run did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunSummary {
    /// Reels in the resize index.
    pub reels: usize,
    /// Resizes started by the automatic policy.
    pub grows_started: usize,
    /// Shrinks started by the automatic policy.
    pub shrinks_started: usize,
    /// Phase changes made (each a settings write).
    pub steps: usize,
    /// Resizes brought to `stable`.
    pub completed: usize,
    /// Shards folded into the base item.
    pub folds: usize,
    /// Retired shards checked empty and closed at cleanup (their items
    /// are kept as tombstones).
    pub deletes: usize,
    /// Reels whose next step is not due yet (left for the next run).
    pub waiting: usize,
    /// Reels not visited because the run's deadline was near.
    pub skipped: usize,
    /// How long the oldest resize still in progress has been in its phase
    /// (0: none): a resize stuck in one phase shows here.
    pub oldest_phase_ms: u64,
    /// Reels that failed this run (retried by the next).
    pub errors: usize,
    /// Wall-clock length of the run, in milliseconds.
    pub duration_ms: u64,
}

impl<S: ResizeStore> Resharder<S> {
    /// One scheduled run: every reel in the resize index has its due steps
    /// taken (sleeping for a step due within `RESHARD_MAX_WAIT_MS`, never
    /// past `deadline`), and stable ones are sampled for the automatic grow
    /// and shrink.
    pub async fn run_scheduled(&self, deadline: Option<Instant>) -> Result<RunSummary, Error> {
        let started = Instant::now();
        let mut reels = self.store.indexed_reels().await?;
        // A run cut short by its deadline must not always leave the same
        // reels out.
        fastrand::shuffle(&mut reels);
        let mut summary = RunSummary {
            reels: reels.len(),
            ..RunSummary::default()
        };
        let reports: Vec<ReelReport> = futures::stream::iter(reels)
            .map(|reel| async move { self.tend(&reel, deadline).await })
            .buffer_unordered(RUN_CONCURRENCY)
            .collect()
            .await;
        for r in reports {
            summary.steps += r.tally.steps;
            summary.completed += r.tally.completed;
            summary.folds += r.tally.folds;
            summary.deletes += r.tally.deletes;
            summary.waiting += usize::from(r.waiting);
            summary.skipped += usize::from(r.skipped);
            summary.oldest_phase_ms = summary.oldest_phase_ms.max(r.phase_age_ms);
            summary.errors += usize::from(r.error);
            match r.started {
                Some(Phase::Growing) => summary.grows_started += 1,
                Some(Phase::Draining) => summary.shrinks_started += 1,
                _ => {}
            }
        }
        summary.duration_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            reels = summary.reels,
            steps = summary.steps,
            completed = summary.completed,
            folds = summary.folds,
            grows_started = summary.grows_started,
            shrinks_started = summary.shrinks_started,
            waiting = summary.waiting,
            errors = summary.errors,
            duration_ms = summary.duration_ms,
            "reshard run"
        );
        Ok(summary)
    }

    async fn tend(&self, reel: &ReelId, deadline: Option<Instant>) -> ReelReport {
        let mut report = ReelReport::default();
        if deadline.is_some_and(|d| Instant::now() + DEADLINE_SAFETY >= d) {
            report.skipped = true;
            return report;
        }
        // A resize takes at most three waits; the bound only guards against
        // a settings item that keeps changing under the run.
        for _ in 0..8 {
            let mut limit = None;
            let progress = match self
                .advance_inner(reel, &mut limit, &mut report.tally)
                .await
            {
                Ok(p) => p,
                Err(Stop::Failed(e)) => {
                    tracing::warn!(reel = %reel, error = e.code(), "resize step failed; retried next run");
                    report.error = true;
                    // A resize that keeps failing is the one to alarm on.
                    if let Ok(s) = read_settings(&self.store, reel).await
                        && s.phase != Phase::Stable
                        && s.phase_at_ms != UNOBSERVED
                    {
                        report.phase_age_ms = now_ms().saturating_sub(s.phase_at_ms).max(0) as u64;
                    }
                    return report;
                }
                Err(Stop::Interrupted) => return report,
            };
            match progress {
                Progress::Stable(settings) => {
                    if !self.resize.auto || report.started.is_some() {
                        return report;
                    }
                    match self.autoscale(reel, &settings).await {
                        Ok(Some(phase)) => report.started = Some(phase),
                        Ok(None) => return report,
                        Err(e) => {
                            tracing::warn!(reel = %reel, error = e.code(), "sampling failed");
                            report.error = true;
                            return report;
                        }
                    }
                }
                Progress::Waiting { due_ms, settings } => {
                    report.phase_age_ms =
                        now_ms().saturating_sub(settings.phase_at_ms).max(0) as u64;
                    let wait = Duration::from_millis(due_ms.saturating_sub(now_ms()).max(0) as u64);
                    let fits = deadline.is_none_or(|d| Instant::now() + wait + DEADLINE_SAFETY < d);
                    if wait > self.resize.max_wait || !fits {
                        report.waiting = true;
                        return report;
                    }
                    // Just past due, so the next advance finds it due.
                    tokio::time::sleep(wait + Duration::from_millis(5)).await;
                }
                Progress::Interrupted => return report,
            }
        }
        report
    }

    /// Samples a stable reel's write rate (the change of its shards' `w`
    /// since the previous run) and starts a grow when it is hot or a shrink
    /// when it has been cool for `COOL_DOWN_SECS` (to one shard at the
    /// fewest; in stream mode no like writes a shard, so a reel grown by
    /// hand shrinks back once cool).
    /// Returns the phase of a resize it started.
    async fn autoscale(&self, reel: &ReelId, cur: &Settings) -> Result<Option<Phase>, Error> {
        if !cur.indexed() {
            // One shard, stable: nothing to shrink; the read and like paths
            // grow it when it gets hot.
            return Ok(None);
        }
        let sums = self.store.sum_shards(&[(reel.clone(), *cur)]).await?;
        let writes = sums.get(reel).map_or(0, |s| s.w);
        let now = now_ms();
        let rate = cur.sample.and_then(|p| {
            (now > p.at_ms && writes >= p.writes)
                .then(|| (writes - p.writes) as f64 * 1000.0 / (now - p.at_ms) as f64)
        });
        let mut next = Settings {
            sample: Some(WriteSample { writes, at_ms: now }),
            ..*cur
        };
        let mut target = None;
        if let Some(rate) = rate {
            if rate >= self.resize.hot_per_sec {
                next.cool_since_ms = None;
                let want = self.resize.grow_target(cur.write_shards, Some(rate), false);
                if want > cur.write_shards {
                    target = Some(want);
                }
            } else if rate < self.resize.cool_per_sec {
                let since = cur.cool_since_ms.unwrap_or(now);
                next.cool_since_ms = Some(since);
                let cooled = now.saturating_sub(since) >= self.resize.cool_down.as_millis() as i64;
                if cooled && cur.shards_to_sum() > 1 {
                    // One shrink retires at most 99 shards (see `plan`).
                    let have = cur.shards_to_sum();
                    let to = have.saturating_sub(keys::MAX_TRANSACT_ITEMS - 1).max(1);
                    target = (to < have).then_some(to);
                }
            } else {
                next.cool_since_ms = None;
            }
            tracing::debug!(reel = %reel, rate, ?target, "sampled");
        }
        let mut started = None;
        if let Some(t) = target
            && let Plan::Put(resize) = plan(&next, t, now)?
            // Something moved while clearing: the next run tries again.
            && clear_strays(&self.store, reel, cur, &resize).await?
        {
            started = Some(resize.phase);
            next = resize;
        }
        let applied = self.store.put_settings(reel, cur.version, &next).await?;
        if applied && let Some(phase) = started {
            tracing::info!(reel = %reel, rate = ?rate, from = cur.write_shards, target = next.target, phase = phase.as_str(), "automatic resize started");
            return Ok(Some(phase));
        }
        Ok(None)
    }
}

#[derive(Default)]
struct ReelReport {
    tally: Tally,
    started: Option<Phase>,
    waiting: bool,
    skipped: bool,
    error: bool,
    phase_age_ms: u64,
}
