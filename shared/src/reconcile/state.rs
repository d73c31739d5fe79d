//! The run state and how it is stored: its lease (claim, commit, release),
//! its encoding, and the checkpoint chunks of the likes scan.

use super::pace::{Limiter, write_units};
use super::{Inv, Mode, Options, Reconciler};
use crate::clock::now_ms;
use crate::config::Counting;
use crate::error::Error;
use crate::keys::ReelId;
use crate::store::{ReconcileStore, StoredRun};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a lease outlives the last checkpoint when the invocation has no
/// deadline of its own (a local run).
const LOCAL_LEASE: Duration = Duration::from_secs(120);
/// Checkpoint chunks stay this long (TTL), well past any run.
pub(super) const CHUNK_TTL_SECS: i64 = 7 * 86_400;
/// An unfinished run older than this is abandoned.
const MAX_RUN_AGE_MS: i64 = 2 * 86_400_000;
/// Largest chunk item (DynamoDB's item limit is 400 KB).
const CHUNK_BYTES: usize = 350_000;
/// The run state is never written larger than this (far above
/// [`state_bytes_bound`] for the largest segment count allowed).
const STATE_BYTES_MAX: usize = 350_000;
/// The state format this code writes. A run in progress in another format
/// (an older release's, which listed every checkpoint) is started afresh.
const STATE_FORMAT: u32 = 3;

/// The largest run state (JSON bytes) a run with `segments` segments
/// writes, whatever the table's size: fixed fields and bounded statistics,
/// and per segment of each scan a cursor (a like row's key: a user id of at
/// most 256 bytes and a reel id of at most 64, escaped) and its checkpoint
/// bookkeeping.
pub const fn state_bytes_bound(segments: u32) -> usize {
    // 1.5 KiB a segment: a cursor escaped twice (it is JSON inside JSON)
    // at worst doubles each of its quotes and backslashes. At the largest
    // RECONCILE_SEGMENTS (200) that is 308 KiB, under DynamoDB's 400 KB.
    8 * 1024 + 1536 * segments as usize
}

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RunPhase {
    ScanLikes,
    /// Dry runs only: the reels counted in memory, in order.
    CheckReels,
    /// The check phase of a real run (and the rowless reels of a dry run):
    /// a parallel scan of the counters table.
    ScanCounters,
    Done,
}

/// One segment of either scan: its cursor and progress.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Segment {
    pub(super) cursor: Option<String>,
    pub(super) done: bool,
    pub(super) rows: u64,
    /// Likes scan, stream mode: rows liked at or after the run's cut, not
    /// counted (see [`RunState::cut_ms`]).
    #[serde(default)]
    pub(super) young: u64,
    /// Likes scan: checkpoints committed (the number of the last).
    #[serde(default)]
    pub(super) seq: u64,
    /// Likes scan: the last checkpoint, while its counts may not all be in
    /// the count items yet.
    #[serde(default)]
    pub(super) pending: Option<Pending>,
}

/// A committed checkpoint whose counts are being added to the count items.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Pending {
    pub(super) seq: u64,
    /// The invocation that wrote its chunks (part of their keys).
    pub(super) owner: String,
    pub(super) chunks: u32,
    /// Reels (lines of its chunks, in order) already added.
    pub(super) applied: u64,
}

/// What the run has counted and done so far, with bounded samples.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Stats {
    pub(super) rows_scanned: u64,
    /// Stream mode: rows scanned but liked at or after the cut.
    #[serde(default)]
    pub(super) rows_after_cut: u64,
    /// Read units the scans consumed, as DynamoDB reported them.
    #[serde(default)]
    pub(super) scan_read_units: f64,
    pub(super) reels_checked: u64,
    pub(super) reels_corrected: u64,
    pub(super) reels_deferred: u64,
    pub(super) total_abs_drift: u64,
    pub(super) largest_drift: i64,
    pub(super) largest_drift_reel: Option<String>,
    pub(super) corrected_reels: Vec<String>,
    pub(super) deferred_reels: Vec<String>,
    #[serde(default)]
    pub(super) checkpoints: u64,
    /// Reel counts the committed checkpoints hold (lines of their chunks).
    #[serde(default)]
    pub(super) count_lines: u64,
    /// Count-item updates sent: `count_lines` plus any repeated after a
    /// crash.
    #[serde(default)]
    pub(super) count_writes: u64,
    /// Items outside their reel's read range that were not empty, deleted
    /// (dry run: found).
    #[serde(default)]
    pub(super) strays_cleared: u64,
    #[serde(default)]
    pub(super) stray_reels: Vec<String>,
    /// The largest item the run wrote (state or chunk), in bytes.
    #[serde(default)]
    pub(super) largest_item_bytes: u64,
    #[serde(default)]
    pub(super) largest_state_bytes: u64,
}

/// The run as checkpointed (JSON) in the counters table, under a lease.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct RunState {
    #[serde(default)]
    pub(super) format: u32,
    pub(super) run_id: String,
    pub(super) dry_run: bool,
    pub(super) started_ms: i64,
    /// Stream mode: the moment the run counts rows at (Unix ms, a multiple
    /// of the recent-change bucket width): rows liked from it on are left
    /// out of the count, and what the shards took from them is taken out
    /// of their sum (see [`crate::reconcile`]).
    #[serde(default)]
    pub(super) cut_ms: Option<i64>,
    /// When the likes scan finished (Unix ms): stream mode compares no
    /// reel until every record made before it can have been applied.
    #[serde(default)]
    pub(super) likes_done_ms: Option<i64>,
    pub(super) phase: RunPhase,
    pub(super) segments: Vec<Segment>,
    /// Dry runs' check phase: the last reel (in sorted order) done.
    pub(super) reel_cursor: Option<String>,
    pub(super) counter_segments: Vec<Segment>,
    pub(super) lease_owner: String,
    pub(super) lease_until_ms: i64,
    pub(super) invocations: u32,
    pub(super) stats: Stats,
    pub(super) finished_ms: Option<i64>,
}

/// The run state as this invocation last committed it (or is about to),
/// and the version it was committed at.
pub(super) struct Committed {
    pub(super) state: RunState,
    pub(super) version: u64,
}

/// Whether this invocation got the run.
pub(super) enum Claim {
    /// The run, as now committed with this invocation's lease, and whether
    /// it was `started` or `resumed`.
    Go(Committed, &'static str),
    /// Another invocation holds the run (as read).
    Busy(Option<RunState>),
    /// Resume mode and no run to resume (the last one, if any).
    Idle(Option<RunState>),
}

impl<S: ReconcileStore> Reconciler<S> {
    /// Takes the run for this invocation (`me`): the one in progress, or
    /// a new one unless resuming only; or finds it busy, or nothing to do.
    pub(super) async fn claim(
        &self,
        opts: &Options,
        me: &str,
        writes: &Limiter,
    ) -> Result<Claim, Error> {
        let now = now_ms();
        let fresh = |ver_hint: u32| RunState {
            format: STATE_FORMAT,
            run_id: format!("{now}-{:08x}", fastrand::u32(..)),
            dry_run: opts.dry_run,
            started_ms: now,
            cut_ms: self.cut_ms(now),
            likes_done_ms: None,
            phase: RunPhase::ScanLikes,
            segments: vec![Segment::default(); self.cfg.segments as usize],
            reel_cursor: None,
            // Stream mode: twice as many, the odd ones over the writer
            // items' table (see `ScanTable::Counters`).
            counter_segments: vec![
                Segment::default();
                self.cfg.segments as usize
                    * if self.counting == Counting::Stream {
                        2
                    } else {
                        1
                    }
            ],
            lease_owner: me.to_owned(),
            lease_until_ms: lease_until(opts.deadline),
            invocations: ver_hint,
            stats: Stats::default(),
            finished_ms: None,
        };
        if opts.dry_run {
            // Nothing is written, so nothing is resumed either.
            return Ok(Claim::Go(
                Committed {
                    state: fresh(1),
                    version: 0,
                },
                "started",
            ));
        }
        let (current, ver) = match self.store.load_run().await? {
            None => (None, 0),
            Some(StoredRun {
                state: json,
                version: ver,
            }) => match serde_json::from_str::<RunState>(&json) {
                Ok(s) => (Some(s), ver),
                Err(e) => {
                    tracing::error!(error = %e, "unreadable reconcile run state; starting over");
                    (None, ver)
                }
            },
        };
        let (mut state, how) = match current {
            Some(s)
                if s.phase != RunPhase::Done && s.lease_until_ms > now && s.lease_owner != me =>
            {
                return Ok(Claim::Busy(Some(s)));
            }
            // A run older than this is abandoned (its chunks may be
            // expiring), and so is one in another state format: the next
            // start begins afresh.
            Some(s)
                if s.phase != RunPhase::Done
                    && (now - s.started_ms > MAX_RUN_AGE_MS || s.format != STATE_FORMAT) =>
            {
                tracing::warn!(run_id = %s.run_id, format = s.format, "abandoning a reconcile run that is too old or in another state format");
                if opts.mode == Mode::Resume {
                    return Ok(Claim::Idle(Some(s)));
                }
                (fresh(1), "started")
            }
            Some(mut s) if s.phase != RunPhase::Done => {
                s.lease_owner = me.to_owned();
                s.lease_until_ms = lease_until(opts.deadline);
                s.invocations += 1;
                (s, "resumed")
            }
            other if opts.mode == Mode::Resume => return Ok(Claim::Idle(other)),
            _ => (fresh(1), "started"),
        };
        let json = encode_state(&mut state)?;
        writes.take(write_units(json.len())).await;
        if !self.store.save_run(&json, ver).await? {
            return Ok(Claim::Busy(Some(state)));
        }
        Ok(Claim::Go(
            Committed {
                state,
                version: ver + 1,
            },
            how,
        ))
    }

    /// Best effort: clears the lease in the stored run state if `me` still
    /// holds it. On any failure the lease simply expires.
    pub(super) async fn release(&self, me: &str, writes: &Limiter) {
        let Ok(Some(StoredRun {
            state: json,
            version: ver,
        })) = self.store.load_run().await
        else {
            return;
        };
        let Ok(mut state) = serde_json::from_str::<RunState>(&json) else {
            return;
        };
        if state.lease_owner != me || state.dry_run {
            return;
        }
        state.lease_until_ms = 0;
        if let Ok(json) = encode_state(&mut state) {
            writes.take(write_units(json.len())).await;
            let _ = self.store.save_run(&json, ver).await;
        }
    }

    /// Writes the state (renewing the lease). A version conflict means
    /// another invocation took the run over: `Error::Conflict`.
    pub(super) async fn commit(&self, inv: &Inv<'_>) -> Result<(), Error> {
        self.commit_with(inv, false).await
    }

    /// [`Self::commit`], releasing the lease instead if `release`.
    pub(super) async fn commit_with(&self, inv: &Inv<'_>, release: bool) -> Result<(), Error> {
        let mut guard = inv.run.lock().await;
        let Committed { state, version } = &mut *guard;
        if state.dry_run {
            return Ok(());
        }
        state.lease_until_ms = if release {
            0
        } else {
            lease_until(inv.opts.deadline)
        };
        let json = encode_state(state)?;
        inv.writes.take(write_units(json.len())).await;
        if self.store.save_run(&json, *version).await? {
            *version += 1;
            Ok(())
        } else {
            tracing::warn!(run_id = %state.run_id, "reconcile run taken over by another invocation");
            Err(Error::Conflict {
                code: "run_taken_over",
                message: "another invocation holds the run".into(),
            })
        }
    }
}

fn lease_until(deadline: Option<Instant>) -> i64 {
    let left = match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()) + Duration::from_secs(30),
        None => LOCAL_LEASE,
    };
    now_ms() + left.as_millis() as i64
}

/// The chunk name of a segment's checkpoint `seq`, written by `owner`.
pub(super) fn part_name(segment: usize, seq: u64, owner: &str) -> String {
    format!("likes{segment}q{seq}w{owner}")
}

/// The state as stored: its JSON, after recording its own size in its
/// statistics. Refused (never written) past [`STATE_BYTES_MAX`].
fn encode_state(state: &mut RunState) -> Result<String, Error> {
    let encode = |state: &RunState| {
        serde_json::to_string(state)
            .map_err(|e| Error::internal("encoding the reconcile run state", e))
    };
    let mut json = encode(state)?;
    // Recording the size may lengthen it by a digit or two: settle it.
    for _ in 0..3 {
        let len = json.len() as u64;
        let stats = &mut state.stats;
        if stats.largest_state_bytes >= len && stats.largest_item_bytes >= len {
            break;
        }
        stats.largest_state_bytes = stats.largest_state_bytes.max(len);
        stats.largest_item_bytes = stats.largest_item_bytes.max(len);
        json = encode(state)?;
    }
    if json.len() > STATE_BYTES_MAX {
        return Err(Error::internal(
            "reconcile run state too large to store",
            format_args!("{} bytes", json.len()),
        ));
    }
    Ok(json)
}

/// `reel count` lines, split into chunks of at most [`CHUNK_BYTES`].
pub(super) fn encode_counts(counts: &HashMap<ReelId, u64>) -> Vec<Vec<u8>> {
    let mut chunks = vec![Vec::new()];
    for (reel, n) in counts {
        let line = format!("{} {n}\n", reel.as_str());
        if chunks
            .last()
            .is_some_and(|c| c.len() + line.len() > CHUNK_BYTES)
        {
            chunks.push(Vec::new());
        }
        if let Some(c) = chunks.last_mut() {
            c.extend_from_slice(line.as_bytes());
        }
    }
    chunks
}

/// The `reel count` lines of a chunk, in order.
pub(super) fn decode_counts(data: &[u8], into: &mut Vec<(ReelId, u64)>) -> Result<(), Error> {
    let bad =
        |cause: &dyn std::fmt::Display| Error::internal("unreadable reconcile count chunk", cause);
    let text = std::str::from_utf8(data).map_err(|e| bad(&e))?;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (reel, n) = line.split_once(' ').ok_or_else(|| bad(&line))?;
        let reel = ReelId::parse(reel).map_err(|e| bad(&e))?;
        let n: u64 = n.parse().map_err(|e| bad(&e))?;
        into.push((reel, n));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_trip_through_chunks() {
        let mut counts = HashMap::new();
        for i in 0..40_000u64 {
            counts.insert(ReelId::parse(&format!("reel-{i}")).unwrap(), i);
        }
        let chunks = encode_counts(&counts);
        assert!(chunks.len() > 1, "large counts split");
        assert!(chunks.iter().all(|c| c.len() <= CHUNK_BYTES));
        let mut lines = Vec::new();
        for c in &chunks {
            decode_counts(c, &mut lines).unwrap();
        }
        assert_eq!(lines.len(), counts.len(), "each reel once");
        let back: HashMap<ReelId, u64> = lines.into_iter().collect();
        assert_eq!(back, counts);
        assert!(decode_counts(b"bad line", &mut Vec::new()).is_err());
    }
}
