//! [`WarmStore`]: the cache warmer's items ([`crate::warmer`] writes
//! them), what they hold, and when an instance may serve them. The reads
//! every count read may make (the warm set, the warm figures) are
//! [`super::CounterStore`]'s and [`super::ViewStore`]'s, so that a store
//! without a warmer (a test's) answers them with nothing.
//!
//! * `warm#{reel_id}`: a trending reel's totals (likes as its shards sum
//!   them, views as its view items do), summed by the warmer every
//!   `WARM_PERIOD_MS` ([`WarmFigures`]). An instance that misses the reel
//!   in its count cache reads this one item instead of the reel's shard
//!   and writer items, and caches it for what is left of `CACHE_TTL_MS`
//!   since the warmer's read was sent: a warm count is never older than a
//!   summed one may be.
//! * `trending#warm`: which reels have such an item ([`WarmSet`]), read by
//!   an instance once per [`crate::trending::LIST_TTL`], so that a reel that is not
//!   warm costs no extra read.
//! * `trending#{metric}#{window}`: each list as the warmer ranked it, with
//!   its reels' totals ([`StoredList`]): `GET /trending` serves it, and a
//!   client showing the list needs no count read at all.

use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::window::WindowCounts;
use crate::trending::{Entry, Ranked};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How far two instances' clocks may differ (ms). A warm figure is taken
/// as read this much earlier than its clock says, so that an instance
/// never takes it for newer than it is: Lambda's clocks are kept by NTP
/// (Amazon Time Sync) to well within this.
pub const SKEW_MS: i64 = 100;

/// A warm set or list older than this (ms) is not used: the warmer has
/// stopped (it writes both every [`crate::trending::LIST_TTL`]).
pub const MAX_AGE_MS: i64 = 30_000;

/// A reel's totals as the warmer summed them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmFigures {
    /// When the warmer sent its reads (Unix ms, its clock).
    pub read_ms: i64,
    /// The reel's likes, as its shards (and writer items) summed.
    pub likes: Option<WarmLikes>,
    /// Its views, as its view items summed.
    pub views: Option<WarmViews>,
}

/// A reel's likes (see [`super::ShardSum`], which converts to and from
/// them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmLikes {
    /// Likes minus unlikes.
    pub n: i64,
    /// Likes plus unlikes ever applied.
    pub w: i64,
    /// The latest `updated_at` of the items summed.
    pub last_write_ms: i64,
    /// The net changes of the last hour, day and week.
    pub windows: WindowCounts,
    /// The clock (Unix ms) the windows were read at.
    pub windows_at_ms: i64,
    /// The own-change tails (stream mode; [`crate::keys::tail`]).
    #[serde(
        default,
        skip_serializing_if = "crate::keys::tail::RecentTail::is_none"
    )]
    pub tail: crate::keys::tail::RecentTail,
}

/// A reel's view figures (see [`crate::views::read::ViewCounts`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmViews {
    /// Views, all time.
    pub views: u64,
    /// Distinct viewers, all time (an estimate).
    pub unique_viewers: u64,
    /// Views on the last seven UTC days.
    pub views_7d: u64,
    /// Distinct viewers over those days (an estimate).
    pub unique_viewers_7d: u64,
    /// Views over the last hour, 24 hours and 7 days.
    pub windows: WindowCounts,
    /// The clock (Unix ms) the windows were read at.
    pub as_of_ms: i64,
}

impl WarmFigures {
    /// When, on this instance, the warmer's read was sent at the latest
    /// (its age as the clocks say, plus `SKEW_MS`); `None` when that
    /// leaves nothing of `ttl` to cache it for (or `ttl` is 0: no cache,
    /// every count read now).
    pub fn read_at(&self, now_ms: i64, ttl: Duration) -> Option<Instant> {
        let age = (now_ms - self.read_ms).max(0).saturating_add(SKEW_MS) as u64;
        if u128::from(age) >= ttl.as_millis() {
            return None;
        }
        Instant::now().checked_sub(Duration::from_millis(age))
    }
}

/// The reels the warmer keeps `warm#` items of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmSet {
    /// When it was written (Unix ms).
    pub written_ms: i64,
    /// The reels.
    pub reels: Vec<String>,
}

/// A list as the warmer ranked it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredList {
    /// When it was ranked (Unix ms).
    pub as_of_ms: i64,
    /// See [`Ranked::max_error`].
    pub max_error: u64,
    /// See [`Ranked::candidates`].
    pub candidates: usize,
    /// Each reel: its id, its count over the window, its likes and views.
    pub reels: Vec<(String, i64, Option<i64>, Option<u64>)>,
}

impl From<&Ranked> for StoredList {
    fn from(r: &Ranked) -> Self {
        StoredList {
            as_of_ms: r.as_of_ms,
            max_error: r.max_error,
            candidates: r.candidates,
            reels: r
                .reels
                .iter()
                .map(|e| (e.reel.as_str().to_owned(), e.count, e.likes, e.views))
                .collect(),
        }
    }
}

impl StoredList {
    /// The list to serve at `now_ms`, if it is recent enough.
    pub fn fresh(self, now_ms: i64) -> Option<Ranked> {
        (now_ms - self.as_of_ms <= MAX_AGE_MS).then(|| Ranked {
            reels: self
                .reels
                .into_iter()
                .filter_map(|(reel, count, likes, views)| {
                    let reel = ReelId::parse(&reel).ok()?;
                    Some(Entry {
                        reel,
                        count,
                        likes,
                        views,
                    })
                })
                .collect(),
            as_of_ms: self.as_of_ms,
            max_error: self.max_error,
            candidates: self.candidates,
            warmed: true,
        })
    }
}

/// The warm set as this instance last read it, for
/// [`crate::trending::LIST_TTL`].
pub struct SetCache(moka::future::Cache<(), Arc<HashSet<ReelId>>>);

impl Default for SetCache {
    fn default() -> Self {
        SetCache(
            moka::future::Cache::builder()
                .time_to_live(crate::trending::LIST_TTL)
                .max_capacity(1)
                .build(),
        )
    }
}

impl SetCache {
    /// The reels warm now, read by `load` when the copy held is old. A
    /// set the warmer stopped writing, or one that cannot be read, is
    /// empty: every reel is summed as if there were no warmer.
    pub async fn get(
        &self,
        load: impl Future<Output = Result<Option<WarmSet>, Error>>,
    ) -> Arc<HashSet<ReelId>> {
        self.0
            .get_with((), async {
                match load.await {
                    Ok(Some(s)) if crate::clock::now_ms() - s.written_ms <= MAX_AGE_MS => Arc::new(
                        s.reels
                            .iter()
                            .filter_map(|r| ReelId::parse(r).ok())
                            .collect(),
                    ),
                    Ok(_) => Arc::default(),
                    Err(e) => {
                        tracing::warn!(error = e.code(), "the warm set could not be read");
                        Arc::default()
                    }
                }
            })
            .await
    }
}

/// Storage of the cache warmer's items.
pub trait WarmStore: Send + Sync {
    /// Writes each reel's figures (`warm#{reel_id}`), in as few batch
    /// writes as they need.
    fn put_warm(
        &self,
        figures: &[(ReelId, WarmFigures)],
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Writes the warm set (`trending#warm`).
    fn put_warm_set(&self, set: &WarmSet) -> impl Future<Output = Result<(), Error>> + Send;

    /// Writes a list (`trending#{metric}#{window}`).
    fn put_list(
        &self,
        metric: &str,
        window: &str,
        list: &StoredList,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The list the warmer last wrote, if any.
    fn trending_list(
        &self,
        metric: &str,
        window: &str,
    ) -> impl Future<Output = Result<Option<StoredList>, Error>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warm_figure_is_cached_for_what_is_left_of_the_ttl() {
        let f = WarmFigures {
            read_ms: 10_000,
            ..WarmFigures::default()
        };
        let ttl = Duration::from_millis(2_000);
        let at = f.read_at(10_500, ttl).expect("young enough");
        // Taken as sent 600 ms ago: its age and the skew.
        assert!(at.elapsed() >= Duration::from_millis(600));
        assert!(
            f.read_at(11_900, ttl).is_none(),
            "1.9 s + skew: no time left"
        );
        assert!(f.read_at(10_000, Duration::ZERO).is_none(), "no cache");
        // A warmer clock ahead of this one's: never younger than 0.
        let at = f.read_at(9_000, ttl).unwrap();
        assert!(at.elapsed() >= Duration::from_millis(SKEW_MS as u64));
    }

    #[test]
    fn a_stored_list_is_served_while_fresh() {
        let list = StoredList {
            as_of_ms: 1_000,
            max_error: 3,
            candidates: 2,
            reels: vec![
                ("a".into(), 5, Some(9), Some(40)),
                ("#bad".into(), 4, None, None),
            ],
        };
        let r = list.clone().fresh(1_000 + MAX_AGE_MS).unwrap();
        assert!(r.warmed);
        assert_eq!(r.reels.len(), 1, "an id that is not a reel id is dropped");
        assert_eq!((r.reels[0].count, r.reels[0].likes), (5, Some(9)));
        assert!(list.fresh(1_001 + MAX_AGE_MS).is_none());
    }
}
