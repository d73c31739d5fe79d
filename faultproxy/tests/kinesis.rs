//! The Kinesis classes through real HTTP: a client, the proxy, and a tiny
//! stand-in for kinesis-mock that answers `PutRecords` with a sequence
//! number per record and remembers every request it got, so each test can
//! tell what reached the emulator from what the client was told.

use bytes::Bytes;
use faultproxy::{Faults, Proxy};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// Every request the stand-in got: (operation, body).
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A record's result as the stand-in gives it: a sequence number naming
/// the partition key, so an answer's order can be checked against the
/// request's; a record with partition key `reject` fails at the stand-in
/// itself (Kinesis failing a record on its own).
fn result(record: &Value) -> Value {
    let pk = record["PartitionKey"].as_str().unwrap_or("");
    if pk == "reject" {
        json!({"ErrorCode": "InternalFailure", "ErrorMessage": "the emulator's own"})
    } else {
        json!({"SequenceNumber": format!("seq-{pk}"), "ShardId": "shardId-000000000000"})
    }
}

fn answer_to(op: &str, body: &Value) -> Value {
    match op {
        "PutRecords" => {
            let records: Vec<Value> = body["Records"]
                .as_array()
                .map(|r| r.iter().map(result).collect())
                .unwrap_or_default();
            let failed = records
                .iter()
                .filter(|r| r["ErrorCode"].is_string())
                .count();
            json!({"FailedRecordCount": failed, "Records": records, "EncryptionType": "NONE"})
        }
        "PutRecord" => result(body),
        "GetRecords" => json!({"Records": [], "NextShardIterator": "it", "MillisBehindLatest": 0}),
        _ => json!({}),
    }
}

async fn emulator() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let target = req
                            .headers()
                            .get("x-amz-target")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let op = target.rsplit('.').next().unwrap_or("").to_owned();
                        let bytes = req.into_body().collect().await?.to_bytes();
                        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        let out = answer_to(&op, &body);
                        log.lock().unwrap().push((op, body));
                        let mut r = Response::new(Full::new(Bytes::from(out.to_string())));
                        r.headers_mut().insert(
                            "content-type",
                            "application/x-amz-json-1.1".parse().unwrap(),
                        );
                        Ok::<_, hyper::Error>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, seen)
}

async fn proxy(spec: &str) -> (Proxy, Seen) {
    let (upstream, seen) = emulator().await;
    let faults = Faults::parse(spec).unwrap();
    let proxy = Proxy::start("127.0.0.1:0", &upstream, faults)
        .await
        .unwrap();
    (proxy, seen)
}

/// Sends a Kinesis request through the proxy: (status, answer), or `None`
/// when the connection ended without an answer.
async fn send(proxy: &Proxy, op: &str, body: &Value) -> Option<(u16, Value)> {
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .post(format!("{}/", proxy.url))
        .header("x-amz-target", format!("Kinesis_20131202.{op}"))
        .header("content-type", "application/x-amz-json-1.1")
        .body(body.to_string())
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

fn put_records(keys: &[String]) -> Value {
    let records: Vec<Value> = keys
        .iter()
        .map(|k| json!({"Data": "eA==", "PartitionKey": k}))
        .collect();
    json!({"StreamName": "events", "Records": records})
}

/// The partition keys of the records the stand-in got in `PutRecords`.
fn keys_seen(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(op, _)| op == "PutRecords")
        .flat_map(|(_, b)| b["Records"].as_array().cloned().unwrap_or_default())
        .map(|r| r["PartitionKey"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn kinesis_throttles_are_answered_without_forwarding() {
    let (proxy, seen) = proxy("seed=3,kinesis_throttle=1").await;
    let keys = vec!["a".to_owned()];
    let get = json!({"ShardIterator": "it"});
    let put = json!({"StreamName": "events", "Data": "eA==", "PartitionKey": "a"});
    for (op, body) in [
        ("PutRecords", put_records(&keys)),
        ("PutRecord", put),
        ("GetRecords", get),
    ] {
        let (status, answer) = send(&proxy, op, &body).await.unwrap();
        assert_eq!(status, 400, "{op}");
        assert_eq!(answer["__type"], "ProvisionedThroughputExceededException");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .starts_with("Rate exceeded for shard")
        );
    }
    // Stream management goes through, and so does DynamoDB traffic.
    let (status, _) = send(
        &proxy,
        "DescribeStreamSummary",
        &json!({"StreamName": "events"}),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let r = reqwest::Client::new()
        .post(format!("{}/", proxy.url))
        .header("x-amz-target", "DynamoDB_20120810.Scan")
        .header("content-type", "application/x-amz-json-1.0")
        .body(json!({"TableName": "T"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ops: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(op, _)| op.clone())
        .collect();
    assert_eq!(ops, ["DescribeStreamSummary", "Scan"]);

    let stats = proxy.stats();
    assert_eq!(stats.injected_of("kinesis_throttle"), 3);
    assert_eq!(stats.injected["kinesis_throttle"]["GetRecords"], 1);
    assert_eq!(stats.failures_injected, 3);
    assert_eq!(stats.requests["PutRecords"], 1);
    assert!(!stats.forwarded.contains_key("PutRecords"));
}

#[tokio::test]
async fn a_cbor_request_goes_through_untouched_and_counted() {
    let (proxy, seen) = proxy("seed=3,kinesis_throttle=1").await;
    let r = reqwest::Client::new()
        .post(format!("{}/", proxy.url))
        .header("x-amz-target", "Kinesis_20131202.PutRecord")
        .header("content-type", "application/x-amz-cbor-1.1")
        .body(vec![0xa0u8])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(seen.lock().unwrap().len(), 1);
    let stats = proxy.stats();
    assert_eq!(stats.kinesis.cbor_untouched, 1);
    assert_eq!(stats.failures_injected, 0);
}

#[tokio::test]
async fn dynamodb_classes_leave_kinesis_alone() {
    // Every DynamoDB class at once, and DynamoDB Streams' GetRecords (same
    // name, other target) is still theirs.
    let (proxy, seen) = proxy("seed=3,throttle=0.5,error=0.5").await;
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    for _ in 0..5 {
        let (status, answer) = send(&proxy, "PutRecords", &put_records(&keys))
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert_eq!(answer["FailedRecordCount"], 0);
    }
    assert_eq!(keys_seen(&seen).len(), 25);
    assert_eq!(proxy.stats().failures_injected, 0);
}

#[tokio::test]
async fn kinesis_lost_answers_are_lost_after_the_records_are_written() {
    let (proxy, seen) = proxy("seed=5,kinesis_lost=1,stall_ms=50").await;
    let mut outcomes = Vec::new();
    for i in 0..12 {
        let keys = vec![format!("k{i}")];
        outcomes.push(send(&proxy, "PutRecords", &put_records(&keys)).await);
    }
    // Every request reached the emulator; no client was told it succeeded.
    assert_eq!(keys_seen(&seen).len(), 12);
    for o in &outcomes {
        match o {
            None => {}
            Some((status, answer)) => {
                assert_eq!(*status, 500);
                assert_eq!(answer["__type"], "InternalFailure");
            }
        }
    }
    let stats = proxy.stats();
    let lost: u64 = ["dropped", "stalled", "500"]
        .iter()
        .map(|k| stats.injected_of(&format!("kinesis_lost_{k}")))
        .sum();
    assert_eq!(lost, 12);
    assert_eq!(stats.forwarded["PutRecords"], 12);
    assert_eq!(
        outcomes.iter().filter(|o| o.is_some()).count() as u64,
        stats.injected_of("kinesis_lost_500")
    );
    assert!(stats.injected_of("kinesis_lost_dropped") > 0);
    assert!(stats.injected_of("kinesis_lost_500") > 0);
}

#[tokio::test]
async fn kinesis_partial_failures_never_reach_the_emulator_and_keep_order() {
    let (proxy, seen) = proxy("seed=11,kinesis_partial=0.4").await;
    let (mut injected, mut theirs) = (0, 0);
    for round in 0..6 {
        // One record the emulator fails itself, among the others.
        let mut keys: Vec<String> = (0..10).map(|i| format!("r{round}k{i}")).collect();
        keys[4] = "reject".to_owned();
        let before = keys_seen(&seen).len();
        let (status, answer) = send(&proxy, "PutRecords", &put_records(&keys))
            .await
            .unwrap();
        assert_eq!(status, 200);
        let results = answer["Records"].as_array().unwrap();
        assert_eq!(results.len(), keys.len());
        assert_eq!(answer["EncryptionType"], "NONE");
        // In request order: each success names its own record, and the
        // emulator got exactly the records not failed by the proxy.
        let mut expected = Vec::new();
        let mut failures = 0;
        for (k, r) in keys.iter().zip(results) {
            match r["SequenceNumber"].as_str() {
                Some(seq) => {
                    assert_eq!(seq, format!("seq-{k}"));
                    expected.push(k.clone());
                }
                None => {
                    failures += 1;
                    let code = r["ErrorCode"].as_str().unwrap();
                    assert!(
                        ["ProvisionedThroughputExceededException", "InternalFailure"]
                            .contains(&code)
                    );
                    assert!(r["ErrorMessage"].is_string());
                    if r["ErrorMessage"] == "the emulator's own" {
                        theirs += 1;
                        expected.push(k.clone());
                    } else {
                        injected += 1;
                    }
                }
            }
        }
        assert_eq!(answer["FailedRecordCount"], failures);
        let got = &keys_seen(&seen)[before..];
        assert_eq!(got, expected.as_slice());
    }
    let stats = proxy.stats();
    let k = &stats.kinesis;
    assert!(injected > 0 && injected < 60, "{injected}");
    assert_eq!(k.records_received, 60);
    assert_eq!(k.records_failed_injected, injected);
    assert_eq!(k.records_forwarded, 60 - injected);
    assert!(theirs > 0, "the seed forwards some rejected record");
    assert_eq!(k.records_failed_upstream, theirs);
    assert!(stats.injected_of("kinesis_partial") > 0);
}

#[tokio::test]
async fn a_put_records_whose_every_record_fails_is_not_forwarded() {
    let (proxy, seen) = proxy("seed=2,kinesis_partial=1").await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let (status, answer) = send(&proxy, "PutRecords", &put_records(&keys))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer["FailedRecordCount"], 4);
    assert!(
        answer["Records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["ErrorCode"].is_string())
    );
    assert!(seen.lock().unwrap().is_empty());
    let stats = proxy.stats();
    assert_eq!(stats.injected["kinesis_partial"]["PutRecords"], 1);
    assert_eq!(stats.kinesis.records_failed_injected, 4);
    assert_eq!(stats.kinesis.records_forwarded, 0);
    assert!(!stats.forwarded.contains_key("PutRecords"));
    // The spec can change while it runs: off, everything goes through.
    proxy.set_faults(Faults::default());
    let (_, answer) = send(&proxy, "PutRecords", &put_records(&keys))
        .await
        .unwrap();
    assert_eq!(answer["FailedRecordCount"], 0);
    assert_eq!(keys_seen(&seen), keys);
}

/// The real SDK client, pointed at the proxy, retrying `attempts` times
/// with almost no backoff (the tests count attempts, not time).
fn sdk(proxy: &Proxy, attempts: u32) -> aws_sdk_kinesis::Client {
    use aws_sdk_kinesis::config::retry::RetryConfig;
    use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "test"))
        .endpoint_url(&proxy.url)
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(attempts)
                .with_initial_backoff(Duration::from_millis(1)),
        )
        .build();
    aws_sdk_kinesis::Client::from_conf(config)
}

fn entries(keys: &[String]) -> Vec<aws_sdk_kinesis::types::PutRecordsRequestEntry> {
    keys.iter()
        .map(|k| {
            aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                .data(aws_sdk_kinesis::primitives::Blob::new(k.as_bytes()))
                .partition_key(k)
                .build()
                .unwrap()
        })
        .collect()
}

#[tokio::test]
async fn the_sdk_retries_an_injected_throttle_as_a_throttle() {
    use aws_sdk_kinesis::error::ProvideErrorMetadata;
    use aws_sdk_kinesis::operation::put_record::PutRecordError;
    let (proxy, seen) = proxy("seed=3,kinesis_throttle=1").await;
    let err = sdk(&proxy, 3)
        .put_record()
        .stream_name("events")
        .partition_key("a")
        .data(aws_sdk_kinesis::primitives::Blob::new("x"))
        .send()
        .await
        .unwrap_err();
    let err = err.into_service_error();
    assert_eq!(err.code(), Some("ProvisionedThroughputExceededException"));
    assert!(
        matches!(
            err,
            PutRecordError::ProvisionedThroughputExceededException(_)
        ),
        "{err:?}"
    );
    // The SDK retries only what it classifies as retryable (throttling,
    // transient, 5xx): three attempts for one call.
    assert_eq!(proxy.stats().requests["PutRecord"], 3);
    assert_eq!(proxy.stats().injected_of("kinesis_throttle"), 3);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_sdk_reads_merged_answers_and_a_retry_of_the_failed_writes_each_once() {
    let (proxy, seen) = proxy("seed=13,kinesis_partial=0.3").await;
    let client = sdk(&proxy, 1);
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let mut pending = keys.clone();
    let mut rounds = 0;
    // A producer's loop: resend exactly the records that failed.
    while !pending.is_empty() {
        rounds += 1;
        assert!(rounds < 30, "never all written");
        let out = client
            .put_records()
            .stream_name("events")
            .set_records(Some(entries(&pending)))
            .send()
            .await
            .unwrap();
        let results = out.records();
        assert_eq!(results.len(), pending.len());
        let failed: Vec<String> = pending
            .iter()
            .zip(results)
            .filter_map(|(k, r)| match r.sequence_number() {
                Some(seq) => {
                    assert_eq!(seq, format!("seq-{k}"), "request order");
                    None
                }
                None => {
                    assert!(r.error_code().is_some());
                    Some(k.clone())
                }
            })
            .collect();
        assert_eq!(out.failed_record_count(), Some(failed.len() as i32));
        pending = failed;
    }
    assert!(rounds > 1, "the seed fails some record");
    let mut written = keys_seen(&seen);
    written.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(written, want, "every record written exactly once");
    assert!(proxy.stats().kinesis.records_failed_injected > 0);
}

#[tokio::test]
async fn the_sdk_retries_a_lost_answer_and_writes_twice() {
    let (proxy, seen) = proxy("seed=5,kinesis_lost=1,stall_ms=50").await;
    let result = sdk(&proxy, 2)
        .put_records()
        .stream_name("events")
        .set_records(Some(entries(&["a".to_owned()])))
        .send()
        .await;
    assert!(result.is_err());
    // Both attempts were written: the ambiguity a lost answer leaves.
    assert_eq!(keys_seen(&seen), ["a", "a"]);
    assert_eq!(proxy.stats().forwarded["PutRecords"], 2);
}
