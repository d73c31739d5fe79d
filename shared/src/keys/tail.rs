//! Own-change tails (stream mode, issue 35): each writer item's net change
//! per short bucket of its records' own time (a new row's `liked_at`, a
//! removal's stream timestamp), kept for a few seconds, so that a reader
//! can sum a reel *as of* a moment: the records made before it.
//!
//! Why: an unlike reaching an instance that never saw the like cannot tell
//! from a sum whether the like is in it (the aggregator may have written
//! the reel after the like, for other records). Cut at the like's time,
//! the sum holds neither the like nor the unlike, and every older like
//! (see `LikeService::serve_own_change`, docs/counting.md#what-the-tapper-sees).
//!
//! # On the item
//!
//! One map attribute `t{width}k{keep}` (in ms: a reader configured with
//! another window finds none, and does not cut): key `(start / width) mod
//! 100000`, value the bucket's net change. Every aggregator write sets the whole map, the buckets
//! older than [`TailWindow::kept_from`] dropped, so it holds a few entries
//! (about 18 at the defaults, only those with records). The key is short
//! and cycles; a reader places it by the item's `updated_at`, which all
//! its entries are within [`TailWindow::keep_ms`] (plus the clock skew) of.
//!
//! # In a sum
//!
//! [`RecentTail`]: the net change per bucket from [`TailWindow::covered_from`]
//! on, over every item summed, at a fixed size so that a sum stays `Copy`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Buckets a [`RecentTail`] holds: 32 one-second buckets at the defaults,
/// where a cut needs about 18 (160 bytes a cached sum, with its header).
pub const TAIL_BUCKETS: usize = 32;

/// Entry keys cycle through this many bucket indexes.
const KEY_CYCLE: i64 = 100_000;

/// The tails' bucket width and how long writers keep a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailWindow {
    /// A bucket's width (ms): `CACHE_TTL_MS`, within 100–1000.
    pub width_ms: i64,
    /// How long after a write's clock its oldest bucket is kept (ms).
    pub keep_ms: i64,
    /// The clock skew allowed between function instances (ms).
    pub skew_ms: i64,
}

impl TailWindow {
    /// From the settings: a cut is never older than `visible_ms` (plus a
    /// second, a stream timestamp's rounding) before a read, and the
    /// aggregator's clock may be `skew_ms` ahead of the reader's; a bucket
    /// of margin on each side. Bounded by what a [`RecentTail`] holds.
    /// `visible_ms` 0: no own change waits for the stream, no tails.
    pub fn new(cache_ttl_ms: i64, visible_ms: i64, skew_ms: i64) -> Self {
        let width_ms = cache_ttl_ms.clamp(100, 1000);
        let keep_ms = if visible_ms <= 0 {
            0
        } else {
            (visible_ms + 1000 + skew_ms + 2 * width_ms).min((TAIL_BUCKETS as i64 - 2) * width_ms)
        };
        TailWindow {
            width_ms,
            keep_ms,
            skew_ms,
        }
    }

    /// Whether tails are kept at all.
    pub fn enabled(&self) -> bool {
        self.keep_ms > 0
    }

    /// How long after an item's write its tail may still be cut: a reader
    /// that finds it missing then cannot cut.
    pub fn lives_ms(&self) -> i64 {
        self.keep_ms + self.skew_ms + self.width_ms
    }

    /// The start of the bucket holding `t_ms`.
    pub fn start_of(&self, t_ms: i64) -> i64 {
        t_ms.div_euclid(self.width_ms) * self.width_ms
    }

    /// The oldest bucket start a write at `now_ms` keeps.
    pub fn kept_from(&self, now_ms: i64) -> i64 {
        self.start_of(now_ms - self.keep_ms)
    }

    /// The oldest bucket start a read at `read_ms` can rely on: no item
    /// summed dropped it (their writers' clocks at most `skew_ms` ahead).
    pub fn covered_from(&self, read_ms: i64) -> i64 {
        self.kept_from(read_ms + self.skew_ms) + self.width_ms
    }

    /// The name of the map attribute: its width and how long it keeps, so
    /// that a reader configured otherwise (another `CACHE_TTL_MS`,
    /// `STREAM_VISIBLE_MS` or clock skew than the aggregator's) finds none
    /// and does not cut, rather than trust a tail shorter than it needs.
    pub fn attr(&self) -> String {
        format!("t{}k{}", self.width_ms, self.keep_ms)
    }

    /// An entry's key in the map.
    pub fn entry_key(&self, start_ms: i64) -> String {
        start_ms
            .div_euclid(self.width_ms)
            .rem_euclid(KEY_CYCLE)
            .to_string()
    }

    /// The bucket start of entry `key` of an item last written at
    /// `written_ms` (its entries lie within half a cycle of it).
    pub fn entry_start(&self, key: &str, written_ms: i64) -> Option<i64> {
        let k: i64 = key.parse().ok().filter(|k| (0..KEY_CYCLE).contains(k))?;
        let near = written_ms.div_euclid(self.width_ms);
        let back = (near - k).rem_euclid(KEY_CYCLE);
        let index = if back <= KEY_CYCLE / 2 {
            near - back
        } else {
            near - back + KEY_CYCLE
        };
        Some(index * self.width_ms)
    }

    /// A writer item's map after a write at `now_ms`: `prior` (as the item
    /// holds it) with `adds` (bucket start, net change) added, the buckets
    /// older than [`Self::kept_from`] and the empty ones dropped.
    pub fn merged(
        &self,
        prior: &BTreeMap<i64, i64>,
        adds: impl IntoIterator<Item = (i64, i64)>,
        now_ms: i64,
    ) -> BTreeMap<i64, i64> {
        let from = self.kept_from(now_ms);
        let mut out: BTreeMap<i64, i64> = prior.range(from..).map(|(k, v)| (*k, *v)).collect();
        for (start, d) in adds {
            if start >= from {
                *out.entry(start).or_default() += d;
            }
        }
        out.retain(|_, d| *d != 0);
        out
    }
}

/// The tails of the items of one sum, from [`TailWindow::covered_from`]
/// at the read's clock on. `width_ms == 0`: none (transactional mode, or
/// a sum that could not carry one), and `broken`: an item summed may have
/// records in the window that no tail holds: nothing can be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "TailWire", into = "TailWire")]
pub struct RecentTail {
    /// The read's clock (Unix ms).
    pub read_ms: i64,
    /// The start of bucket 0 (Unix ms).
    pub from_ms: i64,
    /// The bucket width (ms); 0: no tail.
    pub width_ms: i64,
    /// Some item summed may lack its tail (see [`Self::break_off`]).
    pub broken: bool,
    /// Net change per bucket; the last also holds any later one.
    d: [i32; TAIL_BUCKETS],
}

impl Default for RecentTail {
    fn default() -> Self {
        RecentTail {
            read_ms: 0,
            from_ms: 0,
            width_ms: 0,
            broken: false,
            d: [0; TAIL_BUCKETS],
        }
    }
}

impl RecentTail {
    /// An empty tail for a read at `read_ms`.
    pub fn new(window: &TailWindow, read_ms: i64) -> Self {
        RecentTail {
            read_ms,
            from_ms: window.covered_from(read_ms),
            width_ms: window.width_ms,
            broken: false,
            d: [0; TAIL_BUCKETS],
        }
    }

    /// Whether it holds nothing at all (transactional mode).
    pub fn is_none(&self) -> bool {
        self.width_ms == 0 && !self.broken
    }

    /// An item summed may have records in the window without a tail that
    /// holds them (written by an aggregator that keeps none, or another
    /// window; a fold that dropped one; a shard item of transactional
    /// mode): the sum cannot be cut.
    pub fn break_off(&mut self) {
        self.broken = true;
    }

    /// Adds an item's bucket: older than `from_ms`, no cut needs it.
    pub fn add(&mut self, start_ms: i64, delta: i64) {
        if self.width_ms <= 0 || start_ms < self.from_ms {
            return;
        }
        let i = ((start_ms - self.from_ms) / self.width_ms).min(TAIL_BUCKETS as i64 - 1) as usize;
        let sum = i64::from(self.d[i]).saturating_add(delta);
        self.d[i] = sum.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
    }

    /// Adds another tail (another part of the reel, read a little later
    /// or earlier): it covers from the later of the two starts.
    pub fn merge(&mut self, other: &RecentTail) {
        self.broken |= other.broken;
        if other.width_ms == 0 {
            return;
        }
        if self.width_ms == 0 {
            let broken = self.broken;
            *self = *other;
            self.broken = broken;
            return;
        }
        if other.width_ms != self.width_ms {
            self.broken = true;
            return;
        }
        let mut out = RecentTail {
            from_ms: self.from_ms.max(other.from_ms),
            read_ms: self.read_ms.min(other.read_ms),
            d: [0; TAIL_BUCKETS],
            ..*self
        };
        for t in [&*self, other] {
            for (i, d) in t.d.iter().enumerate() {
                if *d != 0 {
                    out.add(t.from_ms + i as i64 * t.width_ms, i64::from(*d));
                }
            }
        }
        *self = out;
    }

    /// The start of the bucket holding `t_ms`.
    pub fn start_of(&self, t_ms: i64) -> i64 {
        t_ms.div_euclid(self.width_ms.max(1)) * self.width_ms.max(1)
    }

    /// The net change of the records from the bucket holding `cut_ms` on:
    /// the sum less this is the sum as of that bucket's start. `None`: the
    /// tail does not reach back that far (or there is none).
    pub fn since(&self, cut_ms: i64) -> Option<i64> {
        if self.width_ms <= 0 || self.broken {
            return None;
        }
        let start = self.start_of(cut_ms);
        if start < self.from_ms {
            return None;
        }
        let i = ((start - self.from_ms) / self.width_ms) as usize;
        if i >= TAIL_BUCKETS {
            // The last bucket holds later ones too: past it, not placed.
            return None;
        }
        Some(self.d.iter().skip(i).map(|d| i64::from(*d)).sum())
    }
}

/// [`RecentTail`] as serialized (the warmer's figures): the buckets as a
/// list, serde's arrays stopping at 32.
#[derive(Clone, Serialize, Deserialize)]
struct TailWire {
    read_ms: i64,
    from_ms: i64,
    width_ms: i64,
    #[serde(default)]
    broken: bool,
    d: Vec<i32>,
}

impl From<RecentTail> for TailWire {
    fn from(t: RecentTail) -> Self {
        TailWire {
            read_ms: t.read_ms,
            from_ms: t.from_ms,
            width_ms: t.width_ms,
            broken: t.broken,
            d: t.d.to_vec(),
        }
    }
}

impl From<TailWire> for RecentTail {
    fn from(w: TailWire) -> Self {
        let mut d = [0; TAIL_BUCKETS];
        for (slot, v) in d.iter_mut().zip(w.d) {
            *slot = v;
        }
        RecentTail {
            read_ms: w.read_ms,
            from_ms: w.from_ms,
            width_ms: w.width_ms,
            broken: w.broken,
            d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> TailWindow {
        TailWindow::new(2000, 10_000, 5000)
    }

    #[test]
    fn the_defaults_keep_eighteen_one_second_buckets() {
        let w = window();
        assert_eq!((w.width_ms, w.keep_ms), (1000, 18_000));
        assert_eq!(w.kept_from(100_500), 82_000);
        // A read's coverage: the writers may be 5 s ahead, and a bucket
        // of margin.
        assert_eq!(w.covered_from(100_500), 88_000);
        // Bounded by the tail's size.
        assert_eq!(TailWindow::new(2000, 600_000, 5000).keep_ms, 30_000);
        assert!(!TailWindow::new(2000, 0, 5000).enabled());
    }

    #[test]
    fn entry_keys_cycle_and_are_placed_by_the_write() {
        let w = window();
        let start = 1_765_000_123_000;
        let key = w.entry_key(start);
        assert_eq!(key, "123");
        assert_eq!(w.entry_start(&key, start + 18_000), Some(start));
        assert_eq!(w.entry_start(&key, start - 5000), Some(start));
        assert_eq!(w.entry_start("x", start), None);
        assert_eq!(w.entry_start("100000", start), None);
        assert_eq!(w.attr(), "t1000k18000");
    }

    #[test]
    fn a_write_keeps_only_its_window() {
        let w = window();
        let prior = BTreeMap::from([(80_000, 2), (90_000, 1), (95_000, -1)]);
        let out = w.merged(&prior, [(95_000, 1), (99_000, 3), (70_000, 5)], 100_000);
        assert_eq!(out, BTreeMap::from([(90_000, 1), (99_000, 3)]));
    }

    #[test]
    fn a_sum_is_cut_from_a_bucket_on_and_not_before_what_it_covers() {
        let w = window();
        let mut t = RecentTail::new(&w, 100_000);
        assert_eq!(t.from_ms, 88_000);
        t.add(80_000, 7); // too old: no cut needs it
        t.add(90_000, 1);
        t.add(95_000, 2);
        t.add(99_000, -1);
        t.add(10_000_000, 4); // far ahead: in the last bucket
        assert_eq!(t.since(10_000_000), None);
        assert_eq!(t.since(95_400), Some(5));
        assert_eq!(t.since(96_000), Some(3));
        assert_eq!(t.since(88_000), Some(6));
        assert_eq!(t.since(87_999), None);
        assert_eq!(RecentTail::default().since(95_000), None);
        let mut other = RecentTail::new(&w, 100_000);
        other.add(95_000, 10);
        t.merge(&other);
        assert_eq!(t.since(95_000), Some(15));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<RecentTail>(&json).unwrap(), t);
        // Another part read a little later covers from its own start on.
        let mut later = RecentTail::new(&w, 101_000);
        later.add(89_000, 3);
        later.add(95_000, 1);
        t.merge(&later);
        assert_eq!((t.from_ms, t.since(89_000)), (89_000, Some(20)));
        assert_eq!(t.since(88_000), None);
        // A part that may lack its tail: nothing is cut.
        let mut lacking = RecentTail::new(&w, 100_000);
        lacking.break_off();
        t.merge(&lacking);
        assert_eq!(t.since(95_000), None);
    }
}
