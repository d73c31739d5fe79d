//! Issue 35: repairs of given-up views ranges are automatic. The local
//! stack's OnFailure queue is an SQS event source of the views aggregator,
//! as the template makes it (`ViewsOnFailureQueue`, `BatchSize` 1,
//! `ReportBatchItemFailures`, `VisibilityTimeout`, `maxReceiveCount`):
//! every range Lambda gives up is delivered to the function, answered
//! `repair_too_early` while it must wait (the message comes back after the
//! visibility timeout), and repaired once it may be, with no one invoking
//! anything by hand.
//!
//! Lambda's view of a give-up is made certain, as in tests/tests/views.rs:
//! every invocation's answer is lost (`lost=1`), and half the batches are
//! taken as too old when about to be handed over (`expire=0.5`), so every
//! batch is given up, about half after an invocation counted it; the
//! producer puts some records twice (`kinesis_lost`). The repair's waits
//! are scaled down (`VIEWS_REPAIR_AFTER_SECS`, `VIEWS_DEDUP_SECS`,
//! `VIEWS_MAX_RECORD_AGE_SECS`), and the queue's visibility timeout with
//! them (`LOCAL_VIEWS_REPAIR_VISIBILITY_SECS`).

mod common;

use common::TestStack;
use likes::views::repair::{QueuedRanges, batch_item_failures};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const REELS: [&str; 3] = ["viral", "r1", "r2"];

/// Sends one batch until it is acknowledged (retrying 429/503 with its
/// key); returns whether it was.
async fn send(t: &TestStack, viewer: &str, key: &str, body: &Value) {
    for _ in 0..30 {
        let r = t
            .http
            .post(t.url("/views"))
            .header("x-user-id", viewer)
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .expect("the gateway answers");
        match r.status().as_u16() {
            202 => return,
            429 | 503 => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("POST /views answered {other}: {}", r.text().await.unwrap()),
        }
    }
    panic!("a batch was never acknowledged in 30 attempts");
}

/// A reel's views.
async fn views(t: &TestStack, reel: &str) -> u64 {
    let r = t
        .http
        .get(t.url(&format!("/reels/{reel}/views")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.json::<Value>().await.unwrap()["views"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn given_up_ranges_are_repaired_from_the_queue_with_no_one_invoking_them() {
    // Before: the given-up ranges stayed in the OnFailure queue until an
    // operator invoked the function with each; this test timed out
    // waiting for the views (nothing delivered the messages).
    let t = TestStack::start(&[
        ("LOCAL_VIEWS", "on"),
        ("LOCAL_VIEWS_SHARDS", "2"),
        ("FAULTS", "seed=7,kinesis_lost=0.2,stall_ms=200"),
        ("LOCAL_VIEWS_FAULTS", "seed=3,lost=1,expire=0.5"),
        ("VIEWS_REPAIR_AFTER_SECS", "2"),
        ("VIEWS_DEDUP_SECS", "1"),
        ("VIEWS_MAX_RECORD_AGE_SECS", "1"),
        ("LOCAL_VIEWS_REPAIR_VISIBILITY_SECS", "1"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("CACHE_TTL_MS", "0"),
    ])
    .await;
    let views_stack = t.stack.views.as_ref().unwrap();
    let queue = views_stack
        .def
        .repairs
        .as_ref()
        .expect("the template's SQS event");
    assert_eq!(
        (queue.queue.as_str(), queue.batch_size),
        ("ViewsOnFailureQueue", 1)
    );
    let source = &views_stack.source.as_ref().unwrap().stats;
    let mut want: BTreeMap<&str, u64> = BTreeMap::new();
    for b in 0..40u64 {
        let reel = REELS[(b % 3) as usize];
        let n = 1 + b % 7;
        let body = json!({"views": [{"reel_id": reel, "count": n}]});
        send(&t, &format!("viewer-{}", b % 9), &format!("k{b}"), &body).await;
        *want.entry(reel).or_default() += n;
    }
    // No repair is invoked here: the queue's event source does them all.
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut got = BTreeMap::new();
    loop {
        let drained = t.stack.views_drained().await.expect("reading the stream");
        got.clear();
        for reel in REELS {
            got.insert(reel, views(&t, reel).await);
        }
        if drained && source.repairs_pending() == 0 && got == want {
            break;
        }
        if Instant::now() >= deadline {
            // Each read on its own: a guard held in the panic's arguments
            // would deadlock `repairs_pending`, which takes the same lock.
            let sent = source.on_failure.lock().unwrap().len();
            let dead = source.dead_letters.lock().unwrap().len();
            let (repaired, pending) = (
                source.repaired.load(Ordering::SeqCst),
                source.repairs_pending(),
            );
            panic!(
                "views {got:?}, want {want:?}; {sent} ranges given up, {repaired} repaired, {pending} pending, {dead} dead-lettered"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let given_up = source.on_failure.lock().unwrap().len() as u64;
    let retries = source.repair_retries.load(Ordering::SeqCst);
    let invocations = source.repair_invocations.load(Ordering::SeqCst);
    eprintln!(
        "{given_up} ranges given up, repaired in {invocations} deliveries ({retries} delivered again)"
    );
    assert!(given_up >= 2, "{given_up} ranges given up");
    assert_eq!(source.repaired.load(Ordering::SeqCst), given_up);
    assert!(source.dead_letters.lock().unwrap().is_empty());
    // Every first delivery came right after its give-up, before
    // VIEWS_REPAIR_AFTER_SECS: answered too early, delivered again after
    // the visibility timeout, then repaired.
    assert!(retries >= given_up, "{retries} deliveries again");
    assert_eq!(invocations, given_up + retries);
    // A repair delivered again after it completed counts nothing (its
    // checkpoint), and nothing is left to deliver.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for reel in REELS {
        assert_eq!(views(&t, reel).await, want[reel], "{reel}");
    }
    assert_eq!(
        source.repair_invocations.load(Ordering::SeqCst),
        invocations
    );
    t.stop().await;
}

/// The function's answer to the queue's SQS event, on a stack without the
/// views stream (no Node.js needed; a Kinesis client that reaches nothing,
/// which a repair too early never calls): a body that is no invocation
/// record is dropped (not named for delivery again), a range too early is
/// named, so SQS delivers it again after the visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqs_answer_names_the_messages_to_deliver_again() {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0"), ("METRICS", "off")]).await;
    let mut config = likes::views::ViewsConfig::from_lookup(|_| None).unwrap();
    config.table = Some("ViewsTable".into());
    config.stream = Some("ViewsStream".into());
    let log = likes::store::kinesis::KinesisLog::new(
        likes_local::kinesis::kinesis_client("http://127.0.0.1:9"),
        "ViewsStream",
    );
    let app = likes::App::new(
        t.stack.config.clone(),
        likes::store::dynamodb::DynamoStore::new(t.stack.client.clone(), &t.stack.config),
    )
    .with_views(config, Some(std::sync::Arc::new(log)));
    let now = aws_sdk_kinesis::primitives::DateTime::from(std::time::SystemTime::now())
        .fmt(aws_sdk_kinesis::primitives::DateTimeFormat::DateTime)
        .unwrap();
    let fresh = json!({
        "requestContext": {"condition": "RetryAttemptsExhausted"},
        "version": "1.0",
        "timestamp": now,
        "KinesisBatchInfo": {
            "shardId": "shardId-000000000000",
            "startSequenceNumber": "49601189658422359378836298521827638475320189012309704722",
            "endSequenceNumber": "49601189658422359378836298522902373528957594348623495186",
            "batchSize": 3,
            "streamArn": "arn:aws:kinesis:us-east-1:000000000000:stream/ViewsStream",
        }
    });
    let record = |id: &str, body: String| {
        json!({"messageId": id, "receiptHandle": "h", "body": body,
               "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
               "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:q",
               "awsRegion": "us-east-1"})
    };
    let event = json!({"Records": [
        record("early", fresh.to_string()),
        record("junk", "{\"hello\": 1}".into()),
        record("not-json", "hello".into()),
    ]});
    assert!(QueuedRanges::is_sqs_event(&event));
    let answer = likes::triggers::handle_views_event(&app, event, None)
        .await
        .expect("an SQS event is answered, never failed");
    assert_eq!(answer, batch_item_failures(["early"]));
    // An event without its messages' ids cannot be answered for: an error,
    // so that Lambda delivers it whole again.
    let mut no_ids = json!({"Records": [record("x", fresh.to_string())]});
    no_ids["Records"][0]["messageId"] = json!(null);
    assert!(
        likes::triggers::handle_views_event(&app, no_ids, None)
            .await
            .is_err()
    );
    t.stop().await;
}
