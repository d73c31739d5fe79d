//! Stream mode's aggregator when Lambda delivers a batch again out of
//! order. AWS documents it for streams with tumbling windows (the Lambda
//! developer guide, "Using tumbling windows" for DynamoDB Streams): *Records
//! are always processed in order the first time. If records are processed
//! more than once, they might be processed out of order.* And this design
//! has records processed more than once routinely (`batchItemFailures`,
//! function errors, bisection).
//!
//! * the checkpoint item refuses a transaction that would move it back.

mod common;

use common::TestStack;
use likes::store::{AggregateStore, ChunkResult, ChunkWrite};
use likes::token::RequestToken;

const ENV: &[(&str, &str)] = &[
    ("COUNTING", "stream"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("AUTO_RESHARD", "off"),
    ("AGGREGATE_CHUNK_REELS", "1"),
    ("METRICS", "memory"),
];

const ARN: &str =
    "arn:aws:dynamodb:us-east-1:123456789012:table/likes-LikesTable/stream/2026-12-01T00:00:00.000";

/// A stack whose own event source is held back: only the batches a test
/// hands over reach the aggregator.
async fn stack() -> TestStack {
    let t = TestStack::start(ENV).await;
    t.stack.streams[0].pause(true);
    t
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
    assert_eq!(store.checkpoint(&key).await.unwrap(), at("100"));
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
    assert_eq!(store.checkpoint(&key).await.unwrap(), at("1000"));
    t.stop().await;
}
