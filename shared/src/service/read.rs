//! The count reads, of one reel or a batch, and the settings reads, with
//! their caches: the count cache's [`Cached`] entries, the settings cache's
//! [`FreshSettings`], and the expiry both share ([`SinceRead`]).

use super::{Count, LikeService};
use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::tail::RecentTail;
use crate::store::{CounterStore, Settings, ShardSum};
use futures::StreamExt;
use moka::Expiry;
use moka::future::Cache;
use moka::ops::compute::Op;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A cached sum and its lineage: which read produced it and how many of
/// this instance's own changes were applied to it since.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    /// `count` includes the own changes; `read_at` and `done_at` are the
    /// read's.
    pub(super) count: Count,
    /// Which read (unique in this instance) the value descends from.
    pub(super) load: u64,
    /// Own changes applied to that read's value, in order.
    pub(super) adjusted: u32,
    /// The value includes no change committed after this instant: the
    /// read's answer, or the return of the last own change applied.
    pub(super) covers: Instant,
    /// Stream mode: the latest clock (Unix ms) at which a change this value
    /// may hold was written: the shards' `updated_at` as read (the
    /// aggregator's clock when it last applied records to them), or the
    /// request clock of an own change applied since. A like row whose
    /// `liked_at` is later is certainly not in the value (see
    /// [`LikeService::serve_own_change`]).
    pub(super) holds_ms: i64,
    /// Stream mode: the read's own-change tail, by which it can be cut
    /// at a moment (see [`crate::keys::tail`]); none in transactional
    /// mode.
    pub(super) tail: RecentTail,
    /// The read's own value, before the own changes in `count`: what
    /// `tail` cuts.
    pub(super) read_n: i64,
}

impl Cached {
    fn read(load: u64, sum: ShardSum, read_at: Instant, done_at: Instant) -> Self {
        Cached {
            count: Count {
                count: sum.n,
                read_at,
                done_at,
                windows: sum.windows,
                windows_at_ms: sum.windows_at_ms,
            },
            load,
            adjusted: 0,
            covers: done_at,
            holds_ms: sum.last_write_ms,
            tail: sum.tail,
            read_n: sum.n,
        }
    }
}

impl ReadAt for Cached {
    fn read_at(&self) -> Instant {
        self.count.read_at
    }
}

/// A reel's settings and when the read that produced them was sent.
#[derive(Clone, Copy, Debug)]
pub(super) struct FreshSettings {
    settings: Settings,
    read_at: Instant,
}

/// A cached value that knows when it was read.
pub(super) trait ReadAt {
    fn read_at(&self) -> Instant;
}

impl ReadAt for FreshSettings {
    fn read_at(&self) -> Instant {
        self.read_at
    }
}

/// Entries expire `ttl` after the read that produced them was sent, however
/// long the read took and however often this instance adjusts a count for
/// its own writes. For settings this is what bounds how long a resize step
/// must wait ([`Config::resize_wait`](crate::config::Config::resize_wait)).
pub(super) struct SinceRead(pub(super) Duration);

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

/// A count or settings cache of at most `max` reels, entries kept `ttl`
/// after their read; `None` (nothing cached) for a zero `ttl`.
pub(super) fn cache<V: ReadAt + Clone + Send + Sync + 'static>(
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

/// The error of a load shared by concurrent misses, as each caller's own.
fn unshare(e: Arc<Error>) -> Error {
    (*e).clone()
}

impl<S: CounterStore> LikeService<S> {
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

    /// One reel's count as the count cache holds it (read on a miss),
    /// for its net likes over the last hour, 24 hours and 7 days
    /// ([`Count::windows`]).
    pub async fn windows(&self, reel: &ReelId) -> Result<Count, Error> {
        Ok(self.cached(reel).await?.count)
    }

    /// The cached count of one reel (summed from its shards on a miss).
    pub async fn count(&self, reel: &ReelId) -> Result<Count, Error> {
        let c = self.cached(reel).await?;
        Ok(self.serve(reel, c).await)
    }

    /// The count cache's entry for `reel`, or a sum read now (concurrent
    /// misses share one read); not yet guarded by [`Self::serve`].
    pub(super) async fn cached(&self, reel: &ReelId) -> Result<Cached, Error> {
        match &self.counts {
            Some(c) => {
                if let Some(n) = c.get(reel).await {
                    self.cache_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(n);
                }
                if let Some(n) = self
                    .never_counted(std::slice::from_ref(reel))
                    .await
                    .remove(reel)
                {
                    return Ok(c.entry(reel.clone()).or_insert(n).await.into_value());
                }
                self.cache_misses.fetch_add(1, Ordering::Relaxed);
                // The load may be joined by callers that come much later
                // (a slow read under faults): what it answers is guarded
                // by `serve`, not trusted for being new.
                c.try_get_with(reel.clone(), self.warm_or_sum(reel))
                    .await
                    .map_err(unshare)
            }
            None => {
                if let Some(n) = self
                    .never_counted(std::slice::from_ref(reel))
                    .await
                    .remove(reel)
                {
                    return Ok(n);
                }
                self.cache_misses.fetch_add(1, Ordering::Relaxed);
                self.sum_now(reel).await
            }
        }
    }

    /// A miss's value: the reel's warm figures if the cache warmer keeps
    /// them and they are young enough to cache, else its shards summed now.
    async fn warm_or_sum(&self, reel: &ReelId) -> Result<Cached, Error> {
        // Boxed: the count reads' futures nest deep in the handlers'.
        let warm = Box::pin(self.warm(std::slice::from_ref(reel))).await;
        match warm.into_iter().next() {
            Some((_, c)) => Ok(c),
            None => Box::pin(self.sum_now(reel)).await,
        }
    }

    /// Of `reels`, those the known-reels set says were never counted, as
    /// cache entries of zero read when the set was last refreshed: no
    /// read of the tables ([`crate::known`]). None without a trusted set.
    async fn never_counted(&self, reels: &[ReelId]) -> HashMap<ReelId, Cached> {
        let Some(k) = &self.known else {
            return HashMap::new();
        };
        if reels.is_empty() {
            return HashMap::new();
        }
        let (absent, at) = k.absent(reels).await;
        let Some(at) = at else {
            return HashMap::new();
        };
        // Read, and done, when the refresh started: the set knows nothing
        // later (`covers` must not claim more).
        let load = self.loads.fetch_add(1, Ordering::Relaxed);
        absent
            .into_iter()
            .map(|r| (r, Cached::read(load, ShardSum::default(), at, at)))
            .collect()
    }

    /// Of `reels`, those the cache warmer keeps warm
    /// ([`crate::store::WarmStore`]) whose figures are young enough to
    /// cache, as cache entries: each taken as read when the warmer sent
    /// its read (less the clocks' skew), so it is cached only for what is
    /// left of `CACHE_TTL_MS` and [`Self::serve`] judges it as any read
    /// sent then. Without a count cache nothing is warm: every count is
    /// read when asked. A warm read that fails only costs the sum.
    async fn warm(&self, reels: &[ReelId]) -> HashMap<ReelId, Cached> {
        if self.counts.is_none() {
            return HashMap::new();
        }
        let set = self.warm.get(self.store.warm_set()).await;
        let wanted: Vec<ReelId> = reels.iter().filter(|r| set.contains(*r)).cloned().collect();
        if wanted.is_empty() {
            return HashMap::new();
        }
        let figures = match self.store.warm_figures(&wanted).await {
            Ok(f) => f,
            Err(e) => {
                tracing::info!(
                    error = e.code(),
                    "warm figures unread: the reels are summed"
                );
                return HashMap::new();
            }
        };
        let now_ms = crate::clock::now_ms();
        let out: HashMap<ReelId, Cached> = figures
            .into_iter()
            .filter_map(|(r, f)| {
                let read_at = f.read_at(now_ms, self.cache_ttl)?;
                let load = self.loads.fetch_add(1, Ordering::Relaxed);
                Some((
                    r,
                    Cached::read(load, f.likes?.into(), read_at, Instant::now()),
                ))
            })
            .collect();
        self.warm_hits
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// Counts served from the cache warmer's figures since this instance
    /// started, instead of summing shards.
    pub fn warm_hits(&self) -> u64 {
        self.warm_hits.load(Ordering::Relaxed)
    }

    /// Sums the reel's shards now, bypassing the count cache.
    pub(super) async fn sum_now(&self, reel: &ReelId) -> Result<Cached, Error> {
        let settings = self.settings(reel).await?;
        let load = self.loads.fetch_add(1, Ordering::Relaxed);
        let read_at = Instant::now();
        let sums = self.store.sum_shards(&[(reel.clone(), settings)]).await?;
        let done_at = Instant::now();
        let sum = sums.get(reel).copied().unwrap_or_default();
        self.observe_rate(reel, &settings, sum, read_at).await;
        Ok(Cached::read(load, sum, read_at, done_at))
    }

    /// The sums of `reels` read now, bypassing the count cache and the
    /// warm figures (the cache warmer's own reads, which the rate
    /// observer sees as any read). A reel whose sum fails is left out.
    pub async fn sums_now(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, ShardSum>, Error> {
        let settings = self.settings_many(reels).await?;
        let plan: Vec<(ReelId, Settings)> = reels
            .iter()
            .map(|r| (r.clone(), settings.get(r).copied().unwrap_or_default()))
            .collect();
        let read_at = Instant::now();
        let sums = match self.store.sum_shards(&plan).await {
            Ok(sums) => sums,
            Err(e) if e.status() >= 429 && e != Error::Throttled && plan.len() > 1 => {
                self.sum_each(&plan).await.0
            }
            Err(e) => return Err(e),
        };
        for (r, s) in &plan {
            if let Some(sum) = sums.get(r) {
                self.observe_rate(r, s, *sum, read_at).await;
            }
        }
        Ok(sums)
    }

    /// Sums the reel's shards now, and caches the result unless the entry
    /// in place covers changes this read may have missed.
    pub(super) async fn sum_fresh(&self, reel: &ReelId) -> Result<Cached, Error> {
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
        for (r, n) in self.never_counted(&missing).await {
            missing.retain(|m| *m != r);
            let n = match &self.counts {
                Some(c) => c.entry(r.clone()).or_insert(n).await.into_value(),
                None => n,
            };
            found.insert(r, n);
        }
        self.cache_misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);
        for (r, n) in Box::pin(self.warm(&missing)).await {
            missing.retain(|m| *m != r);
            let n = match &self.counts {
                // As a read's below: an entry that appeared meanwhile wins.
                Some(c) => c.entry(r.clone()).or_insert(n).await.into_value(),
                None => n,
            };
            found.insert(r, n);
        }
        if !missing.is_empty() {
            let settings = match self.settings_many(&missing).await {
                Ok(s) => s,
                Err(e @ Error::Throttled) => return self.cached_or(found, e).await,
                Err(e) => return Err(e),
            };
            let (plan, over) = within_budget(
                missing
                    .iter()
                    .map(|r| (r.clone(), settings.get(r).copied().unwrap_or_default())),
                self.feed_read_items,
            );
            if !over.is_empty() {
                tracing::info!(
                    reels = over.len(),
                    items = self.feed_read_items,
                    "a batch read left out reels past its read budget"
                );
            }
            missing.retain(|r| !over.contains(r));
            let load = self.loads.fetch_add(1, Ordering::Relaxed);
            let read_at = Instant::now();
            let (sums, failed) = match self.store.sum_shards(&plan).await {
                Ok(sums) => (sums, Vec::new()),
                // Throttled (after the store's bounded retries): reading
                // each reel again one by one would add load at the worst
                // moment.
                Err(e @ Error::Throttled) => return self.cached_or(found, e).await,
                // One reel's sum failing (say, a shrinking reel whose folds
                // kept landing) must not fail the others: each is summed on
                // its own, and the ones that still fail are left out (the
                // answer lists them), unless nothing is left to answer.
                Err(e) if e.status() >= 429 && (plan.len() > 1 || !found.is_empty()) => {
                    // A reel read alone has had its read: it is the one
                    // that failed.
                    let (sums, failed) = match plan.as_slice() {
                        [(only, _)] => (HashMap::new(), vec![only.clone()]),
                        _ => self.sum_each(&plan).await,
                    };
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
                let sum = sums.get(&r).copied().unwrap_or_default();
                let mut n = Cached::read(load, sum, read_at, done_at);
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
        Ok(self.serve_all(found).await)
    }

    /// A batch read that failed with `e` (throttled) fails fast: the counts
    /// `found` in the cache are answered and the rest left out (the handler
    /// lists them as unavailable), or, with none, `e` (a jittered
    /// Retry-After).
    async fn cached_or(
        &self,
        found: HashMap<ReelId, Cached>,
        e: Error,
    ) -> Result<HashMap<ReelId, Count>, Error> {
        if found.is_empty() {
            return Err(e);
        }
        Ok(self.serve_all(found).await)
    }

    /// `found`, each passed through [`Self::serve`].
    async fn serve_all(&self, found: HashMap<ReelId, Cached>) -> HashMap<ReelId, Count> {
        let mut out = HashMap::with_capacity(found.len());
        for (r, c) in found {
            let n = self.serve(&r, c).await;
            out.insert(r, n);
        }
        out
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
}

/// The reels of `plan` (in the request's order) whose shard items fit in
/// `items` together, and the ones left over. The first reel is always
/// read, whatever it costs: a single reel is at most `MAX_SHARDS` items
/// (twice that while it drains), bounded anyway.
fn within_budget(
    plan: impl Iterator<Item = (ReelId, Settings)>,
    items: usize,
) -> (Vec<(ReelId, Settings)>, Vec<ReelId>) {
    let (mut read, mut over) = (Vec::new(), Vec::new());
    let mut spent = 0usize;
    for (reel, settings) in plan {
        let ri = settings.read_items(&reel);
        let cost = ri.batch.len() + ri.atomic.len();
        if read.is_empty() || (over.is_empty() && spent + cost <= items) {
            spent += cost;
            read.push((reel, settings));
        } else {
            over.push(reel);
        }
    }
    (read, over)
}

#[cfg(test)]
mod tests;
