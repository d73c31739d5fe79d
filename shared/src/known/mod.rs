//! The known reels: which reels have ever had a like or a view counted,
//! held by every function instance, so that a read of a reel that never had
//! one answers zero without reading it (issue 36: a feed of ids nobody
//! liked or viewed costs what it returns, nothing).
//!
//! * Writers **register** a reel the set does not hold before they count
//!   it: a like before its write is acknowledged, a view before its
//!   aggregator writes it. A registration is an item of its own
//!   (`crate::keys::known`), put once per reel by the first writer that
//!   does not know it.
//! * Every instance **loads** the set once (the segments, then the
//!   registrations since the segments were folded), then **refreshes** it
//!   by reading the registrations put since its last refresh, at most
//!   every half `CACHE_TTL_MS` and only when a request needs it.
//! * The **fold** ([`fold`], run by the cache warmer's schedule) merges the
//!   registrations into the segments, so that a cold start reads a few
//!   minutes of registrations, not a day's; and backfills the reels counted
//!   before registrations began, after which the set is *complete*.
//!
//! A reader trusts "never counted" only from a complete set refreshed
//! within `CACHE_TTL_MS`: the answer is a cached zero as of that refresh,
//! as old as any cached count may be. Why nothing acknowledged is missed:
//! a like is acknowledged after its registration committed, or after the
//! writer found the reel in its set, which holds only what was committed
//! (segments, registrations); a refresh started later reads both
//! (registrations at or after its last refresh's start less
//! [`Known::margin_ms`]: the clock skew plus the longest registration put
//! a writer accepts, [`MAX_PUT_MS`]; a slower one is put again). Anything
//! that fails makes the set untrusted, and reads read, as without it.
//!
//! # Layout
//!
//! * `set`: the fingerprints as an instance holds them.
//! * [`fold`]: the scheduled merge and backfill.

pub mod fold;
#[cfg(test)]
mod mem;
mod set;
#[cfg(test)]
mod tests;

pub use set::{FpSet, merge_sorted};

use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::known::fingerprint;
use crate::store::KnownStore;
use futures::future::BoxFuture;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// A registration put that took longer than this is put again, stamped
/// anew: a refresh reads back [`Known::margin_ms`] from its last start, so
/// a registration must be readable within that of its stamp.
pub const MAX_PUT_MS: i64 = 2_000;

/// Registrations put under one stamp, at most.
const REGISTER_CHUNK: usize = 32;

/// An untrusted (incomplete) set's meta item is read again this often, to
/// learn that the backfill finished (one read unit each).
pub const META_RECHECK: Duration = Duration::from_secs(10);

/// A trusted set's meta item is read again this often, to learn that it is
/// no longer complete (a backfill started again, a full segment).
const META_RECHECK_COMPLETE: Duration = Duration::from_secs(60);

/// A load that failed is not tried again sooner (reads read meanwhile).
const LOAD_RETRY: Duration = Duration::from_secs(5);

/// A set not refreshed for this long is loaded again rather than
/// refreshed (the registrations of that long are more than the segments'
/// worth re-reading, and the fold may have expired them).
const RELOAD_AFTER: Duration = Duration::from_secs(600);

/// A meta item whose segments are older than this (the fold has not run
/// for that long) is not trusted: the registrations since may be expiring.
pub const MAX_FOLD_AGE_MS: i64 = 3_600_000;

/// What the read and write paths ask of the set (object-safe, so that
/// they hold it whatever its store).
pub trait KnownReels: Send + Sync {
    /// See [`Known::absent_now`].
    fn absent<'a>(&'a self, reels: &'a [ReelId]) -> BoxFuture<'a, Absent>;
    /// See [`Known::register_new`].
    fn register<'a>(&'a self, reels: &'a [&'a ReelId]) -> BoxFuture<'a, Result<(), Error>>;
}

/// Reels certainly never counted, and as of when (none: not known).
pub type Absent = (HashSet<ReelId>, Option<Instant>);

/// The set as the paths hold it.
pub type SharedKnown = Arc<dyn KnownReels>;

impl<S: KnownStore + 'static> KnownReels for Known<S> {
    fn absent<'a>(&'a self, reels: &'a [ReelId]) -> BoxFuture<'a, Absent> {
        Box::pin(Known::absent_now(self, reels))
    }

    fn register<'a>(&'a self, reels: &'a [&'a ReelId]) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Known::register_new(self, reels))
    }
}

/// The set an instance holds, and how fresh it is.
pub struct Known<S> {
    store: Arc<S>,
    /// `CACHE_TTL_MS`: how long a refresh is trusted for "never counted".
    trust: Duration,
    margin_ms: i64,
    state: RwLock<State>,
    /// One refresh at a time; the others wait for it and use its result.
    refreshing: tokio::sync::Mutex<()>,
    /// [`META_RECHECK_COMPLETE`] (tests shorten it).
    recheck_complete: Duration,
    stats: KnownStats,
}

#[derive(Default)]
struct State {
    set: FpSet,
    loaded: bool,
    complete: bool,
    /// The next refresh reads registrations stamped at or after this.
    cursor_ms: i64,
    /// When the last successful refresh (or load) started.
    refreshed: Option<Instant>,
    meta_checked: Option<Instant>,
    failed: Option<Instant>,
    /// The meta item's `first_ms` at the last load: a backfill started
    /// again since means a load again (registrations may have expired
    /// unmerged: what the set learned from them is dropped).
    first_ms: i64,
}

/// What the set did since the instance started (metrics and tests).
#[derive(Default, Debug)]
pub struct KnownStats {
    /// Loads of the whole set.
    pub loads: AtomicU64,
    /// Reels this instance registered.
    pub registered: AtomicU64,
    /// Reels answered as never counted, without a read.
    pub absent: AtomicU64,
    /// Loads and refreshes that failed.
    pub failures: AtomicU64,
}

impl<S: KnownStore> Known<S> {
    /// A set over `store`, trusted for `cache_ttl` after each refresh;
    /// `clock_skew` is the skew allowed between instances' clocks.
    pub fn new(store: Arc<S>, cache_ttl: Duration, clock_skew: Duration) -> Self {
        Known {
            store,
            trust: cache_ttl,
            margin_ms: clock_skew.as_millis() as i64 + MAX_PUT_MS,
            state: RwLock::new(State::default()),
            refreshing: tokio::sync::Mutex::new(()),
            recheck_complete: META_RECHECK_COMPLETE,
            stats: KnownStats::default(),
        }
    }

    /// The same, rechecking a complete set's meta item every `every`.
    #[cfg(test)]
    fn with_recheck(mut self, every: Duration) -> Self {
        self.recheck_complete = every;
        self
    }

    /// How far back of its last start a refresh reads registrations.
    pub fn margin_ms(&self) -> i64 {
        self.margin_ms
    }

    /// What the set did since the instance started.
    pub fn stats(&self) -> &KnownStats {
        &self.stats
    }

    /// Of `reels`, those certainly never counted, and the moment that is
    /// known as of (the start of the refresh it comes from); none while the
    /// set is not trusted.
    pub async fn absent_now(&self, reels: &[ReelId]) -> Absent {
        if reels.is_empty() {
            return (HashSet::new(), None);
        }
        let now = self.refresh(true).await;
        let st = self.state();
        let trusted = |r: &Instant| st.complete && (now || r.elapsed() <= self.trust);
        let Some(at) = st.refreshed.filter(trusted) else {
            return (HashSet::new(), None);
        };
        let out: HashSet<ReelId> = reels
            .iter()
            .filter(|r| !st.set.contains(fingerprint(r.as_str())))
            .cloned()
            .collect();
        self.stats
            .absent
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        (out, Some(at))
    }

    /// Registers those of `reels` the set does not hold, before they are
    /// counted. Fails only when the registration could not be put: then
    /// the count must not be acknowledged.
    pub async fn register_new(&self, reels: &[&ReelId]) -> Result<(), Error> {
        // Refreshed as for a read: an aggregator instance learns what the
        // like functions registered since (a reel they registered is not
        // put again by each instance that counts it after them).
        self.refresh(true).await;
        let todo: Vec<String> = {
            let st = self.state();
            let mut seen = HashSet::new();
            reels
                .iter()
                .filter(|r| !st.set.contains(fingerprint(r.as_str())))
                .filter(|r| seen.insert(r.as_str()))
                .map(|r| r.as_str().to_owned())
                .collect()
        };
        // A put slower than MAX_PUT_MS may be stamped before a refresh
        // that missed it: put again, stamped anew (at most three times;
        // then the count fails, unacknowledged, as on any store error).
        // In chunks, each stamped when sent, so that a large views batch
        // is not one put too slow to count; what a chunk registered is
        // known at once.
        for chunk in todo.chunks(REGISTER_CHUNK) {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let started = Instant::now();
                self.store.register(crate::clock::now_ms(), chunk).await?;
                if started.elapsed().as_millis() as i64 <= MAX_PUT_MS {
                    break;
                }
                if attempts == 3 {
                    return Err(Error::Throttled);
                }
            }
            self.stats
                .registered
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            let mut st = self.state_mut();
            for r in chunk {
                st.set.insert(fingerprint(r));
            }
        }
        Ok(())
    }

    fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn state_mut(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// What is due: a load, a refresh (for reads: older than half the
    /// trust), or nothing.
    fn due(&self, for_reads: bool) -> Option<bool> {
        let st = self.state();
        if st.failed.is_some_and(|f| f.elapsed() < LOAD_RETRY) {
            return None;
        }
        let recheck = if st.complete {
            self.recheck_complete
        } else {
            META_RECHECK
        };
        let reload = !st.loaded
            || st.refreshed.is_none_or(|r| r.elapsed() >= RELOAD_AFTER)
            || st.meta_checked.is_none_or(|m| m.elapsed() >= recheck);
        if reload {
            return Some(true);
        }
        let stale = st.refreshed.is_none_or(|r| r.elapsed() >= self.trust / 2);
        (for_reads && st.complete && stale).then_some(false)
    }

    /// Loads or refreshes the set if due; a failure is logged and leaves
    /// the set untrusted until the next success. True when this call
    /// refreshed it (with `CACHE_TTL_MS` 0, every read does).
    async fn refresh(&self, for_reads: bool) -> bool {
        if self.due(for_reads).is_none() {
            return false;
        }
        let _one = self.refreshing.lock().await;
        // Another task may have done it while this one waited.
        let Some(reload) = self.due(for_reads) else {
            return false;
        };
        let started = Instant::now();
        let started_ms = crate::clock::now_ms();
        let result = if reload {
            self.load(started, started_ms).await
        } else {
            let from = self.state().cursor_ms;
            self.read_registrations(from, started_ms).await.map(|fps| {
                let mut st = self.state_mut();
                for fp in fps {
                    st.set.insert(fp);
                }
                st.cursor_ms = started_ms - self.margin_ms;
                st.refreshed = Some(started);
            })
        };
        let Err(e) = result else {
            return true;
        };
        {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
            let mut st = self.state_mut();
            st.failed = Some(Instant::now());
            // Untrusted until a load succeeds: the registrations missed
            // meanwhile are read by the next load.
            st.refreshed = None;
            tracing::warn!(
                error = e.code(),
                "the known reels could not be read: reads read every reel meanwhile"
            );
        }
        false
    }

    /// Reads the meta item; then, unless the set is loaded and what the
    /// meta item says has not changed (a recheck), the segments and the
    /// registrations since they were folded (if complete; else the last
    /// moments: an incomplete set is used by writers only, to spare
    /// repeated registrations). A load replaces the set whole, so an
    /// instance knows only what the table holds (never a registration the
    /// fold might not merge).
    async fn load(&self, started: Instant, started_ms: i64) -> Result<(), Error> {
        let meta = self.store.known_meta().await?;
        // Complete, and folded lately: a fold that has not run for
        // FOLD_GAP_MS may have missed a release that did not register (the
        // fold backfills again at its next run).
        let complete = meta.as_ref().is_some_and(|m| {
            m.complete
                && !m.full
                && started_ms - m.to_ms <= MAX_FOLD_AGE_MS
                && started_ms - m.seen_ms <= fold::FOLD_GAP_MS
        });
        let first_ms = meta.as_ref().map_or(0, |m| m.first_ms);
        let (recheck, cursor) = {
            let st = self.state();
            let fresh = st.refreshed.is_some_and(|r| r.elapsed() < RELOAD_AFTER);
            let same = st.first_ms == first_ms;
            let changes = st.complete == complete || !complete;
            (st.loaded && fresh && same && changes, st.cursor_ms)
        };
        if recheck {
            // Unchanged, or no longer complete (nothing to trust; what
            // writers know stays true). A complete set is refreshed as
            // well: a recheck is the refresh of the read that made it.
            let fps = if complete {
                self.read_registrations(cursor, started_ms).await?
            } else {
                Vec::new()
            };
            let mut st = self.state_mut();
            for fp in fps {
                st.set.insert(fp);
            }
            if complete {
                st.cursor_ms = started_ms - self.margin_ms;
            }
            st.refreshed = Some(started);
            st.meta_checked = Some(started);
            st.complete = complete;
            st.failed = None;
            return Ok(());
        }
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        let segments = self.store.known_segments().await?;
        let from = match (&meta, complete) {
            (Some(m), true) => m.to_ms - self.margin_ms,
            _ => started_ms - self.margin_ms,
        };
        let recent = self.read_registrations(from, started_ms).await?;
        let mut set = FpSet::default();
        for s in segments {
            set.set_segment(s.index, s.fps);
        }
        for fp in recent {
            set.insert(fp);
        }
        let mut st = self.state_mut();
        st.set = set;
        st.first_ms = first_ms;
        st.loaded = true;
        st.complete = complete;
        st.cursor_ms = started_ms - self.margin_ms;
        st.refreshed = Some(started);
        st.meta_checked = Some(started);
        st.failed = None;
        Ok(())
    }

    /// The fingerprints of the registrations stamped at or after `from_ms`
    /// (up to `now_ms` and a clock skew past it).
    async fn read_registrations(
        &self,
        from_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<(usize, u32)>, Error> {
        let minutes = from_ms.div_euclid(60_000)..=(now_ms + self.margin_ms).div_euclid(60_000);
        let reads = minutes.map(|m| self.store.registrations(m, from_ms));
        let pages = futures::future::try_join_all(reads).await?;
        Ok(pages
            .into_iter()
            .flatten()
            .map(|(_, reel)| fingerprint(&reel))
            .collect())
    }
}
