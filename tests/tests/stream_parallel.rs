//! Issue 35: what two batches of one stream shard at once (a
//! `ParallelizationFactor` above 1) do to an aggregator, and why the design
//! refuses them rather than being exact with them.
//!
//! Each aggregator (the likes one here; the views one applies its records
//! through the same core) keeps one checkpoint per stream shard: a
//! high-water mark, the highest sequence number applied, every record at or
//! below it taken as applied. That is exact when one batch of a shard is in
//! flight at a time (a batch handed over again, in any order, is applied
//! sorted above the checkpoint). With two at once, Lambda splits a shard's
//! records between concurrent batches by partition key, so their sequence
//! numbers interleave: the batch applied second skips each of its records
//! below the other's last, silently. The measurement: batch A = …10, …30,
//! …50, then batch B = …20, …40, …60, six likes of one reel: 4 counted.
//!
//! So the factor is 1 by construction: one template parameter bounded to 1
//! and refused otherwise by a rule (both event sources take it), the
//! functions refusing `BATCHES_PER_STREAM_SHARD` other than 1 at start-up,
//! and the local event sources refusing a template that says otherwise
//! (tests/tests/template.rs,
//! `every_stream_event_source_takes_one_batch_per_shard_from_one_parameter`).
//!
//! Not built, noted: the aggregator could detect such a batch cheaply, one
//! whose first record is below the checkpoint while later ones are above
//! it, and which was never applied. A redelivered batch looks the same
//! (its applied head below the checkpoint, newer records appended), so
//! telling them apart needs one more value in the checkpoint item: where
//! the last applied batch began (a batch starting below that is a
//! redelivery of it or older; one starting between it and the checkpoint
//! was never seen). It would turn the silent loss into a refused batch and
//! an alarm, not into an exact count.

mod common;

use common::TestStack;
use common::stream_events::{ARN, batch_of as batch, deliver};
use serde_json::{Value, json};

const ENV: &[(&str, &str)] = &[
    ("COUNTING", "stream"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("AUTO_RESHARD", "off"),
    ("METRICS", "memory"),
];

/// A stream sequence number of the usual 21+ digits, `n` after a base.
fn seq(n: u64) -> String {
    (100_000_000_000_000_000_000u128 + u128::from(n)).to_string()
}

/// A stream record: `user` liked `reel` (an INSERT written in stream mode).
fn like(n: u64, user: &str, reel: &str) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    json!({
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "eventSourceARN": ARN,
        "dynamodb": {
            "Keys": {"user_id": {"S": user}, "reel_id": {"S": reel}},
            "NewImage": {"user_id": {"S": user}, "reel_id": {"S": reel}, "cm": {"S": "s"}},
            "SequenceNumber": seq(n),
            "ApproximateCreationDateTime": now,
            "StreamViewType": "NEW_IMAGE",
        },
    })
}

/// Six likes of one reel on one stream shard: in one shard's order (one
/// batch at a time) all six count; split between two batches with
/// interleaved sequence numbers, as two batches at once would have them,
/// four do. The design refuses the setting that leads there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batches_of_one_shard_at_once_skip_records_so_they_are_refused() {
    let t = TestStack::start(ENV).await;
    // Only the batches handed over here reach the aggregator.
    t.stack.streams[0].pause(true);

    // One batch per shard at a time: …10 to …30, then …40 to …60.
    let first = [(10, "u1"), (20, "u2"), (30, "u3")];
    let then = [(40, "u4"), (50, "u5"), (60, "u6")];
    let of = |recs: &[(u64, &str)], reel: &str| -> Vec<Value> {
        recs.iter().map(|(n, u)| like(*n, u, reel)).collect()
    };
    deliver(&t, &batch("s1", &of(&first, "in-order"))).await;
    deliver(&t, &batch("s1", &of(&then, "in-order"))).await;
    assert_eq!(t.shard_sum("in-order").await, 6);

    // Two batches of one shard at once: A = …10, …30, …50 applied first,
    // moving the checkpoint to …50; B = …20, …40, …60 then counts only
    // …60.
    let a = [(10, "u1"), (30, "u3"), (50, "u5")];
    let b = [(20, "u2"), (40, "u4"), (60, "u6")];
    deliver(&t, &batch("s2", &of(&a, "parallel"))).await;
    deliver(&t, &batch("s2", &of(&b, "parallel"))).await;
    assert_eq!(
        t.shard_sum("parallel").await,
        4,
        "the high-water checkpoint skips B's records below A's last: \
         if this is exact now, the design (and issue 35's refusals) can change"
    );

    // Which is why nothing deploys or starts with it: the functions refuse
    // the factor, as the template and the local event sources do.
    let env = |k: &str| match k {
        "COUNTERS_TABLE" => Some("counters".to_owned()),
        "LIKES_TABLE" => Some("likes".to_owned()),
        "BATCHES_PER_STREAM_SHARD" => Some("2".to_owned()),
        _ => None,
    };
    let refused = likes::Config::from_lookup(env).unwrap_err().to_string();
    assert!(refused.contains("high-water mark"), "{refused}");
    t.stop().await;
}
