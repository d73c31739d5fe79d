//! What an aggregator instance keeps of each writer's sketch between its
//! chunks, and when a chunk writes it into the checkpoint.
//!
//! Writing the sketch with every chunk would make it exact (the chunk's
//! transaction holds it), but a sketch of a few KB costs a write unit per
//! KB each time: at a record a chunk (a quiet stream shard) that is units
//! per like. So a chunk writes it only when it costs nothing or is due:
//! while it is small (within [`FREE_BYTES`]), when its hour starts or ends,
//! or when it was last written [`FLUSH_MS`] ago. In between, this instance
//! holds the newer one. If the writer's next batch lands in another
//! instance, that one starts from the checkpoint's sketch, and what this
//! instance applied since it last wrote the sketch is missing from it: at
//! most [`FLUSH_MS`] of one writer's records, from the candidates only
//! (the ranking reads the exact windowed counts).

use super::sketch::{HourSketch, SketchStep, step};
use std::collections::HashMap;
use std::sync::Mutex;

/// A sketch this small rides in the checkpoint item within its first write
/// unit: written with every chunk.
pub const FREE_BYTES: usize = 600;

/// The longest a chunk leaves a larger sketch unwritten.
pub const FLUSH_MS: i64 = 60_000;

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
    /// The checkpoint of `key` was read: `seq`, with `stored` beside it.
    /// This instance's own copy stands if it goes with that checkpoint
    /// (it holds what it applied and did not write); otherwise the stored
    /// one does.
    pub fn read(&self, key: &str, seq: Option<&str>, stored: Option<HourSketch>) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mine = m.get(key).is_some_and(|k| k.seq.as_deref() == seq);
        if !mine {
            m.insert(
                key.to_owned(),
                Known {
                    seq: seq.map(str::to_owned),
                    sketch: stored,
                    written_ms: 0,
                },
            );
        }
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
        let write = step.opened
            || step.finished.is_some()
            || step.current.bytes.len() <= FREE_BYTES
            || now_ms - written_ms >= FLUSH_MS;
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
    fn a_large_sketch_is_written_at_most_once_a_minute_and_never_lost_here() {
        let s = Sketches::default();
        s.read("ck", None, None);
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
        s.read("ck", Some("2"), Some(first.step.current.clone()));
        let third = s.plan("ck", 5 * H + FLUSH_MS, [("hot", 1_000)]);
        assert!(third.write, "a minute after the last write");
        assert_eq!(
            candidates([third.step.current.bytes.as_slice()]).0[0],
            "hot"
        );
        // Another instance moved the checkpoint: the stored sketch stands.
        s.read("ck", Some("9"), None);
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
