//! What one viewer may make the view function do: each `POST /views` is a
//! record in the log (the log's price is per record and per byte), and
//! every view it claims is counted, so a script claiming a million views a
//! minute would both spend and inflate. Each batch first passes
//! [`ViewerLimits::admit`], in memory, before anything is put:
//!
//! * batches a second per viewer (a token bucket: `VIEWER_BATCHES_PER_SEC`,
//!   bursts of `VIEWER_BATCH_BURST`): a client batches seconds of watching
//!   into one request;
//! * views a minute per viewer (`VIEWER_VIEWS_PER_MIN`): a person watching
//!   reels on a loop views a few a second at most. A batch larger than a
//!   minute's views (the contract allows 100 × 1,000) is admitted when the
//!   bucket is full and leaves it owing: the viewer then waits until the
//!   debt is repaid, so over time the bound holds whatever the batches.
//!
//! A refusal is 429 `rate_limited` with the seconds until the bound frees
//! up, and puts nothing. Kept per function instance, as the like path's
//! bounds are (`service::limits`): across instances a viewer gets the
//! bound once per instance it reaches, which `ViewReservedConcurrency`
//! caps.

use crate::error::{Error, MAX_RETRY_AFTER_SECS};
use crate::keys::UserId;
use moka::future::Cache;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bounds (see the module notes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ViewerBounds {
    /// `VIEWER_BATCHES_PER_SEC` (default 1).
    pub batches_per_sec: f64,
    /// `VIEWER_BATCH_BURST` (default 10).
    pub batch_burst: f64,
    /// `VIEWER_VIEWS_PER_MIN` (default 6,000: a hundred a second, far
    /// above what a person watches).
    pub views_per_min: f64,
}

impl Default for ViewerBounds {
    fn default() -> Self {
        ViewerBounds {
            batches_per_sec: 1.0,
            batch_burst: 10.0,
            views_per_min: 6_000.0,
        }
    }
}

/// A viewer's two buckets.
struct Buckets {
    batches: f64,
    views: f64,
    topped: Instant,
}

/// The per-viewer buckets of one instance.
pub struct ViewerLimits {
    bounds: ViewerBounds,
    viewers: Cache<UserId, Arc<Mutex<Buckets>>>,
}

/// Viewers one instance keeps buckets for (a few dozen bytes each); an
/// active viewer is never the least recently seen.
const MAX_VIEWERS: u64 = 100_000;

impl ViewerLimits {
    /// Buckets under `bounds`, for batches of at most `largest_batch`
    /// views.
    pub fn new(bounds: ViewerBounds, largest_batch: u64) -> Self {
        ViewerLimits {
            bounds,
            viewers: Cache::builder()
                .max_capacity(MAX_VIEWERS)
                .time_to_idle(keep_idle(&bounds, largest_batch))
                .build(),
        }
    }

    /// Takes one batch of `views` from `viewer`'s buckets, or says how long
    /// until they could (429 `rate_limited`, nothing taken).
    pub async fn admit(&self, viewer: &UserId, views: u64) -> Result<(), Error> {
        let b = self.bounds;
        let views = views as f64;
        let buckets = self
            .viewers
            .get_with(viewer.clone(), async {
                Arc::new(Mutex::new(Buckets {
                    batches: b.batch_burst,
                    views: b.views_per_min,
                    topped: Instant::now(),
                }))
            })
            .await;
        let mut g = buckets.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let secs = now.duration_since(g.topped).as_secs_f64();
        g.topped = now;
        g.batches = (g.batches + secs * b.batches_per_sec).min(b.batch_burst);
        g.views = (g.views + secs * b.views_per_min / 60.0).min(b.views_per_min);
        // A batch over the bucket's size needs a full bucket, and leaves it
        // below zero.
        let needed = views.min(b.views_per_min);
        if g.batches >= 1.0 && g.views >= needed {
            g.batches -= 1.0;
            g.views -= views;
            return Ok(());
        }
        let wait_batches = (1.0 - g.batches).max(0.0) / b.batches_per_sec.max(f64::MIN_POSITIVE);
        let wait_views =
            (needed - g.views).max(0.0) * 60.0 / b.views_per_min.max(f64::MIN_POSITIVE);
        Err(Error::RateLimited {
            retry_after: wait_batches
                .max(wait_views)
                .ceil()
                .clamp(1.0, f64::from(MAX_RETRY_AFTER_SECS)) as u32,
        })
    }
}

/// How long an idle viewer's buckets are kept: ten minutes, or as long as
/// the deepest debt one batch can leave takes to repay, if that is longer
/// (up to a week). A debt forgotten early would hand the viewer a full
/// bucket: a batch of 100,000 views every ten minutes against a bound of
/// 6,000 a minute.
fn keep_idle(bounds: &ViewerBounds, largest_batch: u64) -> Duration {
    const WEEK: f64 = 7.0 * 86_400.0;
    let per_sec = bounds.views_per_min.max(f64::MIN_POSITIVE) / 60.0;
    let debt = (largest_batch as f64 - bounds.views_per_min).max(0.0);
    let repaid = (debt / per_sec).ceil().min(WEEK);
    Duration::from_secs(600).max(Duration::from_secs_f64(repaid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_viewer_gets_a_burst_then_its_rate_and_others_are_untouched() {
        let l = ViewerLimits::new(
            ViewerBounds {
                batches_per_sec: 1.0,
                batch_burst: 3.0,
                views_per_min: 60.0,
            },
            150,
        );
        let (u, v) = (UserId::parse("u").unwrap(), UserId::parse("v").unwrap());
        for _ in 0..3 {
            l.admit(&u, 1).await.unwrap();
        }
        let e = l.admit(&u, 1).await.unwrap_err();
        assert!(matches!(e, Error::RateLimited { retry_after: 1 }), "{e:?}");
        l.admit(&v, 50).await.unwrap();
        // 10 views left for v: 20 more wait 10 s.
        let e = l.admit(&v, 20).await.unwrap_err();
        assert!(matches!(e, Error::RateLimited { retry_after: 10 }), "{e:?}");
        // A batch over a minute's views waits for a full bucket, then goes
        // through and leaves a debt: the next one waits it out.
        let w = UserId::parse("w").unwrap();
        l.admit(&w, 150).await.unwrap();
        let e = l.admit(&w, 1).await.unwrap_err();
        assert!(matches!(e, Error::RateLimited { retry_after: 91 }), "{e:?}");
    }

    #[test]
    fn a_debt_is_kept_until_it_is_repaid() {
        // Before: every viewer's buckets were dropped after 10 idle
        // minutes, so a batch of 100,000 views (94,000 owed at 100 a
        // second, 940 s) found a full bucket again after 600 s.
        let largest = 100 * 1_000;
        let l = ViewerLimits::new(ViewerBounds::default(), largest);
        let idle = l.viewers.policy().time_to_idle().unwrap();
        assert!(idle >= Duration::from_secs(940), "{idle:?}");
        let low = ViewerBounds {
            views_per_min: 600.0,
            ..ViewerBounds::default()
        };
        let idle = ViewerLimits::new(low, largest)
            .viewers
            .policy()
            .time_to_idle();
        assert!(idle.unwrap() >= Duration::from_secs(9_940), "{idle:?}");
        // Batches within a minute's views leave no debt: ten minutes.
        let idle = ViewerLimits::new(ViewerBounds::default(), 6_000)
            .viewers
            .policy()
            .time_to_idle();
        assert_eq!(idle, Some(Duration::from_secs(600)));
    }
}
