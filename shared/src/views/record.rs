//! The views log's records: what the view function writes (one record per
//! accepted request), and Lambda's Kinesis event as the aggregator reads
//! it, in sequence order whatever order it was delivered in.

use crate::aggregate::records::SequenceNumber;
use crate::keys::ReelId;
use base64::Engine;
use serde::{Deserialize, Serialize};

/// The format version written in every record; a reader refuses others.
const FORMAT: u32 = 1;

/// One accepted `POST /views` request, as the log carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewRecord {
    /// The event id: the same for every copy of one request in the log (a
    /// producer's retry, a client's retry of the same entries with its
    /// `Idempotency-Key`), so
    /// the aggregator counts it once (see [`super::aggregate`]).
    pub id: u64,
    /// The viewer (JWT `sub`; locally `x-user-id`).
    pub viewer: String,
    /// When the view function accepted it (Unix ms): the day it counts in.
    pub at_ms: i64,
    /// Views per reel, each reel once.
    pub views: Vec<(ReelId, u32)>,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    f: u32,
    id: String,
    viewer: String,
    at: i64,
    views: Vec<(String, u32)>,
}

impl ViewRecord {
    /// The record's bytes (JSON, the id as 16 hex digits).
    pub fn encode(&self) -> Vec<u8> {
        let wire = Wire {
            f: FORMAT,
            id: format!("{:016x}", self.id),
            viewer: self.viewer.clone(),
            at: self.at_ms,
            views: self
                .views
                .iter()
                .map(|(r, n)| (r.as_str().to_owned(), *n))
                .collect(),
        };
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    /// Reads a record's bytes; `None` for anything this version did not
    /// write (counted as malformed, never guessed at).
    pub fn decode(bytes: &[u8]) -> Option<ViewRecord> {
        let wire: Wire = serde_json::from_slice(bytes).ok()?;
        if wire.f != FORMAT || wire.id.len() != 16 {
            return None;
        }
        let id = u64::from_str_radix(&wire.id, 16).ok()?;
        let views = wire
            .views
            .into_iter()
            .map(|(r, n)| Some((ReelId::parse(&r).ok()?, n)))
            .collect::<Option<Vec<_>>>()?;
        Some(ViewRecord {
            id,
            viewer: wire.viewer,
            at_ms: wire.at,
            views,
        })
    }
}

/// Lambda's Kinesis event, the fields the aggregator reads.
#[derive(Debug, Deserialize)]
pub struct KinesisEvent {
    /// One shard's records: in order the first time, in any order when
    /// delivered again.
    #[serde(rename = "Records", default)]
    pub records: Vec<KinesisEventRecord>,
}

/// One record of a [`KinesisEvent`].
#[derive(Debug, Deserialize)]
pub struct KinesisEventRecord {
    /// `shardId-…:<sequence number>`: names the record's shard.
    #[serde(rename = "eventID", default)]
    pub event_id: String,
    /// The stream's ARN.
    #[serde(rename = "eventSourceARN", default)]
    pub event_source_arn: String,
    /// The record itself.
    pub kinesis: KinesisData,
}

/// The Kinesis part of a [`KinesisEventRecord`].
#[derive(Debug, Deserialize)]
pub struct KinesisData {
    /// Its sequence number (decimal digits).
    #[serde(rename = "sequenceNumber")]
    pub sequence_number: String,
    /// Its data, base64.
    #[serde(default)]
    pub data: String,
    /// When Kinesis accepted it (Unix seconds, fractional).
    #[serde(rename = "approximateArrivalTimestamp", default)]
    pub approximate_arrival_timestamp: f64,
}

/// One record of the log, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// Its place in its shard.
    pub seq: SequenceNumber,
    /// When Kinesis accepted it (Unix ms).
    pub arrival_ms: i64,
    /// What it says; `None` if its data is not a record this version
    /// reads (applied as nothing: a record that can never be read must not
    /// stop its shard).
    pub body: Option<ViewRecord>,
}

/// A batch as the aggregator applies it (see [`ordered`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The shard the records are from.
    pub shard_id: String,
    /// The stream's ARN.
    pub stream_arn: String,
    /// The records, sequence numbers strictly ascending.
    pub records: Vec<LogRecord>,
    /// Delivered in another order than their sequence numbers', or one
    /// twice: a redelivery.
    pub out_of_order: bool,
    /// Copies of a record left out.
    pub duplicates: usize,
    /// The first record without a readable sequence number, as given: the
    /// batch is applied below it and handed back from it.
    pub unreadable: Option<String>,
}

/// The event's records in sequence order, each once; `Err` if they are not
/// all of one shard of one stream (no event source sends that).
pub fn ordered(event: &KinesisEvent) -> Result<Batch, String> {
    let mut out = Batch::default();
    let Some(first) = event.records.first() else {
        return Ok(out);
    };
    out.shard_id = shard_of(&first.event_id)
        .ok_or("a record's eventID names no shard")?
        .to_owned();
    out.stream_arn = first.event_source_arn.clone();
    let mut previous: Option<SequenceNumber> = None;
    let mut bound: Option<SequenceNumber> = None;
    let mut readable = Vec::with_capacity(event.records.len());
    for r in &event.records {
        if shard_of(&r.event_id) != Some(out.shard_id.as_str())
            || r.event_source_arn != out.stream_arn
        {
            return Err("records of more than one shard in one event".into());
        }
        let Some(seq) = SequenceNumber::parse_kinesis(&r.kinesis.sequence_number) else {
            if out.unreadable.is_none() {
                out.unreadable = Some(r.kinesis.sequence_number.clone());
            }
            continue;
        };
        if previous.as_ref().is_some_and(|p| *p >= seq) {
            out.out_of_order = true;
        }
        previous = Some(seq.clone());
        if out.unreadable.is_some() {
            // Handed back with the unreadable one: what is applied now stays
            // below it, or the checkpoint would pass a record sent again.
            bound = Some(bound.map_or(seq.clone(), |b| b.min(seq.clone())));
            continue;
        }
        let body = base64::engine::general_purpose::STANDARD
            .decode(r.kinesis.data.as_bytes())
            .ok()
            .and_then(|bytes| ViewRecord::decode(&bytes));
        readable.push(LogRecord {
            seq,
            arrival_ms: (r.kinesis.approximate_arrival_timestamp * 1000.0) as i64,
            body,
        });
    }
    if let Some(b) = &bound {
        readable.retain(|c: &LogRecord| c.seq < *b);
    }
    (out.records, out.duplicates) = in_sequence(readable);
    Ok(out)
}

/// `records` in sequence order, each once; and how many copies were left
/// out.
fn in_sequence(mut records: Vec<LogRecord>) -> (Vec<LogRecord>, usize) {
    records.sort_by(|a, b| a.seq.cmp(&b.seq));
    let before = records.len();
    records.dedup_by(|later, first| later.seq == first.seq);
    let duplicates = before - records.len();
    (records, duplicates)
}

/// Records read back from shard `shard_id` of `stream_arn`
/// ([`crate::store::LogStore::read_range`]) as a batch: in sequence order,
/// each once, those without a readable sequence number left out (the log
/// gives none such).
pub fn batch_of(stream_arn: &str, shard_id: &str, reads: &[crate::store::LogRead]) -> Batch {
    let records: Vec<LogRecord> = reads
        .iter()
        .filter_map(|r| {
            Some(LogRecord {
                seq: SequenceNumber::parse_kinesis(&r.sequence)?,
                arrival_ms: r.arrival_ms,
                body: ViewRecord::decode(&r.data),
            })
        })
        .collect();
    let (records, duplicates) = in_sequence(records);
    Batch {
        shard_id: shard_id.to_owned(),
        stream_arn: stream_arn.to_owned(),
        duplicates,
        records,
        out_of_order: false,
        unreadable: None,
    }
}

/// The shard id in a Kinesis record's `eventID` (`<shard id>:<sequence>`).
fn shard_of(event_id: &str) -> Option<&str> {
    event_id
        .split_once(':')
        .map(|(s, _)| s)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64) -> ViewRecord {
        ViewRecord {
            id,
            viewer: "u1".into(),
            at_ms: 1_700_000_000_000,
            views: vec![(ReelId::parse("r1").unwrap(), 3)],
        }
    }

    fn event(seqs: &[&str]) -> KinesisEvent {
        let data = base64::engine::general_purpose::STANDARD.encode(rec(7).encode());
        serde_json::from_value(serde_json::json!({
            "Records": seqs.iter().map(|s| serde_json::json!({
                "eventID": format!("shardId-000000000001:{s}"),
                "eventSourceARN": "arn:aws:kinesis:us-east-1:1:stream/v",
                "kinesis": {"sequenceNumber": s, "data": data, "approximateArrivalTimestamp": 1700000000.25}
            })).collect::<Vec<_>>()
        }))
        .unwrap()
    }

    #[test]
    fn records_round_trip_and_foreign_data_is_refused() {
        let r = rec(u64::MAX);
        assert_eq!(ViewRecord::decode(&r.encode()), Some(r));
        assert_eq!(ViewRecord::decode(b"{}"), None);
        assert_eq!(ViewRecord::decode(b"not json"), None);
        let mut bad = serde_json::from_slice::<serde_json::Value>(&rec(1).encode()).unwrap();
        bad["views"] = serde_json::json!([["bad#id", 1]]);
        assert_eq!(ViewRecord::decode(bad.to_string().as_bytes()), None);
    }

    #[test]
    fn a_redelivered_batch_is_applied_in_sequence_order_each_record_once() {
        let b = ordered(&event(&["30", "9", "20", "30", "100"])).unwrap();
        let seqs: Vec<&str> = b.records.iter().map(|r| r.seq.as_reported()).collect();
        assert_eq!(seqs, ["9", "20", "30", "100"]);
        assert!(b.out_of_order);
        assert_eq!(b.duplicates, 1);
        assert_eq!(b.shard_id, "shardId-000000000001");
        assert_eq!(b.records[0].arrival_ms, 1_700_000_000_250);
        assert_eq!(b.records[0].body, Some(rec(7)));
        let first = ordered(&event(&["1", "2"])).unwrap();
        assert!(!first.out_of_order);
    }

    #[test]
    fn an_unreadable_sequence_number_bounds_what_is_applied() {
        let b = ordered(&event(&["5", "x", "7", "3"])).unwrap();
        let seqs: Vec<&str> = b.records.iter().map(|r| r.seq.as_reported()).collect();
        // 7 and 3 come after the unreadable record: only what lies below
        // the lowest of them is applied now.
        assert_eq!(seqs, Vec::<&str>::new());
        assert_eq!(b.unreadable.as_deref(), Some("x"));
    }
}
