//! The Likes table's stream records as the aggregator sees them: Lambda's
//! DynamoDB event (with the tumbling-window fields that name the stream
//! shard), parsed into changes of one reel's count each, in sequence order
//! whatever order they were delivered in.

use crate::keys::{self, ReelId};
use serde::Deserialize;
use std::cmp::Ordering;
use std::fmt;

/// Digits a stream sequence number may have. DynamoDB documents 21 to 40;
/// anything from 1 digit is accepted (emulators number from small values),
/// nothing longer, nothing but ASCII digits.
pub const MAX_SEQUENCE_DIGITS: usize = 40;

/// Digits a Kinesis sequence number may have (the API reference's pattern
/// allows up to 129; 56 are typical).
pub const MAX_KINESIS_SEQUENCE_DIGITS: usize = 129;

/// A stream record's sequence number: a decimal string, ordered as the
/// number it is (never as raw text: "9" < "10"). Stored zero-padded to
/// [`MAX_SEQUENCE_DIGITS`], so stored values compare as strings too.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SequenceNumber(String);

impl SequenceNumber {
    /// Parses a sequence number; `None` if it is not 1–40 ASCII digits.
    pub fn parse(s: &str) -> Option<Self> {
        Self::parse_width(s, MAX_SEQUENCE_DIGITS)
    }

    /// Parses a Kinesis sequence number (1–129 digits), padded to
    /// [`MAX_KINESIS_SEQUENCE_DIGITS`]. One source's numbers all have one
    /// width, so they compare as strings as they do as numbers.
    pub fn parse_kinesis(s: &str) -> Option<Self> {
        Self::parse_width(s, MAX_KINESIS_SEQUENCE_DIGITS)
    }

    fn parse_width(s: &str, width: usize) -> Option<Self> {
        if s.is_empty() || s.len() > width || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(SequenceNumber(format!("{s:0>width$}")))
    }

    /// The zero-padded form (40 digits; Kinesis's 129): what checkpoints
    /// store.
    pub fn padded(&self) -> &str {
        &self.0
    }

    /// The number as DynamoDB wrote it (leading zeros removed), which is
    /// what Lambda expects back in `batchItemFailures`.
    pub fn as_reported(&self) -> &str {
        let trimmed = self.0.trim_start_matches('0');
        if trimmed.is_empty() { "0" } else { trimmed }
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        // Equal widths: text order is numeric order.
        self.0.cmp(&other.0)
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_reported())
    }
}

/// One stream record, reduced to what it does to a count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Its place in the stream shard.
    pub seq: SequenceNumber,
    /// The reel whose count it changes; `None` for a row without a valid
    /// reel id (never counted, as reconciliation never counts it).
    pub reel: Option<ReelId>,
    /// What it adds to the count: +1 for a like row written in stream mode,
    /// −1 for a removed row, 0 for anything else (a row whose own
    /// transaction counted it, a modified row, a removal before the switch
    /// to stream mode: see [`ordered`]).
    pub delta: i64,
    /// When DynamoDB wrote it (`ApproximateCreationDateTime`, Unix ms).
    pub at_ms: Option<i64>,
    /// The time reconciliation sorts it by (Unix ms): a new row's own
    /// `liked_at`, the clock its rows are counted by; a removal's `at_ms`
    /// (a removed row has no image). See [`crate::reconcile`].
    pub key_ms: Option<i64>,
}

/// Lambda's DynamoDB stream event, the fields the aggregator reads. With a
/// tumbling window on the event source mapping the event also names its
/// stream shard (`shardId`), which a plain event does not.
#[derive(Debug, Deserialize)]
pub struct StreamEvent {
    /// The records of one stream shard: in stream order when first
    /// delivered, in any order when delivered again.
    #[serde(rename = "Records", default)]
    pub records: Vec<StreamRecord>,
    /// The stream shard (tumbling-window events only).
    #[serde(rename = "shardId")]
    pub shard_id: Option<String>,
    /// The stream's ARN (tumbling-window events only; also on each record).
    #[serde(rename = "eventSourceARN")]
    pub event_source_arn: Option<String>,
}

/// One record of a [`StreamEvent`].
#[derive(Debug, Deserialize)]
pub struct StreamRecord {
    /// `INSERT`, `MODIFY` or `REMOVE`.
    #[serde(rename = "eventName", default)]
    pub event_name: String,
    /// The stream's ARN.
    #[serde(rename = "eventSourceARN")]
    pub event_source_arn: Option<String>,
    /// The change itself.
    pub dynamodb: StreamChange,
}

/// The DynamoDB part of a [`StreamRecord`].
#[derive(Debug, Deserialize)]
pub struct StreamChange {
    /// The item's key, as DynamoDB JSON (`{"reel_id": {"S": "..."}}`).
    #[serde(rename = "Keys", default)]
    pub keys: Option<serde_json::Map<String, serde_json::Value>>,
    /// The item as written (`NEW_IMAGE` streams; absent for a removal).
    #[serde(rename = "NewImage", default)]
    pub new_image: Option<serde_json::Map<String, serde_json::Value>>,
    /// The record's sequence number in its shard.
    #[serde(rename = "SequenceNumber", default)]
    pub sequence_number: String,
    /// Seconds since the epoch (fractional), when the change was made.
    #[serde(rename = "ApproximateCreationDateTime")]
    pub approximate_creation_date_time: Option<f64>,
}

/// Why a record cannot be placed in its shard's order. The batch cannot be
/// applied past it: only what lies below every record delivered after it
/// is applied, and the aggregator reports it as the batch's failure.
#[derive(Debug, PartialEq, Eq)]
pub struct Unordered {
    /// Where it is in the batch.
    pub index: usize,
    /// The sequence number it carried.
    pub raw: String,
}

impl StreamRecord {
    /// What the record does to a count; removals stamped before `since_ms`
    /// (the switch to stream mode) count 0, their transactions counted them.
    pub fn change(&self, since_ms: i64) -> Option<Change> {
        let seq = SequenceNumber::parse(&self.dynamodb.sequence_number)?;
        let reel = self
            .dynamodb
            .keys
            .as_ref()
            .and_then(|k| k.get("reel_id"))
            .and_then(|v| v.get("S"))
            .and_then(serde_json::Value::as_str)
            .and_then(|r| ReelId::parse(r).ok());
        let at_ms = self
            .dynamodb
            .approximate_creation_date_time
            .filter(|t| t.is_finite() && *t > 0.0)
            .map(|t| (t * 1000.0) as i64);
        let (attr, value) = keys::COUNTED_BY_STREAM;
        let by_stream = self
            .dynamodb
            .new_image
            .as_ref()
            .and_then(|m| m.get(attr))
            .and_then(|v| v.get("S"))
            .and_then(serde_json::Value::as_str)
            == Some(value);
        let delta = match self.event_name.as_str() {
            "INSERT" if by_stream => 1,
            "REMOVE" if at_ms.is_none_or(|at| at >= since_ms) => -1,
            _ => 0,
        };
        let liked_at = self
            .dynamodb
            .new_image
            .as_ref()
            .and_then(|m| m.get("liked_at"))
            .and_then(|v| v.get("N"))
            .and_then(serde_json::Value::as_str)
            .and_then(|n| n.parse::<i64>().ok());
        let key_ms = match self.event_name.as_str() {
            "INSERT" => liked_at.or(at_ms),
            _ => at_ms,
        };
        Some(Change {
            seq,
            reel,
            delta,
            at_ms,
            key_ms,
        })
    }
}

/// A batch's changes as the aggregator applies them: in sequence order,
/// each record once, whatever order Lambda delivered them in.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The changes, their sequence numbers strictly ascending.
    pub changes: Vec<Change>,
    /// The records came in another order than their sequence numbers', or
    /// one of them more than once: a redelivery (AWS: "If records are
    /// processed more than once, they might be processed out of order").
    pub out_of_order: bool,
    /// Records left out as copies of one already in the batch.
    pub duplicates: usize,
    /// The first record without a readable sequence number: the batch is
    /// applied below it and handed back from it.
    pub unreadable: Option<Unordered>,
}

/// The batch's changes in sequence order (see [`Batch`]).
///
/// A stream shard's records are totally ordered by sequence number, and
/// Lambda hands each the first time in that order; a redelivery may not.
/// Sorted, a batch is applied as it was first delivered, so the checkpoint
/// (the last record applied) covers exactly the records applied. Two
/// records with one sequence number are one record delivered twice: the
/// first is kept.
///
/// A new row counts only if stream mode wrote it ([`keys::COUNTED_BY_STREAM`]):
/// a row written by transactional mode was counted by its own transaction,
/// which is what makes inserts exact across a switch of modes. A removal
/// carries no such mark (a deleted item has no new image), so removals are
/// told apart by time: those before `since_ms` (`STREAM_SINCE_MS`, when the
/// deployment switched to stream mode) were counted by their transactions.
pub fn ordered(records: &[StreamRecord], since_ms: i64) -> Batch {
    let mut out = Batch::default();
    let mut readable: Vec<Change> = Vec::with_capacity(records.len());
    let mut previous: Option<SequenceNumber> = None;
    let mut bound: Option<SequenceNumber> = None;
    for (index, r) in records.iter().enumerate() {
        match r.change(since_ms) {
            Some(c) => {
                if previous.as_ref().is_some_and(|p| *p >= c.seq) {
                    out.out_of_order = true;
                }
                previous = Some(c.seq.clone());
                if out.unreadable.is_some() {
                    // Handed back with the unreadable record: what is
                    // applied now must stay below it, or the checkpoint
                    // would pass a record Lambda delivers again.
                    bound = Some(bound.map_or(c.seq.clone(), |b| b.min(c.seq.clone())));
                } else {
                    readable.push(c);
                }
            }
            None if out.unreadable.is_none() => {
                out.unreadable = Some(Unordered {
                    index,
                    raw: r.dynamodb.sequence_number.clone(),
                });
            }
            None => {}
        }
    }
    if let Some(b) = &bound {
        readable.retain(|c| c.seq < *b);
    }
    // Stable: of two copies of a record, the one delivered first stays.
    readable.sort_by(|a, b| a.seq.cmp(&b.seq));
    let before = readable.len();
    readable.dedup_by(|later, first| later.seq == first.seq);
    out.duplicates = before - readable.len();
    out.changes = readable;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_order_as_numbers_not_as_text() {
        let n = |s: &str| SequenceNumber::parse(s).unwrap();
        assert!(n("9") < n("10"));
        assert!(n("000000000000000000009") < n("100000000000000000000"));
        assert!(n("99999999999999999999") < n("100000000000000000000"));
        let forty = "9".repeat(40);
        assert!(n("100000000000000000000") < n(&forty));
        assert_eq!(n("007"), n("7"));
        assert_eq!(n("007").as_reported(), "7");
        assert_eq!(n("0").as_reported(), "0");
        assert_eq!(n("123").padded().len(), 40);
        for bad in ["", "12a", "-1", "1.5", " 1", &"1".repeat(41)] {
            assert_eq!(SequenceNumber::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn inserts_add_removes_subtract_and_unreadable_records_stop_the_batch() {
        let event: StreamEvent = serde_json::from_value(serde_json::json!({
            "shardId": "shard-1",
            "eventSourceARN": "arn:stream",
            "Records": [
                {"eventName": "INSERT", "dynamodb": {"Keys": {"user_id": {"S": "u"}, "reel_id": {"S": "r1"}},
                 "NewImage": {"user_id": {"S": "u"}, "reel_id": {"S": "r1"}, "cm": {"S": "s"}},
                 "SequenceNumber": "100000000000000000001", "ApproximateCreationDateTime": 1700000000.5}},
                {"eventName": "INSERT", "dynamodb": {"Keys": {"user_id": {"S": "v"}, "reel_id": {"S": "r1"}},
                 "NewImage": {"user_id": {"S": "v"}, "reel_id": {"S": "r1"}},
                 "SequenceNumber": "100000000000000000002", "ApproximateCreationDateTime": 1700000000.5}},
                {"eventName": "REMOVE", "dynamodb": {"Keys": {"user_id": {"S": "u"}, "reel_id": {"S": "r1"}},
                 "SequenceNumber": "100000000000000000003"}},
                {"eventName": "MODIFY", "dynamodb": {"Keys": {"user_id": {"S": "u"}, "reel_id": {"S": "bad#id"}},
                 "SequenceNumber": "100000000000000000004"}},
            ]
        }))
        .unwrap();
        assert_eq!(event.shard_id.as_deref(), Some("shard-1"));
        let batch = ordered(&event.records, 0);
        assert!(!batch.out_of_order && batch.unreadable.is_none());
        let c = batch.changes;
        // The second row was written (and counted) by a transaction.
        assert_eq!(c.iter().map(|c| c.delta).collect::<Vec<_>>(), [1, 0, -1, 0]);
        assert_eq!(c[0].reel, Some(ReelId::parse("r1").unwrap()));
        assert_eq!(c[0].at_ms, Some(1_700_000_000_500));
        assert_eq!(c[3].reel, None, "an invalid reel id is never counted");
        // A removal before the switch to stream mode was counted by its
        // transaction; one with no time is taken as after it.
        let before = ordered(&event.records, 1_800_000_000_000).changes;
        assert_eq!(before[2].delta, -1, "no creation time: after the switch");
        let mut timed = serde_json::to_value(serde_json::json!({
            "eventName": "REMOVE", "dynamodb": {"SequenceNumber": "9", "ApproximateCreationDateTime": 1700000000.0,
            "Keys": {"reel_id": {"S": "r1"}}}
        })).unwrap();
        let r: StreamRecord = serde_json::from_value(timed.take()).unwrap();
        assert_eq!(r.change(1_800_000_000_000).unwrap().delta, 0);
        assert_eq!(r.change(1_600_000_000_000).unwrap().delta, -1);
        let bad: StreamEvent = serde_json::from_value(serde_json::json!({
            "Records": [
                {"eventName": "INSERT", "dynamodb": {"SequenceNumber": "5"}},
                {"eventName": "INSERT", "dynamodb": {"SequenceNumber": "x"}},
            ]
        }))
        .unwrap();
        let bad = ordered(&bad.records, 0);
        assert_eq!(
            bad.unreadable,
            Some(Unordered {
                index: 1,
                raw: "x".into()
            })
        );
        assert_eq!(bad.changes.len(), 1);
    }

    /// A batch of `(sequence number, reel)` likes, in the order given.
    fn batch_of(records: &[(&str, &str)]) -> Vec<StreamRecord> {
        records
            .iter()
            .map(|(seq, reel)| {
                serde_json::from_value(serde_json::json!({
                    "eventName": "INSERT",
                    "dynamodb": {"Keys": {"user_id": {"S": "u"}, "reel_id": {"S": reel}},
                        "NewImage": {"cm": {"S": "s"}}, "SequenceNumber": seq}
                }))
                .unwrap()
            })
            .collect()
    }

    fn order(b: &Batch) -> Vec<(String, String)> {
        b.changes
            .iter()
            .map(|c| {
                (
                    c.seq.to_string(),
                    c.reel.as_ref().unwrap().as_str().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_batch_is_applied_in_sequence_order_each_record_once() {
        let pair = |s: &str, r: &str| (s.to_owned(), r.to_owned());
        // In order: as delivered.
        let b = ordered(&batch_of(&[("9", "a"), ("10", "b")]), 0);
        assert_eq!(order(&b), [pair("9", "a"), pair("10", "b")]);
        assert!(!b.out_of_order);
        // Reversed (and "10" < "9" as text): by number.
        let b = ordered(&batch_of(&[("30", "a"), ("10", "b"), ("9", "c")]), 0);
        assert_eq!(
            order(&b),
            [pair("9", "c"), pair("10", "b"), pair("30", "a")]
        );
        assert!(b.out_of_order);
        // Repeated: once, the copy delivered first kept.
        let b = ordered(&batch_of(&[("1", "a"), ("2", "b"), ("1", "x")]), 0);
        assert_eq!(order(&b), [pair("1", "a"), pair("2", "b")]);
        assert_eq!((b.out_of_order, b.duplicates), (true, 1));
        let b = ordered(&batch_of(&[("1", "a"), ("1", "a")]), 0);
        assert_eq!(
            (b.changes.len(), b.out_of_order, b.duplicates),
            (1, true, 1)
        );
        // Behind an unreadable record: only what lies below every record
        // handed back with it.
        let b = ordered(
            &batch_of(&[("5", "a"), ("9", "b"), ("x", "c"), ("7", "d"), ("8", "e")]),
            0,
        );
        assert_eq!(order(&b), [pair("5", "a")]);
        assert_eq!(b.unreadable.map(|u| u.index), Some(2));
        assert!(b.out_of_order, "9 before 7");
    }
}
