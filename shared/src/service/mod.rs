//! The like counter itself: exactly-once like/unlike, and cached sums.
//!
//! [`LikeService`] sees storage only through [`CounterStore`]. It keeps two
//! bounded in-memory caches per function instance:
//!
//! * the summed count of a reel, for `CACHE_TTL_MS`: a viral reel is summed
//!   at most once per TTL per instance instead of on every view;
//! * a reel's settings (shard counts), for `SETTINGS_TTL_MS`: read on every
//!   like, and the reason resizing waits that long between its steps.
//!
//! Both are size-bounded (`CACHE_MAX_REELS`, least recently used evicted) and
//! coalesce concurrent misses of one reel into one DynamoDB read.
//!
//! Every count this instance serves (a read, a batch read, the count in a
//! like's answer) also passes one guard, `LikeService::serve`: per reel it
//! remembers the last value served and the instant that value is known to
//! cover, and a sum read sent before that instant never replaces it (a
//! slow read, a load joined late, a batch read landing after the entry was
//! dropped). Under likes only, the served count therefore never decreases,
//! and it never exceeds the truth. In stream mode an own change is applied
//! to what was served last and replaces it, so an unlike after a like
//! answers without that like; an unlike takes nothing off a value that
//! cannot hold its like (the shards last written before the like row's
//! `liked_at`, as on a fresh instance while the stream carries a like made
//! elsewhere), and a read that the guard keeps out for lacking an own
//! unlike still lifts the count to itself less those unlikes.
//!
//! # Layout
//!
//! * `read`: the count reads (one reel, a batch) and the settings reads,
//!   with their two caches.
//! * `served`: the guard every count served passes (served counts never go
//!   back).
//! * `write`: the exactly-once like/unlike path, its retries, and the count
//!   it answers with.
//! * `attempts`: what one write sends and keeps across its attempts (its
//!   token, its transaction, their tally).
//! * `erase`: every like of one user removed (an operator's erasure).
//! * `limits`: what one caller may make this instance write.
//! * `budget`: what one caller's count reads may cost, across instances.
//! * `sketch`: transactional mode's trending sketch of the likes this
//!   instance committed.
//! * `reels`: which ids are reels (a deployment's own check plugs in
//!   there).
//! * `observer`: the write-rate and contention observations that start a
//!   grow of a hot reel.
//! * `health`: the cached readiness probe of the store (`GET /healthz`).

use crate::config::{Config, Counting};
use crate::error::Error;
use crate::keys::window::WindowCounts;
use crate::keys::{Action, ReelId, UserId};
use crate::retry::Backoff;
use crate::store::CounterStore;
pub use erase::Erased;
pub use health::HEALTH_TTL;
use moka::future::Cache;
use observer::Observer;
use read::{Cached, FreshSettings};
pub use reels::{AnyReel, ReelCheck};
use served::Served;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod attempts;
mod budget;
mod erase;
#[cfg(test)]
mod fake;
mod health;
mod limits;
mod observer;
mod read;
mod reels;
mod served;
mod sketch;
mod write;

/// A summed count and when its shards were read.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    /// The reel's likes: its shards (and base item) summed, plus this
    /// instance's own changes since the read.
    pub count: i64,
    /// When the BatchGetItem that produced `count` was sent.
    pub read_at: Instant,
    /// When it had answered. A read that finished before a transaction was
    /// sent cannot include it; one sent after it committed does.
    pub done_at: Instant,
    /// The net likes of the last hour, 24 hours and 7 days, as read (own
    /// changes since are not in them: they show with the next read).
    pub windows: WindowCounts,
    /// The clock (Unix ms) the windows were read at.
    pub windows_at_ms: i64,
}

impl Count {
    /// How long ago the read was sent: the `age_ms` of a count response.
    pub fn age(&self) -> Duration {
        self.read_at.elapsed()
    }
}

/// A like or unlike as the handler hands it over.
#[derive(Clone, Debug)]
pub struct WriteRequest {
    /// The caller, already verified.
    pub user: UserId,
    /// The reel liked or unliked.
    pub reel: ReelId,
    /// Like or unlike.
    pub action: Action,
    /// The client's `Idempotency-Key`, if any.
    pub idempotency_key: Option<String>,
    /// The API Gateway request id, if the event carried one.
    pub request_id: Option<String>,
}

/// Which path a write took; logged, and asserted on by the fault tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePath {
    /// The transaction committed now.
    Applied,
    /// An earlier attempt with the same token had committed; DynamoDB
    /// replayed its success without writing again.
    Replayed,
    /// Committed, now or by an earlier attempt with the same token:
    /// DynamoDB's answer reported no read/write split to tell which
    /// ([`TxResult::CommittedUnsure`]). Counted once either way; the count
    /// is read afresh, as after a replay.
    ///
    /// [`TxResult::CommittedUnsure`]: crate::store::TxResult::CommittedUnsure
    Committed,
    /// The like row was already in the requested state: nothing written.
    AlreadyInState,
    /// A request with an `Idempotency-Key` that was already used: answered
    /// from the key's record, nothing written.
    ResolvedByRecord,
    /// The same request (same API request id) delivered again after its
    /// shard moved (IdempotentParameterMismatch): answered from the like
    /// row, nothing written.
    ResolvedByRow,
}

impl WritePath {
    /// The `outcome` of the write's log line and the `WritePath` label of
    /// the `Writes` metric.
    pub fn as_str(self) -> &'static str {
        match self {
            WritePath::Applied => "applied",
            WritePath::Replayed => "replayed",
            WritePath::Committed => "committed",
            WritePath::AlreadyInState => "already_in_state",
            WritePath::ResolvedByRecord => "resolved_by_record",
            WritePath::ResolvedByRow => "resolved_by_row",
        }
    }
}

/// What a like or unlike did: the handler's answer (`liked`, `changed`,
/// `count`) and what the logs and metrics record about it.
#[derive(Clone, Debug)]
pub struct WriteOutcome {
    /// Whether the caller likes the reel now.
    pub liked: bool,
    /// Whether this request (or its earlier attempt) changed the like state.
    pub changed: bool,
    /// The cached total, adjusted by this request's own change.
    pub count: i64,
    /// How the answer was reached.
    pub path: WritePath,
    /// Transaction attempts beyond the first (conflicts, throttles).
    pub retries: u32,
    /// Of the attempts, how many were cancelled for a conflict with another
    /// transaction.
    pub conflicts: u32,
    /// Of the attempts, how many DynamoDB throttled.
    pub throttles: u32,
    /// The write shard the request's token picked (`None` in stream
    /// mode: the aggregator picks it).
    pub shard: Option<u32>,
}

/// Like, unlike and count for one function instance, over a
/// [`CounterStore`]: the exactly-once write path, the bounded caches, and the
/// observations that grow a hot reel.
pub struct LikeService<S> {
    /// Shared with the background tasks that start automatic grows.
    store: Arc<S>,
    counts: Option<Cache<ReelId, Cached>>,
    /// The last count served per reel: survives the count cache's
    /// invalidations and expiry (see [`LikeService::serve`]).
    served: Cache<ReelId, Served>,
    /// Numbers the sum reads, for [`Cached::load`].
    loads: AtomicU64,
    settings: Option<Cache<ReelId, FreshSettings>>,
    /// `None` when `AUTO_RESHARD=off`.
    observer: Option<Observer>,
    /// Count-cache hits and misses, and transaction attempts cancelled for
    /// a conflict or throttled, since this instance started (metrics).
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    conflicts: AtomicU64,
    throttles: AtomicU64,
    backoff: Backoff,
    /// See [`Config::request_budget`].
    budget: Duration,
    /// The SDK's bound on one call.
    call_timeout: Duration,
    /// See [`Config::idempotency_ttl`].
    key_ttl: Duration,
    /// See [`Config::counting`].
    counting: Counting,
    /// See [`Config::shard_key`].
    shard_key: crate::token::ShardKey,
    /// See [`Config::stream_visible`].
    stream_visible: Duration,
    /// See [`Config::feed_read_items`].
    feed_read_items: usize,
    /// Each caller's write bounds on this instance.
    limits: limits::Limits,
    /// Each caller's read units this minute (`CALLER_READ_UNITS_PER_MIN`).
    read_budget: budget::ReadBudget,
    /// Which ids a like may name ([`LikeService::with_reel_check`]).
    reels: reels::Reels,
    /// `CACHE_MAX_REELS`, for the reel check's cache.
    cache_max_reels: u64,
    /// The readiness probe's last result ([`LikeService::ready`]).
    health: health::Health,
    /// See [`Config::cache_ttl`]: how long a warm figure may be cached.
    cache_ttl: Duration,
    /// The cache warmer's set as last read ([`crate::store::WarmStore`]).
    warm: crate::store::SetCache,
    /// Counts served from warm figures instead of a sum (metrics).
    warm_hits: AtomicU64,
    /// Transactional mode: the likes this instance committed, as a
    /// trending writer of its own (`None` in stream mode).
    sketch: Option<crate::trending::InstanceSketch>,
    /// The reels ever counted ([`LikeService::with_known`]): a like
    /// registers its reel, a read answers a reel never counted without
    /// reading it.
    known: Option<crate::known::SharedKnown>,
}

/// Transactional mode's sketch of the likes this instance commits, put in
/// `WRITERS_TABLE` (the views table), where rankings read the likes'
/// sketches. Without it (a deployment that left it out), nothing is put,
/// and that is said once here rather than with every like.
fn own_sketch(config: &Config) -> Option<crate::trending::InstanceSketch> {
    if config.counting != Counting::Transactional {
        return None;
    }
    if config.writers_table.is_none() {
        tracing::warn!("WRITERS_TABLE is not set: likes are not ranked (GET /trending)");
        return None;
    }
    Some(crate::trending::InstanceSketch::new(
        crate::keys::top::instance_writer(fastrand::u64(..)),
    ))
}

impl<S: CounterStore> LikeService<S> {
    /// A service over `store` with empty caches; built once per cold start.
    pub fn new(store: S, config: &Config) -> Self {
        LikeService {
            store: Arc::new(store),
            counts: read::cache(config.cache_ttl, config.cache_max_reels),
            served: served::records(config),
            loads: AtomicU64::new(0),
            settings: read::cache(config.settings_ttl, config.cache_max_reels),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            throttles: AtomicU64::new(0),
            // Stream mode writes no shard on the like path, so no reel has a
            // write ceiling to grow past there.
            observer: (config.resize.auto && config.counting == Counting::Transactional)
                .then(|| Observer::new(config)),
            backoff: Backoff::from_config(config),
            budget: config.request_budget,
            call_timeout: config.ddb_operation_timeout,
            key_ttl: config.idempotency_ttl,
            counting: config.counting,
            shard_key: config.shard_key.clone(),
            stream_visible: config.stream_visible,
            feed_read_items: config.feed_read_items as usize,
            limits: limits::Limits::new(config.write_limits, limits::MAX_USERS),
            read_budget: budget::ReadBudget::new(config.access.read_units_per_min),
            reels: reels::Reels::any(),
            cache_max_reels: config.cache_max_reels,
            health: health::Health::default(),
            cache_ttl: config.cache_ttl,
            warm: crate::store::SetCache::default(),
            warm_hits: AtomicU64::new(0),
            sketch: own_sketch(config),
            known: None,
        }
    }

    /// Registers each liked reel in `known` before its like is written,
    /// and answers reels `known` says were never counted without reading
    /// them ([`crate::known`]).
    pub fn with_known(mut self, known: crate::known::SharedKnown) -> Self {
        self.known = Some(known);
        self
    }

    /// Likes only reels `check` knows; the others are refused with
    /// [`Error::UnknownReel`] (404 `reel_not_found`) before anything is
    /// written. The default is [`AnyReel`]. A deployment plugs its check in
    /// where its like function builds the service (docs/operations.md,
    /// "Your own reel ids").
    pub fn with_reel_check(mut self, check: std::sync::Arc<dyn ReelCheck>) -> Self {
        self.reels = reels::Reels::checked(check, self.cache_max_reels);
        self
    }

    /// `Ok` when every reel of `reels` may be counted ([`Error::UnknownReel`]
    /// otherwise): a view batch asks as a like does, so views of invented
    /// ids are refused before they reach the log, and a reel the check
    /// knows costs a lookup per instance. Asked concurrently, each answer
    /// cached as a like's.
    pub async fn admit_reels(&self, reels: &[&ReelId]) -> Result<(), Error> {
        futures::future::try_join_all(reels.iter().map(|r| self.reels.admit(r))).await?;
        Ok(())
    }

    /// `Ok` unless `caller`'s count reads this minute are past their
    /// bound as last seen here (429 `rate_limited` until the minute ends):
    /// asked before a read route reads anything.
    pub async fn admit_reads(&self, caller: &str) -> Result<(), Error> {
        self.read_budget.admit(caller, crate::clock::now_ms()).await
    }

    /// Counts `units` of read cost served to `caller`, adding them to the
    /// shared per-minute item in steps (`budget.rs`). A failed step is kept
    /// for the next: the bound is an estimate, never a reason to fail a
    /// read already served.
    pub async fn charge_reads(&self, caller: &str, units: u64) {
        let now = crate::clock::now_ms();
        let Some(flush) = self.read_budget.charge(caller, units, now).await else {
            return;
        };
        let expires = (flush.minute + 2) * 60;
        match self
            .store
            .add_caller_reads(&flush.caller, flush.minute, flush.units, expires)
            .await
        {
            Ok(total) => self.read_budget.flushed(&flush, total).await,
            Err(e) => {
                tracing::warn!(error = e.code(), "could not add to a caller's read units");
                self.read_budget.unflushed(&flush).await;
            }
        }
    }

    /// Readiness: both tables answer. One probe answers every check for
    /// [`HEALTH_TTL`]; every failure but a fault of ours is
    /// [`Error::Unavailable`].
    pub async fn ready(&self) -> Result<(), Error> {
        self.health.check(&*self.store).await
    }

    /// How this instance counts likes.
    pub fn counting(&self) -> Counting {
        self.counting
    }

    /// The store it writes through (the health probe, the read metrics and
    /// tests use it).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Transaction attempts cancelled for (conflicts, throttling) since this
    /// instance started, given-up requests included.
    pub fn retry_stats(&self) -> (u64, u64) {
        (
            self.conflicts.load(Ordering::Relaxed),
            self.throttles.load(Ordering::Relaxed),
        )
    }

    /// Count-cache (hits, misses) since this instance started.
    pub fn cache_stats(&self) -> (u64, u64) {
        (
            self.cache_hits.load(Ordering::Relaxed),
            self.cache_misses.load(Ordering::Relaxed),
        )
    }

    /// Whether `user` likes `reel` now (a consistent read of the like row).
    pub async fn liked(&self, user: &UserId, reel: &ReelId) -> Result<bool, Error> {
        Ok(self.store.like_row(user, reel).await?.is_some())
    }
}
