//! Kinesis records as Lambda hands them to the function: the event JSON of
//! a batch, and sequence numbers compared as the numbers they are. Apart
//! from the mapping because it is a format, not a behaviour: what the
//! views function parses, pinned in one place.

use base64::Engine;
use serde_json::{Value, json};
use std::cmp::Ordering;

/// The account and region of the ARNs the local event source writes (the
/// emulator's defaults).
pub(super) const REGION: &str = "us-east-1";
pub(super) const ACCOUNT: &str = "000000000000";

/// One record read from a shard, reduced to what the event carries.
#[derive(Clone, Debug, PartialEq)]
pub struct KinesisRecord {
    /// The shard it was read from.
    pub shard: String,
    pub sequence: String,
    pub partition_key: String,
    pub data: Vec<u8>,
    /// `ApproximateArrivalTimestamp`, seconds since the epoch.
    pub arrival: f64,
}

impl KinesisRecord {
    /// From what `GetRecords` returned for `shard`.
    pub(super) fn from_sdk(shard: &str, r: &aws_sdk_kinesis::types::Record) -> Self {
        KinesisRecord {
            shard: shard.to_owned(),
            sequence: r.sequence_number().to_owned(),
            partition_key: r.partition_key().unwrap_or_default().to_owned(),
            data: r.data().as_ref().to_vec(),
            arrival: r
                .approximate_arrival_timestamp()
                .map_or(0.0, |t| t.as_secs_f64()),
        }
    }
}

/// The stream's ARN as Lambda's events name it.
pub fn stream_arn(stream: &str) -> String {
    format!("arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{stream}")
}

/// Lambda's Kinesis event for `records`, in the order given.
pub fn event(stream_arn: &str, records: &[KinesisRecord]) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|r| {
            json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": r.partition_key,
                    "sequenceNumber": r.sequence,
                    "data": base64::engine::general_purpose::STANDARD.encode(&r.data),
                    "approximateArrivalTimestamp": r.arrival,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{}:{}", r.shard, r.sequence),
                "eventName": "aws:kinesis:record",
                "invokeIdentityArn": format!("arn:aws:iam::{ACCOUNT}:role/local"),
                "awsRegion": REGION,
                "eventSourceARN": stream_arn,
            })
        })
        .collect();
    json!({ "Records": records })
}

/// Kinesis sequence numbers are decimal strings of up to 129 digits, far
/// past any integer type, and of differing lengths: compared as numbers
/// (leading zeros dropped, then the longer is the larger), never as text.
/// `None` for anything that is not a sequence number.
pub fn compare_sequences(a: &str, b: &str) -> Option<Ordering> {
    fn digits(s: &str) -> Option<&str> {
        (!s.is_empty() && s.len() <= 129 && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.trim_start_matches('0'))
    }
    let (a, b) = (digits(a)?, digits(b)?);
    Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert_eq!(compare_sequences("9", "10"), Some(Ordering::Less));
        assert_eq!(compare_sequences("010", "10"), Some(Ordering::Equal));
        let long = "49".to_owned() + &"0".repeat(54);
        let longer = "1".to_owned() + &"0".repeat(56);
        assert_eq!(compare_sequences(&long, &longer), Some(Ordering::Less));
        assert_eq!(
            compare_sequences(&"9".repeat(129), "1"),
            Some(Ordering::Greater)
        );
        assert_eq!(compare_sequences(&"9".repeat(130), "1"), None);
        assert_eq!(compare_sequences("", "1"), None);
        assert_eq!(compare_sequences("1a", "1"), None);
    }

    #[test]
    fn the_event_is_lambdas_kinesis_event() {
        let r = KinesisRecord {
            shard: "shardId-000000000001".into(),
            sequence: "4959".into(),
            partition_key: "reel-1".into(),
            data: b"hello".to_vec(),
            arrival: 1_700_000_000.5,
        };
        let arn = stream_arn("ViewsStream");
        let e = event(&arn, &[r]);
        assert_eq!(
            e,
            json!({"Records": [{
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": "reel-1",
                    "sequenceNumber": "4959",
                    "data": "aGVsbG8=",
                    "approximateArrivalTimestamp": 1_700_000_000.5,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": "shardId-000000000001:4959",
                "eventName": "aws:kinesis:record",
                "invokeIdentityArn": "arn:aws:iam::000000000000:role/local",
                "awsRegion": "us-east-1",
                "eventSourceARN": "arn:aws:kinesis:us-east-1:000000000000:stream/ViewsStream",
            }]})
        );
    }
}
