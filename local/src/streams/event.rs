//! Stream records as Lambda hands them to the function: the event JSON of
//! a batch (`Records`, and the tumbling window's fields), each record's
//! images in DynamoDB JSON. Apart from the mapping because it is a format,
//! not a behaviour: what the aggregator parses, pinned in one place.

use aws_sdk_dynamodbstreams::types::{AttributeValue, Record};
use base64::Engine;
use serde_json::{Map, Value, json};

/// Lambda's event for `records` of `shard`.
pub(super) fn event(
    stream_arn: &str,
    tumbling_window_secs: u32,
    shard: &str,
    records: &[Record],
) -> Value {
    let records: Vec<Value> = records.iter().map(|r| record(stream_arn, r)).collect();
    let mut event = Map::new();
    event.insert("Records".into(), Value::Array(records));
    if tumbling_window_secs > 0 {
        window(&mut event, stream_arn, tumbling_window_secs, shard, false);
    }
    Value::Object(event)
}

/// The invocation Lambda makes at the end of a tumbling window of `shard`:
/// the window's fields with `isFinalInvokeForWindow: true`, and no records
/// ("At the end of your window, the flag isFinalInvokeForWindow is set to
/// true to indicate that this is the final state and that it's ready for
/// processing", with the event's shape there:
/// <https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-windows.html>).
pub(super) fn final_window(stream_arn: &str, tumbling_window_secs: u32, shard: &str) -> Value {
    let mut event = Map::new();
    event.insert("Records".into(), json!([]));
    window(
        &mut event,
        stream_arn,
        tumbling_window_secs.max(1),
        shard,
        true,
    );
    Value::Object(event)
}

/// The tumbling window's fields: the window now open, its (unused) state,
/// and the shard.
fn window(event: &mut Map<String, Value>, stream_arn: &str, secs: u32, shard: &str, last: bool) {
    let span = i64::from(secs);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let start = now - now.rem_euclid(span);
    event.insert("shardId".into(), json!(shard));
    event.insert("eventSourceARN".into(), json!(stream_arn));
    event.insert(
        "window".into(),
        json!({ "start": rfc3339(start), "end": rfc3339(start + span) }),
    );
    event.insert("state".into(), json!({}));
    event.insert("isFinalInvokeForWindow".into(), json!(last));
    event.insert("isWindowTerminatedEarly".into(), json!(false));
}

/// One stream record as the event's `Records` hold it.
fn record(stream_arn: &str, r: &Record) -> Value {
    let d = r.dynamodb();
    let image =
        |m: Option<&std::collections::HashMap<String, AttributeValue>>| -> Map<String, Value> {
            m.into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), attribute(v)))
                .collect()
        };
    let keys = image(d.and_then(|d| d.keys()));
    let new_image = d.and_then(|d| d.new_image()).map(|m| image(Some(m)));
    json!({
        "eventID": r.event_id(),
        "eventName": r.event_name().map(|n| n.as_str()),
        "eventVersion": r.event_version(),
        "eventSource": r.event_source(),
        "awsRegion": r.aws_region(),
        "eventSourceARN": stream_arn,
        "dynamodb": {
            "ApproximateCreationDateTime": d
                .and_then(|d| d.approximate_creation_date_time())
                .map(|t| t.as_secs_f64()),
            "Keys": keys,
            "NewImage": new_image,
            "SequenceNumber": d.and_then(|d| d.sequence_number()),
            "SizeBytes": d.and_then(|d| d.size_bytes()),
            "StreamViewType": d.and_then(|d| d.stream_view_type()).map(|v| v.as_str()),
        },
    })
}

/// A record's sequence number: how the stream, the checkpoint and
/// `batchItemFailures` name it.
pub(super) fn sequence(r: &Record) -> Option<&str> {
    r.dynamodb().and_then(|d| d.sequence_number())
}

/// An attribute in DynamoDB JSON: the scalar types a like row holds (the
/// aggregator reads nothing else).
fn attribute(v: &AttributeValue) -> Value {
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::B(b) => {
            json!({ "B": base64::engine::general_purpose::STANDARD.encode(b.as_ref()) })
        }
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        _ => json!({ "NULL": true }),
    }
}

/// `secs` (Unix) as an RFC 3339 UTC timestamp, as Lambda writes windows.
fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_written_as_lambda_writes_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_607_497_440), "2020-12-09T07:04:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn the_final_invoke_of_a_window_has_its_fields_and_no_records() {
        let e = final_window("arn:stream", 60, "shard-1-v2");
        assert_eq!(e["Records"], json!([]));
        assert_eq!(e["isFinalInvokeForWindow"], true);
        assert_eq!(e["isWindowTerminatedEarly"], false);
        assert_eq!(
            (e["shardId"].as_str(), e["eventSourceARN"].as_str()),
            (Some("shard-1-v2"), Some("arn:stream"))
        );
        assert!(e["state"].is_object());
        let (start, end) = (
            e["window"]["start"].as_str().unwrap(),
            e["window"]["end"].as_str().unwrap(),
        );
        assert!(
            start < end && start.ends_with(":00Z") && end.ends_with(":00Z"),
            "{start} {end}"
        );
        // An ordinary batch says it is not the last of its window.
        assert_eq!(
            event("arn:stream", 60, "s", &[])["isFinalInvokeForWindow"],
            false
        );
        assert!(event("arn:stream", 0, "s", &[]).get("shardId").is_none());
    }
}
