//! The check phase: the scan of the counters table, each reel checked
//! against its counted rows and corrected, and the stray items cleared.

use super::state::{CHUNK_TTL_SECS, Segment};
use super::{CHECK_CONCURRENCY, Inv, Reconciler, Task, near};
use crate::clock::now_ms;
use crate::config::{Counting, RecentWindow};
use crate::error::Error;
use crate::keys::ReelId;
use crate::store::{
    CorrectResult, CountItem, FoldResult, Phase, ReconcileStore, ReelView, ScanPage, ScanTable,
    ShardValue,
};
use futures::StreamExt;
use std::collections::{BTreeMap, HashSet};
use tokio::sync::Mutex;

/// Reels checked between two checkpoints of a dry run's check phase.
const CHECK_BATCH: usize = 200;
/// The counters scan commits its cursor at least every this many pages: a
/// commit is one write of the run state whatever the pages held (unlike
/// the likes scan's checkpoints, which write a unit per reel), and a crash
/// re-checks only the reels since.
const CHECK_COMMIT_PAGES: u32 = 10;
/// Reels listed by name in a summary.
const SAMPLE: usize = 20;
/// Recent-change buckets of another width than this deployment's (written
/// before a configuration change) are dropped after this long: far longer
/// than any deployment keeps its own (four settle times of at most 25
/// hours).
const STALE_OTHER_WIDTH_MS: i64 = 8 * 86_400_000;

/// What checking one reel found.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Agrees,
    Corrected(i64),
    /// Dry run: this drift would be corrected.
    Drift(i64),
    /// Already corrected by this run (an earlier, interrupted invocation
    /// applied this drift but did not checkpoint it).
    AlreadyCorrected(i64),
    Deferred(&'static str),
}

impl<S: ReconcileStore> Reconciler<S> {
    /// A dry run's check of every reel it counted, in order, from its
    /// cursor. Returns whether it got through all of them.
    pub(super) async fn check_counted(&self, inv: &Inv<'_>) -> Result<bool, Error> {
        let cursor = inv.run.lock().await.state.reel_cursor.clone();
        let mut reels: Vec<(ReelId, u64)> = inv
            .dry_counts
            .lock()
            .await
            .iter()
            .filter(|(r, _)| cursor.as_deref().is_none_or(|c| r.as_str() > c))
            .map(|(r, n)| (r.clone(), *n))
            .collect();
        reels.sort();
        for batch in reels.chunks(CHECK_BATCH) {
            if near(inv.opts.deadline) {
                return Ok(false);
            }
            let outcomes = self.check_all(inv, batch.to_vec()).await;
            self.record(inv, outcomes).await;
            if let Some((last, _)) = batch.last() {
                inv.run.lock().await.state.reel_cursor = Some(last.as_str().to_owned());
            }
            self.commit(inv).await?;
        }
        Ok(true)
    }

    /// The check phase: a parallel scan of the counters table. Each count
    /// item of this run is checked against its rows; a reel met through its
    /// other items, without a count item, against zero rows (once: a claim
    /// marker, or a dry run's memory, says it was taken); items outside a
    /// reel's read range are cleared.
    pub(super) async fn scan_counters(&self, inv: &Inv<'_>) -> Result<bool, Error> {
        let todo: Vec<(usize, Segment)> = {
            let g = inv.run.lock().await;
            g.state
                .counter_segments
                .iter()
                .cloned()
                .enumerate()
                .filter(|(_, s)| !s.done)
                .collect()
        };
        let seen: Mutex<HashSet<ReelId>> = Mutex::new(HashSet::new());
        let tasks: Vec<Task<'_, Result<bool, Error>>> = todo
            .into_iter()
            .map(|(i, mut seg)| {
                let seen = &seen;
                Box::pin(async move {
                    let mut pages = 0u32;
                    let mut unsaved = 0u32;
                    loop {
                        if pages > 0 && near(inv.opts.deadline) {
                            // Keep the pages done: the next invocation goes on
                            // from here.
                            if unsaved > 0 {
                                inv.run.lock().await.state.counter_segments[i] = seg.clone();
                                self.commit(inv).await?;
                            }
                            return Ok(false);
                        }
                        let page = self.next_page(inv, ScanTable::Counters, i, &seg).await?;
                        pages += 1;
                        let reels = self.reels_to_check(inv, &page, seen).await?;
                        let outcomes = self.check_all(inv, reels).await;
                        self.record(inv, outcomes).await;
                        self.clear_strays(inv, page.count_items).await;
                        self.drop_stale_windows(inv, page.stale_windows).await;
                        seg.rows += page.items;
                        seg.cursor = page.next;
                        seg.done = seg.cursor.is_none();
                        unsaved += 1;
                        if seg.done || unsaved >= self.cfg.checkpoint_pages.min(CHECK_COMMIT_PAGES)
                        {
                            inv.run.lock().await.state.counter_segments[i] = seg.clone();
                            self.commit(inv).await?;
                            unsaved = 0;
                        }
                        if seg.done {
                            return Ok(true);
                        }
                    }
                }) as Task<'_, _>
            })
            .collect();
        let results: Vec<Result<bool, Error>> = futures::stream::iter(tasks)
            .buffer_unordered(self.cfg.segments as usize)
            .collect()
            .await;
        let mut all = true;
        for r in results {
            all &= r?;
        }
        Ok(all)
    }

    /// The reels a counters page asks to check, with their counted rows.
    async fn reels_to_check(
        &self,
        inv: &Inv<'_>,
        page: &ScanPage,
        seen: &Mutex<HashSet<ReelId>>,
    ) -> Result<Vec<(ReelId, u64)>, Error> {
        let (run_id, dry) = {
            let g = inv.run.lock().await;
            (g.state.run_id.clone(), g.state.dry_run)
        };
        let mut out: Vec<(ReelId, u64)> = page
            .run_counts
            .iter()
            .filter(|c| !dry && c.run_id == run_id && !c.claimed)
            .map(|c| (c.reel.clone(), c.rows))
            .collect();
        let with_rows: HashSet<&ReelId> = out.iter().map(|(r, _)| r).collect();
        let mut candidates: Vec<ReelId> = page
            .reels
            .iter()
            .filter(|r| !with_rows.contains(r))
            .cloned()
            .collect();
        candidates.sort();
        candidates.dedup();
        if dry {
            let counted = inv.dry_counts.lock().await;
            let mut seen = seen.lock().await;
            for r in candidates {
                if !counted.contains_key(&r) && seen.insert(r.clone()) {
                    out.push((r, 0));
                }
            }
        } else if !candidates.is_empty() {
            inv.reads.take(candidates.len() as f64).await;
            let counted = self.store.run_counts(&run_id, &candidates).await?;
            let expires = now_ms() / 1000 + CHUNK_TTL_SECS;
            for r in candidates {
                // A reel with rows is checked at its own count item; a
                // claimed one by whoever claimed it.
                if counted.contains_key(&r) {
                    continue;
                }
                inv.writes.take(1.0).await;
                let claimer = format!("{:016x}", fastrand::u64(..));
                if self
                    .store
                    .claim_rowless(&run_id, &r, &claimer, expires)
                    .await?
                {
                    out.push((r, 0));
                }
            }
        }
        Ok(out)
    }

    /// Deletes the non-empty items outside their stable reel's read range
    /// (a dry run only counts them). A failure leaves the item to the next
    /// run; the run goes on.
    async fn clear_strays(&self, inv: &Inv<'_>, items: Vec<(ReelId, CountItem, ShardValue)>) {
        if items.is_empty() {
            return;
        }
        let dry = inv.run.lock().await.state.dry_run;
        let mut reels: Vec<ReelId> = items.iter().map(|(r, _, _)| r.clone()).collect();
        reels.sort();
        reels.dedup();
        inv.reads.take(reels.len() as f64).await;
        let settings = match self.store.settings(&reels).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    error = e.code(),
                    "reconcile could not read settings for stray items"
                );
                return;
            }
        };
        for (reel, item, seen) in items {
            let st = settings.get(&reel).copied().unwrap_or_default();
            // A resize owns its reel's items until it is stable again.
            if st.phase != Phase::Stable {
                continue;
            }
            if st.sums(item) {
                continue;
            }
            let cleared = dry
                || {
                    // A transaction: two units per item.
                    inv.writes.take(4.0).await;
                    match self.store.clear_stray(&reel, item, seen, st.version).await {
                        Ok(FoldResult::Folded) => true,
                        Ok(other) => {
                            tracing::info!(reel = %reel, ?item, result = ?other, "a stray item changed meanwhile; left for the next run");
                            false
                        }
                        Err(e) => {
                            tracing::warn!(reel = %reel, ?item, error = e.code(), "reconcile could not clear a stray item");
                            false
                        }
                    }
                };
            if cleared {
                tracing::warn!(reel = %reel, ?item, n = seen.n, w = seen.w, dry, "a non-empty item outside the reel's read range");
                let stats = &mut inv.run.lock().await.state.stats;
                stats.strays_cleared += 1;
                if stats.stray_reels.len() < SAMPLE
                    && !stats.stray_reels.contains(&reel.to_string())
                {
                    stats.stray_reels.push(reel.to_string());
                }
            }
        }
    }

    /// Checks `reels` (a few at a time) against their counted rows.
    async fn check_all(
        &self,
        inv: &Inv<'_>,
        reels: Vec<(ReelId, u64)>,
    ) -> Vec<(ReelId, Result<Outcome, Error>)> {
        let tasks: Vec<Task<'_, (ReelId, Result<Outcome, Error>)>> = reels
            .into_iter()
            .map(|(r, rows)| {
                Box::pin(async move {
                    let outcome = self.check(inv, &r, rows).await;
                    (r, outcome)
                }) as Task<'_, _>
            })
            .collect();
        futures::stream::iter(tasks)
            .buffer_unordered(CHECK_CONCURRENCY)
            .collect()
            .await
    }

    /// Adds checked reels to the run's statistics.
    async fn record(&self, inv: &Inv<'_>, outcomes: Vec<(ReelId, Result<Outcome, Error>)>) {
        let mut g = inv.run.lock().await;
        let stats = &mut g.state.stats;
        for (reel, outcome) in outcomes {
            stats.reels_checked += 1;
            let drift = match outcome {
                Ok(Outcome::Agrees) => None,
                Ok(Outcome::Corrected(d))
                | Ok(Outcome::Drift(d))
                | Ok(Outcome::AlreadyCorrected(d)) => {
                    stats.reels_corrected += 1;
                    if stats.corrected_reels.len() < SAMPLE {
                        stats.corrected_reels.push(reel.as_str().to_owned());
                    }
                    Some(d)
                }
                Ok(Outcome::Deferred(why)) => {
                    tracing::info!(reel = %reel, why, "reconcile deferred a reel");
                    stats.reels_deferred += 1;
                    if stats.deferred_reels.len() < SAMPLE {
                        stats.deferred_reels.push(reel.as_str().to_owned());
                    }
                    None
                }
                Err(e) => {
                    // Left for the next run; the run goes on.
                    tracing::warn!(reel = %reel, error = e.code(), "reconcile could not check a reel");
                    stats.reels_deferred += 1;
                    if stats.deferred_reels.len() < SAMPLE {
                        stats.deferred_reels.push(reel.as_str().to_owned());
                    }
                    None
                }
            };
            if let Some(d) = drift {
                stats.total_abs_drift += d.unsigned_abs();
                if d.unsigned_abs() > stats.largest_drift.unsigned_abs() {
                    stats.largest_drift = d;
                    stats.largest_drift_reel = Some(reel.as_str().to_owned());
                }
            }
        }
    }

    /// Checks one reel against `rows` counted rows, and corrects it.
    async fn check(&self, inv: &Inv<'_>, reel: &ReelId, rows: u64) -> Result<Outcome, Error> {
        let (run_id, started_ms, dry, cut_ms, likes_done_ms) = {
            let g = inv.run.lock().await;
            (
                g.state.run_id.clone(),
                g.state.started_ms,
                g.state.dry_run,
                g.state.cut_ms,
                g.state.likes_done_ms,
            )
        };
        let view = self.store.reel_view(reel).await?;
        inv.reads
            .take(2.0 + f64::from(view.settings.shards_to_sum()))
            .await;
        if view.ledger.last_run.as_deref() == Some(run_id.as_str()) {
            return Ok(Outcome::AlreadyCorrected(view.ledger.last_drift));
        }
        if view.settings.phase != Phase::Stable {
            return Ok(Outcome::Deferred("resizing"));
        }
        self.drop_stale_buckets(inv, reel, &view).await;
        let drift = match self.counting {
            Counting::Stream => {
                match self.stream_drift(cut_ms, likes_done_ms, rows, &view, now_ms()) {
                    Ok(drift) => drift,
                    Err(why) => return Ok(Outcome::Deferred(why)),
                }
            }
            // A run started in stream mode counted rows at a cut: not
            // comparable with the shards in this mode.
            Counting::Transactional if cut_ms.is_some() => {
                return Ok(Outcome::Deferred("counted_at_a_cut"));
            }
            Counting::Transactional => {
                // A resize step during the run moves counts between items
                // (a fold carries no like's stamp) and changes which items
                // are summed.
                if view.settings.phase_at_ms >= started_ms - self.margin_ms {
                    return Ok(Outcome::Deferred("resized_during_run"));
                }
                if view.sum.last_write_ms >= started_ms - self.margin_ms {
                    return Ok(Outcome::Deferred("written_during_run"));
                }
                rows as i64 - view.sum.n
            }
        };
        if drift == 0 {
            return Ok(Outcome::Agrees);
        }
        if dry {
            return Ok(Outcome::Drift(drift));
        }
        let mut attempt = 0;
        // One correction, one body: every attempt is stamped alike.
        let at_ms = crate::clock::now_ms();
        loop {
            attempt += 1;
            inv.writes.take(4.0).await;
            match self
                .store
                .correct(reel, drift, view.ledger.corrections, &run_id, at_ms)
                .await?
            {
                CorrectResult::Applied => {
                    tracing::info!(reel = %reel, drift, rows, "reconcile corrected a reel");
                    return Ok(Outcome::Corrected(drift));
                }
                CorrectResult::LedgerChanged => {
                    return Ok(Outcome::Deferred("corrected_meanwhile"));
                }
                CorrectResult::Retry(_) if self.backoff.allows(attempt) => {
                    tokio::time::sleep(self.backoff.delay(attempt)).await;
                }
                CorrectResult::Retry(_) => return Ok(Outcome::Deferred("contended")),
            }
        }
    }

    /// Stream mode: a stable reel's drift at the run's cut, `rows` being
    /// the rows it counted as liked before the cut, and `view` read at
    /// `now_ms`; or why it cannot be told exactly yet (see
    /// [Stream mode](super#stream-mode)).
    pub(super) fn stream_drift(
        &self,
        cut_ms: Option<i64>,
        likes_done_ms: Option<i64>,
        rows: u64,
        view: &ReelView,
        now_ms: i64,
    ) -> Result<i64, &'static str> {
        let (Some(cut), Some(done)) = (cut_ms, likes_done_ms) else {
            // A run started in transactional mode: its rows were counted
            // without a cut.
            return Err("counted_without_cut");
        };
        // Rows liked before the switch to stream mode were counted by their
        // own transactions, not recorded in buckets.
        if cut < self.stream_since_ms + self.margin_ms {
            return Err("switched_to_stream_during_run");
        }
        if now_ms < self.stream_ready_ms(done) {
            return Err("records_in_flight");
        }
        let RecentWindow {
            width_ms: w,
            keep_ms,
        } = self.window;
        // The bucket width changed since the run started (its cut is not a
        // bucket start any more).
        if cut.rem_euclid(w) != 0 {
            return Err("bucket_width_changed");
        }
        // A resize moves counts between items without their buckets.
        if view.settings.phase_at_ms >= cut - self.margin_ms {
            return Err("resized_during_run");
        }
        // A row liked before the cut and removed before the scan reached it
        // is in no count. Such a removal was committed before the likes
        // scan ended; its stream timestamp is at most that (DynamoDB's
        // clock: the skew) and at least its commit's whole second (the
        // skew again) after the cut. A removal after the scan is in both
        // counts, as its row was.
        let removals_from = (cut - 1_000 - self.skew_ms).div_euclid(w) * w;
        let removals_to = done + self.skew_ms;
        // Every bucket read must still be there. Only the aggregator's
        // writes drop buckets (a write at `t`, by its clock, drops those
        // starting `keep − width` before it), and each stamps the item's
        // `updated_at` with that clock: so the reel's last stamp bounds
        // what was dropped (plus `skew`: an earlier write may have had a
        // faster clock). A reel quiet since a little after the cut can be
        // compared however long after it the run reaches it; the clock
        // now says nothing about it. (The run's own stale-bucket removal
        // drops only buckets older than any later run's cut.)
        if view.sum.last_write_ms + self.skew_ms > removals_from + keep_ms - w {
            return Err("past_recent_window");
        }
        let mut after = 0i64;
        for b in &view.recent {
            let a = b.attr;
            if a.width_ms != w {
                // Written under another width (a configuration change): it
                // cannot be cut at this run's cut.
                if a.start_ms + a.width_ms > cut - keep_ms {
                    return Err("bucket_width_changed");
                }
                continue;
            }
            if a.removals {
                if (removals_from..=removals_to).contains(&a.start_ms) && b.value > 0 {
                    return Err("unliked_during_run");
                }
            } else if a.start_ms >= cut {
                // What the shards took from rows liked at or after the cut.
                after += b.value;
            }
        }
        Ok(rows as i64 - (view.sum.n - after))
    }

    /// The recent-change buckets of `view` that no aggregator writes any
    /// more, by item: this run's width older than the window (with the
    /// skew and a bucket to spare), other widths after [`STALE_OTHER_WIDTH_MS`].
    fn stale_buckets(&self, view: &ReelView, now_ms: i64) -> BTreeMap<String, Vec<String>> {
        let RecentWindow {
            width_ms: w,
            keep_ms,
        } = self.window;
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for b in &view.recent {
            let limit = if b.attr.width_ms == w {
                now_ms - keep_ms - self.skew_ms - w
            } else {
                now_ms - STALE_OTHER_WIDTH_MS
            };
            if b.attr.start_ms + b.attr.width_ms < limit {
                out.entry(b.item.clone()).or_default().push(b.name.clone());
            }
        }
        out
    }

    /// Removes windowed-count buckets past every window from the items
    /// that hold them (best effort: a failure leaves them to the next
    /// run). An item's own writes prune the buckets that just expired; one
    /// not written for a while after keeps the rest until here, so this
    /// bounds what it keeps to what a day between runs leaves.
    async fn drop_stale_windows(&self, inv: &Inv<'_>, items: Vec<(String, Vec<String>)>) {
        if inv.opts.dry_run {
            return;
        }
        for (item, names) in items {
            inv.writes.take(2.0).await;
            if let Err(e) = self.store.drop_attributes(&item, &names).await {
                tracing::warn!(
                    item,
                    error = e.code(),
                    "reconcile could not drop expired window buckets"
                );
            }
        }
    }

    /// Removes stale recent-change buckets from a reel's items (best
    /// effort: a failure leaves them to the next run).
    async fn drop_stale_buckets(&self, inv: &Inv<'_>, reel: &ReelId, view: &ReelView) {
        if self.counting != Counting::Stream || inv.opts.dry_run {
            return;
        }
        for (item, names) in self.stale_buckets(view, now_ms()) {
            inv.writes.take(1.0).await;
            if let Err(e) = self.store.drop_attributes(&item, &names).await {
                tracing::warn!(reel = %reel, error = e.code(), "reconcile could not drop stale buckets");
            }
        }
    }
}
