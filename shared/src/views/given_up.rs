//! A range of a views-log shard that Lambda gave up on, as the OnFailure
//! invocation record it sent names it (`KinesisBatchInfo`): what a repair
//! ([`super::repair`]) counts once. A record that is not what Lambda
//! writes is a 400 (`invalid_invocation_record`).

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
}
