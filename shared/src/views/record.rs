//! The views log's records: what the view function writes (one record per
//! accepted request), and Lambda's Kinesis event as the aggregator reads
//! it, in sequence order whatever order it was delivered in.

use crate::aggregate::records::SequenceNumber;
use crate::keys::ReelId;
use base64::Engine;
use serde::{Deserialize, Serialize};

/// The format version written in every record, and the newest this
/// version reads.
///
/// # The one rule every format keeps
///
/// Every record is a JSON object whose member `f` is its format's version,
/// a whole number, raised by any change a reader of the previous version
/// would misread or refuse. That is all a reader of any version can tell
/// of a record it was not written for, and it is enough to tell the two
/// kinds of record it cannot read apart ([`Decoded`]):
///
/// * a newer format (`f` above this): written by a view function deployed
///   before this aggregator (CloudFormation orders neither before the
///   other). Its views were acknowledged (`202`), and a reader that knows
///   the format is on its way: the batch is handed back from it, so the
///   checkpoint stays below it and Lambda delivers it again until that
///   reader comes (or, past the event source's retries, gives it up to
///   the OnFailure queue, whose repair, run by that reader, counts it).
/// * malformed (not JSON, no whole-number `f`, an `f` of 0 or of a version
///   this reader knows but whose fields it refuses): no version of the view
///   function wrote it so, so no reader will ever count it, and waiting for
///   one would stop the shard for good (Lambda would deliver the batch
///   until it gave it up, then the next, each as stuck). It is applied as
///   nothing, its checkpoint moves past it, and it is counted
///   (`ViewRecordsMalformed`) and logged (shard, sequence number) for an
///   operator to read.
pub const FORMAT: u32 = 1;

/// What a reader makes of a record's bytes (see [`FORMAT`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A record of this reader's format.
    Record(ViewRecord),
    /// A record of a format newer than this reader's (its version): to be
    /// read by a newer reader, never skipped.
    Newer(u64),
    /// Not a view record any version wrote: skipped, and counted.
    Malformed,
}

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

    /// Reads a record's bytes; `None` for anything this version does not
    /// read (never guessed at). [`ViewRecord::read`] says why.
    pub fn decode(bytes: &[u8]) -> Option<ViewRecord> {
        match Self::read(bytes) {
            Decoded::Record(r) => Some(r),
            Decoded::Newer(_) | Decoded::Malformed => None,
        }
    }

    /// Reads a record's bytes: a record, one of a newer format, or
    /// malformed (see [`FORMAT`]).
    pub fn read(bytes: &[u8]) -> Decoded {
        if let Some(r) = Self::read_current(bytes) {
            return Decoded::Record(r);
        }
        // The one member every format keeps, of a JSON object.
        let version = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(bytes)
            .ok()
            .and_then(|o| o.get("f").and_then(serde_json::Value::as_u64));
        match version {
            Some(f) if f > u64::from(FORMAT) => Decoded::Newer(f),
            _ => Decoded::Malformed,
        }
    }

    /// A record of this version's format, `None` for anything else.
    fn read_current(bytes: &[u8]) -> Option<ViewRecord> {
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
    /// What it says; `None` if its data is malformed (applied as nothing,
    /// see [`FORMAT`]: a record that can never be read must not stop its
    /// shard). A record of a newer format is never a `LogRecord`: it
    /// bounds its batch ([`Batch::newer`]).
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
    /// The lowest sequence number (as given) of a record in a format newer
    /// than this reader's ([`Decoded::Newer`]): the batch is applied below
    /// it and handed back from it, so its checkpoint never passes it.
    pub newer: Option<String>,
    /// Records of a newer format in the batch (each once).
    pub newer_format: usize,
}

impl Batch {
    /// Where Lambda is to deliver again from, whatever is applied below
    /// it: the first record of a newer format, else the first record
    /// without a readable sequence number. (Records delivered after an
    /// unreadable one are not read, so a newer one found was delivered
    /// before it, and lies before it in the shard when delivered in order.)
    pub fn handed_back_from(&self) -> Option<&str> {
        self.newer.as_deref().or(self.unreadable.as_deref())
    }
}

/// Records of a newer format among `records` (sequence number, as given),
/// lowest first, each once.
fn newer_bound(newer: &mut Vec<(SequenceNumber, String)>) -> (Option<SequenceNumber>, usize) {
    newer.sort_by(|a, b| a.0.cmp(&b.0));
    newer.dedup_by(|a, b| a.0 == b.0);
    (newer.first().map(|n| n.0.clone()), newer.len())
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
    let mut newer: Vec<(SequenceNumber, String)> = Vec::new();
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
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(r.kinesis.data.as_bytes())
            .map_or(Decoded::Malformed, |bytes| ViewRecord::read(&bytes));
        let body = match decoded {
            Decoded::Record(v) => Some(v),
            Decoded::Malformed => None,
            Decoded::Newer(_) => {
                newer.push((seq, r.kinesis.sequence_number.clone()));
                continue;
            }
        };
        readable.push(LogRecord {
            seq,
            arrival_ms: (r.kinesis.approximate_arrival_timestamp * 1000.0) as i64,
            body,
        });
    }
    if let Some(b) = &bound {
        readable.retain(|c: &LogRecord| c.seq < *b);
        newer.retain(|n| n.0 < *b);
    }
    let (first_newer, newer_format) = newer_bound(&mut newer);
    if let Some(n) = &first_newer {
        readable.retain(|c: &LogRecord| c.seq < *n);
        out.newer = newer.first().map(|n| n.1.clone());
    }
    out.newer_format = newer_format;
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
/// gives none such), and those from the first of a newer format on left
/// out too ([`Batch::newer`]).
pub fn batch_of(stream_arn: &str, shard_id: &str, reads: &[crate::store::LogRead]) -> Batch {
    let mut newer: Vec<(SequenceNumber, String)> = Vec::new();
    let mut records: Vec<LogRecord> = Vec::with_capacity(reads.len());
    for r in reads {
        let Some(seq) = SequenceNumber::parse_kinesis(&r.sequence) else {
            continue;
        };
        let body = match ViewRecord::read(&r.data) {
            Decoded::Record(v) => Some(v),
            Decoded::Malformed => None,
            Decoded::Newer(_) => {
                newer.push((seq, r.sequence.clone()));
                continue;
            }
        };
        records.push(LogRecord {
            seq,
            arrival_ms: r.arrival_ms,
            body,
        });
    }
    let (first_newer, newer_format) = newer_bound(&mut newer);
    if let Some(n) = &first_newer {
        records.retain(|c| c.seq < *n);
    }
    let (records, duplicates) = in_sequence(records);
    Batch {
        shard_id: shard_id.to_owned(),
        stream_arn: stream_arn.to_owned(),
        duplicates,
        records,
        out_of_order: false,
        unreadable: None,
        newer: newer.first().map(|n| n.1.clone()),
        newer_format,
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
    fn a_newer_format_is_told_from_a_malformed_record() {
        assert_eq!(ViewRecord::read(&rec(3).encode()), Decoded::Record(rec(3)));
        // Whatever else a newer format holds, its `f` says it is newer.
        for newer in [
            &br#"{"f":2,"id":"0000000000000001","views":[{"reel":"r1"}]}"#[..],
            br#"{"f":7}"#,
            br#"{"views":[], "f": 99999999999}"#,
        ] {
            assert!(
                matches!(ViewRecord::read(newer), Decoded::Newer(_)),
                "{}",
                String::from_utf8_lossy(newer)
            );
            assert_eq!(ViewRecord::decode(newer), None);
        }
        let mut bad = serde_json::from_slice::<serde_json::Value>(&rec(1).encode()).unwrap();
        bad["views"] = serde_json::json!([["bad#id", 1]]);
        for malformed in [
            &b"not json"[..],
            b"",
            b"{}",
            b"[2]",
            br#"{"f":0}"#,
            br#"{"f":-3}"#,
            br#"{"f":"2"}"#,
            br#"{"f":2.5}"#,
            // This version's format with a field it refuses.
            bad.to_string().as_bytes(),
        ] {
            assert_eq!(
                ViewRecord::read(malformed),
                Decoded::Malformed,
                "{}",
                String::from_utf8_lossy(malformed)
            );
        }
    }

    #[test]
    fn a_record_of_a_newer_format_bounds_what_is_applied() {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut e = event(&["5", "9", "7", "3", "12"]);
        e.records[1].kinesis.data = b64(br#"{"f":2}"#);
        e.records[2].kinesis.data = b64(br#"{"f":3}"#);
        e.records[3].kinesis.data = b64(b"garbage");
        let b = ordered(&e).unwrap();
        let seqs: Vec<&str> = b.records.iter().map(|r| r.seq.as_reported()).collect();
        // 3 (malformed, applied as nothing) and 5 lie below 7, the first of
        // a newer format; 9 and 12 lie above it.
        assert_eq!(seqs, ["3", "5"]);
        assert_eq!(b.records[0].body, None);
        assert_eq!((b.newer.as_deref(), b.newer_format), (Some("7"), 2));
        assert_eq!(b.handed_back_from(), Some("7"));
        // Read back from the log alike.
        let reads: Vec<crate::store::LogRead> = [
            ("5", &rec(1).encode()[..]),
            ("7", br#"{"f":2}"#),
            ("8", &rec(2).encode()[..]),
        ]
        .iter()
        .map(|(s, d)| crate::store::LogRead {
            sequence: (*s).into(),
            arrival_ms: 1,
            data: d.to_vec(),
        })
        .collect();
        let b = batch_of("arn", "shard", &reads);
        assert_eq!(b.records.len(), 1);
        assert_eq!((b.newer.as_deref(), b.newer_format), (Some("7"), 1));
        let plain = ordered(&event(&["1", "2"])).unwrap();
        assert_eq!((plain.newer, plain.newer_format), (None, 0));
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
