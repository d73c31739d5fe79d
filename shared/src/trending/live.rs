//! What an aggregator instance keeps of each writer's sketch between its
//! chunks, and when a chunk writes it.
//!
//! The sketch is an item of its own (`top#{metric}#{hour}`, sort key the
//! writer), never part of the checkpoint: DynamoDB charges an update by
//! the whole item's size, so a sketch of a few KB riding in the checkpoint
//! would cost its KB in write units with every chunk, written or not
//! (a record a chunk on a quiet stream shard: units per like). A chunk
//! puts it, in its transaction, only when its hour starts or ends, or when
//! it was last written [`FLUSH_MS`] ago; the checkpoint keeps only the
//! hour it is of (`fh`, to find it again). In between, this instance
//! holds the newer one. If the writer's next batch lands in another
//! instance, that one reads the stored sketch, and what this instance
//! applied since it last wrote it is missing from it: at most
//! [`FLUSH_MS`] of one writer's records, from the candidates only (the
//! ranking reads the exact windowed counts).

use super::sketch::{HourSketch, SketchStep, step};
use std::collections::HashMap;
use std::sync::Mutex;

/// The longest a chunk leaves its writer's sketch unwritten: how late a
/// new candidate may reach the lists, and what bounds the sketch's writes
/// to one put per writer per 10 s while records flow.
pub const FLUSH_MS: i64 = 10_000;

/// Writers an instance keeps sketches of before it forgets those of
/// earlier hours: on Lambda any instance may take any stream shard's
/// batch, and stream shards roll every few hours.
pub const MAX_KNOWN: usize = 1_024;

/// A writer's sketch as this instance last knew it.
#[derive(Clone, Debug)]
struct Known {
    /// The checkpoint (padded sequence number) it goes with.
    seq: Option<String>,
    /// The sketch, including what this instance applied and did not write.
    sketch: Option<HourSketch>,
    /// When it was last written into the checkpoint (Unix ms).
    written_ms: i64,
}

/// What a chunk writes of its writer's sketch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SketchWrite {
    /// The step the chunk makes (applied to this instance's copy in any
    /// case).
    pub step: SketchStep,
    /// Whether the chunk's transaction writes it.
    pub write: bool,
}

/// Every writer's sketch this instance aggregates, by checkpoint key.
#[derive(Debug, Default)]
pub struct Sketches(Mutex<HashMap<String, Known>>);

impl Sketches {
    /// Whether this instance's own copy of `key`'s sketch goes with the
    /// checkpoint `seq` just read (it holds what it applied and did not
    /// write); if not, the stored one must be read and [`Self::restore`]d.
    pub fn holds(&self, key: &str, seq: Option<&str>) -> bool {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key).is_some_and(|k| k.seq.as_deref() == seq)
    }

    /// The checkpoint of `key` was read, `seq`, and this instance did not
    /// hold its sketch: `stored` (the writer's stored sketch, if any) it is.
    pub fn restore(&self, key: &str, seq: Option<&str>, stored: Option<HourSketch>) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(
            key.to_owned(),
            Known {
                seq: seq.map(str::to_owned),
                sketch: stored,
                written_ms: 0,
            },
        );
    }

    /// What a chunk applying `counts` on top of the checkpoint last read
    /// or applied writes, at `now_ms`. The same state and clock plan the
    /// same step, so a chunk planned again is the same transaction.
    pub fn plan<'a>(
        &self,
        key: &str,
        now_ms: i64,
        counts: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> SketchWrite {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let known = m.get(key);
        let step = step(known.and_then(|k| k.sketch.as_ref()), now_ms, counts);
        let written_ms = known.map_or(0, |k| k.written_ms);
        let write = step.opened || step.finished.is_some() || now_ms - written_ms >= FLUSH_MS;
        SketchWrite { step, write }
    }

    /// The chunk of `write` landed: the checkpoint is `seq` now. Past
    /// [`MAX_KNOWN`] writers, those whose sketch is of an hour before the
    /// last are forgotten (a writer that comes back starts from its
    /// checkpoint's sketch).
    pub fn applied(&self, key: &str, seq: &str, write: &SketchWrite, now_ms: i64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_KNOWN {
            let recent = super::sketch::hour_of(now_ms) - 1;
            m.retain(|_, k| k.sketch.as_ref().is_some_and(|s| s.hour >= recent));
        }
        let before = m.get(key).map_or(0, |k| k.written_ms);
        m.insert(
            key.to_owned(),
            Known {
                seq: Some(seq.to_owned()),
                sketch: Some(write.step.current.clone()),
                written_ms: if write.write { now_ms } else { before },
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trending::sketch::candidates;

    const H: i64 = 3_600_000;

    #[test]
    fn a_sketch_is_written_at_most_once_per_flush_and_never_lost_here() {
        let s = Sketches::default();
        assert!(!s.holds("ck", None));
        s.restore("ck", None, None);
        // Long ids and uneven counts: a sketch of several KB.
        let many: Vec<(String, u64)> = (0..300)
            .map(|i| (format!("reel-{i:03}-{}", "x".repeat(40)), 1 + i % 7))
            .collect();
        let counts = || many.iter().map(|(r, n)| (r.as_str(), *n));
        let first = s.plan("ck", 5 * H, counts());
        assert!(first.write, "a new hour is written at once");
        s.applied("ck", "1", &first, 5 * H);
        let second = s.plan("ck", 5 * H + 1_000, counts());
        assert!(
            !second.write,
            "{} bytes, written a second ago",
            second.step.current.bytes.len()
        );
        s.applied("ck", "2", &second, 5 * H + 1_000);
        // Read again at the checkpoint this instance applied: its copy
        // stands, with the unwritten chunk in it.
        assert!(s.holds("ck", Some("2")));
        let third = s.plan("ck", 5 * H + FLUSH_MS, [("hot", 1_000)]);
        assert!(third.write, "FLUSH_MS after the last write");
        assert_eq!(
            candidates([third.step.current.bytes.as_slice()]).0[0],
            "hot"
        );
        // Another instance moved the checkpoint: the stored sketch stands.
        assert!(!s.holds("ck", Some("9")));
        s.restore("ck", Some("9"), None);
        let fresh = s.plan("ck", 5 * H + FLUSH_MS + 1, [("x", 1)]);
        assert!(fresh.step.opened);
    }

    #[test]
    fn an_instance_forgets_writers_of_earlier_hours_past_its_bound() {
        let s = Sketches::default();
        for w in 0..MAX_KNOWN {
            let key = format!("old-{w}");
            let step = s.plan(&key, H, [("a", 1)]);
            s.applied(&key, "1", &step, H);
        }
        let step = s.plan("new", 5 * H, [("b", 1)]);
        s.applied("new", "1", &step, 5 * H);
        let m = s.0.lock().unwrap();
        assert_eq!(m.len(), 1, "the hour-1 writers are forgotten");
        assert!(m.contains_key("new"));
    }
}
