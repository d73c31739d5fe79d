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
//! Reels only in the counters table (every like removed, or shards written
//! without rows) are found by a second parallel scan, of the counters
//! table, and reconciled against zero rows.
//!
//! It converges: a deferred reel is one written during the run, which
//! likes/unlikes cannot make drift; the first run during which it stays
//! quiet corrects it.
//!
//! # At any size
//!
//! The run's state (phase, per-segment cursors, partial counts in chunk
//! items, the reel cursor of the check phase, statistics) is checkpointed in
//! the counters table under a lease, so a run spans as many invocations as
//! it needs; a crashed invocation resumes from its last checkpoint, and a
//! finished segment is never scanned again.

use crate::config::{Config, ReconcileConfig};
use crate::error::Error;
use crate::keys::{self, ReelId};
use crate::reshard::now_ms;
use crate::retry::Backoff;
use crate::store::{CorrectResult, Phase, ReconcileStore, ScanPage, ScanTable};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
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
/// Reels checked between two checkpoints of the check phase.
const CHECK_BATCH: usize = 200;
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

#[derive(Clone, Debug, Default)]
pub struct Options {
    pub mode: Mode,
    /// Report, write nothing (not even checkpoints: a dry run lives in one
    /// invocation).
    pub dry_run: bool,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RunPhase {
    ScanLikes,
    CheckReels,
    ScanCounters,
    Done,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Segment {
    cursor: Option<String>,
    done: bool,
    rows: u64,
    /// The committed checkpoints: each the rows per reel counted since the
    /// one before, in chunks written by `owner`.
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Part {
    owner: String,
    chunks: u32,
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
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct RunState {
    run_id: String,
    dry_run: bool,
    started_ms: i64,
    phase: RunPhase,
    segments: Vec<Segment>,
    /// Check phase: the last reel (in sorted order) done and checkpointed.
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
    pub run_id: Option<String>,
    /// `started`, `resumed`, `busy` (another invocation holds the run) or
    /// `idle` (resume mode, no run in progress).
    pub invocation: &'static str,
    pub dry_run: bool,
    /// The run finished (in this invocation or before).
    pub complete: bool,
    pub phase: String,
    pub rows_scanned: u64,
    /// Read units the run's scans consumed (DynamoDB's ConsumedCapacity).
    pub scan_read_units: f64,
    pub reels_checked: u64,
    pub reels_corrected: u64,
    pub reels_deferred: u64,
    pub total_abs_drift: u64,
    pub largest_drift: i64,
    pub largest_drift_reel: Option<String>,
    pub corrected_reels: Vec<String>,
    pub deferred_reels: Vec<String>,
    pub segments: u32,
    /// Likes-scan segments finished (by any invocation of the run).
    pub segments_done: usize,
    /// Likes-scan segments this invocation scanned (part of).
    pub segments_scanned: usize,
    pub invocations: u32,
    pub duration_ms: u64,
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

pub struct Reconciler<S> {
    store: S,
    cfg: ReconcileConfig,
    /// `REQUEST_TIMEOUT_MS` + `DDB_OPERATION_TIMEOUT_MS` +
    /// `RECONCILE_CLOCK_SKEW_MS`.
    margin_ms: i64,
    backoff: Backoff,
}

/// The run state and its version, shared by an invocation's tasks.
type Shared = Arc<Mutex<(RunState, u64)>>;

/// A task of an invocation, boxed so that it is `Send` for the lifetimes it
/// borrows (rustc cannot prove that through nested closures otherwise).
type Task<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Whether the (already safety-adjusted) deadline has come.
fn near(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

impl<S: ReconcileStore> Reconciler<S> {
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
        let (state, ver, invocation) = match self.claim(opts, &me).await? {
            Claim::Go(state, ver, how) => (state, ver, how),
            Claim::Busy(state) => return Ok(self.summary(state.as_ref(), "busy", began, 0)),
            Claim::Idle(state) => return Ok(self.summary(state.as_ref(), "idle", began, 0)),
        };
        let shared: Shared = Arc::new(Mutex::new((state, ver)));
        let scanned = match self.drive(&shared, opts).await {
            Ok(n) => n,
            Err(Error::Conflict { .. }) => {
                // Lost the lease to another invocation: it carries on.
                let (state, _) = shared.lock().await.clone();
                return Ok(self.summary(Some(&state), "busy", began, 0));
            }
            Err(e) => {
                // Failing is stopping too: hand the run over now rather than
                // when the lease expires. Only the lease of the committed
                // state changes; what was not checkpointed is redone, as
                // after a crash.
                self.release(&me).await;
                return Err(e);
            }
        };
        // Stopping on purpose (done, or at the deadline) hands the run over
        // at once; only a crash leaves the lease to expire.
        if !shared.lock().await.0.dry_run {
            match self.commit_with(&shared, None, true).await {
                Ok(()) | Err(Error::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let (state, _) = shared.lock().await.clone();
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
            duration_ms = summary.duration_ms,
            "reconcile"
        );
        Ok(summary)
    }

    async fn claim(&self, opts: &Options, me: &str) -> Result<Claim, Error> {
        let now = now_ms();
        let fresh = |ver_hint: u32| RunState {
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
        let (state, how) = match current {
            // A run older than this is abandoned (its chunks may be expiring):
            // the next start begins afresh.
            Some(s) if s.phase != RunPhase::Done && now - s.started_ms > MAX_RUN_AGE_MS => {
                tracing::warn!(run_id = %s.run_id, "abandoning a reconcile run older than two days");
                if opts.mode == Mode::Resume {
                    return Ok(Claim::Idle(Some(s)));
                }
                (fresh(1), "started")
            }
            Some(mut s) if s.phase != RunPhase::Done => {
                if s.lease_until_ms > now && s.lease_owner != me {
                    return Ok(Claim::Busy(Some(s)));
                }
                s.lease_owner = me.to_owned();
                s.lease_until_ms = lease_until(opts.deadline);
                s.invocations += 1;
                (s, "resumed")
            }
            other if opts.mode == Mode::Resume => return Ok(Claim::Idle(other)),
            _ => (fresh(1), "started"),
        };
        let json = serde_json::to_string(&state).map_err(|_| Error::Internal)?;
        if !self.store.save_run(&json, ver).await? {
            return Ok(Claim::Busy(Some(state)));
        }
        Ok(Claim::Go(state, ver + 1, how))
    }

    /// Best effort: clears the lease in the stored run state if `me` still
    /// holds it. On any failure the lease simply expires.
    async fn release(&self, me: &str) {
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
        if let Ok(json) = serde_json::to_string(&state) {
            let _ = self.store.save_run(&json, ver).await;
        }
    }

    /// Writes the state (renewing the lease). A version conflict means
    /// another invocation took the run over: `Error::Conflict`.
    async fn commit(&self, shared: &Shared, deadline: Option<Instant>) -> Result<(), Error> {
        self.commit_with(shared, deadline, false).await
    }

    async fn commit_with(
        &self,
        shared: &Shared,
        deadline: Option<Instant>,
        release: bool,
    ) -> Result<(), Error> {
        let mut guard = shared.lock().await;
        let (state, ver) = &mut *guard;
        if state.dry_run {
            return Ok(());
        }
        state.lease_until_ms = if release { 0 } else { lease_until(deadline) };
        let json = serde_json::to_string(state).map_err(|_| Error::Internal)?;
        if self.store.save_run(&json, *ver).await? {
            *ver += 1;
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
    async fn drive(&self, shared: &Shared, opts: &Options) -> Result<usize, Error> {
        let reads = Limiter::new(self.cfg.max_read_units);
        let writes = Limiter::new(self.cfg.max_write_units);
        // A dry run keeps its counts here (it writes no chunks); a real run
        // reads them back from its checkpoints when the scan is done.
        let dry_counts: Mutex<HashMap<ReelId, u64>> = Mutex::new(HashMap::new());
        let mut counts: Option<HashMap<ReelId, u64>> = None;
        let mut scanned = 0;
        loop {
            let (phase, dry) = {
                let g = shared.lock().await;
                (g.0.phase, g.0.dry_run)
            };
            if matches!(phase, RunPhase::CheckReels | RunPhase::ScanCounters) && counts.is_none() {
                counts = Some(if dry {
                    std::mem::take(&mut *dry_counts.lock().await)
                } else {
                    self.load_all(shared, &reads).await?
                });
            }
            let empty = HashMap::new();
            let counted = counts.as_ref().unwrap_or(&empty);
            match phase {
                RunPhase::ScanLikes => {
                    let (done, n) = self
                        .scan_likes(shared, opts, &reads, &writes, &dry_counts)
                        .await?;
                    scanned += n;
                    if !done {
                        return Ok(scanned);
                    }
                    shared.lock().await.0.phase = RunPhase::CheckReels;
                    self.commit(shared, opts.deadline).await?;
                }
                RunPhase::CheckReels => {
                    if !self
                        .check_counted(shared, opts, counted, &reads, &writes)
                        .await?
                    {
                        return Ok(scanned);
                    }
                    shared.lock().await.0.phase = RunPhase::ScanCounters;
                    self.commit(shared, opts.deadline).await?;
                }
                RunPhase::ScanCounters => {
                    if !self
                        .scan_counters(shared, opts, counted, &reads, &writes)
                        .await?
                    {
                        return Ok(scanned);
                    }
                    {
                        let mut g = shared.lock().await;
                        g.0.phase = RunPhase::Done;
                        g.0.finished_ms = Some(now_ms());
                    }
                    self.commit(shared, opts.deadline).await?;
                }
                RunPhase::Done => return Ok(scanned),
            }
        }
    }

    /// The likes scan: every unfinished segment at once. Returns whether
    /// all segments are done, and how many it scanned (part of).
    async fn scan_likes(
        &self,
        shared: &Shared,
        opts: &Options,
        reads: &Limiter,
        writes: &Limiter,
        dry_counts: &Mutex<HashMap<ReelId, u64>>,
    ) -> Result<(bool, usize), Error> {
        let mut todo: Vec<(usize, Segment)> = {
            let g = shared.lock().await;
            g.0.segments
                .iter()
                .cloned()
                .enumerate()
                .filter(|(_, s)| !s.done)
                .collect()
        };
        if let Some(k) = opts.stop_after_segments {
            todo.truncate(k);
        }
        let n = todo.len();
        let tasks: Vec<Task<'_, Result<(), Error>>> = todo
            .into_iter()
            .map(|(i, seg)| {
                Box::pin(self.scan_segment(shared, opts, reads, writes, dry_counts, i, seg))
                    as Task<'_, _>
            })
            .collect();
        let results: Vec<Result<(), Error>> = futures::stream::iter(tasks)
            .buffer_unordered(self.cfg.segments as usize)
            .collect()
            .await;
        for r in results {
            r?;
        }
        let all_done = shared.lock().await.0.segments.iter().all(|s| s.done);
        Ok((all_done, n))
    }

    /// Scans one segment from its cursor. The rows counted since the last
    /// checkpoint are all it holds; each checkpoint stores them as a new,
    /// immutable part, so memory and checkpoint writes stay proportional to
    /// what was scanned, not to the run so far.
    #[allow(clippy::too_many_arguments)]
    async fn scan_segment(
        &self,
        shared: &Shared,
        opts: &Options,
        reads: &Limiter,
        writes: &Limiter,
        dry_counts: &Mutex<HashMap<ReelId, u64>>,
        index: usize,
        mut seg: Segment,
    ) -> Result<(), Error> {
        let mut delta: HashMap<ReelId, u64> = HashMap::new();
        let mut pages = 0u32;
        let mut pending = 0u32;
        loop {
            let page_limit = opts.stop_after_pages.is_some_and(|max| pages >= max);
            if page_limit || near(opts.deadline) {
                if pending > 0 {
                    self.checkpoint_segment(
                        shared, opts, writes, dry_counts, index, &mut seg, &mut delta,
                    )
                    .await?;
                }
                return Ok(());
            }
            let page = self
                .next_page(shared, reads, ScanTable::Likes, index, &seg)
                .await?;
            for r in page.reels {
                *delta.entry(r).or_default() += 1;
            }
            seg.rows += page.items;
            seg.cursor = page.next;
            seg.done = seg.cursor.is_none();
            pages += 1;
            pending += 1;
            if seg.done || pending >= self.cfg.checkpoint_pages {
                self.checkpoint_segment(
                    shared, opts, writes, dry_counts, index, &mut seg, &mut delta,
                )
                .await?;
                pending = 0;
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
        shared: &Shared,
        reads: &Limiter,
        table: ScanTable,
        index: usize,
        seg: &Segment,
    ) -> Result<ScanPage, Error> {
        // The run's own segment count: RECONCILE_SEGMENTS may have changed
        // since the run started.
        let total = {
            let g = shared.lock().await;
            match table {
                ScanTable::Likes => g.0.segments.len(),
                ScanTable::Counters => g.0.counter_segments.len(),
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
        reads.take(page.read_units).await;
        shared.lock().await.0.stats.scan_read_units += page.read_units;
        Ok(page)
    }

    /// Stores the rows counted since the last checkpoint as a new part
    /// (chunks keyed by this invocation, so no other invocation's committed
    /// chunks are ever overwritten), then commits the part with the cursor
    /// in one conditional write of the run state: a crash in between leaves
    /// the previous checkpoint whole, and the uncommitted part is ignored.
    #[allow(clippy::too_many_arguments)]
    async fn checkpoint_segment(
        &self,
        shared: &Shared,
        opts: &Options,
        writes: &Limiter,
        dry_counts: &Mutex<HashMap<ReelId, u64>>,
        index: usize,
        seg: &mut Segment,
        delta: &mut HashMap<ReelId, u64>,
    ) -> Result<(), Error> {
        let (run_id, owner, dry) = {
            let g = shared.lock().await;
            (g.0.run_id.clone(), g.0.lease_owner.clone(), g.0.dry_run)
        };
        if dry {
            let mut all = dry_counts.lock().await;
            for (r, n) in delta.drain() {
                *all.entry(r).or_default() += n;
            }
        } else if !delta.is_empty() {
            let chunks = encode_counts(delta);
            let expires = now_ms() / 1000 + CHUNK_TTL_SECS;
            let name = part_name(index, seg.parts.len(), &owner);
            for (i, data) in chunks.iter().enumerate() {
                writes.take(data.len() as f64 / 1024.0).await;
                let key = keys::reconcile_chunk_key(&run_id, &name, i as u32);
                self.store.put_chunk(&key, data, expires).await?;
            }
            seg.parts.push(Part {
                owner,
                chunks: chunks.len() as u32,
            });
            delta.clear();
        }
        {
            let mut g = shared.lock().await;
            g.0.segments[index] = seg.clone();
            g.0.stats.rows_scanned = g.0.segments.iter().map(|s| s.rows).sum();
        }
        self.commit(shared, opts.deadline).await
    }

    /// Every committed part of every segment, summed per reel.
    async fn load_all(
        &self,
        shared: &Shared,
        reads: &Limiter,
    ) -> Result<HashMap<ReelId, u64>, Error> {
        let (run_id, segments) = {
            let g = shared.lock().await;
            (g.0.run_id.clone(), g.0.segments.clone())
        };
        let mut counts = HashMap::new();
        for (s, seg) in segments.iter().enumerate() {
            for (k, part) in seg.parts.iter().enumerate() {
                let name = part_name(s, k, &part.owner);
                for i in 0..part.chunks {
                    let key = keys::reconcile_chunk_key(&run_id, &name, i);
                    let data = self.store.get_chunk(&key).await?.ok_or_else(|| {
                        tracing::error!(key, "a committed checkpoint chunk is missing");
                        Error::Internal
                    })?;
                    reads.take(data.len() as f64 / 4096.0).await;
                    decode_counts(&data, &mut counts)?;
                }
            }
        }
        Ok(counts)
    }

    /// Checks every counted reel, in order, from the checkpointed cursor.
    /// Returns whether it got through all of them.
    async fn check_counted(
        &self,
        shared: &Shared,
        opts: &Options,
        counts: &HashMap<ReelId, u64>,
        reads: &Limiter,
        writes: &Limiter,
    ) -> Result<bool, Error> {
        let cursor = shared.lock().await.0.reel_cursor.clone();
        let mut reels: Vec<&ReelId> = counts
            .keys()
            .filter(|r| cursor.as_deref().is_none_or(|c| r.as_str() > c))
            .collect();
        reels.sort();
        for batch in reels.chunks(CHECK_BATCH) {
            if near(opts.deadline) {
                return Ok(false);
            }
            let outcomes = self
                .check_all(
                    shared,
                    batch.iter().map(|r| (*r).clone()).collect(),
                    counts,
                    reads,
                    writes,
                )
                .await;
            self.record(shared, outcomes).await?;
            if let Some(last) = batch.last() {
                shared.lock().await.0.reel_cursor = Some(last.as_str().to_owned());
            }
            self.commit(shared, opts.deadline).await?;
        }
        Ok(true)
    }

    /// The counters scan: reels with shards (or settings) but no like rows.
    async fn scan_counters(
        &self,
        shared: &Shared,
        opts: &Options,
        counts: &HashMap<ReelId, u64>,
        reads: &Limiter,
        writes: &Limiter,
    ) -> Result<bool, Error> {
        let todo: Vec<(usize, Segment)> = {
            let g = shared.lock().await;
            g.0.counter_segments
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
                    let mut pending = 0u32;
                    loop {
                        if near(opts.deadline) {
                            // Keep the pages done: the next invocation goes on
                            // from here.
                            if pending > 0 {
                                shared.lock().await.0.counter_segments[i] = seg.clone();
                                self.commit(shared, opts.deadline).await?;
                            }
                            return Ok(false);
                        }
                        let page = self
                            .next_page(shared, reads, ScanTable::Counters, i, &seg)
                            .await?;
                        let mut fresh = Vec::new();
                        {
                            let mut seen = seen.lock().await;
                            for r in page.reels {
                                if !counts.contains_key(&r) && seen.insert(r.clone()) {
                                    fresh.push(r);
                                }
                            }
                        }
                        let outcomes = self.check_all(shared, fresh, counts, reads, writes).await;
                        self.record(shared, outcomes).await?;
                        seg.rows += page.items;
                        seg.cursor = page.next;
                        seg.done = seg.cursor.is_none();
                        pending += 1;
                        if seg.done || pending >= self.cfg.checkpoint_pages {
                            shared.lock().await.0.counter_segments[i] = seg.clone();
                            self.commit(shared, opts.deadline).await?;
                            pending = 0;
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

    /// Checks `reels` (a few at a time) against their counted rows (0 when
    /// not counted).
    async fn check_all(
        &self,
        shared: &Shared,
        reels: Vec<ReelId>,
        counts: &HashMap<ReelId, u64>,
        reads: &Limiter,
        writes: &Limiter,
    ) -> Vec<(ReelId, Result<Outcome, Error>)> {
        let tasks: Vec<Task<'_, (ReelId, Result<Outcome, Error>)>> = reels
            .into_iter()
            .map(|r| {
                Box::pin(async move {
                    let rows = counts.get(&r).copied().unwrap_or(0);
                    let outcome = self.check(shared, &r, rows, reads, writes).await;
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
    async fn record(
        &self,
        shared: &Shared,
        outcomes: Vec<(ReelId, Result<Outcome, Error>)>,
    ) -> Result<(), Error> {
        let mut g = shared.lock().await;
        let stats = &mut g.0.stats;
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
        Ok(())
    }

    /// Checks one reel against `rows` counted rows, and corrects it.
    async fn check(
        &self,
        shared: &Shared,
        reel: &ReelId,
        rows: u64,
        reads: &Limiter,
        writes: &Limiter,
    ) -> Result<Outcome, Error> {
        let (run_id, started_ms, dry) = {
            let g = shared.lock().await;
            (g.0.run_id.clone(), g.0.started_ms, g.0.dry_run)
        };
        let view = self.store.reel_view(reel).await?;
        reads
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
            writes.take(4.0).await;
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

fn part_name(segment: usize, part: usize, owner: &str) -> String {
    format!("likes{segment}p{part}w{owner}")
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

fn decode_counts(data: &[u8], into: &mut HashMap<ReelId, u64>) -> Result<(), Error> {
    let text = std::str::from_utf8(data).map_err(|_| Error::Internal)?;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (reel, n) = line.split_once(' ').ok_or(Error::Internal)?;
        let reel = ReelId::parse(reel).map_err(|_| Error::Internal)?;
        let n: u64 = n.parse().map_err(|_| Error::Internal)?;
        *into.entry(reel).or_default() += n;
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
        let mut back = HashMap::new();
        for c in &chunks {
            decode_counts(c, &mut back).unwrap();
        }
        assert_eq!(back, counts);
        assert!(decode_counts(b"bad line", &mut back).is_err());
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
