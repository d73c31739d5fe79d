//! A range of a views-log shard that Lambda gave up on, as the OnFailure
//! invocation record it sent names it (`KinesisBatchInfo`): what a repair
//! ([`super::repair`]) counts once. A record that is not what Lambda
//! writes is a 400 (`invalid_invocation_record`). The record comes as the
//! payload of a manual invocation, or as the body of a message of the
//! OnFailure queue, which is an SQS event source of the same function
//! ([`QueuedRanges`]).

use crate::aggregate::records::SequenceNumber;
use crate::error::Error;
use serde_json::Value;

/// A range Lambda gave up on: the `KinesisBatchInfo` of an OnFailure
/// invocation record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GivenUp {
    /// The stream's ARN (`streamArn`).
    pub stream_arn: String,
    /// The shard (`shardId`).
    pub shard_id: String,
    /// The first record's sequence number (`startSequenceNumber`).
    pub start: String,
    /// The last record's sequence number (`endSequenceNumber`).
    pub end: String,
    /// Records in the batch (`batchSize`).
    pub batch_size: Option<u64>,
    /// When Lambda gave it up (`timestamp`, Unix ms).
    pub given_up_ms: i64,
}

impl GivenUp {
    /// Whether `event` is an OnFailure invocation record of a Kinesis
    /// source (it has `KinesisBatchInfo`), not a batch of records.
    pub fn is_invocation_record(event: &Value) -> bool {
        event.get("KinesisBatchInfo").is_some()
    }

    /// The range `event` (an OnFailure invocation record) names; a 400 if
    /// a field is missing or is not what Lambda writes.
    pub fn parse(event: &Value) -> Result<Self, Error> {
        let info = &event["KinesisBatchInfo"];
        let text = |name: &'static str| -> Result<String, Error> {
            info[name]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| {
                    Error::bad_request(
                        "invalid_invocation_record",
                        format!("KinesisBatchInfo.{name} must be a non-empty string"),
                    )
                })
        };
        let g = GivenUp {
            stream_arn: text("streamArn")?,
            shard_id: text("shardId")?,
            start: text("startSequenceNumber")?,
            end: text("endSequenceNumber")?,
            batch_size: info["batchSize"].as_u64(),
            given_up_ms: event["timestamp"]
                .as_str()
                .and_then(|t| {
                    aws_sdk_kinesis::primitives::DateTime::from_str(
                        t,
                        aws_sdk_kinesis::primitives::DateTimeFormat::DateTime,
                    )
                    .ok()
                })
                .and_then(|t| t.to_millis().ok())
                .ok_or_else(|| {
                    Error::bad_request(
                        "invalid_invocation_record",
                        "timestamp must be the ISO 8601 time Lambda gave the batch up",
                    )
                })?,
        };
        let (Some(a), Some(b)) = (
            SequenceNumber::parse_kinesis(&g.start),
            SequenceNumber::parse_kinesis(&g.end),
        ) else {
            return Err(Error::bad_request(
                "invalid_invocation_record",
                "startSequenceNumber and endSequenceNumber must be sequence numbers",
            ));
        };
        if a > b {
            return Err(Error::bad_request(
                "invalid_invocation_record",
                "startSequenceNumber is after endSequenceNumber",
            ));
        }
        Ok(g)
    }
}

/// The messages of an SQS event (Lambda's, from the OnFailure queue as
/// an event source): each message's id, which a `batchItemFailures` answer
/// names, and its body read as an invocation record.
#[derive(Debug)]
pub struct QueuedRanges(pub Vec<(String, Result<GivenUp, Error>)>);

impl QueuedRanges {
    /// Whether `event` is an SQS event: `Records` whose `eventSource` is
    /// `aws:sqs` (a Kinesis batch's say `aws:kinesis`).
    pub fn is_sqs_event(event: &Value) -> bool {
        event["Records"]
            .as_array()
            .and_then(|r| r.first())
            .is_some_and(|r| r["eventSource"] == "aws:sqs")
    }

    /// The messages of `event` (an SQS event). A body that is not an
    /// invocation record is that message's error, not the event's; a
    /// record without a `messageId` (which Lambda always writes) cannot be
    /// answered for, and makes the event an error, so Lambda delivers it
    /// whole again.
    pub fn parse(event: &Value) -> Result<Self, Error> {
        let records = event["Records"].as_array().ok_or_else(|| {
            Error::bad_request("invalid_event", "an SQS event has a Records array")
        })?;
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let id = r["messageId"]
                .as_str()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    Error::bad_request("invalid_event", "an SQS record has a messageId")
                })?;
            let range = match r["body"].as_str().map(serde_json::from_str::<Value>) {
                Some(Ok(body)) => GivenUp::parse(&body),
                Some(Err(e)) => Err(Error::bad_request(
                    "invalid_invocation_record",
                    format!("the message's body is not JSON: {e}"),
                )),
                None => Err(Error::bad_request(
                    "invalid_invocation_record",
                    "the message has no body",
                )),
            };
            out.push((id.to_owned(), range));
        }
        Ok(QueuedRanges(out))
    }
}

/// The answer to an SQS event (`ReportBatchItemFailures`): the messages
/// SQS is to deliver again, after the queue's visibility timeout; the
/// others are deleted.
pub fn batch_item_failures<'a>(again: impl IntoIterator<Item = &'a str>) -> Value {
    let failures: Vec<Value> = again
        .into_iter()
        .map(|id| serde_json::json!({ "itemIdentifier": id }))
        .collect();
    serde_json::json!({ "batchItemFailures": failures })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Lambda's example of a Kinesis OnFailure invocation record.
    fn record() -> Value {
        json!({
            "requestContext": {
                "requestId": "c9b8fa9f-5a7f-xmpl-af9c-0c604cde93a5",
                "functionArn": "arn:aws:lambda:us-east-2:123456789012:function:myfunction",
                "condition": "RetryAttemptsExhausted",
                "approximateInvokeCount": 1
            },
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "version": "1.0",
            "timestamp": "2019-11-14T00:38:06.021Z",
            "KinesisBatchInfo": {
                "shardId": "shardId-000000000001",
                "startSequenceNumber": "49601189658422359378836298521827638475320189012309704722",
                "endSequenceNumber": "49601189658422359378836298522902373528957594348623495186",
                "approximateArrivalOfFirstRecord": "2019-11-14T00:38:04.835Z",
                "approximateArrivalOfLastRecord": "2019-11-14T00:38:05.580Z",
                "batchSize": 500,
                "streamArn": "arn:aws:kinesis:us-east-2:123456789012:stream/mystream"
            }
        })
    }

    #[test]
    fn an_invocation_record_names_its_range() {
        let r = record();
        assert!(GivenUp::is_invocation_record(&r));
        assert!(!GivenUp::is_invocation_record(&json!({"Records": []})));
        let g = GivenUp::parse(&r).unwrap();
        assert_eq!(g.shard_id, "shardId-000000000001");
        assert_eq!(
            g.stream_arn,
            "arn:aws:kinesis:us-east-2:123456789012:stream/mystream"
        );
        assert_eq!(g.batch_size, Some(500));
        assert_eq!(g.given_up_ms, 1_573_691_886_021);
        assert!(g.start < g.end);
    }

    #[test]
    fn a_record_missing_a_field_or_out_of_order_is_a_400() {
        let mut r = record();
        r["timestamp"] = json!("yesterday");
        assert_eq!(
            GivenUp::parse(&r).unwrap_err().code(),
            "invalid_invocation_record"
        );
        for (field, value) in [
            ("shardId", json!(null)),
            ("streamArn", json!("")),
            ("startSequenceNumber", json!("not-a-number")),
            ("endSequenceNumber", json!(7)),
            // The end before the start.
            ("endSequenceNumber", json!("4960")),
        ] {
            let mut r = record();
            r["KinesisBatchInfo"][field] = value;
            let e = GivenUp::parse(&r).unwrap_err();
            assert_eq!(e.code(), "invalid_invocation_record", "{field}");
        }
    }

    /// Lambda's SQS event holding `bodies` as its messages' bodies.
    fn sqs(bodies: &[String]) -> Value {
        json!({"Records": bodies.iter().enumerate().map(|(i, b)| json!({
            "messageId": format!("m{i}"),
            "receiptHandle": "AQEB",
            "body": b,
            "attributes": {"ApproximateReceiveCount": "1"},
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-2:123456789012:ViewsOnFailureQueue",
            "awsRegion": "us-east-2"
        })).collect::<Vec<_>>()})
    }

    #[test]
    fn an_sqs_event_carries_invocation_records_each_answered_by_its_id() {
        let good = record().to_string();
        let event = sqs(&[good, "not json".into(), json!({"x": 1}).to_string()]);
        assert!(QueuedRanges::is_sqs_event(&event));
        assert!(!QueuedRanges::is_sqs_event(&record()));
        assert!(!QueuedRanges::is_sqs_event(&json!({"Records": [
            {"eventSource": "aws:kinesis"}
        ]})));
        assert!(!QueuedRanges::is_sqs_event(&json!({"Records": []})));
        let q = QueuedRanges::parse(&event).unwrap();
        assert_eq!(q.0.len(), 3);
        assert_eq!(q.0[0].0, "m0");
        assert_eq!(q.0[0].1.as_ref().unwrap().shard_id, "shardId-000000000001");
        for (id, r) in &q.0[1..] {
            let e = r.as_ref().unwrap_err();
            assert_eq!(e.code(), "invalid_invocation_record", "{id}");
        }
        // A record without its id cannot be answered for: the event fails.
        let mut no_id = sqs(&[record().to_string()]);
        no_id["Records"][0]["messageId"] = json!(null);
        assert!(QueuedRanges::parse(&no_id).is_err());
        assert_eq!(
            batch_item_failures(["m0", "m2"]),
            json!({"batchItemFailures": [{"itemIdentifier": "m0"}, {"itemIdentifier": "m2"}]})
        );
        assert_eq!(batch_item_failures([]), json!({"batchItemFailures": []}));
    }
}
