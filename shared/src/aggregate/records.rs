//! The Likes table's stream records as the aggregator sees them: Lambda's
//! DynamoDB event (with the tumbling-window fields that name the stream
//! shard), parsed into ordered changes of one reel's count each.

use crate::keys::{self, ReelId};
use serde::Deserialize;
use std::cmp::Ordering;
use std::fmt;

/// Digits a stream sequence number may have. DynamoDB documents 21 to 40;
/// anything from 1 digit is accepted (emulators number from small values),
/// nothing longer, nothing but ASCII digits.
pub const MAX_SEQUENCE_DIGITS: usize = 40;

/// A stream record's sequence number: a decimal string, ordered as the
/// number it is (never as raw text: "9" < "10"). Stored zero-padded to
/// [`MAX_SEQUENCE_DIGITS`], so stored values compare as strings too.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SequenceNumber(String);

impl SequenceNumber {
    /// Parses a sequence number; `None` if it is not 1–40 ASCII digits.
    pub fn parse(s: &str) -> Option<Self> {
        if s.is_empty() || s.len() > MAX_SEQUENCE_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(SequenceNumber(format!("{s:0>40}")))
    }

    /// The zero-padded form (40 digits): what checkpoints store.
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
    /// to stream mode: see [`changes`]).
    pub delta: i64,
    /// When DynamoDB wrote it (`ApproximateCreationDateTime`, Unix ms).
    pub at_ms: Option<i64>,
}

/// Lambda's DynamoDB stream event, the fields the aggregator reads. With a
/// tumbling window on the event source mapping the event also names its
/// stream shard (`shardId`), which a plain event does not.
#[derive(Debug, Deserialize)]
pub struct StreamEvent {
    /// The records of one stream shard, in stream order.
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
/// applied past it: the aggregator reports it as the batch's failure.
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
        Some(Change {
            seq,
            reel,
            delta,
            at_ms,
        })
    }
}

/// The batch's changes in stream order, or the first record that has no
/// readable sequence number.
///
/// A new row counts only if stream mode wrote it ([`keys::COUNTED_BY_STREAM`]):
/// a row written by transactional mode was counted by its own transaction,
/// which is what makes inserts exact across a switch of modes. A removal
/// carries no such mark (a deleted item has no new image), so removals are
/// told apart by time: those before `since_ms` (`STREAM_SINCE_MS`, when the
/// deployment switched to stream mode) were counted by their transactions.
pub fn changes(records: &[StreamRecord], since_ms: i64) -> Result<Vec<Change>, Unordered> {
    records
        .iter()
        .enumerate()
        .map(|(index, r)| {
            r.change(since_ms).ok_or_else(|| Unordered {
                index,
                raw: r.dynamodb.sequence_number.clone(),
            })
        })
        .collect()
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
                 "SequenceNumber": "100000000000000000001", "ApproximateCreationDateTime": 1700000000.5}},
                {"eventName": "REMOVE", "dynamodb": {"Keys": {"user_id": {"S": "u"}, "reel_id": {"S": "r1"}},
                 "SequenceNumber": "100000000000000000002"}},
                {"eventName": "MODIFY", "dynamodb": {"Keys": {"user_id": {"S": "u"}, "reel_id": {"S": "bad#id"}},
                 "SequenceNumber": "100000000000000000003"}},
            ]
        }))
        .unwrap();
        assert_eq!(event.shard_id.as_deref(), Some("shard-1"));
        let c = changes(&event.records, 0).unwrap();
        // The second row was written (and counted) by a transaction.
        assert_eq!(c.iter().map(|c| c.delta).collect::<Vec<_>>(), [1, 0, -1, 0]);
        assert_eq!(c[0].reel, Some(ReelId::parse("r1").unwrap()));
        assert_eq!(c[0].at_ms, Some(1_700_000_000_500));
        assert_eq!(c[3].reel, None, "an invalid reel id is never counted");
        // A removal before the switch to stream mode was counted by its
        // transaction; one with no time is taken as after it.
        let before = changes(&event.records, 1_800_000_000_000).unwrap();
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
        assert_eq!(
            changes(&bad.records, 0),
            Err(Unordered {
                index: 1,
                raw: "x".into()
            })
        );
    }
}
