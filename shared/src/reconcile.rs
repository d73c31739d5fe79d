//! Reconciliation: recount every reel from the like rows (the truth) and
//! repair its shards where they drifted, at any table size.
//!
//! # Why the corrections are exact
//!
//! A like or unlike changes the like rows and the shard sum together (one
//! transaction), so a reel's drift `D = rows − Σn` only changes through
//! manual edits, restores, bugs, and corrections. A run:
//!
//! 1. scans the Likes table in parallel segments, counting rows per reel;
//! 2. then, per reel, reads its correction ledger, its settings and its
//!    shards (`n`, and `updated_at`, which every like/unlike transaction
//!    stamps on the shard it touches);
//! 3. defers the reel if it is resizing, or if any shard was stamped after
//!    `run start − REQUEST_TIMEOUT_MS − RECONCILE_CLOCK_SKEW_MS` (a stamp is
//!    the request's clock, at most a request timeout before its commit):
//!    then no like or unlike committed on the reel between the start of the
//!    scan and the read of its shards, so the rows counted are the rows at
//!    that read and `rows − Σn` is its drift at that moment, exactly;
//! 4. adds `D` to shard 0 (an increment: likes landing meanwhile keep `D`
//!    as it is, so nothing they add is lost), in one transaction with the
//!    ledger's next entry, conditioned on the ledger count read in step 2.
//!    Two runs, or a retried one, can therefore never both apply a
//!    correction computed from the same state.
//!
//! The rows counted for a reel live in the run's count item of that reel
//! (`recon#{run}#reel#{reel}`), so the check phase is one parallel scan of
//! the counters table: a count item is checked against its rows; a reel
//! met through any other item (shards written without rows, every like
//! removed) is checked against zero rows once it is claimed, unless it has
//! a count item.
//!
//! It converges: a deferred reel is one written during the run, which
//! likes/unlikes cannot make drift; the first run during which it stays
//! quiet corrects it.
//!
//! # Items outside the read range
//!
//! A shard item at or beyond a stable reel's `shards_to_sum()` (or a base
//! item before the reel's first shrink) is read by no reader, so it is not
//! part of the count; but a later grow would start reading it. The check
//! phase deletes every such item that is not empty, in one transaction
//! conditioned on the settings version it read and on the item still
//! holding what it read: the count shown does not change, and a resize
//! never adopts it. Resizing reels are left to the resize (a grow clears
//! the items it is about to read, under the same conditions).
//!
//! # At any size
//!
//! The run's state (phase, per-segment cursors and checkpoint numbers, the
//! one checkpoint per segment not yet added to the count items, statistics
//! with bounded samples) is checkpointed in the counters table under a
//! lease, so a run spans as many invocations as it needs; a crashed
//! invocation resumes from its last checkpoint, and nothing a committed
//! checkpoint covers is done again. Its size depends on the segment count
//! only ([`state_bytes_bound`]), never on rows or checkpoints:
//!
//! 1. a segment's checkpoint `k` writes the rows counted since `k − 1` as
//!    chunk items under this invocation's name (never overwriting another
//!    invocation's), then commits the cursor with "checkpoint `k` pending"
//!    in one conditional write of the state;
//! 2. it then adds each reel's rows to the reel's count item as segment
//!    `s`, checkpoint `k` (a conditional update that applies once per
//!    checkpoint), and the next commit drops the pending mark. A crash in
//!    between leaves the mark: the next invocation reads the chunks back and
//!    adds them again, which changes nothing that was already added. How far
//!    it got is committed at a deadline, so no invocation repeats it.
//!
//! Every write of a run (chunks, count items, claims, corrections, stray
//! removals and the state itself) is paced by `RECONCILE_MAX_WRITE_UNITS`,
//! and every read by `RECONCILE_MAX_READ_UNITS`.

use crate::clock::now_ms;
use crate::config::{Config, ReconcileConfig};
use crate::error::Error;
use crate::keys::{self, ReelId};
use crate::retry::Backoff;
use crate::store::{
    CorrectResult, CountItem, FoldResult, Phase, ReconcileStore, ScanPage, ScanTable, ShardValue,
};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// An invocation stops starting work this long before its deadline (or a
/// quarter of its time, if shorter), and checkpoints what it has.
const DEADLINE_SAFETY: Duration = Duration::from_secs(60);
/// How long a lease outlives the last checkpoint when the invocation has no
/// deadline of its own (a local run).
const LOCAL_LEASE: Duration = Duration::from_secs(120);
/// Checkpoint chunks stay this long (TTL), well past any run.
const CHUNK_TTL_SECS: i64 = 7 * 86_400;
/// An unfinished run older than this is abandoned.
const MAX_RUN_AGE_MS: i64 = 2 * 86_400_000;
/// Largest chunk item (DynamoDB's item limit is 400 KB).
const CHUNK_BYTES: usize = 350_000;
/// The run state is never written larger than this (far above
/// [`state_bytes_bound`] for the largest segment count allowed).
const STATE_BYTES_MAX: usize = 350_000;
/// The state format this code writes. A run in progress in another format
/// (an older release's, which listed every checkpoint) is started afresh.
const STATE_FORMAT: u32 = 2;
/// Reels checked between two checkpoints of a dry run's check phase.
const CHECK_BATCH: usize = 200;
/// Count-item updates sent at once, and between two deadline checks.
const APPLY_BATCH: usize = 64;
/// Reels checked at once.
const CHECK_CONCURRENCY: usize = 8;
/// Reels listed by name in a summary.
const SAMPLE: usize = 20;

/// Whether an invocation may start a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Continue the run in progress, or start a new one (the daily schedule).
    #[default]
    Start,
    /// Only continue a run in progress (the continuation schedule).
    Resume,
}

/// How one invocation runs: set by the scheduled event, or by tests.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Whether it may start a new run or only continue one.
    pub mode: Mode,
    /// Report, write nothing (not even checkpoints: a dry run lives in one
    /// invocation).
    pub dry_run: bool,
    /// When the invocation must have returned (the Lambda deadline; `None`
    /// locally): it stops starting work a safety margin before it.
    pub deadline: Option<Instant>,
    /// Scan only this many of the unfinished likes-scan segments, then stop:
    /// the crash of an invocation after some segments, for the resume tests.
    #[doc(hidden)]
    pub stop_after_segments: Option<usize>,
    /// Scan at most this many pages per segment, then checkpoint and stop:
    /// a crash in the middle of segments.
    #[doc(hidden)]
    pub stop_after_pages: Option<u32>,
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RunPhase {
    ScanLikes,
    /// Dry runs only: the reels counted in memory, in order.
    CheckReels,
    /// The check phase of a real run (and the rowless reels of a dry run):
    /// a parallel scan of the counters table.
    ScanCounters,
    Done,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Segment {
    cursor: Option<String>,
    done: bool,
    rows: u64,
    /// Likes scan: checkpoints committed (the number of the last).
    #[serde(default)]
    seq: u64,
    /// Likes scan: the last checkpoint, while its counts may not all be in
    /// the count items yet.
    #[serde(default)]
    pending: Option<Pending>,
}

/// A committed checkpoint whose counts are being added to the count items.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Pending {
    seq: u64,
    /// The invocation that wrote its chunks (part of their keys).
    owner: String,
    chunks: u32,
    /// Reels (lines of its chunks, in order) already added.
    applied: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Stats {
    rows_scanned: u64,
    /// Read units the scans consumed, as DynamoDB reported them.
    #[serde(default)]
    scan_read_units: f64,
    reels_checked: u64,
    reels_corrected: u64,
    reels_deferred: u64,
    total_abs_drift: u64,
    largest_drift: i64,
    largest_drift_reel: Option<String>,
    corrected_reels: Vec<String>,
    deferred_reels: Vec<String>,
    #[serde(default)]
    checkpoints: u64,
    /// Reel counts the committed checkpoints hold (lines of their chunks).
    #[serde(default)]
    count_lines: u64,
    /// Count-item updates sent: `count_lines` plus any repeated after a
    /// crash.
    #[serde(default)]
    count_writes: u64,
    /// Items outside their reel's read range that were not empty, deleted
    /// (dry run: found).
    #[serde(default)]
    strays_cleared: u64,
    #[serde(default)]
    stray_reels: Vec<String>,
    /// The largest item the run wrote (state or chunk), in bytes.
    #[serde(default)]
    largest_item_bytes: u64,
    #[serde(default)]
    largest_state_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct RunState {
    #[serde(default)]
    format: u32,
    run_id: String,
    dry_run: bool,
    started_ms: i64,
    phase: RunPhase,
    segments: Vec<Segment>,
    /// Dry runs' check phase: the last reel (in sorted order) done.
    reel_cursor: Option<String>,
    counter_segments: Vec<Segment>,
    lease_owner: String,
    lease_until_ms: i64,
    invocations: u32,
    stats: Stats,
    finished_ms: Option<i64>,
}

/// What an invocation reports (its result and a structured log line).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The run this invocation worked on (`None`: no run, e.g. `idle`).
    pub run_id: Option<String>,
    /// `started`, `resumed`, `busy` (another invocation holds the run) or
    /// `idle` (resume mode, no run in progress).
    pub invocation: &'static str,
    /// The run reports and writes nothing.
    pub dry_run: bool,
    /// The run finished (in this invocation or before).
    pub complete: bool,
    /// Where the run stands: `scan_likes`, `check_reels` (dry runs),
    /// `scan_counters`, `done`, or `none` without a run.
    pub phase: String,
    /// Like rows the likes scan has counted so far, all segments.
    pub rows_scanned: u64,
    /// Read units the run's scans consumed (DynamoDB's ConsumedCapacity).
    pub scan_read_units: f64,
    /// Reels compared with their rows so far.
    pub reels_checked: u64,
    /// Reels found to drift and corrected (a dry run: that would be).
    pub reels_corrected: u64,
    /// Reels left for a later run: resizing or resized, written or corrected
    /// meanwhile, contended, or not readable.
    pub reels_deferred: u64,
    /// The sum of the corrected drifts' absolute values.
    pub total_abs_drift: u64,
    /// The corrected drift of the largest magnitude (0: none).
    pub largest_drift: i64,
    /// The reel of `largest_drift`.
    pub largest_drift_reel: Option<String>,
    /// Up to 20 of the corrected reels, a sample for the log.
    pub corrected_reels: Vec<String>,
    /// Up to 20 of the deferred reels, a sample for the log.
    pub deferred_reels: Vec<String>,
    /// Likes-scan segments of the run (`RECONCILE_SEGMENTS` when it started).
    pub segments: u32,
    /// Likes-scan segments finished (by any invocation of the run).
    pub segments_done: usize,
    /// Likes-scan segments this invocation scanned (part of).
    pub segments_scanned: usize,
    /// Invocations that have worked on the run, this one included.
    pub invocations: u32,
    /// Likes-scan checkpoints the run committed.
    pub checkpoints: u64,
    /// Reel counts its checkpoints held.
    pub count_lines: u64,
    /// Count-item updates the run sent to add them: `count_lines`, more
    /// only if a crash made it repeat some.
    pub count_writes: u64,
    /// Non-empty items outside their reel's read range deleted (a dry run:
    /// found).
    pub strays_cleared: u64,
    /// Up to 20 of those items' reels, a sample for the log.
    pub stray_reels: Vec<String>,
    /// The largest item the run wrote (its state or a chunk), in bytes.
    pub largest_item_bytes: u64,
    /// The largest run state it wrote, in bytes (bounded by
    /// [`state_bytes_bound`]).
    pub largest_state_bytes: u64,
    /// How long this invocation took, in milliseconds.
    pub duration_ms: u64,
    /// How long the run has taken from its start to its end (or to now),
    /// across invocations, in milliseconds.
    pub run_duration_ms: u64,
}

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

/// Spaces calls so that their capacity units stay under a rate.
struct Limiter {
    per_sec: f64,
    next: std::sync::Mutex<Instant>,
}

impl Limiter {
    fn new(per_sec: f64) -> Self {
        Limiter {
            per_sec,
            next: std::sync::Mutex::new(Instant::now()),
        }
    }

    async fn take(&self, units: f64) {
        let wait = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + Duration::from_secs_f64(units.max(0.0) / self.per_sec);
            start - now
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Runs reconciliation over a [`ReconcileStore`]: one [`Reconciler::run`]
/// per invocation, a run spanning as many as it needs.
pub struct Reconciler<S> {
    store: S,
    cfg: ReconcileConfig,
    /// `REQUEST_TIMEOUT_MS` + `DDB_OPERATION_TIMEOUT_MS` +
    /// `RECONCILE_CLOCK_SKEW_MS`.
    margin_ms: i64,
    backoff: Backoff,
}

/// The run state as this invocation last committed it (or is about to),
/// and the version it was committed at.
struct Committed {
    state: RunState,
    version: u64,
}

/// One invocation: the run state its tasks share, its options, and the
/// limiters that pace every call it makes.
struct Inv<'a> {
    run: Mutex<Committed>,
    opts: &'a Options,
    reads: Limiter,
    writes: Limiter,
    /// A dry run keeps its counts here: it writes nothing.
    dry_counts: Mutex<HashMap<ReelId, u64>>,
}

/// A task of an invocation, boxed so that it is `Send` for the lifetimes it
/// borrows (rustc cannot prove that through nested closures otherwise).
type Task<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Whether the (already safety-adjusted) deadline has come.
fn near(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Write units of an item of `bytes` (one per KB started).
fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

/// Read units of a consistent read of an item of `bytes` (one per 4 KB).
fn read_units(bytes: usize) -> f64 {
    bytes.div_ceil(4096).max(1) as f64
}

impl<S: ReconcileStore> Reconciler<S> {
    /// A reconciler over `store`, with the reconcile settings of `config`.
    pub fn new(store: S, config: &Config) -> Self {
        Reconciler {
            store,
            cfg: config.reconcile.clone(),
            // A stamp is the request's clock; its commit may land up to a
            // request timeout later, and the SDK's last attempt up to an
            // operation timeout after the client gave up.
            margin_ms: (config.request_timeout
                + config.ddb_operation_timeout
                + config.reconcile.clock_skew)
                .as_millis() as i64,
            backoff: Backoff::from_config(config),
        }
    }

    /// The store it reads and repairs, for tests that inspect it.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// One invocation: starts or resumes the run and takes it as far as the
    /// deadline allows.
    pub async fn run(&self, opts: &Options) -> Result<Summary, Error> {
        let began = Instant::now();
        let opts = &Options {
            deadline: opts.deadline.map(|d| {
                let left = d.saturating_duration_since(began);
                d.checked_sub(DEADLINE_SAFETY.min(left / 4)).unwrap_or(d)
            }),
            ..opts.clone()
        };
        let me = format!("{:016x}", fastrand::u64(..));
        let writes = Limiter::new(self.cfg.max_write_units);
        let (state, version, invocation) = match self.claim(opts, &me, &writes).await? {
            Claim::Go(state, ver, how) => (state, ver, how),
            Claim::Busy(state) => return Ok(self.summary(state.as_ref(), "busy", began, 0)),
            Claim::Idle(state) => return Ok(self.summary(state.as_ref(), "idle", began, 0)),
        };
        let inv = Inv {
            run: Mutex::new(Committed { state, version }),
            opts,
            reads: Limiter::new(self.cfg.max_read_units),
            writes,
            dry_counts: Mutex::new(HashMap::new()),
        };
        let scanned = match self.drive(&inv).await {
            Ok(n) => n,
            Err(Error::Conflict { .. }) => {
                // Lost the lease to another invocation: it carries on.
                let state = inv.run.lock().await.state.clone();
                return Ok(self.summary(Some(&state), "busy", began, 0));
            }
            Err(e) => {
                // Failing is stopping too: hand the run over now rather than
                // when the lease expires. Only the lease of the committed
                // state changes; what was not checkpointed is redone, as
                // after a crash.
                self.release(&me, &inv.writes).await;
                return Err(e);
            }
        };
        // Stopping on purpose (done, or at the deadline) hands the run over
        // at once; only a crash leaves the lease to expire.
        match self.commit_with(&inv, true).await {
            Ok(()) | Err(Error::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
        let state = inv.run.lock().await.state.clone();
        let summary = self.summary(Some(&state), invocation, began, scanned);
        tracing::info!(
            run_id = %state.run_id,
            invocation,
            dry_run = state.dry_run,
            complete = summary.complete,
            phase = %summary.phase,
            rows_scanned = summary.rows_scanned,
            reels_checked = summary.reels_checked,
            reels_corrected = summary.reels_corrected,
            reels_deferred = summary.reels_deferred,
            total_abs_drift = summary.total_abs_drift,
            largest_drift = summary.largest_drift,
            strays_cleared = summary.strays_cleared,
            checkpoints = summary.checkpoints,
            largest_item_bytes = summary.largest_item_bytes,
            duration_ms = summary.duration_ms,
            "reconcile"
        );
        Ok(summary)
    }

    async fn claim(&self, opts: &Options, me: &str, writes: &Limiter) -> Result<Claim, Error> {
        let now = now_ms();
        let fresh = |ver_hint: u32| RunState {
            format: STATE_FORMAT,
            run_id: format!("{now}-{:08x}", fastrand::u32(..)),
            dry_run: opts.dry_run,
            started_ms: now,
            phase: RunPhase::ScanLikes,
            segments: vec![Segment::default(); self.cfg.segments as usize],
            reel_cursor: None,
            counter_segments: vec![Segment::default(); self.cfg.segments as usize],
            lease_owner: me.to_owned(),
            lease_until_ms: lease_until(opts.deadline),
            invocations: ver_hint,
            stats: Stats::default(),
            finished_ms: None,
        };
        if opts.dry_run {
            // Nothing is written, so nothing is resumed either.
            return Ok(Claim::Go(fresh(1), 0, "started"));
        }
        let (current, ver) = match self.store.load_run().await? {
            None => (None, 0),
            Some((json, ver)) => match serde_json::from_str::<RunState>(&json) {
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
        Ok(Claim::Go(state, ver + 1, how))
    }

    /// Best effort: clears the lease in the stored run state if `me` still
    /// holds it. On any failure the lease simply expires.
    async fn release(&self, me: &str, writes: &Limiter) {
        let Ok(Some((json, ver))) = self.store.load_run().await else {
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
    async fn commit(&self, inv: &Inv<'_>) -> Result<(), Error> {
        self.commit_with(inv, false).await
    }

    async fn commit_with(&self, inv: &Inv<'_>, release: bool) -> Result<(), Error> {
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

    /// Runs the phases; returns how many likes segments it scanned.
    async fn drive(&self, inv: &Inv<'_>) -> Result<usize, Error> {
        let mut scanned = 0;
        loop {
            let (phase, dry) = {
                let g = inv.run.lock().await;
                (g.state.phase, g.state.dry_run)
            };
            match phase {
                RunPhase::ScanLikes => {
                    let (done, n) = self.scan_likes(inv).await?;
                    scanned += n;
                    if !done {
                        return Ok(scanned);
                    }
                    inv.run.lock().await.state.phase = if dry {
                        RunPhase::CheckReels
                    } else {
                        RunPhase::ScanCounters
                    };
                    self.commit(inv).await?;
                }
                RunPhase::CheckReels => {
                    if !self.check_counted(inv).await? {
                        return Ok(scanned);
                    }
                    inv.run.lock().await.state.phase = RunPhase::ScanCounters;
                    self.commit(inv).await?;
                }
                RunPhase::ScanCounters => {
                    if !self.scan_counters(inv).await? {
                        return Ok(scanned);
                    }
                    {
                        let mut g = inv.run.lock().await;
                        g.state.phase = RunPhase::Done;
                        g.state.finished_ms = Some(now_ms());
                    }
                    self.commit(inv).await?;
                }
                RunPhase::Done => return Ok(scanned),
            }
        }
    }

    /// The likes scan: every unfinished segment at once. Returns whether
    /// all segments are done (with their counts in the count items), and
    /// how many it scanned (part of).
    async fn scan_likes(&self, inv: &Inv<'_>) -> Result<(bool, usize), Error> {
        let mut todo: Vec<(usize, Segment)> = {
            let g = inv.run.lock().await;
            g.state
                .segments
                .iter()
                .cloned()
                .enumerate()
                .filter(|(_, s)| !s.done || s.pending.is_some())
                .collect()
        };
        if let Some(k) = inv.opts.stop_after_segments {
            todo.truncate(k);
        }
        let n = todo.len();
        let tasks: Vec<Task<'_, Result<(), Error>>> = todo
            .into_iter()
            .map(|(i, seg)| Box::pin(self.scan_segment(inv, i, seg)) as Task<'_, _>)
            .collect();
        let results: Vec<Result<(), Error>> = futures::stream::iter(tasks)
            .buffer_unordered(self.cfg.segments as usize)
            .collect()
            .await;
        for r in results {
            r?;
        }
        let all_done = inv
            .run
            .lock()
            .await
            .state
            .segments
            .iter()
            .all(|s| s.done && s.pending.is_none());
        Ok((all_done, n))
    }

    /// Scans one segment from its cursor, first finishing the checkpoint a
    /// previous invocation left pending. The rows counted since the last
    /// checkpoint are all it holds in memory.
    async fn scan_segment(
        &self,
        inv: &Inv<'_>,
        index: usize,
        mut seg: Segment,
    ) -> Result<(), Error> {
        if seg.pending.is_some() && !self.apply_pending(inv, index, &mut seg, None).await? {
            return Ok(());
        }
        if seg.done {
            return Ok(());
        }
        let mut delta: HashMap<ReelId, u64> = HashMap::new();
        let mut pages = 0u32;
        let mut unsaved = 0u32;
        loop {
            let page_limit = inv.opts.stop_after_pages.is_some_and(|max| pages >= max);
            // At least one page per invocation, however near its deadline:
            // every invocation moves the run on.
            if page_limit || (pages > 0 && near(inv.opts.deadline)) {
                if unsaved > 0 {
                    self.checkpoint_segment(inv, index, &mut seg, &mut delta)
                        .await?;
                }
                return Ok(());
            }
            let page = self.next_page(inv, ScanTable::Likes, index, &seg).await?;
            for r in page.reels {
                *delta.entry(r).or_default() += 1;
            }
            seg.rows += page.items;
            seg.cursor = page.next;
            seg.done = seg.cursor.is_none();
            pages += 1;
            unsaved += 1;
            if seg.done || unsaved >= self.cfg.checkpoint_pages {
                if !self
                    .checkpoint_segment(inv, index, &mut seg, &mut delta)
                    .await?
                {
                    return Ok(());
                }
                unsaved = 0;
            }
            if seg.done {
                return Ok(());
            }
        }
    }

    /// The next page of a segment of either scan, paid for in the read
    /// limiter and the run's statistics.
    async fn next_page(
        &self,
        inv: &Inv<'_>,
        table: ScanTable,
        index: usize,
        seg: &Segment,
    ) -> Result<ScanPage, Error> {
        // The run's own segment count: RECONCILE_SEGMENTS may have changed
        // since the run started.
        let total = {
            let g = inv.run.lock().await;
            match table {
                ScanTable::Likes => g.state.segments.len(),
                ScanTable::Counters => g.state.counter_segments.len(),
            }
        } as u32;
        let page = self
            .store
            .scan_page(
                table,
                index as u32,
                total,
                seg.cursor.as_deref(),
                self.cfg.page_items,
            )
            .await?;
        inv.reads.take(page.read_units).await;
        inv.run.lock().await.state.stats.scan_read_units += page.read_units;
        Ok(page)
    }

    /// Checkpoint `seq + 1` of a segment: the rows counted since the last
    /// one go to chunk items keyed by this invocation (no other
    /// invocation's chunks are ever overwritten), then the cursor and the
    /// pending mark are committed in one conditional write of the run state
    /// (a crash in between leaves the previous checkpoint whole), then the
    /// counts are added to the count items. Returns `false` if the deadline
    /// came while adding them (what was added is committed).
    async fn checkpoint_segment(
        &self,
        inv: &Inv<'_>,
        index: usize,
        seg: &mut Segment,
        delta: &mut HashMap<ReelId, u64>,
    ) -> Result<bool, Error> {
        let (run_id, owner, dry) = {
            let g = inv.run.lock().await;
            (
                g.state.run_id.clone(),
                g.state.lease_owner.clone(),
                g.state.dry_run,
            )
        };
        let mut written = None;
        let lines = delta.len() as u64;
        if dry {
            let mut all = inv.dry_counts.lock().await;
            for (r, n) in delta.drain() {
                *all.entry(r).or_default() += n;
            }
        } else if !delta.is_empty() {
            let seq = seg.seq + 1;
            let chunks = encode_counts(delta);
            let expires = now_ms() / 1000 + CHUNK_TTL_SECS;
            let name = part_name(index, seq, &owner);
            for (i, data) in chunks.iter().enumerate() {
                inv.writes.take(write_units(data.len())).await;
                let key = keys::reconcile_chunk_key(&run_id, &name, i as u32);
                self.store.put_chunk(&key, data, expires).await?;
                let stats = &mut inv.run.lock().await.state.stats;
                stats.largest_item_bytes = stats.largest_item_bytes.max(data.len() as u64);
            }
            seg.seq = seq;
            seg.pending = Some(Pending {
                seq,
                owner,
                chunks: chunks.len() as u32,
                applied: 0,
            });
            delta.clear();
            written = Some(chunks);
        }
        {
            let mut g = inv.run.lock().await;
            g.state.segments[index] = seg.clone();
            g.state.stats.rows_scanned = g.state.segments.iter().map(|s| s.rows).sum();
            g.state.stats.checkpoints += 1;
            g.state.stats.count_lines += written.as_ref().map_or(0, |_| lines);
        }
        self.commit(inv).await?;
        match written {
            Some(chunks) => self.apply_pending(inv, index, seg, Some(chunks)).await,
            None => Ok(true),
        }
    }

    /// Adds the segment's pending checkpoint to the count items, from
    /// `chunks` (as just written) or from its stored chunks, skipping what
    /// was already recorded as added. At the deadline it commits how far it
    /// got and returns `false`; done, it clears the mark (committed with the
    /// next commit) and returns `true`.
    async fn apply_pending(
        &self,
        inv: &Inv<'_>,
        index: usize,
        seg: &mut Segment,
        chunks: Option<Vec<Vec<u8>>>,
    ) -> Result<bool, Error> {
        let Some(pending) = seg.pending.clone() else {
            return Ok(true);
        };
        let run_id = inv.run.lock().await.state.run_id.clone();
        let chunks = match chunks {
            Some(c) => c,
            None => {
                let name = part_name(index, pending.seq, &pending.owner);
                let mut out = Vec::with_capacity(pending.chunks as usize);
                for i in 0..pending.chunks {
                    let key = keys::reconcile_chunk_key(&run_id, &name, i);
                    let data = self.store.get_chunk(&key).await?.ok_or_else(|| {
                        tracing::error!(key, "a committed checkpoint chunk is missing");
                        Error::Internal
                    })?;
                    inv.reads.take(read_units(data.len())).await;
                    out.push(data);
                }
                out
            }
        };
        let mut lines = Vec::new();
        for c in &chunks {
            decode_counts(c, &mut lines)?;
        }
        let expires = now_ms() / 1000 + CHUNK_TTL_SECS;
        // A count item holds two small numbers per segment.
        let units = write_units(64 + 24 * inv.run.lock().await.state.segments.len());
        let mut applied = (pending.applied as usize).min(lines.len());
        let mut first = true;
        while applied < lines.len() {
            if !first && near(inv.opts.deadline) {
                if let Some(p) = seg.pending.as_mut() {
                    p.applied = applied as u64;
                }
                inv.run.lock().await.state.segments[index] = seg.clone();
                self.commit(inv).await?;
                return Ok(false);
            }
            first = false;
            let batch = &lines[applied..(applied + APPLY_BATCH).min(lines.len())];
            let run_id = &run_id;
            let tasks: Vec<Task<'_, Result<(), Error>>> = batch
                .iter()
                .map(|(reel, rows)| {
                    Box::pin(async move {
                        inv.writes.take(units).await;
                        self.store
                            .add_run_count(run_id, reel, index as u32, pending.seq, *rows, expires)
                            .await
                    }) as Task<'_, _>
                })
                .collect();
            let results: Vec<Result<(), Error>> = futures::stream::iter(tasks)
                .buffer_unordered(CHECK_CONCURRENCY)
                .collect()
                .await;
            for r in results {
                r?;
            }
            applied += batch.len();
            inv.run.lock().await.state.stats.count_writes += batch.len() as u64;
        }
        seg.pending = None;
        inv.run.lock().await.state.segments[index] = seg.clone();
        Ok(true)
    }

    /// A dry run's check of every reel it counted, in order, from its
    /// cursor. Returns whether it got through all of them.
    async fn check_counted(&self, inv: &Inv<'_>) -> Result<bool, Error> {
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
    async fn scan_counters(&self, inv: &Inv<'_>) -> Result<bool, Error> {
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
                        seg.rows += page.items;
                        seg.cursor = page.next;
                        seg.done = seg.cursor.is_none();
                        unsaved += 1;
                        if seg.done || unsaved >= self.cfg.checkpoint_pages {
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
        let (run_id, started_ms, dry) = {
            let g = inv.run.lock().await;
            (g.state.run_id.clone(), g.state.started_ms, g.state.dry_run)
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
        // A resize step during the run moves counts between items (a fold
        // carries no like's stamp) and changes which items are summed.
        if view.settings.phase_at_ms >= started_ms - self.margin_ms {
            return Ok(Outcome::Deferred("resized_during_run"));
        }
        if view.sum.last_write_ms >= started_ms - self.margin_ms {
            return Ok(Outcome::Deferred("written_during_run"));
        }
        let drift = rows as i64 - view.sum.n;
        if drift == 0 {
            return Ok(Outcome::Agrees);
        }
        if dry {
            return Ok(Outcome::Drift(drift));
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            inv.writes.take(4.0).await;
            match self
                .store
                .correct(reel, drift, view.ledger.corrections, &run_id)
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

    fn summary(
        &self,
        state: Option<&RunState>,
        invocation: &'static str,
        began: Instant,
        segments_scanned: usize,
    ) -> Summary {
        let stats = state.map(|s| s.stats.clone()).unwrap_or_default();
        Summary {
            run_id: state.map(|s| s.run_id.clone()),
            invocation,
            dry_run: state.is_some_and(|s| s.dry_run),
            complete: state.is_some_and(|s| s.phase == RunPhase::Done),
            phase: state
                .map(|s| {
                    serde_json::to_value(s.phase)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                })
                .unwrap_or_else(|| "none".into()),
            rows_scanned: stats.rows_scanned,
            scan_read_units: stats.scan_read_units,
            reels_checked: stats.reels_checked,
            reels_corrected: stats.reels_corrected,
            reels_deferred: stats.reels_deferred,
            total_abs_drift: stats.total_abs_drift,
            largest_drift: stats.largest_drift,
            largest_drift_reel: stats.largest_drift_reel,
            corrected_reels: stats.corrected_reels,
            deferred_reels: stats.deferred_reels,
            segments: state.map_or(self.cfg.segments, |s| s.segments.len() as u32),
            segments_done: state.map_or(0, |s| s.segments.iter().filter(|g| g.done).count()),
            segments_scanned,
            invocations: state.map_or(0, |s| s.invocations),
            checkpoints: stats.checkpoints,
            count_lines: stats.count_lines,
            count_writes: stats.count_writes,
            strays_cleared: stats.strays_cleared,
            stray_reels: stats.stray_reels,
            largest_item_bytes: stats.largest_item_bytes,
            largest_state_bytes: stats.largest_state_bytes,
            duration_ms: began.elapsed().as_millis() as u64,
            run_duration_ms: state.map_or(0, |s| {
                (s.finished_ms.unwrap_or_else(now_ms) - s.started_ms).max(0) as u64
            }),
        }
    }
}

enum Claim {
    Go(RunState, u64, &'static str),
    Busy(Option<RunState>),
    Idle(Option<RunState>),
}

fn lease_until(deadline: Option<Instant>) -> i64 {
    let left = match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()) + Duration::from_secs(30),
        None => LOCAL_LEASE,
    };
    now_ms() + left.as_millis() as i64
}

/// The chunk name of a segment's checkpoint `seq`, written by `owner`.
fn part_name(segment: usize, seq: u64, owner: &str) -> String {
    format!("likes{segment}q{seq}w{owner}")
}

/// The state as stored: its JSON, after recording its own size in its
/// statistics. Refused (never written) past [`STATE_BYTES_MAX`].
fn encode_state(state: &mut RunState) -> Result<String, Error> {
    let mut json = serde_json::to_string(state).map_err(|_| Error::Internal)?;
    // Recording the size may lengthen it by a digit or two: settle it.
    for _ in 0..3 {
        let len = json.len() as u64;
        let stats = &mut state.stats;
        if stats.largest_state_bytes >= len && stats.largest_item_bytes >= len {
            break;
        }
        stats.largest_state_bytes = stats.largest_state_bytes.max(len);
        stats.largest_item_bytes = stats.largest_item_bytes.max(len);
        json = serde_json::to_string(state).map_err(|_| Error::Internal)?;
    }
    if json.len() > STATE_BYTES_MAX {
        tracing::error!(bytes = json.len(), "reconcile run state too large to store");
        return Err(Error::Internal);
    }
    Ok(json)
}

/// `reel count` lines, split into chunks of at most [`CHUNK_BYTES`].
fn encode_counts(counts: &HashMap<ReelId, u64>) -> Vec<Vec<u8>> {
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
fn decode_counts(data: &[u8], into: &mut Vec<(ReelId, u64)>) -> Result<(), Error> {
    let text = std::str::from_utf8(data).map_err(|_| Error::Internal)?;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (reel, n) = line.split_once(' ').ok_or(Error::Internal)?;
        let reel = ReelId::parse(reel).map_err(|_| Error::Internal)?;
        let n: u64 = n.parse().map_err(|_| Error::Internal)?;
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

    #[tokio::test]
    async fn the_limiter_spaces_calls_by_their_units() {
        let l = Limiter::new(100.0);
        let t = Instant::now();
        for _ in 0..5 {
            l.take(10.0).await;
        }
        // 50 units at 100/s: the first is free, the rest take ~0.4 s.
        let e = t.elapsed();
        assert!(e >= Duration::from_millis(380), "{e:?}");
    }
}
