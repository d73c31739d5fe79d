//! `GET /reels/{reel_id}/views`: a reel's views and unique viewers, all
//! time and over the last seven UTC days, summed over its writers' items
//! and cached as like counts are.

use super::sketch::union_estimate;
use crate::error::Error;
use crate::keys::window::{Window, WindowCounts};
use crate::keys::{self, ReelId};
use crate::store::ViewStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// UTC days the `_7d` figures cover: today and the six before.
pub const WINDOW_DAYS: i64 = 7;

/// A reel's figures, as summed at `read_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewCounts {
    /// Views, all time.
    pub views: u64,
    /// Distinct viewers, all time (an estimate).
    pub unique_viewers: u64,
    /// Views on the last seven UTC days, today included.
    pub views_7d: u64,
    /// Distinct viewers over those days (an estimate).
    pub unique_viewers_7d: u64,
    /// Views over the last hour, 24 hours and 7 days
    /// ([`crate::keys::window`]; the 7 days are the day items of
    /// [`Window::Week`]'s days, today's included).
    pub windows: WindowCounts,
    /// The clock (Unix ms) the windows were read at.
    pub as_of_ms: i64,
    /// When they were read.
    pub read_at: Instant,
}

impl ViewCounts {
    /// How old the figures are.
    pub fn age(&self) -> Duration {
        self.read_at.elapsed()
    }
}

/// Reads and caches reels' view figures.
pub struct ViewReader<S> {
    store: S,
    /// `None` with a lifetime of 0: every read sums.
    cache: Option<moka::future::Cache<ReelId, Arc<ViewCounts>>>,
    clock: super::Clock,
    /// Reads of the table since this reader was built (cache misses).
    reads: std::sync::atomic::AtomicU64,
    /// How long a sum is cached: a warm one, for what is left of it.
    ttl: Duration,
    /// The cache warmer's set as last read ([`crate::store::WarmStore`]).
    warm: crate::store::SetCache,
    /// Figures served from the warmer's items instead of a read.
    warm_hits: std::sync::atomic::AtomicU64,
    /// The reels ever counted: one never counted is answered without a
    /// read ([`crate::known`]).
    known: Option<crate::known::SharedKnown>,
}

/// A sum expires `ttl` after it was read (a warm one: after the warmer's
/// read was sent).
struct SinceRead(Duration);

impl moka::Expiry<ReelId, Arc<ViewCounts>> for SinceRead {
    fn expire_after_create(
        &self,
        _: &ReelId,
        value: &Arc<ViewCounts>,
        _: Instant,
    ) -> Option<Duration> {
        Some(self.0.saturating_sub(value.read_at.elapsed()))
    }
}

impl<S: ViewStore> ViewReader<S> {
    /// A reader over `store`, keeping sums for `ttl` (at most `capacity`
    /// reels), with `clock` (Unix ms) telling the day.
    pub fn new(store: S, ttl: Duration, capacity: u64, clock: super::Clock) -> Self {
        ViewReader {
            store,
            cache: (!ttl.is_zero()).then(|| {
                moka::future::Cache::builder()
                    .expire_after(SinceRead(ttl))
                    .max_capacity(capacity)
                    .build()
            }),
            clock,
            reads: std::sync::atomic::AtomicU64::new(0),
            ttl,
            warm: crate::store::SetCache::default(),
            warm_hits: std::sync::atomic::AtomicU64::new(0),
            known: None,
        }
    }

    /// Answers reels `known` says were never counted with zeros, without
    /// a read.
    pub fn with_known(mut self, known: crate::known::SharedKnown) -> Self {
        self.known = Some(known);
        self
    }

    /// Zeros, as of the known-reels set's last refresh, if the set says
    /// `reel` never had a view counted.
    async fn never_viewed(&self, reel: &ReelId) -> Option<Arc<ViewCounts>> {
        let (absent, at) = self
            .known
            .as_ref()?
            .absent(std::slice::from_ref(reel))
            .await;
        let read_at = at.filter(|_| absent.contains(reel))?;
        Some(Arc::new(ViewCounts {
            views: 0,
            unique_viewers: 0,
            views_7d: 0,
            unique_viewers_7d: 0,
            windows: Default::default(),
            as_of_ms: (self.clock)() - read_at.elapsed().as_millis() as i64,
            read_at,
        }))
    }

    /// Reels read from the table (not from the cache) since it was built.
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The trending sketches of `metric`'s writers in `hour`, as each
    /// stored it last ([`crate::trending`]).
    pub async fn hour_sketches(
        &self,
        metric: &str,
        hour: i64,
    ) -> Result<crate::store::HourSketches, Error> {
        self.store.hour_sketches(metric, hour).await
    }

    /// The figures of `reel`, from the cache while they are fresh; one
    /// read of the items at a time per reel per instance.
    pub async fn counts(&self, reel: &ReelId) -> Result<Arc<ViewCounts>, Error> {
        match &self.cache {
            Some(c) => c
                .try_get_with(reel.clone(), Box::pin(self.warm_or_read(reel)))
                .await
                .map_err(|e| (*e).clone()),
            None => match self.never_viewed(reel).await {
                Some(zero) => Ok(zero),
                None => self.read_now(reel).await,
            },
        }
    }

    /// Figures served from the cache warmer's items since this reader was
    /// built.
    pub fn warm_hits(&self) -> u64 {
        self.warm_hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A miss's figures: the cache warmer's, if it keeps the reel warm and
    /// they are young enough to cache (as for like counts:
    /// [`crate::store::WarmStore`]), else read now. A warm read that fails
    /// only costs the read.
    async fn warm_or_read(&self, reel: &ReelId) -> Result<Arc<ViewCounts>, Error> {
        if let Some(zero) = self.never_viewed(reel).await {
            return Ok(zero);
        }
        if self.warm.get(self.store.warm_set()).await.contains(reel) {
            match self.store.warm_figures(reel).await {
                Ok(Some(f)) => {
                    let read_at = f.read_at(crate::clock::now_ms(), self.ttl);
                    if let (Some(read_at), Some(v)) = (read_at, f.views) {
                        self.warm_hits
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Ok(Arc::new(ViewCounts {
                            views: v.views,
                            unique_viewers: v.unique_viewers,
                            views_7d: v.views_7d,
                            unique_viewers_7d: v.unique_viewers_7d,
                            windows: v.windows,
                            as_of_ms: v.as_of_ms,
                            read_at,
                        }));
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::info!(error = e.code(), "warm figures unread: the reel is read"),
            }
        }
        self.read_now(reel).await
    }

    /// The figures of `reel` read now, bypassing the cache and the warm
    /// figures (the cache warmer's own reads).
    pub async fn read_now(&self, reel: &ReelId) -> Result<Arc<ViewCounts>, Error> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = (self.clock)();
        let today = keys::utc_day(now);
        let first = keys::utc_day(now - (WINDOW_DAYS - 1) * 86_400_000);
        // The week window's first day is one before the seven days'.
        let oldest = keys::utc_day(Window::Week.from_ms(now));
        let range = keys::views_day_range(&oldest, &today);
        let (all, days) = self
            .store
            .reel_views(&keys::views_reel_key(reel), (&range.0, &range.1))
            .await?;
        let day_of = |sk: &str| {
            keys::parse_views_sort(sk)
                .and_then(|(d, _)| d)
                .map(str::to_owned)
        };
        let last7: Vec<_> = days
            .iter()
            .filter(|i| day_of(&i.sk).is_some_and(|d| d >= first))
            .collect();
        let mut windows = WindowCounts::default();
        for item in &days {
            for (name, v) in &item.windows {
                windows.add_attr(name, *v, now);
            }
            windows.week = windows.week.saturating_add(item.views as i64);
        }
        Ok(Arc::new(ViewCounts {
            views: all.iter().map(|i| i.views).sum(),
            unique_viewers: union_estimate(all.iter().map(|i| i.sketch.as_slice())),
            views_7d: last7.iter().map(|i| i.views).sum(),
            unique_viewers_7d: union_estimate(last7.iter().map(|i| i.sketch.as_slice())),
            windows,
            as_of_ms: now,
            read_at: Instant::now(),
        }))
    }
}
