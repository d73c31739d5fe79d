//! Stream mode's aggregator when Lambda delivers a batch again out of
//! order. AWS documents it for streams with tumbling windows (the Lambda
//! developer guide, "Using tumbling windows" for DynamoDB Streams): *Records
//! are always processed in order the first time. If records are processed
//! more than once, they might be processed out of order.* And this design
//! has records processed more than once routinely (`batchItemFailures`,
//! function errors, bisection).
//!
//! Batches go to the aggregate function's entry point
//! (`likes::triggers::handle_aggregate_event`, what the binary's `main`
//! calls with Lambda's payload) against the embedded emulator, one reel a
//! transaction (`AGGREGATE_CHUNK_REELS=1`) so that a batch of two reels is
//! two transactions, each moving the checkpoint:
//!
//! * a batch delivered twice in reverse order counts each record once;
//! * a batch delivered again reversed, with newer records appended, too;
//! * a record repeated inside one batch counts once;
//! * a like row's INSERT and REMOVE delivered REMOVE first cancel out;
//! * the checkpoint item refuses a transaction that would move it back;
//! * records that change no count take no reel's place in a transaction.

mod common;

use common::TestStack;
use common::stream_events::{ARN, batch_of as batch, deliver};
use likes::store::{AggregateStore, ChunkResult, ChunkWrite};
use likes::token::RequestToken;
use serde_json::{Value, json};

const ENV: &[(&str, &str)] = &[
    ("COUNTING", "stream"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("AUTO_RESHARD", "off"),
    ("AGGREGATE_CHUNK_REELS", "1"),
    ("METRICS", "memory"),
];

/// A stream sequence number of the usual 21+ digits, `n` after a base.
fn seq(n: u64) -> String {
    (100_000_000_000_000_000_000u128 + u128::from(n)).to_string()
}

/// A stream record: `user` liked (INSERT, written in stream mode) or
/// unliked (REMOVE) `reel`.
fn record(n: u64, like: bool, user: &str, reel: &str) -> Value {
    let keys = json!({"user_id": {"S": user}, "reel_id": {"S": reel}});
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut dynamodb = json!({
        "Keys": keys,
        "SequenceNumber": seq(n),
        "ApproximateCreationDateTime": now,
        "StreamViewType": "NEW_IMAGE",
    });
    if like {
        dynamodb["NewImage"] =
            json!({"user_id": {"S": user}, "reel_id": {"S": reel}, "cm": {"S": "s"}});
    }
    json!({
        "eventName": if like { "INSERT" } else { "REMOVE" },
        "eventSource": "aws:dynamodb",
        "eventSourceARN": ARN,
        "dynamodb": dynamodb,
    })
}

fn like(n: u64, user: &str, reel: &str) -> Value {
    record(n, true, user, reel)
}

fn unlike(n: u64, user: &str, reel: &str) -> Value {
    record(n, false, user, reel)
}

/// A stack whose own event source is held back: only the batches a test
/// hands over reach the aggregator.
async fn stack() -> TestStack {
    let t = TestStack::start(ENV).await;
    t.stack.streams[0].pause(true);
    t
}

/// The checkpoint of stream shard `shard`, as stored.
async fn checkpoint(t: &TestStack, shard: &str) -> Option<String> {
    let key = likes::keys::aggregate_checkpoint_key(ARN, shard);
    t.stack
        .app
        .aggregate
        .store()
        .checkpoint(&key)
        .await
        .unwrap()
        .seq
}

fn padded(n: u64) -> String {
    format!("{:0>40}", seq(n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_delivered_out_of_order_counts_each_record_once() {
    let t = stack().await;
    // The measurement: …30 → reel a, …20 → reel b, twice.
    let reordered = batch("s1", &[like(30, "u", "a"), like(20, "u", "b")]);
    deliver(&t, &reordered).await;
    deliver(&t, &reordered).await;
    assert_eq!(
        (t.shard_sum("a").await, t.shard_sum("b").await),
        (1, 1),
        "each like once"
    );
    assert_eq!(checkpoint(&t, "s1").await, Some(padded(30)));
    // Delivered in order first, then again out of order: nothing new.
    let in_order = batch("s2", &[like(20, "u", "c"), like(30, "u", "d")]);
    deliver(&t, &in_order).await;
    let again = batch("s2", &[like(30, "u", "d"), like(20, "u", "c")]);
    deliver(&t, &again).await;
    assert_eq!((t.shard_sum("c").await, t.shard_sum("d").await), (1, 1));
    // An out-of-order batch is counted in a metric; an ordered one is not.
    let outcome = |e: &Value| {
        let e: likes::aggregate::records::StreamEvent = serde_json::from_value(e.clone()).unwrap();
        let app = t.stack.app.clone();
        async move { app.aggregate.handle(&e, None).await.unwrap() }
    };
    assert!(outcome(&again).await.out_of_order);
    assert!(!outcome(&in_order).await.out_of_order);
    let counted: f64 = t
        .stack
        .config
        .metrics
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|d| d["Function"] == "aggregate")
        .filter_map(|d| d["AggregateBatchesOutOfOrder"].as_f64())
        .sum();
    assert!(counted >= 1.0, "AggregateBatchesOutOfOrder was not written");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_delivered_again_reversed_with_newer_records_counts_once() {
    let t = stack().await;
    deliver(&t, &batch("s1", &[like(10, "u", "a"), like(20, "u", "b")])).await;
    // Lambda delivers the batch again, reversed, with two newer records.
    let reversed = batch(
        "s1",
        &[
            like(40, "v", "a"),
            like(30, "u", "c"),
            like(20, "u", "b"),
            like(10, "u", "a"),
        ],
    );
    deliver(&t, &reversed).await;
    deliver(&t, &reversed).await;
    assert_eq!(
        (
            t.shard_sum("a").await,
            t.shard_sum("b").await,
            t.shard_sum("c").await
        ),
        (2, 1, 1)
    );
    assert_eq!(checkpoint(&t, "s1").await, Some(padded(40)));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_repeated_inside_one_batch_counts_once() {
    let t = stack().await;
    // Repeated side by side: one chunk would add it twice.
    deliver(
        &t,
        &batch(
            "s1",
            &[like(10, "u", "a"), like(10, "u", "a"), like(20, "u", "b")],
        ),
    )
    .await;
    assert_eq!((t.shard_sum("a").await, t.shard_sum("b").await), (1, 1));
    // Repeated after another reel's record: a chunk of its own.
    deliver(
        &t,
        &batch(
            "s2",
            &[like(10, "u", "c"), like(20, "u", "d"), like(10, "u", "c")],
        ),
    )
    .await;
    assert_eq!((t.shard_sum("c").await, t.shard_sum("d").await), (1, 1));
    assert_eq!(checkpoint(&t, "s2").await, Some(padded(20)));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_like_and_its_unlike_delivered_reversed_cancel_out() {
    let t = stack().await;
    // u liked a (…10) and unliked it (…30); v liked b between them.
    let reversed = batch(
        "s1",
        &[unlike(30, "u", "a"), like(20, "v", "b"), like(10, "u", "a")],
    );
    deliver(&t, &reversed).await;
    deliver(&t, &reversed).await;
    assert_eq!((t.shard_sum("a").await, t.shard_sum("b").await), (0, 1));
    // The pair alone, in one chunk.
    let pair = batch("s2", &[unlike(30, "u", "c"), like(10, "u", "c")]);
    deliver(&t, &pair).await;
    deliver(&t, &pair).await;
    assert_eq!(t.shard_sum("c").await, 0);
    assert_eq!(checkpoint(&t, "s2").await, Some(padded(30)));
    t.stop().await;
}

/// A transaction of stream shard `key` moving its checkpoint from
/// `expected` to `next` (raw sequence numbers), adding nothing.
fn moving(key: &str, expected: Option<&str>, next: &str) -> ChunkWrite {
    let pad = |s: &str| {
        likes::aggregate::records::SequenceNumber::parse(s)
            .unwrap()
            .padded()
            .to_owned()
    };
    let expected = expected.map(pad);
    let next = pad(next);
    ChunkWrite {
        checkpoint_key: key.to_owned(),
        shard_id: "s1".into(),
        token: RequestToken::for_fields("test", &[key, expected.as_deref().unwrap_or("-"), &next]),
        expected,
        next,
        adds: Vec::new(),
        records: 1,
        now_ms: 1,
        expires_at: 4_000_000_000,
        width_ms: 1_000,
        tail_width_ms: 1_000,
        tail_keep_ms: 0,
        prune: Vec::new(),
        window_prune: Vec::new(),
        sketch: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_item_refuses_to_move_back() {
    let t = stack().await;
    let store = t.stack.app.aggregate.store();
    let key = likes::keys::aggregate_checkpoint_key(ARN, "s1");
    let at = |s: &str| Some(format!("{s:0>40}"));
    assert_eq!(
        store.apply_chunk(&moving(&key, None, "100")).await.unwrap(),
        ChunkResult::Applied
    );
    // 99 < 100 as numbers, though "99" > "100" as text: the padded form
    // compares as the number in the condition.
    assert_eq!(
        store
            .apply_chunk(&moving(&key, Some("100"), "99"))
            .await
            .unwrap(),
        ChunkResult::CheckpointMoved,
        "a move back is refused"
    );
    assert_eq!(store.checkpoint(&key).await.unwrap().seq, at("100"));
    assert_eq!(
        store
            .apply_chunk(&moving(&key, Some("100"), "100"))
            .await
            .unwrap(),
        ChunkResult::CheckpointMoved,
        "a move to itself is refused"
    );
    assert_eq!(
        store
            .apply_chunk(&moving(&key, Some("100"), "1000"))
            .await
            .unwrap(),
        ChunkResult::Applied,
        "a move forward is taken"
    );
    assert_eq!(store.checkpoint(&key).await.unwrap().seq, at("1000"));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_that_change_no_count_take_no_reels_place() {
    let t = stack().await;
    // Rows written by transactional mode (no stream mark: their own
    // transactions counted them), each on its own reel, then one like.
    let mut records: Vec<Value> = (1..=20)
        .map(|n| {
            let mut r = like(n, "old", &format!("old{n}"));
            r["dynamodb"]["NewImage"]
                .as_object_mut()
                .unwrap()
                .remove("cm");
            r
        })
        .collect();
    records.push(like(21, "new", "fresh"));
    let event: likes::aggregate::records::StreamEvent =
        serde_json::from_value(batch("s1", &records)).unwrap();
    let out = t.stack.app.aggregate.handle(&event, None).await.unwrap();
    assert_eq!(
        (out.applied, out.chunks),
        (21, 1),
        "one transaction, although a transaction holds one reel"
    );
    assert_eq!(t.shard_sum("fresh").await, 1);
    assert_eq!(t.shard_sum("old1").await, 0);
    assert_eq!(checkpoint(&t, "s1").await, Some(padded(21)));
    t.stop().await;
}
