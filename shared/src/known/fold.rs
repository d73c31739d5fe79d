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

/// Registrations one run merges at most, in minutes of them: a fold that
/// fell behind catches up over several runs.
const MINUTES_PER_RUN: i64 = 60;

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
        let mut meta = match &stored {
            Some(m) => m.clone(),
            None => KnownMeta {
                to_ms: now_ms - self.margin_ms,
                first_ms: now_ms,
                cursor: Some(ScanCursor {
                    table: KnownScan::Counters,
                    last: None,
                }),
                ..KnownMeta::default()
            },
        };
        if meta.full {
            return Ok(report);
        }
        // Registrations expire: a fold that stopped for that long has lost
        // some, and only a new backfill makes the set complete again.
        if now_ms - meta.to_ms > REGISTRATION_TTL_SECS * 1000 - 2 * MAX_AGE_SLACK_MS {
            tracing::warn!(
                to_ms = meta.to_ms,
                "the known reels were not folded for a day: backfilling again"
            );
            meta.to_ms = now_ms - self.margin_ms;
            meta.complete = false;
            meta.first_ms = now_ms;
            meta.cursor = Some(ScanCursor {
                table: KnownScan::Counters,
                last: None,
            });
        }
        let mut add: Vec<Vec<u32>> = vec![Vec::new(); SEGMENTS];
        // Registrations stamped before `to`: every one is readable now (a
        // writer's put is readable within the margin of its stamp).
        let to = (now_ms - self.margin_ms).min(meta.to_ms + MINUTES_PER_RUN * 60_000);
        let backfilling = !meta.complete && now_ms >= meta.first_ms + self.backfill_delay_ms;
        if to - meta.to_ms < FOLD_EVERY_MS && !backfilling && stored.is_some() {
            report.complete = meta.complete;
            return Ok(report);
        }
        for minute in meta.to_ms.div_euclid(60_000)..=to.div_euclid(60_000) {
            for (at, reel) in self.store.registrations(minute, meta.to_ms).await? {
                if at < to {
                    let (s, f) = fingerprint(&reel);
                    add[s].push(f);
                    report.registrations += 1;
                }
            }
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
        if !self.store.put_meta(&meta).await? {
            report.lost = true;
            return Ok(report);
        }
        report.complete = meta.complete;
        Ok(report)
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

/// Slack kept between a registration's expiry and the oldest meta item a
/// fold still trusts (TTL removals are never early).
const MAX_AGE_SLACK_MS: i64 = 3_600_000;

#[cfg(test)]
mod tests;
