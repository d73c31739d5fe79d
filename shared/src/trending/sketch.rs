//! A writer's hourly heavy-hitter sketch: what one chunk does to it, and
//! the merge of many into a window's candidates.

use datasketches::frequencies::{ErrorType, FrequentItemsSketch};

/// The map size of a writer's hourly sketch: it keeps every reel above
/// 3.5 / 128 (2.7 %) of what the writer applied in the hour, in at most 96
/// entries (a few KB with their ids).
pub const WRITER_MAP_SIZE: usize = 128;

/// The map size of a window's merged sketch: its candidates.
pub const MERGED_MAP_SIZE: usize = 1024;

/// An hour's sketch of one writer: the hour (Unix ms / 3,600,000) and the
/// serialized Frequent Items sketch of what the writer applied in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HourSketch {
    /// The hour it covers.
    pub hour: i64,
    /// The sketch, serialized (DataSketches' format).
    pub bytes: Vec<u8>,
}

/// What one chunk does to its writer's sketch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SketchStep {
    /// The writer's sketch after the chunk.
    pub current: HourSketch,
    /// The sketch of an hour that has ended: stored as it ends.
    pub finished: Option<HourSketch>,
    /// The chunk opened `current`'s hour for the writer: its sketch is
    /// stored at once, so that readers of the hour find the writer.
    pub opened: bool,
}

/// The hour of `ms`.
pub const fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(3_600_000)
}

/// `prev` (the checkpoint's sketch) with `counts` added, in the hour of
/// `now_ms` (the aggregator's clock): a new hour starts an empty sketch,
/// and the previous one is handed back as finished. A stored sketch that
/// cannot be read is started over (candidates only: the ranking is by the
/// exact windowed counts).
pub fn step<'a>(
    prev: Option<&HourSketch>,
    now_ms: i64,
    counts: impl IntoIterator<Item = (&'a str, u64)>,
) -> SketchStep {
    let now = hour_of(now_ms);
    let (mut tally, finished, opened) = match prev {
        // The same hour, or a clock behind the stored one: add to it.
        Some(p) if p.hour >= now => (Tally::resume(p), None, false),
        Some(p) => (Tally::new(now), Some(p.clone()), true),
        None => (Tally::new(now), None, true),
    };
    for (item, n) in counts {
        tally.add(item, n);
    }
    SketchStep {
        current: tally.snapshot(),
        finished,
        opened,
    }
}

/// An hour's sketch kept open in memory, added to like by like (a like
/// function instance's, in transactional mode: [`super::instance`]), and
/// serialized only when it is put.
#[derive(Debug)]
pub struct Tally {
    /// The hour it covers.
    pub hour: i64,
    sketch: FrequentItemsSketch<String>,
}

impl Tally {
    /// An empty sketch of `hour`.
    pub fn new(hour: i64) -> Self {
        Tally {
            hour,
            sketch: new(WRITER_MAP_SIZE),
        }
    }

    /// `stored`, to add to (started over if it cannot be read).
    pub fn resume(stored: &HourSketch) -> Self {
        Tally {
            hour: stored.hour,
            sketch: decode(&stored.bytes, WRITER_MAP_SIZE),
        }
    }

    /// `n` more of `item`.
    pub fn add(&mut self, item: &str, n: u64) {
        if n > 0 {
            self.sketch.update_with_count(item.to_owned(), n);
        }
    }

    /// The sketch as it is put.
    pub fn snapshot(&self) -> HourSketch {
        HourSketch {
            hour: self.hour,
            bytes: self.sketch.serialize(),
        }
    }
}

fn new(size: usize) -> FrequentItemsSketch<String> {
    FrequentItemsSketch::new(size).expect("a power of two within the sketch's range")
}

fn decode(bytes: &[u8], size: usize) -> FrequentItemsSketch<String> {
    FrequentItemsSketch::deserialize(bytes).unwrap_or_else(|_| new(size))
}

/// Many writers' hourly sketches merged: the window's candidates, most
/// frequent first (by upper bound), with the merged sketch's maximum error
/// (an item whose true count is above it is among them).
pub fn candidates<'a>(sketches: impl IntoIterator<Item = &'a [u8]>) -> (Vec<String>, u64) {
    let merged = merged(sketches);
    let rows = merged.frequent_items(ErrorType::NoFalseNegatives);
    (
        rows.into_iter().map(|r| r.item().clone()).collect(),
        merged.maximum_error(),
    )
}

/// Many writers' sketches of one hour merged (map [`MERGED_MAP_SIZE`]),
/// serialized: what [`candidates`] takes in their place once the hour has
/// ended, since merging is associative (its error is carried in it).
pub fn merge_hour<'a>(sketches: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    merged(sketches).serialize()
}

/// `sketches` merged into one of map [`MERGED_MAP_SIZE`] (one that
/// cannot be read is left out).
fn merged<'a>(sketches: impl IntoIterator<Item = &'a [u8]>) -> FrequentItemsSketch<String> {
    let mut merged = new(MERGED_MAP_SIZE);
    for bytes in sketches {
        if let Ok(s) = FrequentItemsSketch::<String>::deserialize(bytes) {
            merged.merge(&s);
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3_600_000;

    #[test]
    fn a_chunk_adds_to_its_hour_and_a_new_hour_hands_the_old_one_over() {
        let first = step(None, 10 * H + 5, [("a", 3), ("b", 1), ("c", 0)]);
        assert!(first.opened && first.finished.is_none());
        assert_eq!(first.current.hour, 10);
        let same = step(Some(&first.current), 10 * H + 99, [("a", 2)]);
        assert!(!same.opened && same.finished.is_none());
        let next = step(Some(&same.current), 11 * H, [("b", 4)]);
        assert!(next.opened);
        assert_eq!(next.finished, Some(same.current.clone()));
        let (c, err) = candidates([same.current.bytes.as_slice(), next.current.bytes.as_slice()]);
        assert_eq!(err, 0, "exact while few reels");
        assert_eq!(c, ["a", "b"], "a: 5, b: 5 (1 + 4), c never counted");
        // A clock behind the stored hour adds to the stored one.
        let behind = step(Some(&next.current), 10 * H, [("d", 1)]);
        assert_eq!(behind.current.hour, 11);
        assert!(!behind.opened && behind.finished.is_none());
    }

    #[test]
    fn a_writer_sketch_stays_small_and_keeps_the_heavy_reels() {
        let mut s: Option<HourSketch> = None;
        // 500 reels, reel-0 to reel-2 with 5 % of the likes each.
        for round in 0..20 {
            let counts: Vec<(String, u64)> = (0..500)
                .map(|i| (format!("reel-{i}"), if i < 3 { 28 } else { 1 }))
                .collect();
            let step = step(
                s.as_ref(),
                7 * H + round,
                counts.iter().map(|(r, n)| (r.as_str(), *n)),
            );
            s = Some(step.current);
        }
        let bytes = s.unwrap().bytes;
        assert!(bytes.len() < 4_000, "{} bytes", bytes.len());
        let (c, _) = candidates([bytes.as_slice()]);
        for heavy in ["reel-0", "reel-1", "reel-2"] {
            assert!(c.iter().any(|r| r == heavy), "{heavy} in {c:?}");
        }
    }

    #[test]
    fn an_hours_merge_stands_for_its_sketches() {
        let a = step(None, 3 * H, [("x", 5), ("y", 1)]).current.bytes;
        let b = step(None, 3 * H, [("x", 2), ("z", 4)]).current.bytes;
        let c = step(None, 4 * H, [("z", 3)]).current.bytes;
        let direct = candidates([a.as_slice(), b.as_slice(), c.as_slice()]);
        let hour = merge_hour([a.as_slice(), b.as_slice()]);
        assert_eq!(candidates([hour.as_slice(), c.as_slice()]), direct);
        assert_eq!(
            direct.0,
            ["z", "x", "y"],
            "z: 7, x: 7, y: 1 (upper bounds, ties kept)"
        );
    }

    #[test]
    fn an_unreadable_sketch_starts_over() {
        let bad = HourSketch {
            hour: 3,
            bytes: vec![1, 2, 3],
        };
        let s = step(Some(&bad), 3 * H, [("a", 1)]);
        assert_eq!(candidates([s.current.bytes.as_slice()]).0, ["a"]);
    }
}
