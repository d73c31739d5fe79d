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
    /// yet) give this stream shard; `now` is the aggregator's clock.
    pub fn write(
        &self,
        key: &str,
        shard_id: &str,
        checkpoint: Option<&SequenceNumber>,
        settings: &HashMap<ReelId, Settings>,
        now: Duration,
    ) -> ChunkWrite {
        let mut adds = Vec::with_capacity(self.deltas.len());
        for (reel, delta) in self.nonzero() {
            let s = settings.get(reel).copied().unwrap_or_default();
            adds.push(ChunkAdd {
                reel: reel.clone(),
                shard: counter_shard(key, s.write_shards),
                delta,
            });
        }
        let mut write = ChunkWrite {
            checkpoint_key: key.to_owned(),
            shard_id: shard_id.to_owned(),
            expected: checkpoint.map(|c| c.padded().to_owned()),
            next: self.last.padded().to_owned(),
            adds,
            records: self.records as u64,
            // Derived from the rest, once it is all there (below).
            token: RequestToken::for_fields("aggregate", &[]),
            now_ms: now.as_millis() as i64,
            expires_at: (now + CHECKPOINT_TTL).as_secs() as i64,
        };
        write.token = token(&write);
        write
    }
}

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
    for ChunkAdd { reel, shard, delta } in adds {
        fields.extend([
            reel.as_str().to_owned(),
            shard.to_string(),
            delta.to_string(),
        ]);
    }
    let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
    // v3: the body lost the settings checks (a v2 token names another body).
    RequestToken::for_fields("aggregate/v3", &fields)
}

/// Cuts `changes` (in sequence order, none at or below the checkpoint) into
/// consecutive chunks whose net changes touch at most `max_reels` reels
/// each. The cut depends only on the changes, so a batch delivered again
/// after a failure is cut the same way from the checkpoint on (a smaller or
/// larger batch may end its last chunk elsewhere: the checkpoint, not the
/// cut, is what makes a record count once).
///
/// A reel's place bounds the transaction's items (a shard update each),
/// so only a net change needs one: a record that
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

    #[test]
    fn a_token_names_one_transaction_body() {
        let cs: Vec<(usize, Change)> = [change(10, "a", 1), change(11, "b", -1)]
            .into_iter()
            .enumerate()
            .collect();
        let chunk = &chunks(&cs, 5)[0];
        let key = "agg#k";
        let read = SequenceNumber::parse("9");
        let reel = |r: &str| ReelId::parse(r).unwrap();
        let mut settings = HashMap::from([(reel("a"), Settings::default())]);
        let now = Duration::from_millis(1_800_000_000_000);
        let write = |chunk: &Chunk, read: Option<&SequenceNumber>, s: &HashMap<_, _>, now| {
            chunk.write(key, "shard-1", read, s, now)
        };
        let base = write(chunk, read.as_ref(), &settings, now);
        // Planned again from the same state, the same transaction: an
        // SDK or aggregator retry is a replay.
        assert_eq!(write(chunk, read.as_ref(), &settings, now), base);
        // Any other body, another token: DynamoDB answers a token used
        // again with another body with IdempotentParameterMismatch.
        let mut others = vec![
            // Planned later (a retried batch): another clock, stamped on
            // the shards and the checkpoint's expiry.
            write(
                chunk,
                read.as_ref(),
                &settings,
                now + Duration::from_secs(5),
            ),
            write(chunk, None, &settings, now),
        ];
        settings.get_mut(&reel("a")).unwrap().write_shards = 7;
        others.push(write(chunk, read.as_ref(), &settings, now));
        // The same range with other deltas (another STREAM_SINCE_MS).
        let mut changed = chunk.clone();
        changed.deltas.insert(reel("a"), 2);
        others.push(write(&changed, read.as_ref(), &HashMap::new(), now));
        for (i, other) in others.iter().enumerate() {
            assert_ne!(*other, base, "variant {i}");
            assert_ne!(
                other.token, base.token,
                "variant {i}: one token, two bodies"
            );
        }
    }
}
