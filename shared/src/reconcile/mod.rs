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
//! # Stream mode
//!
//! In stream mode a like writes its row only; the shards take it later,
//! from the table's stream. Rows and shards then differ by the records in
//! flight, and a reel's rows keep changing while the scan counts them, so
//! the rule above would defer every active reel. Instead a run counts
//! rows *at a cut* `T` (a bucket start, a request timeout and the clock
//! skew before the run starts), and compares them with what the shards
//! hold from the records of before `T`:
//!
//! 1. the likes scan counts only rows liked before `T` (a row's
//!    `liked_at`; each was committed before the scan began). A row liked
//!    at or after `T` is left out, however the scan meets it;
//! 2. the aggregator records on each shard item, beside `n`, what it added
//!    by time bucket ([`crate::keys::recent_delta_attr`]): a new row by its
//!    `liked_at`, a removal by its stream timestamp, and how many removals
//!    a bucket held. So `n − Σ(buckets from T on)` is what the item holds
//!    from the records of before `T`, whenever it is read;
//! 3. the run compares reels only once every record made before its likes
//!    scan ended can have been applied ([`ReconcileConfig::stream_settle`]:
//!    the event source's `MaximumRecordAgeInSeconds`, or the stream's
//!    24 hours, plus a margin), waiting or handing the run to the
//!    continuation schedule meanwhile: records in flight are never
//!    corrected;
//! 4. a reel with a removal from `T` on is deferred: a row liked before `T`
//!    and removed before the scan reached it is in no count. Likes alone,
//!    however many, do not stop a reel from being compared.
//!
//! Then `rows − (Σn − Σ(buckets from T on))` is the reel's drift at `T`,
//! exactly; it is corrected as above. A reel that keeps taking likes is
//! repaired by one run; one that takes unlikes all the time waits for a run
//! during which it takes none (the table's key is the user, so a reel's
//! rows cannot be counted at one instant without a snapshot of the table).
//! Buckets are [`RecentWindow`] wide and kept for four settle times. Only
//! the aggregator drops them, by its writes, each of which stamps the item
//! (`updated_at`): so a reel whose last stamp is within that window of the
//! cut still holds every bucket from it, however long after the run
//! reaches it, and one written later is deferred. A scan of any length
//! thus repairs the reels quiet since its cut.
//!
//! # Items outside the read range
//!
//! A shard item at or beyond a stable reel's `shards_to_sum()` (or a base
//! item before the reel's first shrink) is read by no reader, so it is not
//! part of the count; but a later grow would start reading it. The check
//! phase empties every such item that is not empty, in one transaction
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
//!
//! # Layout
//!
//! * `state`: the run state and how it is stored: its lease (claim,
//!   commit, release), its encoding and the checkpoint chunks.
//! * `scan`: the likes scan, segment by segment, and its checkpoints.
//! * `check`: the check phase: the scan of the counters table, the
//!   per-reel check and correction, stray items.
//! * `pace`: the limiter that paces every read and write of a run.

use crate::clock::now_ms;
use crate::config::{Config, Counting, RecentWindow, ReconcileConfig};
use crate::error::Error;
use crate::keys::ReelId;
use crate::retry::Backoff;
use crate::store::ReconcileStore;
use pace::Limiter;
use serde::{Deserialize, Serialize};
use state::{Claim, Committed, RunPhase, RunState};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

pub use state::state_bytes_bound;

mod check;
mod pace;
mod scan;
mod state;

/// An invocation stops starting work this long before its deadline (or a
/// quarter of its time, if shorter), and checkpoints what it has.
const DEADLINE_SAFETY: Duration = Duration::from_secs(60);
/// Reels checked at once (the check phase), and count-item updates sent
/// at once (the likes scan's checkpoints).
const CHECK_CONCURRENCY: usize = 8;
/// Without a deadline (a local run), stream mode's wait for the records in
/// flight is slept through if it is no longer than this; otherwise the
/// invocation ends and a later one resumes.
const LOCAL_STREAM_WAIT: Duration = Duration::from_secs(300);
/// With a deadline (Lambda), the longest such wait slept through.
const LAMBDA_STREAM_WAIT: Duration = Duration::from_secs(60);

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
    /// Like rows the likes scan has read so far, all segments.
    pub rows_scanned: u64,
    /// Stream mode: rows read but left out as liked at or after the cut.
    pub rows_after_cut: u64,
    /// Stream mode: the moment the run counts rows at (Unix ms).
    pub cut_ms: Option<i64>,
    /// Stream mode: when the run may compare its reels, once the likes
    /// scan is done (Unix ms): the records made before can all have been
    /// applied by then.
    pub stream_ready_at_ms: Option<i64>,
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

/// Runs reconciliation over a [`ReconcileStore`]: one [`Reconciler::run`]
/// per invocation, a run spanning as many as it needs.
pub struct Reconciler<S> {
    store: S,
    cfg: ReconcileConfig,
    /// `REQUEST_TIMEOUT_MS` + `DDB_OPERATION_TIMEOUT_MS` +
    /// `RECONCILE_CLOCK_SKEW_MS`.
    margin_ms: i64,
    backoff: Backoff,
    /// See [`Config::counting`]: stream mode counts rows at a cut.
    counting: Counting,
    /// [`ReconcileConfig::stream_settle`], in milliseconds.
    stream_settle_ms: i64,
    /// `RECONCILE_CLOCK_SKEW_MS`, in milliseconds.
    skew_ms: i64,
    /// The shard items' recent-change buckets (stream mode).
    window: RecentWindow,
    /// See [`Config::stream_since_ms`].
    stream_since_ms: i64,
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
            counting: config.counting,
            stream_settle_ms: config.reconcile.stream_settle.as_millis() as i64,
            skew_ms: config.reconcile.clock_skew.as_millis() as i64,
            window: config.reconcile.recent_window(),
            stream_since_ms: config.stream_since_ms,
        }
    }

    /// Stream mode: the cut of a run started at `started_ms` (see
    /// [Stream mode](#stream-mode)): a request timeout and the clock skew
    /// before it, down to a bucket start, so that every row liked before
    /// the cut was committed before the scan began.
    pub(super) fn cut_ms(&self, started_ms: i64) -> Option<i64> {
        (self.counting == Counting::Stream).then(|| {
            let w = self.window.width_ms;
            (started_ms - self.margin_ms).div_euclid(w) * w
        })
    }

    /// Stream mode: when a run whose likes scan ended at `likes_done_ms`
    /// may compare its reels (every record made before can have been
    /// applied by then, or given up).
    pub(super) fn stream_ready_ms(&self, likes_done_ms: i64) -> i64 {
        // Stream timestamps are whole seconds.
        likes_done_ms + self.stream_settle_ms + self.skew_ms + 1_000
    }

    /// Stream mode: waits until the run may compare reels, if the deadline
    /// allows (or, without one, if it is near); `false`: not yet, the
    /// continuation schedule resumes the run.
    async fn wait_for_stream(&self, inv: &Inv<'_>) -> bool {
        let ready = {
            let g = inv.run.lock().await;
            match (g.state.cut_ms, g.state.likes_done_ms) {
                (Some(_), Some(done)) => self.stream_ready_ms(done),
                _ => return true,
            }
        };
        let wait = ready - now_ms();
        if wait <= 0 {
            return true;
        }
        let wait = Duration::from_millis(wait as u64);
        let fits = match inv.opts.deadline {
            // A Lambda invocation is billed while it sleeps: a short wait
            // only; the continuation schedule comes back for a long one.
            Some(d) => wait <= LAMBDA_STREAM_WAIT && Instant::now() + wait < d,
            None => wait <= LOCAL_STREAM_WAIT,
        };
        if !fits {
            tracing::info!(
                ready_at_ms = ready,
                "reconcile waits for the stream records in flight; the continuation resumes it"
            );
            return false;
        }
        tokio::time::sleep(wait).await;
        true
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
        let (run, invocation) = match self.claim(opts, &me, &writes).await? {
            Claim::Go(run, how) => (run, how),
            Claim::Busy(state) => return Ok(self.summary(state.as_ref(), "busy", began, 0)),
            Claim::Idle(state) => return Ok(self.summary(state.as_ref(), "idle", began, 0)),
        };
        let inv = Inv {
            run: Mutex::new(run),
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
                    let scan = self.scan_likes(inv).await?;
                    scanned += scan.segments;
                    if !scan.all_done {
                        return Ok(scanned);
                    }
                    {
                        let mut g = inv.run.lock().await;
                        g.state.phase = if dry {
                            RunPhase::CheckReels
                        } else {
                            RunPhase::ScanCounters
                        };
                        g.state.likes_done_ms = Some(now_ms());
                    }
                    self.commit(inv).await?;
                }
                RunPhase::CheckReels => {
                    if !self.wait_for_stream(inv).await || !self.check_counted(inv).await? {
                        return Ok(scanned);
                    }
                    inv.run.lock().await.state.phase = RunPhase::ScanCounters;
                    self.commit(inv).await?;
                }
                RunPhase::ScanCounters => {
                    if !self.wait_for_stream(inv).await || !self.scan_counters(inv).await? {
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
            rows_after_cut: stats.rows_after_cut,
            cut_ms: state.and_then(|s| s.cut_ms),
            stream_ready_at_ms: state
                .filter(|s| s.cut_ms.is_some())
                .and_then(|s| s.likes_done_ms)
                .map(|d| self.stream_ready_ms(d)),
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
