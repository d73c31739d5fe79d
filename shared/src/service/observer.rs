//! The observations that may call for more shards (the write rate of the
//! reels this instance sums, the contention of the likes it writes) and
//! the grow they ask for.

use super::LikeService;
use crate::config::{Config, ResizeConfig};
use crate::keys::{ReelId, UserId};
use crate::reshard::{self, crowd, crowd::Crowd};
use crate::store::{CounterStore, Settings, ShardSum};
use moka::future::Cache;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What this instance sees that may call for more shards: the write rate of
/// the reels it sums, and the contention of the likes it writes.
pub(super) struct Observer {
    resize: ResizeConfig,
    /// The last (shard writes, when summed) of each reel this instance read.
    samples: Cache<ReelId, (i64, Instant)>,
    /// The shard count this instance last asked a reel to grow to; not asked
    /// again until the resize could have completed.
    asked: Cache<ReelId, u32>,
    /// Contended like transactions per reel, by the distinct users they
    /// came from.
    contention: Crowd,
}

impl Observer {
    /// Empty observations, bounded by `config`'s cache size and resize
    /// wait.
    pub(super) fn new(config: &Config) -> Self {
        Observer {
            resize: config.resize.clone(),
            samples: Cache::builder()
                .max_capacity(config.cache_max_reels)
                .time_to_idle(Duration::from_secs(300))
                .build(),
            asked: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(config.resize_wait() * 2)
                .build(),
            contention: Crowd::new(config.resize.contention_events, Duration::ZERO),
        }
    }
}

impl<S: CounterStore> LikeService<S> {
    /// Notes the write rate of a reel this instance just summed (the change
    /// of its shards' `w` since this instance's previous sum, at least a
    /// second apart) and asks for a grow when it crosses
    /// `HOT_LIKES_PER_SEC`. Any instance that reads a reel sees the reel's
    /// whole write rate this way, not just its own share of the likes.
    pub(super) async fn observe_rate(
        &self,
        reel: &ReelId,
        settings: &Settings,
        sum: ShardSum,
        at: Instant,
    ) {
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

    /// Counts a like transaction of `user` on `reel` that conflicted on the
    /// reel's shard (never a throttle: see `note_retry`); enough of them from distinct users
    /// within [`CROWD_WINDOW`](crowd::CROWD_WINDOW) grow the reel as a saturated one
    /// ([`ResizeConfig::grow_target`]). Distinct users, because growth must
    /// follow a crowd: one user's parallel likes and unlikes (on a reel
    /// that may not even exist) only meet themselves.
    ///
    /// [`ResizeConfig::grow_target`]: crate::config::ResizeConfig::grow_target
    pub(super) async fn observe_contention(
        &self,
        reel: &ReelId,
        user: &UserId,
        settings: &Settings,
    ) {
        let Some(o) = &self.observer else { return };
        if o.contention.note(reel, crowd::source(user.as_str())).await {
            let want = o.resize.grow_target(settings.write_shards, None, true);
            if want > settings.write_shards {
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
}

#[cfg(test)]
mod tests {
    //! Contention observed by [`LikeService::write`](crate::service::LikeService::write)'s retries, driven by a
    //! store that answers from a script, and the grow it starts.
    use super::super::fake::{like, scripted};
    use crate::store::{RetryReason, TxResult};
    use std::time::Duration;

    const DONE: TxResult = TxResult::Committed { replayed: false };

    #[tokio::test]
    async fn repeated_contention_on_a_reel_starts_a_grow_once() {
        let conflict = TxResult::Retry(RetryReason::Conflict);
        // Three users, each meeting the crowd on the reel's shard once.
        let svc = scripted(
            vec![conflict, DONE, conflict, DONE, conflict, DONE],
            &[("CONTENTION_GROW_EVENTS", "3")],
        );
        for user in ["a", "b", "c"] {
            svc.write(like(user, user)).await.unwrap();
        }
        // The grow starts in the background.
        for _ in 0..100 {
            if !svc.store().puts().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The grow's first step, then its stamp once the put returned
        // (crate::reshard: a wait starts when its phase is seen in place).
        for _ in 0..100 {
            if svc.store().puts().len() >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let puts = svc.store().puts();
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

        // Two users stay below the threshold; AUTO_RESHARD=off never grows.
        let svc = scripted(
            vec![conflict, DONE, conflict, DONE],
            &[("CONTENTION_GROW_EVENTS", "3")],
        );
        for user in ["a", "b"] {
            svc.write(like(user, user)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(svc.store().puts().is_empty());
        let svc = scripted(
            vec![conflict, DONE, conflict, DONE, conflict, DONE],
            &[("AUTO_RESHARD", "off")],
        );
        for user in ["a", "b", "c"] {
            svc.write(like(user, user)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(svc.store().puts().is_empty());
    }

    #[tokio::test]
    async fn throttles_never_count_as_a_crowd() {
        // Before: a throttle of the like transaction on the reel's shard
        // counted as contention, so a table throttled by its capacity (not
        // by a crowd on one reel) grew every reel that many users liked.
        let throttled = TxResult::Retry(RetryReason::Throttled);
        let own_throttled = TxResult::Retry(RetryReason::OwnThrottled);
        let svc = scripted(
            vec![
                throttled,
                DONE,
                throttled,
                throttled,
                DONE,
                own_throttled,
                DONE,
                throttled,
                DONE,
                throttled,
                DONE,
            ],
            &[("CONTENTION_GROW_EVENTS", "2")],
        );
        for user in ["a", "b", "c", "d", "e"] {
            let out = svc.write(like(user, user)).await.unwrap();
            assert!(out.throttles >= 1, "{user}: retried on the throttle");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(svc.store().puts().is_empty(), "{:?}", svc.store().puts());
    }

    #[tokio::test]
    async fn one_user_racing_themselves_grows_no_reel() {
        // Before: any five conflicts within 10 s grew the reel ×4, so one
        // user's parallel PUT/DELETE on one reel (or on a reel that does
        // not exist) pushed it to MAX_SHARDS within minutes.
        let conflict = TxResult::Retry(RetryReason::Conflict);
        let own = TxResult::Retry(RetryReason::OwnConflict);
        let own_throttled = TxResult::Retry(RetryReason::OwnThrottled);
        // One user meeting the reel's shard again and again.
        let svc = scripted(
            vec![conflict, conflict, conflict, conflict, conflict, DONE],
            &[("CONTENTION_GROW_EVENTS", "3")],
        );
        svc.write(like("u", "req")).await.unwrap();
        // Many users, each only on their own row or record (or their own
        // partition of the Likes table, throttled).
        let svc_own = scripted(
            vec![own, DONE, own_throttled, DONE, own, DONE, own, DONE],
            &[("CONTENTION_GROW_EVENTS", "3")],
        );
        for user in ["a", "b", "c", "d"] {
            let out = svc_own.write(like(user, user)).await.unwrap();
            assert_eq!(out.conflicts + out.throttles, 1, "retried all the same");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(svc.store().puts().is_empty(), "{:?}", svc.store().puts());
        assert!(
            svc_own.store().puts().is_empty(),
            "{:?}",
            svc_own.store().puts()
        );
    }

    #[tokio::test]
    async fn contention_on_the_like_path_grows_nothing_in_stream_mode() {
        // In stream mode a like writes its row only: its conflicts and
        // throttles are the Likes table's, and say nothing about the load
        // of shards that only the aggregator writes. The script that grows
        // the reel in transactional mode (above) grows nothing here.
        let conflict = TxResult::Retry(RetryReason::Conflict);
        let throttled = TxResult::Retry(RetryReason::Throttled);
        let script = vec![
            conflict,
            throttled,
            conflict,
            throttled,
            TxResult::Committed { replayed: false },
        ];
        let svc = scripted(
            script,
            &[("CONTENTION_GROW_EVENTS", "3"), ("COUNTING", "stream")],
        );
        let out = svc.write(like("u", "req")).await.unwrap();
        assert_eq!((out.conflicts, out.throttles), (2, 2));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(svc.store().puts().is_empty(), "{:?}", svc.store().puts());

        // Three users' conflicts in transactional mode start a grow.
        let svc = scripted(
            vec![conflict, DONE, conflict, DONE, conflict, DONE],
            &[("CONTENTION_GROW_EVENTS", "3")],
        );
        for user in ["a", "b", "c"] {
            svc.write(like(user, user)).await.unwrap();
        }
        for _ in 0..100 {
            if !svc.store().puts().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !svc.store().puts().is_empty(),
            "no grow in transactional mode"
        );
    }
}
