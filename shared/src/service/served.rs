//! The guard every count this instance serves passes: served counts never
//! go back ([`LikeService::serve`]).

use super::read::{Cached, ReadAt, SinceRead};
use super::{Count, LikeService};
use crate::config::Config;
use crate::keys::ReelId;
use crate::store::CounterStore;
use moka::future::Cache;
use moka::ops::compute::{CompResult, Op};
use std::sync::Arc;
use std::time::Instant;

/// The last count this instance served for a reel (see
/// [`LikeService::serve`]).
#[derive(Clone, Debug)]
pub(super) struct Served {
    pub(super) count: i64,
    pub(super) load: u64,
    pub(super) adjusted: u32,
    /// No change committed after this instant is in `count`, and the value
    /// is at least what a read sent at this instant would return (likes
    /// only): a read sent earlier may return less.
    pub(super) covers: Instant,
    /// Stream mode: `count` holds an own unlike that a sum read sent
    /// before this instant may lack (the stream has not carried it to the
    /// shards yet). Such a read may be larger for that reason alone, so it
    /// does not replace the count, larger or not, unless it was sent at or
    /// after `covers` (see [`replaces`]).
    pub(super) unlikes_until: Option<Instant>,
    /// Stream mode: see [`Cached::holds_ms`]. A like row whose `liked_at`
    /// is later is not in `count`.
    pub(super) holds_ms: i64,
    /// Stream mode: the own unlikes `count` holds that a read may still
    /// lack, one entry each: what a read that does not replace `count`
    /// still proves ([`floor`]). Shared: every read of the record clones
    /// it, and only an own unlike changes it.
    pub(super) pending: Arc<Vec<Pending>>,
}

/// An own unlike (stream mode) that a sum read sent before `visible_at`
/// may lack.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    visible_at: Instant,
    /// The `liked_at` of the row it deleted (`None`: not known): a read of
    /// shards last written before it lacks the like as well, so it is not
    /// larger for lacking the unlike.
    liked_at: Option<i64>,
    /// The unlike's request clock (Unix ms): its stream record is stamped
    /// no earlier than the second before.
    at_ms: i64,
}

/// Own unlikes waiting to show in reads that one record keeps at most;
/// past that, a read lifts nothing ([`floor`]).
const MAX_PENDING: usize = 1024;

/// Whether `c` replaces `r`, the value served last: a later value of the
/// same lineage (the same read, adjusted by at least as many own changes),
/// a read sent at or after `r.covers`, or else a larger read, unless `r`
/// holds an own unlike that read may lack.
fn replaces(r: &Served, c: &Cached) -> bool {
    if r.load == c.load {
        return c.adjusted >= r.adjusted;
    }
    let read_at = c.count.read_at;
    if read_at >= r.covers {
        return true;
    }
    let may_lack_own_unlike = r.unlikes_until.is_some_and(|u| read_at < u);
    !may_lack_own_unlike && c.count.count > r.count
}

/// Stream mode: the least count a sum read `c` that does not replace `r`
/// (it may lack own unlikes `r` holds) still proves: `c` less each own
/// unlike it may lack and whose like it may hold. `None` when there is
/// nothing to prove (no own unlike pending, `c` not a plain read, or more
/// pending than kept).
///
/// This is what any other instance would serve from the same read, less
/// this instance's own unlikes on their way: so a count is never held
/// below it for `STREAM_VISIBLE_MS` (issue 35: others' likes, or own
/// changes this instance's value missed, kept out of every count served).
///
/// That alone may be one low per such unlike: a read whose shards were
/// written after the like, for other records, may lack the like too. So
/// the larger of it and what `c` proves when cut ([`cut_floor`]).
fn floor(r: &Served, c: &Cached, visible_ms: i64) -> Option<i64> {
    if r.pending.is_empty() || r.pending.len() >= MAX_PENDING || c.adjusted != 0 {
        return None;
    }
    let read_at = c.count.read_at;
    let lacks = r
        .pending
        .iter()
        .filter(|p| read_at < p.visible_at && p.liked_at.is_none_or(|l| l <= c.holds_ms))
        .count() as i64;
    let plain = (c.count.count - lacks).max(0);
    Some(cut_floor(&r.pending, c, visible_ms).map_or(plain, |n| n.max(plain)))
}

/// Stream mode: what the sum read `c` descends from proves of the reel
/// (its value as read, before any own change applied to it), cut by its
/// own-change tail ([`crate::keys::tail`]) before every own unlike in
/// `pending` it may lack: `c` as of the cut, less the own unlikes whose
/// like is older than the cut. `None`: nothing to cut, or `c` cannot be
/// cut there (no tail, or not reaching back so far; a like row's time not
/// known).
///
/// Each such unlike places the cut: at its like's `liked_at` when the
/// like may not have been carried when `c` was read (younger than
/// `visible_ms` then), else a second before the unlike (its stream record
/// is stamped no earlier). So the cut sum holds neither those likes nor
/// those unlikes, and every like older than the cut: never below the likes
/// older than the freshness bound, never holding an own like since
/// unliked, whichever stream shard carries it and whether it has yet.
fn cut_floor(pending: &[Pending], c: &Cached, visible_ms: i64) -> Option<i64> {
    let read_at = c.count.read_at;
    let mut cut: Option<i64> = None;
    for p in pending.iter().filter(|p| read_at < p.visible_at) {
        let liked = p.liked_at?;
        let carried = liked.saturating_add(visible_ms) <= c.tail.read_ms;
        let at = if carried { p.at_ms - 1000 } else { liked };
        cut = Some(cut.map_or(at, |k| k.min(at)));
    }
    let cut = cut?;
    let since = c.tail.since(cut)?;
    let start = c.tail.start_of(cut);
    let older = pending
        .iter()
        .filter(|p| read_at < p.visible_at && p.liked_at.is_some_and(|l| l < start))
        .count() as i64;
    // The read itself, without the own changes applied to it since: its
    // tail is the read's.
    Some((c.read_n - since - older).max(0))
}

/// The record is kept for as long as a read sent before it covers may
/// still be served: see [`records`].
impl ReadAt for Served {
    fn read_at(&self) -> Instant {
        self.covers
    }
}

/// The cache of [`Served`] records, one per reel.
pub(super) fn records(config: &Config) -> Cache<ReelId, Served> {
    // A value may be served until its entry expires (CACHE_TTL_MS
    // after its read was sent) or, for a load, when it answers
    // (within the request's hard bound); a read sent before a
    // record's `covers` cannot be served later than that, so the
    // record is no longer needed then. The operation timeout is
    // margin. Bounded like the count cache.
    Cache::builder()
        .max_capacity(config.cache_max_reels)
        .expire_after(SinceRead(
            config.cache_ttl + config.request_timeout + config.ddb_operation_timeout,
        ))
        .build()
}

impl<S: CounterStore> LikeService<S> {
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
    /// sent after both settles it (within `CACHE_TTL_MS`). Except in stream
    /// mode after an own unlike: the value holding it was recorded as the
    /// newest ([`Self::serve_own_change`]), and no read sent before the
    /// unlike is visible replaces it, so the tapper never sees their own
    /// unlike undone; such a read still lifts the value to what it proves
    /// (itself less the own unlikes it may lack, [`floor`]).
    pub(super) async fn serve(&self, reel: &ReelId, c: Cached) -> Count {
        self.serve_from(reel, c).await.0
    }

    /// [`Self::serve`], and whether the count served descends from `c`
    /// (it is `c`, or a later adjustment of the same read, so it holds
    /// every change `c` holds). `false`: the guard answered the value of
    /// another read that `c` may predate, which may lack a change `c` has.
    pub(super) async fn serve_from(&self, reel: &ReelId, c: Cached) -> (Count, bool) {
        let visible_ms = self.stream_visible.as_millis() as i64;
        // The common case, a cache hit on the entry last served (or on an
        // older copy of it): nothing to record.
        if let Some(r) = self.served.get(reel).await
            && r.load == c.load
            && r.adjusted >= c.adjusted
        {
            let count = Count {
                count: r.count,
                ..c.count
            };
            return (count, true);
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
                    unlikes_until: None,
                    holds_ms: c.holds_ms,
                    pending: Arc::default(),
                };
                match e.map(|e| e.into_value()) {
                    None => Op::Put(take),
                    Some(r) if replaces(&r, &c) => Op::Put(Served {
                        covers: r.covers.max(c.covers),
                        // Kept while it may matter: a read sent before it
                        // may still arrive.
                        unlikes_until: r.unlikes_until,
                        pending: r.pending,
                        ..take
                    }),
                    Some(r) => match floor(&r, &c, visible_ms) {
                        Some(n) if n > r.count => Op::Put(Served {
                            count: n,
                            holds_ms: r.holds_ms.max(c.holds_ms),
                            ..r
                        }),
                        _ => Op::Nop,
                    },
                }
            })
            .await;
        let (count, descends) = match result {
            CompResult::Inserted(e) | CompResult::ReplacedWith(e) | CompResult::Unchanged(e) => {
                // Replaced by `c`, or kept (the same read adjusted
                // further, or another read's value, perhaps lifted).
                let r = e.into_value();
                (r.count, r.load == c.load)
            }
            // Not produced by the closure above.
            CompResult::Removed(_) | CompResult::StillNone(_) => (c.count.count, true),
        };
        if count != c.count.count {
            tracing::debug!(reel = %reel, had = c.count.count, served = count, "a read older than the count served was not served");
        }
        (Count { count, ..c.count }, descends)
    }

    /// Stream mode: serves the count after an own change (`change`: a like
    /// row written, not yet in any shard) that sum reads hold from
    /// `visible_at` on; `current` is the count cache's value at hand. The
    /// value recorded is returned, for the count cache.
    ///
    /// The change applies to what this instance serves now (`current`, or
    /// the value served last if `current` would not replace it: an earlier
    /// own change may be there and not in `current`; lifted to what
    /// `current` proves, [`floor`]), decided and recorded in one step, so
    /// that no other value is served in between. That value is recorded
    /// whatever was served before: it is the served value with one more
    /// own change, newer than it, and may be below it (an unlike after a
    /// like must answer without that like). Until `visible_at` a read
    /// without the change cannot replace it: a smaller one (likes) because
    /// it was sent before `covers`, a larger one (unlikes) because of
    /// `unlikes_until` (it only lifts it, to itself less the own unlikes it
    /// may lack).
    ///
    /// An unlike takes 1 off only a value that may hold the like it undoes:
    /// one whose `holds_ms` is at or after the like row's `liked_at`. A
    /// value read from shards that the aggregator last wrote before the
    /// like was made, with no own change since, lacks that like (on a fresh
    /// instance: the like made on another one and still on its way through
    /// the stream): taking 1 off would answer below the truth.
    pub(super) async fn serve_own_change(
        &self,
        reel: &ReelId,
        current: Cached,
        change: OwnChange,
        visible_at: Instant,
    ) -> Cached {
        let OwnChange {
            delta,
            at_ms,
            undoes_ms,
        } = change;
        let visible_ms = self.stream_visible.as_millis() as i64;
        let result = self
            .served
            .entry(reel.clone())
            .and_compute_with(|e| async move {
                let now = Instant::now();
                let (base, adjusted, covers, unlikes_until, holds_ms, mut pending) =
                    match e.map(|e| e.into_value()) {
                        Some(r) if !replaces(&r, &current) => {
                            // Of the same lineage, `r` is `current` adjusted
                            // further; of another, a value served over it.
                            let adjusted = if r.load == current.load {
                                r.adjusted
                            } else {
                                current.adjusted
                            };
                            let (base, holds_ms) = match floor(&r, &current, visible_ms) {
                                Some(n) if n > r.count => (n, r.holds_ms.max(current.holds_ms)),
                                _ => (r.count, r.holds_ms),
                            };
                            (
                                base,
                                adjusted,
                                r.covers,
                                r.unlikes_until,
                                holds_ms,
                                r.pending,
                            )
                        }
                        Some(r) => (
                            current.count.count,
                            current.adjusted,
                            r.covers,
                            r.unlikes_until,
                            current.holds_ms,
                            r.pending,
                        ),
                        None => (
                            current.count.count,
                            current.adjusted,
                            current.covers,
                            None,
                            current.holds_ms,
                            Arc::default(),
                        ),
                    };
                // What the read at hand proves, cut before every own unlike
                // it may lack (this one too, which must be recorded: past
                // the bound nothing is cut), with an own like. The list as
                // it was: the read may predate those now visible.
                let this = Pending {
                    visible_at,
                    liked_at: undoes_ms,
                    at_ms,
                };
                let proven = if delta < 0 {
                    let mut all = pending.to_vec();
                    all.push(this);
                    (all.len() <= MAX_PENDING)
                        .then(|| cut_floor(&all, &current, visible_ms))
                        .flatten()
                } else {
                    cut_floor(&pending, &current, visible_ms).map(|n| n + 1)
                };
                // Without those every read still to come holds, and with
                // this unlike.
                if delta < 0 || pending.iter().any(|p| p.visible_at <= now) {
                    let mut kept: Vec<Pending> = pending
                        .iter()
                        .filter(|p| p.visible_at > now)
                        .copied()
                        .collect();
                    if delta < 0 && kept.len() < MAX_PENDING {
                        kept.push(this);
                    }
                    pending = Arc::new(kept);
                }
                let count = (base + applied_delta(delta, undoes_ms, holds_ms)).max(0);
                Op::Put(Served {
                    // Never below 0, which no count is.
                    count: proven.map_or(count, |n| n.max(count)),
                    load: current.load,
                    adjusted: adjusted.saturating_add(1),
                    covers: covers.max(current.covers).max(visible_at),
                    unlikes_until: if delta < 0 {
                        Some(unlikes_until.map_or(visible_at, |u| u.max(visible_at)))
                    } else {
                        unlikes_until
                    },
                    holds_ms: holds_ms.max(at_ms),
                    pending,
                })
            })
            .await;
        let r = result.into_entry().map(|e| e.into_value());
        // Always a put: `Removed` and `StillNone` cannot happen.
        let r = r.unwrap_or_else(|| Served {
            count: (current.count.count + applied_delta(delta, undoes_ms, current.holds_ms)).max(0),
            load: current.load,
            adjusted: current.adjusted.saturating_add(1),
            covers: current.covers.max(visible_at),
            unlikes_until: None,
            holds_ms: current.holds_ms.max(at_ms),
            pending: Arc::default(),
        });
        Cached {
            count: Count {
                count: r.count,
                ..current.count
            },
            load: r.load,
            adjusted: r.adjusted,
            covers: r.covers,
            holds_ms: r.holds_ms,
            tail: current.tail,
            read_n: current.read_n,
        }
    }
}

/// An own like or unlike in stream mode, as [`LikeService::serve_own_change`]
/// applies it.
#[derive(Clone, Copy, Debug)]
pub(super) struct OwnChange {
    /// +1 (like) or −1 (unlike).
    pub(super) delta: i64,
    /// The request's clock (Unix ms): the like row's `liked_at` for a like.
    pub(super) at_ms: i64,
    /// An unlike: the `liked_at` of the row it deleted, read just before
    /// (`None`: not known, taken as held).
    pub(super) undoes_ms: Option<i64>,
}

/// What an own change of `delta` adds to a value whose latest change is of
/// `holds_ms`: an unlike of a like made later than that takes nothing off
/// (the value lacks the like).
fn applied_delta(delta: i64, undoes_ms: Option<i64>, holds_ms: i64) -> i64 {
    match undoes_ms {
        Some(liked_at) if delta < 0 && holds_ms < liked_at => 0,
        _ => delta,
    }
}

#[cfg(test)]
mod tests;
