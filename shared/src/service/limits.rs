//! What one caller may make this instance write (issue 22): a like or
//! unlike costs 4–6 write units, so a valid account sending toggles as fast
//! as it can would spend the table's throughput for everyone. Each write
//! first passes [`Limits::admit`], in memory, before anything is read or
//! written:
//!
//! * writes a second per user (a token bucket: `USER_WRITES_PER_SEC`,
//!   bursts of `USER_WRITE_BURST`);
//! * likes and unlikes of one reel per user per minute
//!   (`REEL_TOGGLES_PER_MIN`): a person taps a heart a few times, a script
//!   toggles it all day;
//! * distinct reels written per user per hour (`USER_REELS_PER_HOUR`): each
//!   one-off like of a made-up reel id leaves a row and a shard item that
//!   reconciliation must walk;
//! * requests with an `Idempotency-Key` per user per minute
//!   (`USER_KEYS_PER_MIN`): each new key writes a key record.
//!
//! A refusal is 429 `rate_limited` with the seconds until the bound frees
//! up, and writes nothing. The bounds cost no read or write: they are kept
//! per function instance. Across instances a caller gets at most the bound
//! once per instance it reaches; the like function's reserved concurrency
//! (template `LikeReservedConcurrency`) caps how many those are, and the
//! route throttles cap everyone together (docs/deploying.md).

use crate::config::WriteLimits;
use crate::error::Error;
use crate::keys::{ReelId, UserId};
use moka::future::Cache;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The per-user windows of one instance.
pub(super) struct Limits {
    bounds: WriteLimits,
    users: Cache<UserId, Arc<Mutex<Window>>>,
    /// When this instance started: minutes and hours count from it.
    epoch: Instant,
}

/// One user's recent writes on this instance.
struct Window {
    /// Write tokens left, and when they were last topped up.
    tokens: f64,
    topped: Instant,
    /// The minute (since `epoch`) `toggles` and `keys` count in.
    minute: u64,
    toggles: HashMap<ReelId, u32>,
    keys: u32,
    /// The hour (since `epoch`) `reels` count in, and the reels written
    /// in it, by hash: 8 bytes each, so a window is at most
    /// `USER_REELS_PER_HOUR` × 8 bytes (plus the set's overhead).
    hour: u64,
    reels: HashSet<u64>,
}

/// Users whose windows one instance keeps: with the default bounds a
/// window is at most a few kilobytes, so this caps their memory at tens of
/// megabytes. An active caller is never the least recently seen one.
pub(super) const MAX_USERS: u64 = 10_000;

/// `reel`'s key in a window (SipHash with fixed keys: the same in every
/// window; a collision only lets a caller write one more reel).
fn reel_key(reel: &ReelId) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    reel.hash(&mut h);
    h.finish()
}

impl Limits {
    /// Windows for up to `users` users (least recently seen dropped; a user
    /// idle for an hour is forgotten).
    pub(super) fn new(bounds: WriteLimits, users: u64) -> Self {
        Limits {
            bounds,
            users: Cache::builder()
                .max_capacity(users)
                .time_to_idle(Duration::from_secs(3600))
                .build(),
            epoch: Instant::now(),
        }
    }

    /// Whether `user` may write `reel` now (`keyed`: with an
    /// `Idempotency-Key`); counts the write when it may.
    pub(super) async fn admit(
        &self,
        user: &UserId,
        reel: &ReelId,
        keyed: bool,
    ) -> Result<(), Error> {
        self.admit_at(user, reel, keyed, Instant::now()).await
    }

    async fn admit_at(
        &self,
        user: &UserId,
        reel: &ReelId,
        keyed: bool,
        now: Instant,
    ) -> Result<(), Error> {
        let b = &self.bounds;
        let window = self
            .users
            .get_with(user.clone(), async {
                Arc::new(Mutex::new(Window {
                    tokens: f64::from(b.burst),
                    topped: now,
                    minute: 0,
                    toggles: HashMap::new(),
                    keys: 0,
                    hour: 0,
                    reels: HashSet::new(),
                }))
            })
            .await;
        // Nothing panics while it is held; a poisoned window is still whole.
        let mut w = window.lock().unwrap_or_else(|p| p.into_inner());
        let since = now.saturating_duration_since(self.epoch);
        let (minute, hour) = (since.as_secs() / 60, since.as_secs() / 3600);
        // Seconds until the current minute or hour is over.
        let minute_left = (60 - since.as_secs() % 60) as u32;
        let hour_left = (3600 - since.as_secs() % 3600) as u32;
        if w.minute != minute {
            w.minute = minute;
            w.toggles.clear();
            w.keys = 0;
        }
        if w.hour != hour {
            w.hour = hour;
            w.reels.clear();
        }
        let elapsed = now.saturating_duration_since(w.topped).as_secs_f64();
        w.tokens = (w.tokens + elapsed * b.per_sec).min(f64::from(b.burst));
        w.topped = now;
        if w.tokens < 1.0 {
            let wait = ((1.0 - w.tokens) / b.per_sec).ceil().max(1.0) as u32;
            return Err(limited("writes_per_second", wait));
        }
        if w.toggles.get(reel).copied().unwrap_or(0) >= b.toggles_per_min {
            return Err(limited("toggles_per_minute", minute_left));
        }
        let key = reel_key(reel);
        if !w.reels.contains(&key) && w.reels.len() >= b.reels_per_hour as usize {
            return Err(limited("reels_per_hour", hour_left));
        }
        if keyed && w.keys >= b.keys_per_min {
            return Err(limited("keys_per_minute", minute_left));
        }
        w.tokens -= 1.0;
        *w.toggles.entry(reel.clone()).or_insert(0) += 1;
        w.reels.insert(key);
        w.keys += u32::from(keyed);
        Ok(())
    }
}

fn limited(bound: &'static str, retry_after: u32) -> Error {
    tracing::info!(bound, retry_after, "a caller's write refused by its bound");
    Error::RateLimited { retry_after }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::new(
            WriteLimits {
                per_sec: 2.0,
                burst: 4,
                toggles_per_min: 3,
                reels_per_hour: 5,
                keys_per_min: 2,
            },
            100,
        )
    }

    fn ids(user: &str, reel: &str) -> (UserId, ReelId) {
        (UserId::parse(user).unwrap(), ReelId::parse(reel).unwrap())
    }

    #[tokio::test]
    async fn a_burst_then_the_rate_per_user() {
        let l = limits();
        let t0 = l.epoch;
        let refused = |r: Result<(), Error>| matches!(r, Err(Error::RateLimited { .. }));
        for (i, reel) in ["a", "b", "c", "d"].iter().enumerate() {
            let (u, r) = ids("u", reel);
            assert!(l.admit_at(&u, &r, false, t0).await.is_ok(), "{i}");
        }
        let (u, e) = ids("u", "e");
        assert_eq!(
            l.admit_at(&u, &e, false, t0).await,
            Err(Error::RateLimited { retry_after: 1 })
        );
        // Half a second later, one token (2 a second) is back.
        let later = t0 + Duration::from_millis(500);
        assert!(l.admit_at(&u, &e, false, later).await.is_ok());
        assert!(refused(l.admit_at(&u, &e, false, later).await));
        // Another user is not affected.
        let (v, a) = ids("v", "a");
        assert!(l.admit_at(&v, &a, false, t0).await.is_ok());
    }

    #[tokio::test]
    async fn toggles_of_one_reel_reels_an_hour_and_keys_a_minute() {
        let l = limits();
        let t = |s: u64| l.epoch + Duration::from_secs(s);
        let (u, a) = ids("u", "a");
        for s in 0..3 {
            assert!(l.admit_at(&u, &a, false, t(s)).await.is_ok());
        }
        // The fourth toggle of reel a in this minute: refused until the
        // minute is over.
        assert_eq!(
            l.admit_at(&u, &a, false, t(10)).await,
            Err(Error::RateLimited { retry_after: 50 })
        );
        assert!(l.admit_at(&u, &a, false, t(61)).await.is_ok());
        // Five distinct reels an hour (a counts): b, c, d, e; f is one too
        // many, a reel already written is not.
        for (i, reel) in ["b", "c", "d", "e"].iter().enumerate() {
            let (_, r) = ids("u", reel);
            assert!(
                l.admit_at(&u, &r, false, t(70 + 3 * i as u64))
                    .await
                    .is_ok()
            );
        }
        let (_, f) = ids("u", "f");
        assert!(matches!(
            l.admit_at(&u, &f, false, t(90)).await,
            Err(Error::RateLimited { retry_after: 3510 })
        ));
        assert!(l.admit_at(&u, &a, false, t(95)).await.is_ok());
        assert!(l.admit_at(&u, &f, false, t(3600)).await.is_ok());
        // Two keyed writes a minute.
        let (k, r) = ids("k", "r");
        let (_, s) = ids("k", "s");
        assert!(l.admit_at(&k, &r, true, t(4000)).await.is_ok());
        assert!(l.admit_at(&k, &s, true, t(4001)).await.is_ok());
        assert!(matches!(
            l.admit_at(&k, &s, true, t(4002)).await,
            Err(Error::RateLimited { .. })
        ));
        assert!(
            l.admit_at(&k, &s, false, t(4003)).await.is_ok(),
            "unkeyed still"
        );
    }
}
