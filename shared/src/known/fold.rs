//! The fold: merges the registrations into the segments, and backfills the
//! reels counted before registrations began. Run by the cache warmer's
//! schedule (once a minute); it merges when the oldest unmerged
//! registration is [`FOLD_EVERY_MS`] old, so a segment is written at most
//! that often, and a cold start reads at most that much of registrations.
//!
//! Two folds never both land: every segment and the meta item are written
//! conditioned on the version read, and a fold that loses stops (the next
//! run folds again from the meta item it finds). The meta item is written
//! last, so its `to_ms` never claims registrations that a segment lacks.

use super::merge_sorted;
use crate::error::Error;
use crate::keys::known::{REGISTRATION_TTL_SECS, SEGMENT_MAX_FPS, SEGMENTS, fingerprint};
use crate::store::{KnownMeta, KnownScan, KnownStore, ScanCursor};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Registrations wait at most about this long (plus the schedule's minute)
/// before they are merged.
pub const FOLD_EVERY_MS: i64 = 600_000;

/// Registrations one run merges at most (whole minutes of them): a fold
/// that fell behind catches up over several runs.
const REGISTRATIONS_PER_RUN: usize = 500_000;

/// Minute partitions of registrations read at once.
const MINUTES_AT_ONCE: usize = 16;

/// A fold whose previous run is older than this backfills again (the
/// schedule runs it once a minute).
pub const FOLD_GAP_MS: i64 = 900_000;

/// How long one run scans for the backfill.
const BACKFILL_BUDGET: Duration = Duration::from_secs(20);

/// What a fold did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldReport {
    /// Registrations read and merged.
    pub registrations: usize,
    /// Fingerprints new to the segments (registrations and backfill).
    pub added: usize,
    /// Segments written.
    pub segments_written: usize,
    /// Reels the backfill's scan met this run.
    pub backfilled: usize,
    /// The set is complete after this run.
    pub complete: bool,
    /// Another fold wrote meanwhile: this one stopped.
    pub lost: bool,
}

/// The scheduled fold.
pub struct Fold<S> {
    store: Arc<S>,
    margin_ms: i64,
    backfill_delay_ms: i64,
}

impl<S: KnownStore> Fold<S> {
    /// A fold over `store`; `margin_ms` as the instances' refreshes
    /// ([`super::Known::margin_ms`]); the backfill starts
    /// `backfill_delay_ms` after the first fold, when every writer running
    /// registers.
    pub fn new(store: Arc<S>, margin_ms: i64, backfill_delay_ms: i64) -> Self {
        Fold {
            store,
            margin_ms,
            backfill_delay_ms,
        }
    }

    /// One run, at `now_ms`.
    pub async fn fold_at(&self, now_ms: i64) -> Result<FoldReport, Error> {
        let mut report = FoldReport::default();
        let stored = self.store.known_meta().await?;
        let day = REGISTRATION_TTL_SECS * 1000;
        let mut meta = match &stored {
            Some(m) => m.clone(),
            // From a day back: every registration any writer may hold in
            // its set is merged, even one put before the first fold.
            None => KnownMeta {
                to_ms: now_ms - day,
                ..KnownMeta::default()
            },
        };
        if meta.full {
            return Ok(report);
        }
        // The fold not running for a while means this release was not
        // running (a rollback to one without the known reels: its writers
        // counted without registering) or failing: backfill again. The
        // first run starts the backfill too.
        if stored.is_none() || now_ms - meta.seen_ms > FOLD_GAP_MS {
            if stored.is_some() {
                tracing::warn!(
                    seen_ms = meta.seen_ms,
                    "the known reels' fold did not run for a while: backfilling again"
                );
            }
            meta.complete = false;
            meta.first_ms = now_ms;
            meta.cursor = Some(ScanCursor {
                table: KnownScan::Counters,
                last: None,
            });
            // Registrations older than a day may be gone: not merged, but
            // the backfill finds what they registered, if it was counted.
            meta.to_ms = meta.to_ms.max(now_ms - day);
        }
        meta.seen_ms = now_ms;
        let mut add: Vec<Vec<u32>> = vec![Vec::new(); SEGMENTS];
        // Registrations stamped before `until`: every one is readable now
        // (a writer's put is readable within the margin of its stamp).
        let until = now_ms - self.margin_ms;
        let backfilling = !meta.complete && now_ms >= meta.first_ms + self.backfill_delay_ms;
        let due = until - meta.to_ms >= FOLD_EVERY_MS || backfilling || stored.is_none();
        let mut to = meta.to_ms;
        if due {
            to = self.read_since(&meta, until, &mut add, &mut report).await?;
        }
        if backfilling {
            self.backfill(&mut meta, &mut add, &mut report).await?;
        }
        if add.iter().any(|a| !a.is_empty()) {
            let mut segments = self.store.known_segments().await?;
            segments.sort_by_key(|s| s.index);
            for (index, new) in add.iter_mut().enumerate() {
                let new = std::mem::take(new);
                if new.is_empty() {
                    continue;
                }
                let mut seg = match segments.iter().position(|s| s.index == index) {
                    Some(i) => std::mem::take(&mut segments[i]),
                    None => crate::store::KnownSegment {
                        index,
                        ..Default::default()
                    },
                };
                let n = merge_sorted(&mut seg.fps, new);
                if n == 0 {
                    continue;
                }
                if seg.fps.len() > SEGMENT_MAX_FPS {
                    // A bound of the item size: the set cannot hold more
                    // reels, and readers read every reel from now on.
                    tracing::error!(segment = index, "a known-reels segment is full");
                    meta.full = true;
                    meta.complete = false;
                    break;
                }
                if !self.store.put_segment(&seg).await? {
                    report.lost = true;
                    return Ok(report);
                }
                report.added += n;
                report.segments_written += 1;
            }
        }
        meta.to_ms = to;
        // Written every run, folded or not: `seen_ms` is the heartbeat a
        // gap is told by.
        if !self.store.put_meta(&meta).await? {
            report.lost = true;
            return Ok(report);
        }
        report.complete = meta.complete;
        Ok(report)
    }

    /// Reads the registrations from the meta item's `to_ms` up to `until`,
    /// minute by minute (a few at a time), into `add`; stops after a whole
    /// minute once a run has [`REGISTRATIONS_PER_RUN`]. Where it stopped:
    /// every registration stamped before it is in `add` or the segments.
    async fn read_since(
        &self,
        meta: &KnownMeta,
        until: i64,
        add: &mut [Vec<u32>],
        report: &mut FoldReport,
    ) -> Result<i64, Error> {
        let mut to = meta.to_ms;
        let last = until.div_euclid(60_000);
        let mut minute = meta.to_ms.div_euclid(60_000);
        while minute <= last {
            let group: Vec<i64> = (minute..=last).take(MINUTES_AT_ONCE).collect();
            let reads = group
                .iter()
                .map(|m| self.store.registrations(*m, meta.to_ms));
            let pages = futures::future::try_join_all(reads).await?;
            for (m, page) in group.iter().zip(pages) {
                for (at, reel) in page {
                    if at < until {
                        let (s, f) = fingerprint(&reel);
                        add[s].push(f);
                        report.registrations += 1;
                    }
                }
                to = ((m + 1) * 60_000).min(until);
                minute = m + 1;
                if report.registrations >= REGISTRATIONS_PER_RUN {
                    return Ok(to);
                }
            }
        }
        Ok(to)
    }

    /// Scans for up to [`BACKFILL_BUDGET`] from the meta item's cursor,
    /// adding the reels met; the set is complete once both tables are done.
    async fn backfill(
        &self,
        meta: &mut KnownMeta,
        add: &mut [Vec<u32>],
        report: &mut FoldReport,
    ) -> Result<(), Error> {
        let started = Instant::now();
        while started.elapsed() < BACKFILL_BUDGET {
            let Some(cursor) = meta.cursor.clone() else {
                break;
            };
            let page = self
                .store
                .scan_known(cursor.table, cursor.last.as_ref())
                .await?;
            for reel in &page.reels {
                let (s, f) = fingerprint(reel);
                add[s].push(f);
            }
            report.backfilled += page.reels.len();
            meta.cursor = match (page.next, cursor.table) {
                (Some(last), table) => Some(ScanCursor {
                    table,
                    last: Some(last),
                }),
                (None, KnownScan::Counters) => Some(ScanCursor {
                    table: KnownScan::Views,
                    last: None,
                }),
                (None, KnownScan::Views) => None,
            };
        }
        if meta.cursor.is_none() {
            meta.complete = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
