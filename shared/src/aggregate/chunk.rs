//! Deterministic sub-batches: a batch's changes cut into consecutive runs
//! that each fit one transaction, so that each can advance the shard's
//! checkpoint to its last record; and each run's transaction.

use super::CHECKPOINT_TTL;
use super::records::{Change, SequenceNumber};
use crate::config::RecentWindow;
use crate::keys::{self, ReelId, window};
use crate::store::{ChunkAdd, ChunkWrite, RecentAdd};
use crate::token::RequestToken;
use crate::trending::SketchWrite;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Consecutive changes of one stream shard, applied by one transaction:
/// every change after the checkpoint up to and including `last`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Its first record.
    pub first: SequenceNumber,
    /// Its last record: the checkpoint once it is applied.
    pub last: SequenceNumber,
    /// Index of its first record among the changes cut (the ordered batch).
    pub first_index: usize,
    /// Records in it.
    pub records: usize,
    /// The net change of each reel a record of it counts for. A reel whose
    /// like and unlike cancel out stays listed (its net change 0): the
    /// removal is recorded in its recent-change buckets all the same, which
    /// reconciliation relies on (a removed row it counted before is one it
    /// cannot count now).
    pub deltas: BTreeMap<ReelId, i64>,
    /// Each listed reel's changes by recent-change bucket (start, Unix ms).
    pub recent: BTreeMap<ReelId, BTreeMap<i64, RecentAdd>>,
    /// Each listed reel's net change by the five minutes its records were
    /// made in (start, Unix ms): what its windowed counts take
    /// ([`crate::keys::window`]; every coarser bucket is a whole number of
    /// these).
    pub made: BTreeMap<ReelId, BTreeMap<i64, i64>>,
    /// Each listed reel's net change by its records' own time (a new
    /// row's `liked_at`, a removal's stream timestamp; Unix ms): what its
    /// writer item's own-change tail takes ([`crate::keys::tail`]).
    pub own: BTreeMap<ReelId, BTreeMap<i64, i64>>,
    /// The latest `ApproximateCreationDateTime` in it (Unix ms).
    pub newest_ms: Option<i64>,
}

/// Where a chunk's transaction writes each reel, and what own-change tail
/// it sets there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ItemPlan {
    /// How many parts each reel is written to now (absent: one): the
    /// spread registry as last read.
    pub parts: HashMap<ReelId, u32>,
    /// The own-change tails' bucket width and how long they keep (ms),
    /// both part of their attribute's name.
    pub tail_width_ms: i64,
    /// See `tail_width_ms`.
    pub tail_keep_ms: i64,
    /// Each reel's writer item's tail after the chunk, whole
    /// ([`crate::keys::tail::TailWindow::merged`]): bucket start, net
    /// change. A reel left out keeps its map as it is (empty before and
    /// after).
    pub tails: HashMap<ReelId, BTreeMap<i64, i64>>,
}

impl Chunk {
    /// The reels it writes the stream shard's item of, with their net
    /// change.
    pub fn reels(&self) -> impl Iterator<Item = (&ReelId, i64)> {
        self.deltas.iter().map(|(r, d)| (r, *d))
    }

    /// Its transaction on the checkpoint item `key` of stream shard
    /// `shard_id`, from `checkpoint` (the value read) to its last record:
    /// each reel's delta on the stream shard's own item of the reel, in
    /// the part of the reel's parts in `items` its writer name picks, with
    /// the tail `items` gives it;
    /// `now` is the aggregator's clock.
    pub fn write(
        &self,
        key: &str,
        shard_id: &str,
        checkpoint: Option<&SequenceNumber>,
        window: RecentWindow,
        now: Duration,
        items: &ItemPlan,
    ) -> ChunkWrite {
        let writer = keys::likes_writer(key);
        let now_ms = now.as_millis() as i64;
        // The oldest bucket kept; the few before it are dropped by this
        // write. A record older than that changes `n` alone: reconciliation
        // never compares a reel that long after its rows were counted.
        let kept_from = (now_ms - window.keep_ms).div_euclid(window.width_ms) * window.width_ms
            + window.width_ms;
        let mut adds = Vec::with_capacity(self.deltas.len());
        for (reel, delta) in self.reels() {
            let recent = self
                .recent
                .get(reel)
                .into_iter()
                .flat_map(|b| b.range(kept_from..))
                .map(|(_, r)| *r)
                .filter(|r| r.delta != 0 || r.removals != 0)
                .collect();
            let mut windows: BTreeMap<String, i64> = BTreeMap::new();
            for (at, d) in self.made.get(reel).into_iter().flatten() {
                for name in window::buckets_of(*at, now_ms) {
                    *windows.entry(name).or_default() += d;
                }
            }
            adds.push(ChunkAdd {
                reel: reel.clone(),
                part: keys::likes_writer_part(writer, items.parts.get(reel).copied().unwrap_or(1)),
                delta,
                recent,
                windows: windows.into_iter().filter(|(_, d)| *d != 0).collect(),
                tail: items.tails.get(reel).cloned(),
            });
        }
        let (prune, window_prune) = if adds.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            (
                (1..=PRUNE_BUCKETS)
                    .map(|k| kept_from - k * window.width_ms)
                    .collect(),
                window::pruned_attrs(now_ms),
            )
        };
        let mut write = ChunkWrite {
            checkpoint_key: key.to_owned(),
            shard_id: shard_id.to_owned(),
            expected: checkpoint.map(|c| c.padded().to_owned()),
            next: self.last.padded().to_owned(),
            adds,
            records: self.records as u64,
            // Derived from the rest, once it is all there (below).
            token: RequestToken::for_fields("aggregate", &[]),
            now_ms,
            expires_at: (now + CHECKPOINT_TTL).as_secs() as i64,
            width_ms: window.width_ms,
            prune,
            window_prune,
            tail_width_ms: items.tail_width_ms,
            tail_keep_ms: items.tail_keep_ms,
            sketch: None,
        };
        write.token = token(&write);
        write
    }
}

/// `write` carrying its stream shard's trending sketch, its token derived
/// anew.
pub fn with_sketch(mut write: ChunkWrite, sketch: SketchWrite) -> ChunkWrite {
    write.sketch = Some(sketch);
    write.token = token(&write);
    write
}

/// Buckets older than the oldest kept that each shard write removes: an
/// item written at least once in this many bucket widths never keeps a
/// stale one.
const PRUNE_BUCKETS: i64 = 4;

/// The `ClientRequestToken` of `write`: derived from all it sends (every
/// value written, every condition, the clock it stamps), so that one token
/// never names two bodies. DynamoDB answers a token sent again within ten
/// minutes with a replay of the first transaction, or, if the body differs,
/// with `IdempotentParameterMismatch`; so a retry of one plan (the SDK's
/// after a lost answer, or the aggregator's) is a replay, and a plan made
/// later (another invocation, another clock) is another transaction, which
/// the checkpoint's condition refuses if the first one landed.
fn token(write: &ChunkWrite) -> RequestToken {
    // Taken apart field by field: a field added to the body is a compile
    // error here until the token covers it.
    let ChunkWrite {
        checkpoint_key,
        shard_id,
        expected,
        next,
        adds,
        records,
        token: _,
        now_ms,
        expires_at,
        width_ms,
        prune,
        window_prune,
        tail_width_ms,
        tail_keep_ms,
        sketch,
    } = write;
    let mut fields: Vec<String> = vec![
        checkpoint_key.clone(),
        shard_id.clone(),
        expected.clone().unwrap_or_else(|| "-".into()),
        next.clone(),
        records.to_string(),
        now_ms.to_string(),
        expires_at.to_string(),
    ];
    fields.push(format!("w{width_ms}"));
    fields.push(format!("t{tail_width_ms}k{tail_keep_ms}"));
    fields.extend(prune.iter().map(|p| format!("p{p}")));
    fields.extend(window_prune.iter().map(|p| format!("-{p}")));
    // The sketch, when the chunk writes it (a digest: it is a few KB).
    if let Some(s) = sketch.as_ref().filter(|s| s.write) {
        let step = &s.step;
        let finished = step.finished.as_ref();
        fields.push(format!(
            "sketch{}:{}:{}:{}",
            step.current.hour,
            RequestToken::for_fields("sketch", &[&hex(&step.current.bytes)]).as_str(),
            finished.map_or(-1, |f| f.hour),
            step.opened,
        ));
        if let Some(f) = finished {
            fields.push(
                RequestToken::for_fields("ended", &[&hex(&f.bytes)])
                    .as_str()
                    .to_owned(),
            );
        }
    }
    for ChunkAdd {
        reel,
        part,
        delta,
        recent,
        windows,
        tail,
    } in adds
    {
        fields.extend([
            reel.as_str().to_owned(),
            format!("part{part}"),
            delta.to_string(),
        ]);
        for RecentAdd {
            start_ms,
            delta,
            removals,
        } in recent
        {
            fields.push(format!("b{start_ms}:{delta}:{removals}"));
        }
        fields.extend(windows.iter().map(|(name, d)| format!("{name}+{d}")));
        if let Some(tail) = tail {
            fields.push("tail".to_owned());
            fields.extend(tail.iter().map(|(start, d)| format!("{start}={d}")));
        }
    }
    let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
    // v9: with the own-change tails; v8: with the trending sketch (v7: the windowed-count buckets; v6:
    // each writer item in its part; v5: part 0 only; v4: shard items with
    // the recent buckets); an older token names another body.
    RequestToken::for_fields("aggregate/v9", &fields)
}

/// Bytes as hex, for a token's fields.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Cuts `changes` (in sequence order, none at or below the checkpoint) into
/// consecutive chunks whose net changes touch at most `max_reels` reels
/// each. The cut depends only on the changes, so a batch delivered again
/// after a failure is cut the same way from the checkpoint on (a smaller or
/// larger batch may end its last chunk elsewhere: the checkpoint, not the
/// cut, is what makes a record count once).
///
/// A reel's place bounds the transaction's items (a shard update each),
/// so only a record that counts takes one: a record that changes no count
/// (a row its own transaction counted, replayed when a busy table switches
/// to stream mode) rides along in any chunk, moving the checkpoint only.
/// Each counted record also goes to its reel's recent-change bucket of
/// width `width_ms`, by its [`Change::key_ms`] (`fallback_ms`, the
/// aggregator's clock, for a record without a timestamp: a removal then
/// defers its reel's reconciliation rather than hide).
pub fn chunks(
    changes: &[(usize, Change)],
    max_reels: usize,
    width_ms: i64,
    fallback_ms: i64,
) -> Vec<Chunk> {
    let max_reels = max_reels.max(1);
    let width_ms = width_ms.max(1);
    let mut out: Vec<Chunk> = Vec::new();
    for (index, c) in changes {
        let reel = c.reel.as_ref().filter(|_| c.delta != 0);
        let fits = out.last().is_some_and(|chunk| match reel {
            Some(r) => chunk.deltas.contains_key(r) || chunk.deltas.len() < max_reels,
            None => true,
        });
        let chunk = match out.last_mut() {
            Some(chunk) if fits => chunk,
            _ => {
                out.push(Chunk {
                    first: c.seq.clone(),
                    last: c.seq.clone(),
                    first_index: *index,
                    records: 0,
                    deltas: BTreeMap::new(),
                    recent: BTreeMap::new(),
                    made: BTreeMap::new(),
                    own: BTreeMap::new(),
                    newest_ms: None,
                });
                let last = out.len() - 1;
                &mut out[last]
            }
        };
        chunk.last = c.seq.clone();
        chunk.records += 1;
        if let Some(r) = reel {
            *chunk.deltas.entry(r.clone()).or_default() += c.delta;
            let start_ms = c.key_ms.unwrap_or(fallback_ms).div_euclid(width_ms) * width_ms;
            let bucket = chunk
                .recent
                .entry(r.clone())
                .or_default()
                .entry(start_ms)
                .or_insert(RecentAdd {
                    start_ms,
                    ..RecentAdd::default()
                });
            bucket.delta += c.delta;
            bucket.removals += i64::from(c.delta < 0);
            let made =
                window::Grain::Minutes5.start_of(c.at_ms.or(c.key_ms).unwrap_or(fallback_ms));
            *chunk
                .made
                .entry(r.clone())
                .or_default()
                .entry(made)
                .or_default() += c.delta;
            *chunk
                .own
                .entry(r.clone())
                .or_default()
                .entry(c.key_ms.unwrap_or(fallback_ms))
                .or_default() += c.delta;
        }
        chunk.newest_ms = chunk.newest_ms.max(c.at_ms);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(seq: u64, reel: &str, delta: i64) -> Change {
        Change {
            seq: SequenceNumber::parse(&seq.to_string()).unwrap(),
            reel: ReelId::parse(reel).ok(),
            delta,
            at_ms: Some(seq as i64),
            key_ms: Some(seq as i64),
        }
    }

    const WINDOW: RecentWindow = RecentWindow {
        width_ms: 10,
        keep_ms: 320,
    };

    #[test]
    fn chunks_are_consecutive_and_hold_at_most_the_reels_allowed() {
        let cs: Vec<(usize, Change)> = [
            change(1, "a", 1),
            change(2, "b", 1),
            change(3, "a", -1),
            change(4, "c", 1),
            change(5, "bad#", 1),
            change(6, "c", 1),
            change(7, "d", 1),
        ]
        .into_iter()
        .enumerate()
        .collect();
        let out = chunks(&cs, 2, 10, 0);
        // a's like and unlike cancel out at 3, but a keeps its place (its
        // removal is recorded): c starts the next chunk.
        assert_eq!(
            cut(&out),
            [("1".into(), "3".into(), 3), ("4".into(), "7".into(), 4)]
        );
        let reel = |r: &str| ReelId::parse(r).unwrap();
        assert_eq!(
            out[0].deltas,
            BTreeMap::from([(reel("a"), 0), (reel("b"), 1)])
        );
        assert_eq!(
            out[1].deltas,
            BTreeMap::from([(reel("c"), 2), (reel("d"), 1)])
        );
        assert_eq!(out[1].first_index, 3);
        assert_eq!(out[1].newest_ms, Some(7));
        // The same changes from a later point are cut the same way there.
        assert_eq!(chunks(&cs[3..], 2, 10, 0), out[1..]);
        assert!(chunks(&[], 5, 10, 0).is_empty());
    }

    fn cut(out: &[Chunk]) -> Vec<(String, String, usize)> {
        out.iter()
            .map(|c| (c.first.to_string(), c.last.to_string(), c.records))
            .collect()
    }

    #[test]
    fn records_that_change_no_count_take_no_reels_place() {
        // A busy table switching to stream mode: a batch of rows written by
        // transactional mode (delta 0), a reel each, then one like.
        let mut cs: Vec<(usize, Change)> = (1..=1000)
            .map(|n| change(n, &format!("old{n}"), 0))
            .enumerate()
            .collect();
        cs.push((1000, change(1001, "new", 1)));
        let out = chunks(&cs, 49, 10, 0);
        assert_eq!(cut(&out), [("1".into(), "1001".into(), 1001)]);
        assert_eq!(out[0].reels().count(), 1);
    }

    #[test]
    fn a_removal_is_recorded_in_its_bucket_even_when_the_reel_nets_zero() {
        // A like at 12 (another row) and a removal at 25 of reel a: the
        // count does not move, but reconciliation must see the removal.
        let cs: Vec<(usize, Change)> =
            [change(12, "a", 1), change(25, "a", -1), change(27, "a", -1)]
                .into_iter()
                .enumerate()
                .collect();
        let out = chunks(&cs, 5, 10, 0);
        let write = out[0].write(
            "agg#k",
            "s",
            None,
            WINDOW,
            Duration::from_millis(100),
            &ItemPlan::default(),
        );
        assert_eq!(write.adds.len(), 1);
        assert_eq!(write.adds[0].delta, -1);
        assert_eq!(
            write.adds[0].recent,
            [
                RecentAdd {
                    start_ms: 10,
                    delta: 1,
                    removals: 0
                },
                RecentAdd {
                    start_ms: 20,
                    delta: -2,
                    removals: 2
                },
            ]
        );
        // Written much later, the buckets are past keeping: `n` alone
        // moves, and the write drops the buckets just before those kept.
        let late = out[0].write(
            "agg#k",
            "s",
            None,
            WINDOW,
            Duration::from_millis(1_000),
            &ItemPlan::default(),
        );
        assert!(late.adds[0].recent.is_empty());
        assert_eq!(late.adds[0].delta, -1);
        assert_eq!(late.prune, [680, 670, 660, 650]);
    }

    #[test]
    fn a_token_names_one_transaction_body() {
        let cs: Vec<(usize, Change)> = [change(10, "a", 1), change(11, "b", -1)]
            .into_iter()
            .enumerate()
            .collect();
        let chunk = &chunks(&cs, 5, 10, 0)[0];
        let key = "agg#k";
        let read = SequenceNumber::parse("9");
        let reel = |r: &str| ReelId::parse(r).unwrap();
        // Soon after the records: their buckets are still kept.
        let now = Duration::from_millis(100);
        let none = ItemPlan::default();
        let write = |chunk: &Chunk, read: Option<&SequenceNumber>, now| {
            chunk.write(key, "shard-1", read, WINDOW, now, &none)
        };
        let base = write(chunk, read.as_ref(), now);
        // Planned again from the same state, the same transaction: an
        // SDK or aggregator retry is a replay.
        assert_eq!(write(chunk, read.as_ref(), now), base);
        // Any other body, another token: DynamoDB answers a token used
        // again with another body with IdempotentParameterMismatch.
        let mut others = vec![
            // Planned later (a retried batch): another clock, stamped on
            // the writer items and the checkpoint's expiry.
            write(chunk, read.as_ref(), now + Duration::from_secs(5)),
            write(chunk, None, now),
        ];
        // The same range with other deltas (another STREAM_SINCE_MS).
        let mut changed = chunk.clone();
        changed.deltas.insert(reel("a"), 2);
        others.push(write(&changed, read.as_ref(), now));
        // The same deltas in other buckets.
        let mut moved = chunk.clone();
        for buckets in moved.recent.values_mut() {
            *buckets = buckets
                .values()
                .map(|b| {
                    (
                        b.start_ms + 10,
                        RecentAdd {
                            start_ms: b.start_ms + 10,
                            ..*b
                        },
                    )
                })
                .collect();
        }
        others.push(write(&moved, read.as_ref(), now));
        // Reel a spread over 8 parts: writer `k` writes part 2 of them.
        let spread = ItemPlan {
            parts: HashMap::from([(reel("a"), 8)]),
            ..ItemPlan::default()
        };
        let to_part = chunk.write(key, "shard-1", read.as_ref(), WINDOW, now, &spread);
        assert_eq!((to_part.adds[0].part, to_part.adds[1].part), (2, 0));
        others.push(to_part);
        // The same records with another own-change tail to set (a prior
        // map read or remembered otherwise).
        let tails = ItemPlan {
            tail_width_ms: 1000,
            tails: HashMap::from([(reel("a"), BTreeMap::from([(0, 1)]))]),
            ..ItemPlan::default()
        };
        let with_tail = chunk.write(key, "shard-1", read.as_ref(), WINDOW, now, &tails);
        assert_eq!(with_tail.adds[0].tail, Some(BTreeMap::from([(0, 1)])));
        others.push(with_tail);
        for (i, other) in others.iter().enumerate() {
            assert_ne!(*other, base, "variant {i}");
            assert_ne!(
                other.token, base.token,
                "variant {i}: one token, two bodies"
            );
        }
    }
}
