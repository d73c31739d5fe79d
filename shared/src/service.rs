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
//! and it never exceeds the truth.

use crate::config::{Config, ResizeConfig};
use crate::error::Error;
use crate::keys::{Action, ReelId, UserId};
use crate::reshard;
use crate::retry::Backoff;
use crate::store::{
    CounterStore, KeyRecordSpec, LikeTx, RetryReason, Settings, ShardSum, TxResult,
};
use crate::token::{RequestIdentity, RequestToken};
use futures::StreamExt;
use moka::Expiry;
use moka::future::Cache;
use moka::ops::compute::{CompResult, Op};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    /// The `outcome` of the write's log line and the `WritePath` property of
    /// its metrics record.
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
    /// The write shard the request's token picked.
    pub shard: u32,
}

/// A cached sum and its lineage: which read produced it and how many of
/// this instance's own changes were applied to it since.
#[derive(Clone, Copy, Debug)]
struct Cached {
    /// `count` includes the own changes; `read_at` and `done_at` are the
    /// read's.
    count: Count,
    /// Which read (unique in this instance) the value descends from.
    load: u64,
    /// Own changes applied to that read's value, in order.
    adjusted: u32,
    /// The value includes no change committed after this instant: the
    /// read's answer, or the return of the last own change applied.
    covers: Instant,
}

impl Cached {
    fn read(load: u64, count: i64, read_at: Instant, done_at: Instant) -> Self {
        Cached {
            count: Count {
                count,
                read_at,
                done_at,
            },
            load,
            adjusted: 0,
            covers: done_at,
        }
    }
}

/// The last count this instance served for a reel (see
/// [`LikeService::serve`]).
#[derive(Clone, Copy, Debug)]
struct Served {
    count: i64,
    load: u64,
    adjusted: u32,
    /// No change committed after this instant is in `count`, and the value
    /// is at least what a read sent at this instant would return (likes
    /// only): a read sent earlier may return less.
    covers: Instant,
}

impl ReadAt for Cached {
    fn read_at(&self) -> Instant {
        self.count.read_at
    }
}

/// The record is kept for as long as a read sent before it covers may
/// still be served: see [`LikeService::new`].
impl ReadAt for Served {
    fn read_at(&self) -> Instant {
        self.covers
    }
}

/// A reel's settings and when the read that produced them was sent.
#[derive(Clone, Copy, Debug)]
struct FreshSettings {
    settings: Settings,
    read_at: Instant,
}

/// A cached value that knows when it was read.
trait ReadAt {
    fn read_at(&self) -> Instant;
}

impl ReadAt for FreshSettings {
    fn read_at(&self) -> Instant {
        self.read_at
    }
}

/// What this instance sees that may call for more shards: the write rate of
/// the reels it sums, and the contention of the likes it writes.
struct Observer {
    resize: ResizeConfig,
    /// The last (shard writes, when summed) of each reel this instance read.
    samples: Cache<ReelId, (i64, Instant)>,
    /// The shard count this instance last asked a reel to grow to; not asked
    /// again until the resize could have completed.
    asked: Cache<ReelId, u32>,
    /// Contended like transactions per reel: (count, first seen).
    contention: Cache<ReelId, (u32, Instant)>,
}

/// Contention counts within this window.
const CONTENTION_WINDOW: Duration = Duration::from_secs(10);

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
}

/// Entries expire `ttl` after the read that produced them was sent, however
/// long the read took and however often this instance adjusts a count for
/// its own writes. For settings this is what bounds how long a resize step
/// must wait ([`Config::resize_wait`]).
struct SinceRead(Duration);

impl<V: ReadAt> Expiry<ReelId, V> for SinceRead {
    fn expire_after_create(&self, _: &ReelId, value: &V, _: Instant) -> Option<Duration> {
        Some(self.0.saturating_sub(value.read_at().elapsed()))
    }

    fn expire_after_update(
        &self,
        _: &ReelId,
        value: &V,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(self.0.saturating_sub(value.read_at().elapsed()))
    }
}

fn cache<V: ReadAt + Clone + Send + Sync + 'static>(
    ttl: Duration,
    max: u64,
) -> Option<Cache<ReelId, V>> {
    // A zero TTL means "do not cache" (useful in tests, costly in production).
    (!ttl.is_zero()).then(|| {
        Cache::builder()
            .max_capacity(max)
            .expire_after(SinceRead(ttl))
            .build()
    })
}

fn unshare(e: Arc<Error>) -> Error {
    (*e).clone()
}

impl<S: CounterStore> LikeService<S> {
    /// A service over `store` with empty caches; built once per cold start.
    pub fn new(store: S, config: &Config) -> Self {
        LikeService {
            store: Arc::new(store),
            counts: cache(config.cache_ttl, config.cache_max_reels),
            // A value may be served until its entry expires (CACHE_TTL_MS
            // after its read was sent) or, for a load, when it answers
            // (within the request's hard bound); a read sent before a
            // record's `covers` cannot be served later than that, so the
            // record is no longer needed then. The operation timeout is
            // margin. Bounded like the count cache.
            served: Cache::builder()
                .max_capacity(config.cache_max_reels)
                .expire_after(SinceRead(
                    config.cache_ttl + config.request_timeout + config.ddb_operation_timeout,
                ))
                .build(),
            loads: AtomicU64::new(0),
            settings: cache(config.settings_ttl, config.cache_max_reels),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            throttles: AtomicU64::new(0),
            observer: config.resize.auto.then(|| Observer {
                resize: config.resize.clone(),
                samples: Cache::builder()
                    .max_capacity(config.cache_max_reels)
                    .time_to_idle(Duration::from_secs(300))
                    .build(),
                asked: Cache::builder()
                    .max_capacity(10_000)
                    .time_to_live(config.resize_wait() * 2)
                    .build(),
                contention: Cache::builder()
                    .max_capacity(10_000)
                    .time_to_live(CONTENTION_WINDOW * 6)
                    .build(),
            }),
            backoff: Backoff::from_config(config),
            budget: config.request_budget,
            call_timeout: config.ddb_operation_timeout,
            key_ttl: config.idempotency_ttl,
        }
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

    /// The settings of one reel, cached.
    pub async fn settings(&self, reel: &ReelId) -> Result<Settings, Error> {
        let load = async {
            let read_at = Instant::now();
            let mut m = self.store.settings(std::slice::from_ref(reel)).await?;
            Ok(FreshSettings {
                settings: m.remove(reel).unwrap_or_default(),
                read_at,
            })
        };
        let fresh = match &self.settings {
            Some(c) => c.try_get_with(reel.clone(), load).await.map_err(unshare)?,
            None => load.await?,
        };
        Ok(fresh.settings)
    }

    async fn settings_many(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
        let mut out = HashMap::with_capacity(reels.len());
        let mut missing = Vec::new();
        for r in reels {
            match self.settings.as_ref() {
                Some(c) => match c.get(r).await {
                    Some(s) => {
                        out.insert(r.clone(), s.settings);
                    }
                    None => missing.push(r.clone()),
                },
                None => missing.push(r.clone()),
            }
        }
        if !missing.is_empty() {
            let read_at = Instant::now();
            let fetched = self.store.settings(&missing).await?;
            for (r, settings) in fetched {
                if let Some(c) = &self.settings {
                    c.insert(r.clone(), FreshSettings { settings, read_at })
                        .await;
                }
                out.insert(r, settings);
            }
        }
        Ok(out)
    }

    /// The cached count of one reel (summed from its shards on a miss).
    pub async fn count(&self, reel: &ReelId) -> Result<Count, Error> {
        let c = self.cached(reel).await?;
        Ok(self.serve(reel, c).await)
    }

    /// The count cache's entry for `reel`, or a sum read now (concurrent
    /// misses share one read); not yet guarded by [`Self::serve`].
    async fn cached(&self, reel: &ReelId) -> Result<Cached, Error> {
        match &self.counts {
            Some(c) => {
                if let Some(n) = c.get(reel).await {
                    self.cache_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(n);
                }
                self.cache_misses.fetch_add(1, Ordering::Relaxed);
                // The load may be joined by callers that come much later
                // (a slow read under faults): what it answers is guarded
                // by `serve`, not trusted for being new.
                c.try_get_with(reel.clone(), self.sum_now(reel))
                    .await
                    .map_err(unshare)
            }
            None => {
                self.cache_misses.fetch_add(1, Ordering::Relaxed);
                self.sum_now(reel).await
            }
        }
    }

    /// Sums the reel's shards now, bypassing the count cache.
    async fn sum_now(&self, reel: &ReelId) -> Result<Cached, Error> {
        let settings = self.settings(reel).await?;
        let load = self.loads.fetch_add(1, Ordering::Relaxed);
        let read_at = Instant::now();
        let sums = self.store.sum_shards(&[(reel.clone(), settings)]).await?;
        let done_at = Instant::now();
        let sum = sums.get(reel).copied().unwrap_or_default();
        self.observe_rate(reel, &settings, sum, read_at).await;
        Ok(Cached::read(load, sum.n, read_at, done_at))
    }

    /// Sums the reel's shards now, and caches the result unless the entry
    /// in place covers changes this read may have missed.
    async fn sum_fresh(&self, reel: &ReelId) -> Result<Cached, Error> {
        let fresh = self.sum_now(reel).await?;
        if let Some(c) = &self.counts {
            c.entry(reel.clone())
                .and_compute_with(|e| async move {
                    match e.map(|e| e.into_value()) {
                        Some(old) if old.covers > fresh.count.read_at => Op::Nop,
                        _ => Op::Put(fresh),
                    }
                })
                .await;
        }
        Ok(fresh)
    }

    /// The count to serve for `reel`, given `c`, the value at hand: `c`
    /// unless this instance already served a value that `c` may predate.
    ///
    /// A value served covers the instant recorded with it (a read: when its
    /// answer arrived; a value adjusted by an own change: when that
    /// transaction returned). A read sent at or after that instant includes
    /// everything the served value did, so it replaces it; so does a later
    /// value of the same lineage (the same read, adjusted by more of this
    /// instance's own changes). A read sent before it is no newer: under
    /// likes only both are at most the truth, so the larger of the two is
    /// served (and recorded), never the smaller. With unlikes, such an
    /// overlapping pair has no order; the larger is served until a read
    /// sent after both settles it (within `CACHE_TTL_MS`).
    async fn serve(&self, reel: &ReelId, c: Cached) -> Count {
        // The common case, a cache hit on the entry last served (or on an
        // older copy of it): nothing to record.
        if let Some(r) = self.served.get(reel).await
            && r.load == c.load
            && r.adjusted >= c.adjusted
        {
            return Count {
                count: r.count,
                ..c.count
            };
        }
        let result = self
            .served
            .entry(reel.clone())
            .and_compute_with(|e| async move {
                let take = Served {
                    count: c.count.count,
                    load: c.load,
                    adjusted: c.adjusted,
                    covers: c.covers,
                };
                match e.map(|e| e.into_value()) {
                    None => Op::Put(take),
                    Some(r) if r.load == c.load => {
                        if c.adjusted >= r.adjusted {
                            Op::Put(Served {
                                covers: r.covers.max(c.covers),
                                ..take
                            })
                        } else {
                            Op::Nop
                        }
                    }
                    Some(r) if c.count.read_at >= r.covers || c.count.count > r.count => {
                        Op::Put(Served {
                            covers: r.covers.max(c.covers),
                            ..take
                        })
                    }
                    Some(_) => Op::Nop,
                }
            })
            .await;
        let count = match result {
            CompResult::Inserted(e) | CompResult::ReplacedWith(e) | CompResult::Unchanged(e) => {
                e.into_value().count
            }
            // Not produced by the closure above.
            CompResult::Removed(_) | CompResult::StillNone(_) => c.count.count,
        };
        if count != c.count.count {
            tracing::debug!(reel = %reel, had = c.count.count, served = count, "a read older than the count served was not served");
        }
        Count { count, ..c.count }
    }

    /// The cached counts of many reels; the misses are summed together in
    /// as few BatchGetItem calls as their shards need.
    pub async fn counts(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Count>, Error> {
        let mut found = HashMap::with_capacity(reels.len());
        let mut missing = Vec::new();
        for r in reels {
            if found.contains_key(r) || missing.contains(r) {
                continue;
            }
            match self.counts.as_ref() {
                Some(c) => match c.get(r).await {
                    Some(n) => {
                        found.insert(r.clone(), n);
                    }
                    None => missing.push(r.clone()),
                },
                None => missing.push(r.clone()),
            }
        }
        self.cache_hits
            .fetch_add(found.len() as u64, Ordering::Relaxed);
        self.cache_misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);
        if !missing.is_empty() {
            let settings = self.settings_many(&missing).await?;
            let plan: Vec<(ReelId, Settings)> = missing
                .iter()
                .map(|r| (r.clone(), settings.get(r).copied().unwrap_or_default()))
                .collect();
            let load = self.loads.fetch_add(1, Ordering::Relaxed);
            let read_at = Instant::now();
            let (sums, failed) = match self.store.sum_shards(&plan).await {
                Ok(sums) => (sums, Vec::new()),
                // One reel's sum failing (say, a shrinking reel whose folds
                // kept landing) must not fail the others: each is summed on
                // its own, and the ones that still fail are left out (the
                // answer lists them), unless nothing is left to answer.
                Err(e) if plan.len() > 1 && e.status() >= 429 => {
                    let (sums, failed) = self.sum_each(&plan).await;
                    if sums.is_empty() && found.is_empty() {
                        return Err(e);
                    }
                    (sums, failed)
                }
                Err(e) => return Err(e),
            };
            let done_at = Instant::now();
            for (r, s) in &plan {
                if let Some(sum) = sums.get(r) {
                    self.observe_rate(r, s, *sum, read_at).await;
                }
            }
            for r in missing.into_iter().filter(|r| !failed.contains(r)) {
                let mut n = Cached::read(load, sums.get(&r).map_or(0, |s| s.n), read_at, done_at);
                if let Some(c) = &self.counts {
                    // An entry that appeared meanwhile (perhaps adjusted for
                    // this instance's own writes) wins over this read; one
                    // removed meanwhile does not make this read new (the
                    // guard below).
                    n = c.entry(r.clone()).or_insert(n).await.into_value();
                }
                found.insert(r, n);
            }
        }
        let mut out = HashMap::with_capacity(found.len());
        for (r, c) in found {
            let n = self.serve(&r, c).await;
            out.insert(r, n);
        }
        Ok(out)
    }

    /// Sums each reel of `plan` on its own: the sums that succeeded, and the
    /// reels whose sum failed (logged).
    async fn sum_each(
        &self,
        plan: &[(ReelId, Settings)],
    ) -> (HashMap<ReelId, ShardSum>, Vec<ReelId>) {
        type Each = (ReelId, Result<HashMap<ReelId, ShardSum>, Error>);
        let results: Vec<Each> = futures::stream::iter(plan.iter().cloned())
            .map(|(r, s)| async move {
                let sum = self.store.sum_shards(&[(r.clone(), s)]).await;
                (r, sum)
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let mut sums = HashMap::with_capacity(results.len());
        let mut failed = Vec::new();
        for (r, result) in results {
            match result {
                Ok(mut m) => {
                    sums.insert(r.clone(), m.remove(&r).unwrap_or_default());
                }
                Err(e) => {
                    tracing::warn!(reel = %r, error = e.code(), "a batch read left out a reel whose sum failed");
                    failed.push(r);
                }
            }
        }
        (sums, failed)
    }

    /// Whether `user` likes `reel` now (a consistent read of the like row).
    pub async fn liked(&self, user: &UserId, reel: &ReelId) -> Result<bool, Error> {
        Ok(self.store.like_row(user, reel).await?.is_some())
    }

    /// Likes or unlikes, exactly once: one transaction writes the like row
    /// (conditioned on its current state) and the shard increment together,
    /// and for a request with an `Idempotency-Key` also the key's record.
    pub async fn write(&self, req: WriteRequest) -> Result<WriteOutcome, Error> {
        let started = Instant::now();
        let settings = self.settings(&req.reel).await?;
        let token = match (&req.idempotency_key, &req.request_id) {
            (Some(k), _) => RequestToken::derive(
                &req.user,
                &req.reel,
                req.action,
                &RequestIdentity::ClientKey(k),
            ),
            (None, Some(id)) => RequestToken::derive(
                &req.user,
                &req.reel,
                req.action,
                &RequestIdentity::RequestId(id),
            ),
            (None, None) => RequestToken::random(),
        };
        let now = crate::clock::since_epoch();
        let record = req.idempotency_key.as_ref().map(|_| KeyRecordSpec {
            key_token: token.clone(),
            // Rounded up to the hour, so that the record does not differ
            // between a request's attempts for this reason.
            expires_at: ((now + self.key_ttl).as_secs() as i64 / 3600 + 1) * 3600,
        });
        let mut tx = LikeTx {
            user: req.user.clone(),
            reel: req.reel.clone(),
            action: req.action,
            shard: token.shard(settings.write_shards),
            token: token.clone(),
            now_ms: now.as_millis() as i64,
            record,
        };
        let wanted = req.action == Action::Like;
        let mut attempt = 0u32;
        let mut retries = 0u32;
        let mut follow_ups = 0u32;
        let mut last_retry = RetryReason::Conflict;
        let (mut conflicts, mut throttles) = (0u32, 0u32);
        let mut sent_at: Instant;
        // (path, liked, changed)
        let (path, liked, changed) = loop {
            attempt += 1;
            if attempt > 1 {
                let delay = self.backoff.delay(attempt - 1);
                let in_budget = started.elapsed() + delay + self.call_timeout <= self.budget;
                if !self.backoff.allows(attempt - 1) || !in_budget {
                    tracing::warn!(reel = %req.reel, action = req.action.as_str(), attempts = attempt - 1, reason = ?last_retry, in_budget, "transaction retries exhausted");
                    return Err(match last_retry {
                        RetryReason::Throttled => Error::Throttled,
                        RetryReason::Conflict | RetryReason::InProgress => Error::Contended,
                    });
                }
                retries += 1;
                tokio::time::sleep(delay).await;
            }
            sent_at = Instant::now();
            match self.store.write_like(&tx).await? {
                TxResult::Committed { replayed: false } => {
                    break (WritePath::Applied, wanted, true);
                }
                TxResult::Committed { replayed: true } => {
                    break (WritePath::Replayed, wanted, true);
                }
                TxResult::CommittedUnsure => {
                    break (WritePath::Committed, wanted, true);
                }
                TxResult::AlreadyInState => match &tx.record {
                    // Record that this key changed nothing, so that a retry
                    // after the user changed state does not act on it then.
                    Some(spec) => {
                        let r = self.store.record_unchanged(spec, req.action).await?;
                        break (
                            if r.changed {
                                WritePath::ResolvedByRecord
                            } else {
                                WritePath::AlreadyInState
                            },
                            wanted,
                            r.changed,
                        );
                    }
                    None => break (WritePath::AlreadyInState, wanted, false),
                },
                TxResult::KeyUsed => {
                    let changed = self
                        .store
                        .key_record(&token)
                        .await?
                        .is_some_and(|r| r.changed);
                    break (WritePath::ResolvedByRecord, wanted, changed);
                }
                TxResult::Retry(reason) => {
                    last_retry = reason;
                    match reason {
                        RetryReason::Conflict => {
                            conflicts += 1;
                            self.conflicts.fetch_add(1, Ordering::Relaxed);
                        }
                        RetryReason::Throttled => {
                            throttles += 1;
                            self.throttles.fetch_add(1, Ordering::Relaxed);
                        }
                        RetryReason::InProgress => {}
                    }
                    if reason != RetryReason::InProgress {
                        self.observe_contention(&req.reel, &settings).await;
                    }
                }
                TxResult::ParameterMismatch if tx.record.is_some() => {
                    // The token is bound to another body: an earlier request
                    // with this key (a like carries its own liked_at; a
                    // resize may have moved the shard). Its record, written
                    // atomically with any change it made, is the answer.
                    if let Some(r) = self.store.key_record(&token).await? {
                        break (WritePath::ResolvedByRecord, wanted, r.changed);
                    }
                    // No record: nothing committed under this key, so acting
                    // now is not acting twice. A fresh token, the same record.
                    follow_ups += 1;
                    tx.token = token.follow_up(follow_ups);
                    tx.shard = tx.token.shard(settings.write_shards);
                    last_retry = RetryReason::Conflict;
                }
                TxResult::ParameterMismatch => {
                    // Without a key the token comes from the request id: the
                    // same request delivered again after a resize moved its
                    // shard. Never write again; the like row tells the state.
                    let row = self.store.like_row(&req.user, &req.reel).await?;
                    // DynamoDB remembers the token, so the first delivery
                    // most likely committed: answer as it did. A like knows
                    // for sure (its row carries the token); an unlike's row
                    // is gone either way, so its `changed` is a best guess.
                    let changed = match (req.action, row) {
                        (Action::Like, Some(row)) => row.token.as_deref() == Some(token.as_str()),
                        (Action::Like, None) => false,
                        (Action::Unlike, _) => true,
                    };
                    break (WritePath::ResolvedByRow, wanted, changed);
                }
            }
        };
        let committed_at = Instant::now();
        let count = match path {
            WritePath::Applied => {
                self.count_after_own_change(&req.reel, req.action.delta(), sent_at, committed_at)
                    .await?
            }
            // Committed during this request (the SDK retried after a lost
            // response) or by an earlier one: which, and so whether a cached
            // sum has it, is unknown. Read afresh, sent now: not a load
            // already in flight, which may have been sent before the commit.
            WritePath::Replayed | WritePath::Committed => {
                let fresh = self.sum_fresh(&req.reel).await?;
                self.serve(&req.reel, fresh).await.count
            }
            // Nothing was written now: the cached total stands as it is.
            _ => self.count(&req.reel).await?.count,
        };
        tracing::info!(
            reel = %req.reel,
            action = req.action.as_str(),
            shard = tx.shard,
            retries,
            outcome = path.as_str(),
            changed,
            keyed = tx.record.is_some(),
            "write"
        );
        Ok(WriteOutcome {
            liked,
            changed,
            count: count.max(0),
            path,
            retries,
            conflicts,
            throttles,
            shard: tx.shard,
        })
    }

    /// The count after this instance committed `delta` with a transaction
    /// sent at `sent_at` that returned at `committed_at`.
    ///
    /// A cached sum whose read finished before the transaction was sent
    /// cannot include it and is adjusted in place (its expiry stays anchored
    /// to when it was read), so this instance's own likes and unlikes show
    /// in what it serves next. A sum read after the commit includes it as it
    /// is. A read that overlapped the transaction is ambiguous: it is
    /// dropped and the shards are read again. So is a cached sum older than
    /// what this instance already served from another read: adjusted, it
    /// could still be below that (and the guard would then answer without
    /// this change).
    async fn count_after_own_change(
        &self,
        reel: &ReelId,
        delta: i64,
        sent_at: Instant,
        committed_at: Instant,
    ) -> Result<i64, Error> {
        let Some(c) = &self.counts else {
            let fresh = self.sum_now(reel).await?;
            return Ok(self.serve(reel, fresh).await.count);
        };
        for _ in 0..3 {
            let current = self.cached(reel).await?;
            if current.count.read_at >= committed_at {
                return Ok(self.serve(reel, current).await.count);
            }
            if let Some(r) = self.served.get(reel).await
                && r.load != current.load
                && current.count.read_at < r.covers
            {
                break;
            }
            let excludes_ours = current.count.done_at < sent_at;
            let result = c
                .entry(reel.clone())
                .and_compute_with(|entry| async move {
                    match entry.map(|e| e.into_value()) {
                        // Still the entry we looked at (other writes of this
                        // instance may have adjusted it meanwhile).
                        Some(n) if n.load == current.load && n.adjusted == current.adjusted => {
                            if excludes_ours {
                                Op::Put(Cached {
                                    count: Count {
                                        count: n.count.count + delta,
                                        ..n.count
                                    },
                                    adjusted: n.adjusted.saturating_add(1),
                                    covers: n.covers.max(committed_at),
                                    ..n
                                })
                            } else {
                                Op::Remove
                            }
                        }
                        _ => Op::Nop,
                    }
                })
                .await;
            if let CompResult::ReplacedWith(e) = result {
                return Ok(self.serve(reel, e.into_value()).await.count);
            }
        }
        // Still racing other loads, or the entry is older than what was
        // served: a sum read now includes the commit.
        let fresh = self.sum_fresh(reel).await?;
        Ok(self.serve(reel, fresh).await.count)
    }

    /// Notes the write rate of a reel this instance just summed (the change
    /// of its shards' `w` since this instance's previous sum, at least a
    /// second apart) and asks for a grow when it crosses
    /// `HOT_LIKES_PER_SEC`. Any instance that reads a reel sees the reel's
    /// whole write rate this way, not just its own share of the likes.
    async fn observe_rate(&self, reel: &ReelId, settings: &Settings, sum: ShardSum, at: Instant) {
        let Some(o) = &self.observer else { return };
        let rate = match o.samples.get(reel).await {
            Some((w0, t0)) if at > t0 => {
                let secs = (at - t0).as_secs_f64();
                if secs < 1.0 {
                    // Too short to say; keep the older sample.
                    return;
                }
                (sum.w >= w0).then(|| (sum.w - w0) as f64 / secs)
            }
            _ => None,
        };
        o.samples.insert(reel.clone(), (sum.w, at)).await;
        let Some(rate) = rate else { return };
        if rate >= o.resize.hot_per_sec {
            let want = o
                .resize
                .grow_target(settings.write_shards, Some(rate), false);
            if want > settings.write_shards {
                self.ask_grow(o, reel, want, "write_rate").await;
            }
        }
    }

    /// Counts a throttled or conflicting like transaction on `reel`; enough
    /// of them within [`CONTENTION_WINDOW`] grow the reel as a saturated
    /// one ([`ResizeConfig::grow_target`]).
    ///
    /// [`ResizeConfig::grow_target`]: crate::config::ResizeConfig::grow_target
    async fn observe_contention(&self, reel: &ReelId, settings: &Settings) {
        let Some(o) = &self.observer else { return };
        if o.resize.contention_events == 0 {
            return;
        }
        let now = Instant::now();
        let (count, _) = o
            .contention
            .entry(reel.clone())
            .and_upsert_with(|e| async move {
                match e.map(|e| e.into_value()) {
                    Some((n, first)) if now.duration_since(first) < CONTENTION_WINDOW => {
                        (n + 1, first)
                    }
                    _ => (1, now),
                }
            })
            .await
            .into_value();
        if count >= o.resize.contention_events {
            let want = o.resize.grow_target(settings.write_shards, None, true);
            if want > settings.write_shards {
                o.contention.invalidate(reel).await;
                self.ask_grow(o, reel, want, "contention").await;
            }
        }
    }

    /// Starts a grow, in the background so that no request waits for it,
    /// unless this instance asked for as many shards recently. Failures are
    /// logged and left to the next observation: a like or read never fails
    /// because a grow could not be started.
    ///
    /// The only `tokio::spawn` on a request path, kept on purpose. On Lambda
    /// the task may be frozen with the sandbox after the response and resume
    /// at its next invocation (seconds or minutes later), or never. Neither
    /// can break the resize rule: the step it writes is not stamped, and its
    /// wait starts only when it is seen in place ([`reshard`]'s module docs),
    /// so a late put only starts the grow late. A task that never resumes
    /// loses the grow until this instance's `asked` entry expires (two
    /// waits) or another instance, or the scheduled run's own sampling,
    /// asks again. Awaiting it instead would spend the request's budget (a
    /// settings read and two conditional puts) on the like or read that
    /// happened to notice, and the like path notices inside its retry loop.
    async fn ask_grow(&self, o: &Observer, reel: &ReelId, want: u32, reason: &'static str) {
        if o.asked.get(reel).await.is_some_and(|asked| asked >= want) {
            return;
        }
        o.asked.insert(reel.clone(), want).await;
        let store = Arc::clone(&self.store);
        let asked = o.asked.clone();
        let reel = reel.clone();
        tokio::spawn(async move {
            if let Err(e) = reshard::request_grow(&*store, &reel, want, reason).await {
                tracing::warn!(reel = %reel, want, reason, error = e.code(), "could not start a grow");
                asked.invalidate(&reel).await;
            }
        });
    }

    /// Readiness: both tables reachable.
    pub async fn ready(&self) -> Result<(), Error> {
        self.store.ping().await
    }
}

#[cfg(test)]
mod tests {
    //! The retry policy of [`LikeService::write`], driven by a store that
    //! answers from a script: the faults no emulator produces (conflicts,
    //! throttling cancellations) and what the service makes of them. The
    //! DynamoDB behaviour itself is tested against dynoxide in `tests/`.
    use super::*;
    use crate::store::{KeyRecord, LikeRow, Settings};
    use std::sync::Mutex;

    struct Scripted {
        answers: Mutex<Vec<TxResult>>,
        calls: Mutex<u32>,
        /// Settings items written (automatic grows).
        puts: Mutex<Vec<Settings>>,
    }

    impl CounterStore for Scripted {
        async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
            Ok(reels
                .iter()
                .map(|r| (r.clone(), Settings::default()))
                .collect())
        }
        async fn sum_shards(
            &self,
            reels: &[(ReelId, Settings)],
        ) -> Result<HashMap<ReelId, ShardSum>, Error> {
            // A reel whose sum always fails (a read that stays contended).
            if reels.iter().any(|(r, _)| r.as_str() == "failing") {
                return Err(Error::Contended);
            }
            Ok(reels
                .iter()
                .map(|(r, _)| {
                    (
                        r.clone(),
                        ShardSum {
                            n: 41,
                            w: 41,
                            last_write_ms: 0,
                        },
                    )
                })
                .collect())
        }
        async fn put_settings(&self, _r: &ReelId, _v: u64, next: &Settings) -> Result<bool, Error> {
            self.puts.lock().unwrap().push(*next);
            Ok(true)
        }
        async fn write_like(&self, _tx: &LikeTx) -> Result<TxResult, Error> {
            *self.calls.lock().unwrap() += 1;
            let mut a = self.answers.lock().unwrap();
            Ok(if a.len() > 1 { a.remove(0) } else { a[0] })
        }
        async fn like_row(&self, _u: &UserId, _r: &ReelId) -> Result<Option<LikeRow>, Error> {
            Ok(None)
        }
        async fn key_record(&self, _t: &RequestToken) -> Result<Option<KeyRecord>, Error> {
            Ok(None)
        }
        async fn record_unchanged(
            &self,
            _s: &KeyRecordSpec,
            action: Action,
        ) -> Result<KeyRecord, Error> {
            Ok(KeyRecord {
                action,
                changed: false,
            })
        }
        async fn count_items(
            &self,
            _r: &ReelId,
            _i: &[crate::store::CountItem],
        ) -> Result<Vec<(crate::store::CountItem, crate::store::ShardValue)>, Error> {
            // These stores hold no items outside a reel's read range.
            Ok(Vec::new())
        }
        async fn ping(&self) -> Result<(), Error> {
            Ok(())
        }
    }

    fn service(answers: Vec<TxResult>, extra: &[(&str, &str)]) -> LikeService<Scripted> {
        let mut vars = vec![
            ("COUNTERS_TABLE", "c"),
            ("LIKES_TABLE", "l"),
            ("RETRY_BASE_MS", "1"),
            ("RETRY_MAX_MS", "2"),
        ];
        vars.extend_from_slice(extra);
        let config = Config::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        LikeService::new(
            Scripted {
                answers: Mutex::new(answers),
                calls: Mutex::new(0),
                puts: Mutex::new(Vec::new()),
            },
            &config,
        )
    }

    fn like() -> WriteRequest {
        WriteRequest {
            user: UserId::parse("u").unwrap(),
            reel: ReelId::parse("r").unwrap(),
            action: Action::Like,
            idempotency_key: None,
            request_id: Some("req".into()),
        }
    }

    #[tokio::test]
    async fn conflicts_are_retried_then_succeed_with_the_retries_counted() {
        let conflict = TxResult::Retry(RetryReason::Conflict);
        let svc = service(
            vec![conflict, conflict, TxResult::Committed { replayed: false }],
            &[],
        );
        let out = svc.write(like()).await.unwrap();
        // The sum (41) was read after the commit, so it already includes it.
        assert_eq!(
            (out.path, out.retries, out.changed, out.count),
            (WritePath::Applied, 2, true, 41)
        );
        assert_eq!(*svc.store().calls.lock().unwrap(), 3);
    }

    #[tokio::test]
    async fn a_sum_cached_before_the_write_is_adjusted_by_it() {
        let svc = service(vec![TxResult::Committed { replayed: false }], &[]);
        svc.count(&ReelId::parse("r").unwrap()).await.unwrap();
        let out = svc.write(like()).await.unwrap();
        assert_eq!((out.changed, out.count), (true, 42));
        let svc = service(vec![TxResult::AlreadyInState], &[]);
        svc.count(&ReelId::parse("r").unwrap()).await.unwrap();
        let out = svc.write(like()).await.unwrap();
        assert_eq!((out.changed, out.count), (false, 41));
    }

    #[tokio::test]
    async fn a_batch_read_does_not_fail_because_of_one_reel() {
        let svc = service(vec![TxResult::Committed { replayed: false }], &[]);
        let reels: Vec<ReelId> = ["a", "failing", "b"]
            .iter()
            .map(|r| ReelId::parse(r).unwrap())
            .collect();
        let counts = svc.counts(&reels).await.unwrap();
        let mut got: Vec<(&str, i64)> = counts.iter().map(|(r, c)| (r.as_str(), c.count)).collect();
        got.sort();
        assert_eq!(got, [("a", 41), ("b", 41)], "the failing reel is left out");
        // Alone, it still fails (there is nothing else to answer).
        assert_eq!(
            svc.counts(&reels[1..2]).await.unwrap_err(),
            Error::Contended
        );
    }

    #[tokio::test]
    async fn retries_are_bounded_and_end_in_429_errors() {
        let svc = service(
            vec![TxResult::Retry(RetryReason::Conflict)],
            &[("TX_MAX_ATTEMPTS", "4")],
        );
        assert_eq!(svc.write(like()).await.unwrap_err(), Error::Contended);
        assert_eq!(*svc.store().calls.lock().unwrap(), 4);

        let svc = service(
            vec![TxResult::Retry(RetryReason::Throttled)],
            &[("TX_MAX_ATTEMPTS", "3")],
        );
        let err = svc.write(like()).await.unwrap_err();
        assert_eq!((err.status(), err.retry_after_secs()), (429, Some(1)));
        assert_eq!(*svc.store().calls.lock().unwrap(), 3);
    }

    #[tokio::test]
    async fn repeated_contention_on_a_reel_starts_a_grow_once() {
        let conflict = TxResult::Retry(RetryReason::Conflict);
        let throttled = TxResult::Retry(RetryReason::Throttled);
        let svc = service(
            vec![
                conflict,
                throttled,
                conflict,
                TxResult::Committed { replayed: false },
            ],
            &[("CONTENTION_GROW_EVENTS", "3")],
        );
        svc.write(like()).await.unwrap();
        // The grow starts in the background.
        for _ in 0..100 {
            if !svc.store().puts.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The grow's first step, then its stamp once the put returned
        // (crate::reshard: a wait starts when its phase is seen in place).
        for _ in 0..100 {
            if svc.store().puts.lock().unwrap().len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let puts = svc.store().puts.lock().unwrap().clone();
        assert_eq!(puts.len(), 2, "{puts:?}");
        assert_eq!(puts[0].phase_at_ms, crate::reshard::UNOBSERVED);
        assert_eq!(puts[1].phase, crate::store::Phase::Growing);
        assert_ne!(puts[1].phase_at_ms, crate::reshard::UNOBSERVED);
        // The first step of a grow 1 -> 4 (a contended reel is saturated:
        // SATURATED_GROWTH): readers first.
        assert_eq!(
            (
                puts[0].phase,
                puts[0].read_shards,
                puts[0].write_shards,
                puts[0].target
            ),
            (crate::store::Phase::Growing, 4, 1, 4)
        );

        // Two contended attempts stay below the threshold; AUTO_RESHARD=off
        // never grows.
        let svc = service(
            vec![conflict, conflict, TxResult::Committed { replayed: false }],
            &[("CONTENTION_GROW_EVENTS", "3")],
        );
        svc.write(like()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(svc.store().puts.lock().unwrap().is_empty());
        let svc = service(
            vec![
                conflict,
                conflict,
                conflict,
                TxResult::Committed { replayed: false },
            ],
            &[("AUTO_RESHARD", "off")],
        );
        svc.write(like()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(svc.store().puts.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn no_attempt_starts_that_could_not_finish_within_the_budget() {
        // One call may take the whole budget: no retry can fit after the first.
        let svc = service(
            vec![TxResult::Retry(RetryReason::Conflict)],
            &[
                ("TX_MAX_ATTEMPTS", "50"),
                ("REQUEST_BUDGET_MS", "100"),
                ("DDB_OPERATION_TIMEOUT_MS", "100"),
                ("RETRY_BASE_MS", "30"),
                ("RETRY_MAX_MS", "30"),
            ],
        );
        assert_eq!(svc.write(like()).await.unwrap_err(), Error::Contended);
        assert_eq!(*svc.store().calls.lock().unwrap(), 1);
    }
}

#[cfg(test)]
mod cache_race_tests {
    //! The cached sum against a read that overlaps this instance's own
    //! transaction, with the timing made explicit by a store whose calls
    //! take set times (the emulator answers too fast to show the race).
    use super::*;
    use crate::store::{KeyRecord, LikeRow};
    use std::sync::atomic::{AtomicI64, Ordering};

    /// One counter; a read answers 200 ms after it is sent; a transaction
    /// commits 10 ms after it is sent and its answer arrives 400 ms later.
    /// (Wide margins: the ordering must hold on a loaded CI machine.)
    struct Timed {
        truth: AtomicI64,
    }

    impl CounterStore for Timed {
        async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
            Ok(reels
                .iter()
                .map(|r| (r.clone(), Settings::default()))
                .collect())
        }
        async fn sum_shards(
            &self,
            reels: &[(ReelId, Settings)],
        ) -> Result<HashMap<ReelId, ShardSum>, Error> {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let n = self.truth.load(Ordering::SeqCst);
            Ok(reels
                .iter()
                .map(|(r, _)| {
                    (
                        r.clone(),
                        ShardSum {
                            n,
                            w: n,
                            last_write_ms: 0,
                        },
                    )
                })
                .collect())
        }
        async fn put_settings(&self, _r: &ReelId, _v: u64, _s: &Settings) -> Result<bool, Error> {
            Ok(true)
        }
        async fn write_like(&self, tx: &LikeTx) -> Result<TxResult, Error> {
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.truth.fetch_add(tx.action.delta(), Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(400)).await;
            Ok(TxResult::Committed { replayed: false })
        }
        async fn like_row(&self, _u: &UserId, _r: &ReelId) -> Result<Option<LikeRow>, Error> {
            Ok(None)
        }
        async fn key_record(&self, _t: &RequestToken) -> Result<Option<KeyRecord>, Error> {
            Ok(None)
        }
        async fn record_unchanged(
            &self,
            _s: &KeyRecordSpec,
            action: Action,
        ) -> Result<KeyRecord, Error> {
            Ok(KeyRecord {
                action,
                changed: false,
            })
        }
        async fn count_items(
            &self,
            _r: &ReelId,
            _i: &[crate::store::CountItem],
        ) -> Result<Vec<(crate::store::CountItem, crate::store::ShardValue)>, Error> {
            // These stores hold no items outside a reel's read range.
            Ok(Vec::new())
        }
        async fn ping(&self) -> Result<(), Error> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_read_that_overlaps_the_commit_is_not_adjusted_again() {
        let config = Config::from_lookup(|k| match k {
            "COUNTERS_TABLE" | "LIKES_TABLE" => Some("t".into()),
            "CACHE_TTL_MS" => Some("60000".into()),
            _ => None,
        })
        .unwrap();
        let svc = Arc::new(LikeService::new(
            Timed {
                truth: AtomicI64::new(0),
            },
            &config,
        ));
        let reel = ReelId::parse("r").unwrap();
        // A reader sends its sum first; the like is sent 5 ms later and
        // commits while the read is in flight, so the read includes it,
        // but it is cached before the like's answer arrives.
        let reader = tokio::spawn({
            let (svc, reel) = (svc.clone(), reel.clone());
            async move { svc.count(&reel).await.unwrap().count }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let out = svc
            .write(WriteRequest {
                user: UserId::parse("u").unwrap(),
                reel: reel.clone(),
                action: Action::Like,
                idempotency_key: None,
                request_id: Some("req".into()),
            })
            .await
            .unwrap();
        assert_eq!(
            reader.await.unwrap(),
            1,
            "the overlapping read saw the commit"
        );
        assert_eq!(out.count, 1, "not adjusted a second time");
        assert_eq!(
            svc.count(&reel).await.unwrap().count,
            1,
            "the cached sum is exact"
        );
    }
}

#[cfg(test)]
mod served_tests {
    //! What one instance serves never goes back (issue 13, part 8): a sum
    //! read sent before a newer value was served never replaces it, through
    //! a store whose reads the test holds and releases, so the races of a
    //! slow read (retries under faults) are ordered deterministically.
    use super::*;
    use crate::store::{KeyRecord, LikeRow};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
    use tokio::sync::Notify;

    /// One counter. Sum read number `hold` (1-based) captures the count
    /// when it is sent, says so (`held`), and answers it only once released
    /// (`release`); every other read answers at once. Every like commits
    /// (+1); `replayed` says, per like in order, whether DynamoDB answered
    /// it as a replay (an earlier attempt, whose answer was lost, committed).
    struct Gated {
        truth: AtomicI64,
        sums: AtomicU32,
        hold: u32,
        held: Notify,
        release: Notify,
        replayed: Mutex<Vec<bool>>,
    }

    impl CounterStore for Gated {
        async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
            Ok(reels
                .iter()
                .map(|r| (r.clone(), Settings::default()))
                .collect())
        }
        async fn sum_shards(
            &self,
            reels: &[(ReelId, Settings)],
        ) -> Result<HashMap<ReelId, ShardSum>, Error> {
            let i = self.sums.fetch_add(1, Ordering::SeqCst) + 1;
            let n = self.truth.load(Ordering::SeqCst);
            if i == self.hold {
                self.held.notify_one();
                self.release.notified().await;
            }
            Ok(reels
                .iter()
                .map(|(r, _)| {
                    (
                        r.clone(),
                        ShardSum {
                            n,
                            w: n,
                            last_write_ms: 0,
                        },
                    )
                })
                .collect())
        }
        async fn put_settings(&self, _r: &ReelId, _v: u64, _s: &Settings) -> Result<bool, Error> {
            Ok(true)
        }
        async fn write_like(&self, _tx: &LikeTx) -> Result<TxResult, Error> {
            self.truth.fetch_add(1, Ordering::SeqCst);
            let mut r = self.replayed.lock().unwrap();
            let replayed = if r.is_empty() { false } else { r.remove(0) };
            Ok(TxResult::Committed { replayed })
        }
        async fn like_row(&self, _u: &UserId, _r: &ReelId) -> Result<Option<LikeRow>, Error> {
            Ok(None)
        }
        async fn key_record(&self, _t: &RequestToken) -> Result<Option<KeyRecord>, Error> {
            Ok(None)
        }
        async fn record_unchanged(
            &self,
            _s: &KeyRecordSpec,
            action: Action,
        ) -> Result<KeyRecord, Error> {
            Ok(KeyRecord {
                action,
                changed: false,
            })
        }
        async fn count_items(
            &self,
            _r: &ReelId,
            _i: &[crate::store::CountItem],
        ) -> Result<Vec<(crate::store::CountItem, crate::store::ShardValue)>, Error> {
            // These stores hold no items outside a reel's read range.
            Ok(Vec::new())
        }
        async fn ping(&self) -> Result<(), Error> {
            Ok(())
        }
    }

    fn service(
        truth: i64,
        hold: u32,
        replayed: Vec<bool>,
        ttl_ms: &str,
    ) -> Arc<LikeService<Gated>> {
        let config = Config::from_lookup(|k| match k {
            "COUNTERS_TABLE" | "LIKES_TABLE" => Some("t".into()),
            "CACHE_TTL_MS" => Some(ttl_ms.into()),
            "AUTO_RESHARD" => Some("off".into()),
            _ => None,
        })
        .unwrap();
        Arc::new(LikeService::new(
            Gated {
                truth: AtomicI64::new(truth),
                sums: AtomicU32::new(0),
                hold,
                held: Notify::new(),
                release: Notify::new(),
                replayed: Mutex::new(replayed),
            },
            &config,
        ))
    }

    fn like(user: &str) -> WriteRequest {
        WriteRequest {
            user: UserId::parse(user).unwrap(),
            reel: ReelId::parse("r").unwrap(),
            action: Action::Like,
            idempotency_key: None,
            request_id: Some(format!("req-{user}")),
        }
    }

    fn truth(svc: &LikeService<Gated>) -> i64 {
        svc.store().truth.load(Ordering::SeqCst)
    }

    /// Likes only, so every value served must be at least the one served
    /// before it, and at most the truth.
    fn assert_never_back(served: &[(&str, i64)], truth: i64) {
        for w in served.windows(2) {
            assert!(w[1].1 >= w[0].1, "served count went back: {served:?}");
        }
        for (what, n) in served {
            assert!(*n <= truth, "{what} served {n} above the truth {truth}");
        }
    }

    #[tokio::test]
    async fn a_replayed_like_never_serves_a_load_that_began_before_a_newer_value() {
        // The traced case: a slow load is in flight; batch reads cache 10; a
        // like adjusts the entry to 11 (served); a replayed like drops the
        // entry and reads again, which must not end in the slow load's 10.
        let svc = service(10, 1, vec![false, true, false], "60000");
        let reel = ReelId::parse("r").unwrap();
        let slow = tokio::spawn({
            let (svc, reel) = (svc.clone(), reel.clone());
            async move { svc.count(&reel).await.unwrap().count }
        });
        svc.store().held.notified().await;
        let mut served = Vec::new();
        let batch = svc.counts(std::slice::from_ref(&reel)).await.unwrap()[&reel].count;
        served.push(("batch read", batch));
        let applied = svc.write(like("a")).await.unwrap();
        assert_eq!((applied.path, applied.count), (WritePath::Applied, 11));
        served.push(("applied like", applied.count));
        let replay = tokio::spawn({
            let svc = svc.clone();
            async move { svc.write(like("b")).await.unwrap() }
        });
        // Let the replayed like reach its read (today: joining the slow
        // load), then let the slow load answer the 10 it read.
        tokio::time::sleep(Duration::from_millis(50)).await;
        svc.store().release.notify_one();
        let replayed = replay.await.unwrap();
        assert_eq!(replayed.path, WritePath::Replayed);
        served.push(("replayed like", replayed.count));
        served.push(("slow load", slow.await.unwrap()));
        served.push(("next read", svc.count(&reel).await.unwrap().count));
        served.push((
            "next batch read",
            svc.counts(std::slice::from_ref(&reel)).await.unwrap()[&reel].count,
        ));
        assert_never_back(&served, truth(&svc));
        // The replayed like's answer includes its own like.
        assert_eq!(replayed.count, 12, "{served:?}");
        // A like applied to the stale entry the slow load left in the cache
        // answers with its own like too, not from below what was served.
        let next = svc.write(like("c")).await.unwrap();
        assert_eq!(
            (next.path, next.count),
            (WritePath::Applied, 13),
            "{served:?}"
        );
        served.push(("last like", next.count));
        served.push(("last read", svc.count(&reel).await.unwrap().count));
        assert_never_back(&served, truth(&svc));
    }

    #[tokio::test]
    async fn a_batch_read_sent_before_a_newer_value_never_replaces_it() {
        // A batch read is sent (and held) with the count at 10; a like is
        // applied and answers 11; the entry expires; then the batch read's
        // 10 arrives and finds no entry (`or_insert`).
        let svc = service(10, 1, vec![], "300");
        let reel = ReelId::parse("r").unwrap();
        let batch = tokio::spawn({
            let (svc, reel) = (svc.clone(), reel.clone());
            async move { svc.counts(std::slice::from_ref(&reel)).await.unwrap()[&reel].count }
        });
        svc.store().held.notified().await;
        let mut served = Vec::new();
        let applied = svc.write(like("a")).await.unwrap();
        assert_eq!(applied.count, 11);
        served.push(("applied like", applied.count));
        served.push(("read", svc.count(&reel).await.unwrap().count));
        // Well past CACHE_TTL_MS (300 ms) after the entry's read.
        tokio::time::sleep(Duration::from_millis(900)).await;
        svc.store().release.notify_one();
        served.push(("held batch read", batch.await.unwrap()));
        served.push(("next read", svc.count(&reel).await.unwrap().count));
        assert_never_back(&served, truth(&svc));
    }
}
