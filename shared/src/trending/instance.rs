//! Transactional mode's likes candidates: no aggregator reads the Likes
//! table's stream there, so each like function instance is a writer of
//! its own. It keeps a sketch of the likes it committed in the current
//! hour and puts it as a stream writer does (`top#likes#{hour}`, sort key
//! [`crate::keys::top::instance_writer`]): when its hour starts, when the
//! hour ends (the ended hour's final sketch, with the next like), and
//! otherwise at most every [`FLUSH_MS`], with a like. Ranking reads every
//! writer's sketch of the window's hours alike.
//!
//! What this gives up, and why it is enough: a like function instance
//! runs only while it answers, so what it added since its last put waits
//! for its next like, and is lost from the candidates (never from the
//! counts: the ranking reads each candidate's exact windowed count) if
//! the instance is reaped first. A reel that trends is liked on many
//! instances, and every busy one puts at least every [`FLUSH_MS`]. The
//! cost is one put of a few KB per instance per [`FLUSH_MS`] while it
//! takes likes, whatever their rate: against the like transactions' 4
//! write units each, nothing at a platform's rate, and at most one more
//! write per like on an instance that takes fewer than one like per
//! [`FLUSH_MS`].

use super::live::FLUSH_MS;
use super::sketch::{HourSketch, Tally, hour_of};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Ended hours an instance keeps unput sketches of at most (their puts
/// failed): a day's lists and an hour to spare, as the items are read.
const KEPT_HOURS: i64 = 25;

/// One like function instance's sketch of the likes it committed.
#[derive(Debug)]
pub struct InstanceSketch {
    /// The writer it is put as (random per instance).
    writer: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The current hour's sketch.
    open: Option<Tally>,
    /// Ended hours' sketches with likes not yet put, by hour.
    ended: BTreeMap<i64, HourSketch>,
    /// Whether `open` holds likes not yet put.
    pending: bool,
    /// When `open` was last put, or its put tried (Unix ms; 0: not yet in
    /// its hour).
    written_ms: i64,
}

/// The puts a like makes due: the writer's sketches to store, an ended
/// hour's first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flush {
    /// The sort key they are put under.
    pub writer: String,
    /// The sketches, each of its hour.
    pub sketches: Vec<HourSketch>,
}

impl InstanceSketch {
    /// A sketch put under `writer` (one per instance).
    pub fn new(writer: String) -> Self {
        InstanceSketch {
            writer,
            state: Mutex::default(),
        }
    }

    /// The writer it is put as.
    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// A like of `reel` committed at `now_ms` (this instance's clock): the
    /// puts now due, if any. A clock behind the open hour adds to it.
    pub fn add(&self, reel: &str, now_ms: i64) -> Option<Flush> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let hour = hour_of(now_ms);
        let open = match s.open.take() {
            Some(t) if t.hour >= hour => t,
            Some(t) => {
                if s.pending {
                    s.ended.insert(t.hour, t.snapshot());
                }
                s.ended.retain(|h, _| *h >= hour - KEPT_HOURS);
                s.written_ms = 0;
                Tally::new(hour)
            }
            None => Tally::new(hour),
        };
        let open = s.open.insert(open);
        open.add(reel, 1);
        let due = s.written_ms == 0 || now_ms - s.written_ms >= FLUSH_MS;
        if !due {
            s.pending = true;
            return None;
        }
        let mut sketches: Vec<HourSketch> = std::mem::take(&mut s.ended).into_values().collect();
        sketches.push(s.open.as_ref().map(Tally::snapshot)?);
        s.pending = false;
        s.written_ms = now_ms;
        Some(Flush {
            writer: self.writer.clone(),
            sketches,
        })
    }

    /// The puts of `flush` did not all land: what they carried goes with
    /// the next put, [`FLUSH_MS`] after this one (not with every like
    /// meanwhile: a throttled table is not asked more often), or at the
    /// next hour's first like (an ended hour's as it was, the open hour's
    /// as it is then).
    pub fn failed(&self, flush: Flush) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let open_hour = s.open.as_ref().map(|t| t.hour);
        for sketch in flush.sketches {
            if Some(sketch.hour) == open_hour {
                s.pending = true;
            } else {
                // An ended hour's final sketch: nothing newer of it exists.
                s.ended.entry(sketch.hour).or_insert(sketch);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trending::sketch::candidates;

    const H: i64 = 3_600_000;

    fn named(f: &Flush) -> Vec<Vec<String>> {
        f.sketches
            .iter()
            .map(|s| candidates([s.bytes.as_slice()]).0)
            .collect()
    }

    #[test]
    fn the_first_like_of_an_hour_is_put_then_at_most_one_put_per_flush() {
        let s = InstanceSketch::new("fn#1".into());
        let first = s.add("a", 5 * H).expect("the hour's first like is put");
        assert_eq!(first.writer, "fn#1");
        assert_eq!(named(&first), [["a"]]);
        assert_eq!(s.add("b", 5 * H + 1), None);
        assert_eq!(s.add("b", 5 * H + FLUSH_MS - 1), None);
        let later = s
            .add("c", 5 * H + FLUSH_MS)
            .expect("FLUSH_MS after the last put");
        assert_eq!(later.sketches.len(), 1);
        let mut names = named(&later).remove(0);
        names.sort();
        assert_eq!(names, ["a", "b", "c"], "everything of the hour");
    }

    #[test]
    fn an_ended_hour_is_put_final_with_the_next_like() {
        let s = InstanceSketch::new("fn#1".into());
        assert!(s.add("a", 5 * H).is_some());
        assert_eq!(s.add("late", 5 * H + 1), None);
        let turn = s.add("new", 6 * H).expect("a new hour");
        assert_eq!(
            turn.sketches.iter().map(|k| k.hour).collect::<Vec<_>>(),
            [5, 6]
        );
        let names = named(&turn);
        assert!(names[0].contains(&"late".to_owned()), "{names:?}");
        assert_eq!(names[1], ["new"]);
        // An hour with nothing left unput is not put again.
        assert!(
            s.add("x", 7 * H)
                .unwrap()
                .sketches
                .iter()
                .all(|k| k.hour == 7)
        );
    }

    #[test]
    fn a_failed_put_goes_with_the_next_put() {
        let s = InstanceSketch::new("fn#1".into());
        let lost = s.add("a", 5 * H).unwrap();
        s.failed(lost);
        assert_eq!(s.add("b", 5 * H + 1), None, "not retried on every like");
        let again = s.add("c", 5 * H + FLUSH_MS).expect("FLUSH_MS later");
        let mut names = named(&again).remove(0);
        names.sort();
        assert_eq!(names, ["a", "b", "c"]);
        // An ended hour's failed put is carried into the next put.
        assert_eq!(s.add("d", 5 * H + FLUSH_MS + 1), None);
        let turn = s.add("e", 6 * H).unwrap();
        s.failed(turn);
        assert_eq!(s.add("f", 6 * H + 1), None);
        let next = s.add("g", 6 * H + FLUSH_MS).unwrap();
        assert_eq!(
            next.sketches.iter().map(|k| k.hour).collect::<Vec<_>>(),
            [5, 6]
        );
        assert!(named(&next)[0].contains(&"d".to_owned()));
    }

    #[test]
    fn every_ended_hour_whose_put_failed_is_kept_until_put() {
        let s = InstanceSketch::new("fn#1".into());
        let first = s.add("a", 5 * H).unwrap();
        s.failed(first);
        // The next like is two hours later: hour 5 is still to put.
        let turn = s.add("b", 7 * H).unwrap();
        assert_eq!(
            turn.sketches.iter().map(|k| k.hour).collect::<Vec<_>>(),
            [5, 7]
        );
        s.failed(turn);
        // Its put failed too, and the hour turns again: 5, 7 and 8.
        let again = s.add("c", 8 * H).unwrap();
        assert_eq!(
            again.sketches.iter().map(|k| k.hour).collect::<Vec<_>>(),
            [5, 7, 8]
        );
        // Past a day, an unput hour is given up (no list reads it).
        s.failed(again);
        let late = s.add("d", 40 * H).unwrap();
        assert_eq!(
            late.sketches.iter().map(|k| k.hour).collect::<Vec<_>>(),
            [40]
        );
    }
}
