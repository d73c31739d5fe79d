//! What's hot right now (issue 37): the reels most liked or viewed over
//! the last hour or day, found from heavy-hitter sketches and ranked by
//! their exact [windowed counts](crate::keys::window).
//!
//! # Candidates
//!
//! Each writer (a stream shard of the Likes table, a Kinesis shard of the
//! views, and in transactional mode a like function instance:
//! [`instance`]) keeps a DataSketches Frequent Items sketch of what it applied in
//! the current hour, as an item of that hour (`top#{metric}#{hour}`, sort
//! key the writer): so one `Query` per hour finds every writer's. A chunk
//! transaction that moves the checkpoint puts it, though not every one
//! ([`live`]: when the hour starts or ends, or every `FLUSH_MS`), and
//! never in the checkpoint item itself, which every chunk updates and
//! DynamoDB charges by its whole size. See [`sketch`].
//!
//! # Ranking
//!
//! The sketches of a window's hours, merged, name the candidates: every
//! reel whose count in them is above the merged sketch's maximum error is
//! among them (Frequent Items' "no false negatives"). Each candidate is
//! then read exactly ([`crate::keys::window`]) and the list ranked by that
//! count (ties by reel id). Ranked by count, not by velocity against a
//! baseline: a count over a stated window is what a reader can check
//! against `GET /reels/{reel_id}/stats`, and a baseline would need a
//! second, longer window of every candidate.

pub mod instance;
pub mod live;
pub mod sketch;

pub use instance::{Flush, InstanceSketch};
pub use live::{SketchWrite, Sketches};
pub use sketch::HourSketch;

/// What is ranked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    /// Net likes.
    Likes,
    /// Views.
    Views,
}

impl Metric {
    /// Its name in the API and in keys.
    pub const fn name(self) -> &'static str {
        match self {
            Metric::Likes => "likes",
            Metric::Views => "views",
        }
    }

    /// The metric a name in the API stands for.
    pub fn parse(name: &str) -> Option<Metric> {
        [Metric::Likes, Metric::Views]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// How long an instance serves a list it ranked itself before it ranks
/// again, and how often the cache warmer ranks every list.
pub const LIST_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// How long an instance serves the cache warmer's list before it reads
/// the list again: one small item, so read often, and the list's age
/// stays near the warmer's own.
pub const WARMED_LIST_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// Reels a list holds at most (`limit` asks for up to this many).
pub const MAX_LIST: usize = 100;

/// Candidates ranked at most: each is one exact read (cached per
/// instance as the counts are).
pub const MAX_CANDIDATES: usize = 300;

/// A list, as ranked.
#[derive(Clone, Debug)]
pub struct Ranked {
    /// The reels, highest count over the window first (ties by reel id),
    /// at most [`MAX_LIST`].
    pub reels: Vec<Entry>,
    /// The clock (Unix ms) it was ranked at.
    pub as_of_ms: i64,
    /// The merged sketch's maximum error: a reel whose count in the
    /// window's hours is above it was a candidate.
    pub max_error: u64,
    /// Candidates read.
    pub candidates: usize,
    /// Ranked by the cache warmer and read from its list item, rather
    /// than by this instance.
    pub warmed: bool,
}

/// A reel of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The reel.
    pub reel: crate::keys::ReelId,
    /// Its exact count over the window, as ranked.
    pub count: i64,
    /// Its net likes, all time (`None`: could not be read).
    pub likes: Option<i64>,
    /// Its views, all time (`None`: views not configured, or not read).
    pub views: Option<u64>,
}

/// `counts` ranked: highest first, ties by reel id, reels that gained
/// nothing left out, at most `max`.
pub fn rank(
    mut counts: Vec<(crate::keys::ReelId, i64)>,
    max: usize,
) -> Vec<(crate::keys::ReelId, i64)> {
    counts.retain(|(_, n)| *n > 0);
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts.truncate(max);
    counts
}

/// The hours whose sketches cover `window` at `now_ms`: from the hour of
/// its start to the current one.
pub fn hours(window: crate::keys::window::Window, now_ms: i64) -> std::ops::RangeInclusive<i64> {
    sketch::hour_of(window.from_ms(now_ms))..=sketch::hour_of(now_ms)
}

/// How long an instance keeps an ended hour's merged sketches, at the
/// least: an ended hour changes only by its writers' late puts (a writer's
/// final sketch of it, put with its first chunk or like of the next hour),
/// so a 24-hour list reads about one hour's sketches per ranking instead of
/// 25. Each hour is kept up to half as long again ([`ended_hour_ttl`]).
pub const ENDED_HOUR_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// How long an instance keeps `hour`'s merged sketches: [`ENDED_HOUR_TTL`]
/// and a part of half of it that the hour's number picks. An instance's
/// first ranking reads and keeps a day's hours at once; kept for one
/// lifetime they would all expire together, and one ranking in every ten
/// minutes would read all 24 again. Spread over five minutes, a ranking
/// reads again the few whose time came. Fixed per hour (not drawn), so
/// what an instance keeps is the same however often it asks.
pub fn ended_hour_ttl(hour: i64) -> std::time::Duration {
    let spread = ENDED_HOUR_TTL.as_secs() / 2;
    // Fibonacci hashing: consecutive hours land far apart in the spread.
    let mixed = (hour as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    ENDED_HOUR_TTL + std::time::Duration::from_secs(mixed % spread.max(1))
}

/// How long after an hour ends its sketches are still read afresh with
/// every ranking, before its merge is kept for [`ended_hour_ttl`]: busy
/// writers put their final sketch of it within seconds.
pub const ENDED_HOUR_SETTLE_MS: i64 = 60_000;

/// The lists an instance ranked or read lately, by metric and window, and
/// the merged sketches of the ended hours they were ranked from.
pub struct Lists {
    lists: moka::future::Cache<(Metric, crate::keys::window::Window), std::sync::Arc<Ranked>>,
    hours: moka::future::Cache<(Metric, i64), std::sync::Arc<Vec<u8>>>,
}

/// An ended hour's merge is kept for [`ended_hour_ttl`].
struct HourExpiry;

impl moka::Expiry<(Metric, i64), std::sync::Arc<Vec<u8>>> for HourExpiry {
    fn expire_after_create(
        &self,
        key: &(Metric, i64),
        _: &std::sync::Arc<Vec<u8>>,
        _: std::time::Instant,
    ) -> Option<std::time::Duration> {
        Some(ended_hour_ttl(key.1))
    }
}

/// A list is kept [`LIST_TTL`] if this instance ranked it,
/// [`WARMED_LIST_TTL`] if it is the warmer's.
struct ListExpiry;

impl moka::Expiry<(Metric, crate::keys::window::Window), std::sync::Arc<Ranked>> for ListExpiry {
    fn expire_after_create(
        &self,
        _: &(Metric, crate::keys::window::Window),
        value: &std::sync::Arc<Ranked>,
        _: std::time::Instant,
    ) -> Option<std::time::Duration> {
        Some(if value.warmed {
            WARMED_LIST_TTL
        } else {
            LIST_TTL
        })
    }
}

impl Default for Lists {
    fn default() -> Self {
        Lists {
            lists: moka::future::Cache::builder()
                .expire_after(ListExpiry)
                .max_capacity(8)
                .build(),
            // Two metrics, a day's hours each and a few to spare.
            hours: moka::future::Cache::builder()
                .expire_after(HourExpiry)
                .max_capacity(64)
                .build(),
        }
    }
}

impl Lists {
    /// The list of `key`, ranked by `rank` if there is none fresh (one
    /// ranking at a time per list per instance).
    pub async fn get(
        &self,
        key: (Metric, crate::keys::window::Window),
        rank: impl std::future::Future<Output = Result<Ranked, crate::error::Error>>,
    ) -> Result<std::sync::Arc<Ranked>, crate::error::Error> {
        self.lists
            .try_get_with(key, async { rank.await.map(std::sync::Arc::new) })
            .await
            .map_err(|e| (*e).clone())
    }

    /// The merged sketches of `metric`'s `hour`, read by `read` unless
    /// kept. Only for an hour that ended [`ENDED_HOUR_SETTLE_MS`] ago
    /// (the caller's to judge): the current hour changes with every put.
    pub async fn ended_hour(
        &self,
        metric: Metric,
        hour: i64,
        read: impl std::future::Future<Output = Result<Vec<u8>, crate::error::Error>>,
    ) -> Result<std::sync::Arc<Vec<u8>>, crate::error::Error> {
        self.hours
            .try_get_with((metric, hour), async {
                read.await.map(std::sync::Arc::new)
            })
            .await
            .map_err(|e| (*e).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_days_ended_hours_are_kept_for_lifetimes_spread_over_five_minutes() {
        for day in [0_i64, 1, 493_000 / 24, 20_000] {
            let ttls: Vec<u64> = (day * 24..day * 24 + 24)
                .map(|h| ended_hour_ttl(h).as_secs())
                .collect();
            assert!(ttls.iter().all(|t| (600..900).contains(t)), "{ttls:?}");
            let distinct: std::collections::BTreeSet<u64> = ttls.iter().copied().collect();
            assert!(distinct.len() >= 20, "{ttls:?}");
            let (lo, hi) = (distinct.first().unwrap(), distinct.last().unwrap());
            assert!(hi - lo >= 240, "{ttls:?}");
            // The same hour, the same lifetime.
            assert_eq!(ended_hour_ttl(day * 24), ended_hour_ttl(day * 24));
        }
    }
}
