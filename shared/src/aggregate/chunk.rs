//! Deterministic sub-batches: a batch's changes cut into consecutive runs
//! that each fit one transaction, so that each can advance the shard's
//! checkpoint to its last record; and each run's transaction.

use super::records::{Change, SequenceNumber};
use super::{CHECKPOINT_TTL, counter_shard};
use crate::keys::ReelId;
use crate::store::{ChunkAdd, ChunkWrite, Settings};
use crate::token::RequestToken;
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
    /// The net change of each reel whose count it changes: never 0 (a
    /// reel whose like and unlike cancel out is not listed).
    pub deltas: BTreeMap<ReelId, i64>,
    /// The latest `ApproximateCreationDateTime` in it (Unix ms).
    pub newest_ms: Option<i64>,
}

impl Chunk {
    /// The reels whose count it changes, with their net change.
    pub fn nonzero(&self) -> impl Iterator<Item = (&ReelId, i64)> {
        self.deltas.iter().map(|(r, d)| (r, *d))
    }

    /// Its transaction on the checkpoint item `key` of stream shard
    /// `shard_id`, from `checkpoint` (the value read) to its last record:
    /// each reel's delta on the shard `settings` (by reel; missing: none
    /// yet) give this stream shard, conditioned on their version; `now` is
    /// the aggregator's clock.
    pub fn write(
        &self,
        key: &str,
        shard_id: &str,
        checkpoint: Option<&SequenceNumber>,
        settings: &HashMap<ReelId, Settings>,
        now: Duration,
    ) -> ChunkWrite {
        let mut adds = Vec::with_capacity(self.deltas.len());
        let mut versions = Vec::with_capacity(self.deltas.len());
        for (reel, delta) in self.nonzero() {
            let s = settings.get(reel).copied().unwrap_or_default();
            versions.push(s.version.to_string());
            adds.push(ChunkAdd {
                reel: reel.clone(),
                shard: counter_shard(key, s.write_shards),
                delta,
                settings_version: s.version,
            });
        }
        let expected = checkpoint.map(|c| c.padded().to_owned());
        let mut fields: Vec<&str> = vec![
            key,
            expected.as_deref().unwrap_or("-"),
            self.first.padded(),
            self.last.padded(),
        ];
        fields.extend(versions.iter().map(String::as_str));
        let token = RequestToken::for_fields("aggregate", &fields);
        ChunkWrite {
            checkpoint_key: key.to_owned(),
            shard_id: shard_id.to_owned(),
            expected,
            next: self.last.padded().to_owned(),
            adds,
            records: self.records as u64,
            token,
            now_ms: now.as_millis() as i64,
            expires_at: (now + CHECKPOINT_TTL).as_secs() as i64,
        }
    }
}

/// Cuts `changes` (in sequence order, none at or below the checkpoint) into
/// consecutive chunks whose net changes touch at most `max_reels` reels
/// each. The cut depends only on the changes, so a batch delivered again
/// after a failure is cut the same way from the checkpoint on (a smaller or
/// larger batch may end its last chunk elsewhere: the checkpoint, not the
/// cut, is what makes a record count once).
///
/// A reel's place bounds the transaction's items (a settings check and a
/// shard update each), so only a net change needs one: a record that
/// changes no count (a row its own transaction counted, replayed when a
/// busy table switches to stream mode) rides along in any chunk, moving
/// the checkpoint only, and a reel whose like and unlike cancel out frees
/// its place.
pub fn chunks(changes: &[(usize, Change)], max_reels: usize) -> Vec<Chunk> {
    let max_reels = max_reels.max(1);
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
                    newest_ms: None,
                });
                let last = out.len() - 1;
                &mut out[last]
            }
        };
        chunk.last = c.seq.clone();
        chunk.records += 1;
        if let Some(r) = reel {
            let net = chunk.deltas.entry(r.clone()).or_default();
            *net += c.delta;
            if *net == 0 {
                chunk.deltas.remove(r);
            }
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
        }
    }

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
        let out = chunks(&cs, 2);
        // a's like and unlike cancel out at 3: its place goes to c.
        assert_eq!(
            cut(&out),
            [("1".into(), "6".into(), 6), ("7".into(), "7".into(), 1)]
        );
        let reel = |r: &str| ReelId::parse(r).unwrap();
        assert_eq!(
            out[0].deltas,
            BTreeMap::from([(reel("b"), 1), (reel("c"), 2)])
        );
        assert_eq!(out[1].first_index, 6);
        assert_eq!(out[1].newest_ms, Some(7));
        // The same changes from a later point are cut the same way there.
        assert_eq!(chunks(&cs[6..], 2), out[1..]);
        assert!(chunks(&[], 5).is_empty());
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
        let out = chunks(&cs, 49);
        assert_eq!(cut(&out), [("1".into(), "1001".into(), 1001)]);
        assert_eq!(out[0].nonzero().count(), 1);
        // A like and an unlike of one reel free its place for the next.
        let cs: Vec<(usize, Change)> = [change(1, "a", 1), change(2, "a", -1), change(3, "b", 1)]
            .into_iter()
            .enumerate()
            .collect();
        let out = chunks(&cs, 1);
        assert_eq!(cut(&out), [("1".into(), "3".into(), 3)]);
        assert_eq!(out[0].nonzero().count(), 1);
    }
}
