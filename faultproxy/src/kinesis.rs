//! The proxy in front of Kinesis Data Streams (AWS JSON 1.1,
//! `X-Amz-Target: Kinesis_20131202.<Operation>`), e.g. kinesis-mock.
//!
//! Like the DynamoDB emulator, kinesis-mock is kind: it never throttles a
//! shard and never fails one record of a `PutRecords`. Real Kinesis does
//! both, and a producer that does not resend exactly the failed records
//! loses or duplicates events. The classes ([`KinesisRates`]), on the same
//! seeded schedule as the DynamoDB ones:
//!
//! * `throttle`: 400 `ProvisionedThroughputExceededException`, not
//!   forwarded. The AWS SDK for Rust retries it as a throttling error: its
//!   error-code classifier (`aws-runtime`, `THROTTLING_ERRORS`) lists that
//!   code, read from `__type` as for DynamoDB's throttle.
//! * `lost`: forwarded, then the answer is lost as DynamoDB's `lost` loses
//!   it (dropped, stalled past the client's timeout, or 500
//!   `InternalFailure`).
//! * `partial` (`PutRecords`): Kinesis's own partial failure. The records
//!   chosen to fail are taken out of the request before it is forwarded, so
//!   they never reach the emulator (a producer's retry of them is then the
//!   only way they get written), and the answer lists every record in
//!   request order: the emulator's results for the forwarded ones, an
//!   `ErrorCode` for the others, and `FailedRecordCount` counting both.
//!
//! Only the data operations (`PutRecords`, `PutRecord`, `GetRecords`) take
//! faults; stream management always goes through. The proxy speaks the JSON
//! protocol (the Rust SDK's); a request in CBOR (the Java SDK's default for
//! Kinesis, `application/x-amz-cbor-1.1`) goes through untouched, since a
//! JSON answer would be garbage to its client, and is counted
//! ([`KinesisStats::cbor_untouched`]) so a run can tell it got no faults.
//!
//! [`KinesisRates`]: crate::config::KinesisRates
//! [`KinesisStats::cbor_untouched`]: crate::stats::KinesisStats::cbor_untouched

use crate::state::{Lost, Shared, bump};
use crate::{Answer, Dropped, json_answer, upstream_answer};
use bytes::Bytes;
use hyper::HeaderMap;
use serde_json::{Value, json};

/// The `X-Amz-Target` prefix of every Kinesis Data Streams operation.
const TARGET_PREFIX: &str = "Kinesis_20131202.";

/// The operations that take the Kinesis classes.
const DATA_OPS: [&str; 3] = ["PutRecords", "PutRecord", "GetRecords"];

const THROTTLED: &str = "ProvisionedThroughputExceededException";
const INTERNAL: &str = "InternalFailure";

/// Whether a request is a Kinesis one, by its `X-Amz-Target`.
pub(crate) fn is_kinesis(target: Option<&str>) -> bool {
    target.is_some_and(|t| t.starts_with(TARGET_PREFIX))
}

/// What to do with one Kinesis request.
#[derive(Default)]
struct Planned {
    /// Answer this without forwarding.
    refuse: Option<(u16, Value)>,
    lost: Option<Lost>,
    /// `PutRecords`: the records to fail (their indexes, in order) and the
    /// error code each gets.
    failed: Vec<(usize, &'static str)>,
}

/// The records of a `PutRecords` request (none if it is unreadable, which
/// then goes through untouched).
fn records(body: &Value) -> &[Value] {
    body.get("Records")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The stream a request names, for the error messages.
fn stream(body: &Value) -> &str {
    body.get("StreamName")
        .and_then(Value::as_str)
        .or_else(|| {
            let arn = body.get("StreamARN")?.as_str()?;
            arn.rsplit_once('/').map(|(_, name)| name)
        })
        .unwrap_or("unknown")
}

/// A Kinesis error body. Kinesis names the type without a namespace.
fn error(kind: &str, message: &str) -> Value {
    json!({ "__type": kind, "message": message })
}

/// The proxy cannot tell which shard a record hashes to (it does not know
/// the shards' ranges), so the message names the stream only; clients read
/// the code, not the message.
fn rate_exceeded(stream: &str) -> String {
    format!("Rate exceeded for shard in stream {stream} (injected by the fault proxy).")
}

/// Kinesis answers in AWS JSON 1.1.
fn answer(status: u16, body: &Value) -> Answer {
    let mut r = json_answer(status, body);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-amz-json-1.1"),
    );
    r
}

/// The draws for one request, under the lock: the exclusive throttle/lost
/// draw, then one draw per record for `partial`.
fn plan(shared: &Shared, op: &str, cbor: bool, body: &Value) -> Planned {
    let mut g = shared.lock();
    let g = &mut *g;
    bump(&mut g.stats.requests, op);
    if cbor {
        g.stats.kinesis.cbor_untouched += 1;
        return Planned::default();
    }
    if !DATA_OPS.contains(&op) {
        return Planned::default();
    }
    let rates = g.faults.kinesis;
    let u = g.rng.f64();
    if u < rates.throttle {
        g.inject("kinesis_throttle", op);
        let body = error(THROTTLED, &rate_exceeded(stream(body)));
        return Planned {
            refuse: Some((400, body)),
            ..Planned::default()
        };
    }
    let lost = (u < rates.throttle + rates.lost).then(|| match g.rng.u8(0..3) {
        0 => Lost::Dropped,
        1 => Lost::Stalled(g.faults.stall),
        _ => Lost::ServerError,
    });
    if let Some(l) = lost {
        let class = match l {
            Lost::Dropped => "kinesis_lost_dropped",
            Lost::Stalled(_) => "kinesis_lost_stalled",
            Lost::ServerError => "kinesis_lost_500",
        };
        g.inject(class, op);
    }
    let mut failed = Vec::new();
    if op == "PutRecords" {
        let n = records(body).len();
        g.stats.kinesis.records_received += n as u64;
        if rates.partial > 0.0 {
            for i in 0..n {
                if g.rng.f64() < rates.partial {
                    // Both codes Kinesis documents for a failed record.
                    failed.push((i, if g.rng.bool() { THROTTLED } else { INTERNAL }));
                }
            }
        }
        if !failed.is_empty() {
            g.inject("kinesis_partial", op);
            g.stats.kinesis.records_failed_injected += failed.len() as u64;
        }
    }
    Planned {
        refuse: None,
        lost,
        failed,
    }
}

/// The request without the records at `failed`, its other fields as sent.
fn without(body: &Value, failed: &[(usize, &'static str)]) -> Value {
    let mut out = body.clone();
    let kept: Vec<Value> = records(body)
        .iter()
        .enumerate()
        .filter(|(i, _)| !failed.iter().any(|(f, _)| f == i))
        .map(|(_, r)| r.clone())
        .collect();
    out["Records"] = Value::Array(kept);
    out
}

/// The answer to a `PutRecords` of `total` records whose records at
/// `failed` the proxy failed and whose others the emulator answered with
/// `upstream` (`None`: nothing was forwarded): every record's result in
/// request order, `FailedRecordCount` counting the emulator's failures and
/// the proxy's. The emulator's other fields (`EncryptionType`) stay.
fn merge(
    total: usize,
    failed: &[(usize, &'static str)],
    stream: &str,
    upstream: Option<&Value>,
) -> Result<Value, String> {
    let theirs: &[Value] = match upstream {
        Some(u) => u
            .get("Records")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .ok_or("the emulator's answer has no Records")?,
        None => &[],
    };
    if theirs.len() + failed.len() != total {
        return Err(format!(
            "the emulator answered {} records for {} forwarded",
            theirs.len(),
            total - failed.len()
        ));
    }
    let mut theirs = theirs.iter();
    let mut out = Vec::with_capacity(total);
    for i in 0..total {
        match failed.iter().find(|(f, _)| *f == i) {
            Some((_, code)) => {
                let message = if *code == THROTTLED {
                    rate_exceeded(stream)
                } else {
                    "Internal service failure (injected by the fault proxy).".to_owned()
                };
                out.push(json!({ "ErrorCode": code, "ErrorMessage": message }));
            }
            None => out.push(theirs.next().cloned().unwrap_or(Value::Null)),
        }
    }
    let failures = out.iter().filter(|r| r.get("ErrorCode").is_some()).count();
    let mut merged = upstream.cloned().unwrap_or_else(|| json!({}));
    merged["Records"] = Value::Array(out);
    merged["FailedRecordCount"] = json!(failures);
    Ok(merged)
}

/// Serves one Kinesis request (`body` as received).
pub(crate) async fn serve(
    shared: &Shared,
    op: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Answer, Dropped> {
    let cbor = headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("cbor"));
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let plan = plan(shared, op, cbor, &parsed);
    if let Some((status, b)) = plan.refuse {
        return Ok(answer(status, &b));
    }
    let total = records(&parsed).len();
    let forward_body = if plan.failed.is_empty() {
        Some(body)
    } else if plan.failed.len() < total {
        Some(Bytes::from(without(&parsed, &plan.failed).to_string()))
    } else {
        // Every record failed: Kinesis wrote none, so neither does the
        // emulator.
        None
    };
    let upstream = match forward_body {
        None => None,
        Some(b) => match shared.forward(headers, b).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, op, "upstream unreachable");
                return Ok(answer(500, &error(INTERNAL, "upstream unreachable")));
            }
        },
    };
    let upstream_json = upstream
        .as_ref()
        .filter(|(status, _, _)| status.is_success() && op == "PutRecords")
        .and_then(|(_, _, b)| serde_json::from_slice::<Value>(b).ok());
    {
        let mut g = shared.lock();
        if upstream.is_some() {
            bump(&mut g.stats.forwarded, op);
            if op == "PutRecords" {
                g.stats.kinesis.records_forwarded += (total - plan.failed.len()) as u64;
            }
        }
        if let Some(answer) = &upstream_json {
            let refused = records(answer)
                .iter()
                .filter(|r| r.get("ErrorCode").is_some());
            g.stats.kinesis.records_failed_upstream += refused.count() as u64;
        }
    }

    match plan.lost {
        Some(Lost::Dropped) => return Err(Dropped),
        Some(Lost::Stalled(d)) => {
            tokio::time::sleep(d).await;
            return Err(Dropped);
        }
        Some(Lost::ServerError) => {
            let b = error(
                INTERNAL,
                "Internal service failure (the request may have been applied).",
            );
            return Ok(answer(500, &b));
        }
        None => {}
    }

    match upstream {
        Some((status, up_headers, up_body)) if plan.failed.is_empty() || !status.is_success() => {
            // Untouched, or refused as a whole by the emulator (nothing it
            // was sent was written, so the injected failures are moot).
            Ok(upstream_answer(status, &up_headers, up_body, false))
        }
        Some((status, up_headers, _)) => {
            match merge(total, &plan.failed, stream(&parsed), upstream_json.as_ref()) {
                Ok(merged) => Ok(upstream_answer(
                    status,
                    &up_headers,
                    Bytes::from(merged.to_string()),
                    true,
                )),
                Err(e) => {
                    // The forwarded records may be written: answer as a
                    // lost answer does, so the producer resends them all.
                    tracing::warn!(error = %e, "cannot merge a PutRecords answer");
                    Ok(answer(500, &error(INTERNAL, &e)))
                }
            }
        }
        None => match merge(total, &plan.failed, stream(&parsed), None) {
            Ok(merged) => Ok(answer(200, &merged)),
            Err(e) => Ok(answer(500, &error(INTERNAL, &e))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keeps_request_order_and_counts_both_failures() {
        let upstream = json!({
            "FailedRecordCount": 1,
            "EncryptionType": "NONE",
            "Records": [
                {"SequenceNumber": "1", "ShardId": "shardId-000000000000"},
                {"ErrorCode": INTERNAL, "ErrorMessage": "theirs"},
                {"SequenceNumber": "3", "ShardId": "shardId-000000000000"},
            ]
        });
        let failed = [(0, THROTTLED), (3, INTERNAL)];
        let m = merge(5, &failed, "s", Some(&upstream)).unwrap();
        let codes: Vec<&str> = m["Records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r["ErrorCode"]
                    .as_str()
                    .or(r["SequenceNumber"].as_str())
                    .unwrap()
            })
            .collect();
        assert_eq!(codes, [THROTTLED, "1", INTERNAL, INTERNAL, "3"]);
        assert_eq!(m["FailedRecordCount"], 3);
        assert_eq!(m["EncryptionType"], "NONE");
        // A count that does not add up is an error, not a wrong order.
        assert!(merge(4, &failed, "s", Some(&upstream)).is_err());
        assert!(merge(5, &failed, "s", Some(&json!({}))).is_err());
        // Nothing forwarded: every record failed.
        let all = merge(2, &[(0, THROTTLED), (1, INTERNAL)], "s", None).unwrap();
        assert_eq!(all["FailedRecordCount"], 2);
    }

    #[test]
    fn only_the_failed_records_are_taken_out() {
        let body = json!({"StreamName": "s", "Records": [
            {"Data": "YQ==", "PartitionKey": "a"},
            {"Data": "Yg==", "PartitionKey": "b", "ExplicitHashKey": "1"},
            {"Data": "Yw==", "PartitionKey": "c"},
        ]});
        let out = without(&body, &[(0, THROTTLED), (2, INTERNAL)]);
        assert_eq!(out["StreamName"], "s");
        assert_eq!(
            out["Records"],
            json!([{"Data": "Yg==", "PartitionKey": "b", "ExplicitHashKey": "1"}])
        );
        assert_eq!(
            stream(&json!({"StreamARN": "arn:aws:kinesis:us-east-1:000000000000:stream/events"})),
            "events"
        );
        assert!(is_kinesis(Some("Kinesis_20131202.PutRecords")));
        assert!(!is_kinesis(Some("DynamoDBStreams_20120810.GetRecords")));
        assert!(!is_kinesis(None));
    }
}
