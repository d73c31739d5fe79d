//! Stream mode's aggregation against resizes (issue 21, point 2): a chunk
//! transaction touches only the checkpoint and the shard items it adds to,
//! never the reel's settings item, and a shard a shrink retired refuses
//! it instead. Batches go to the aggregate function's entry point against
//! the embedded emulator, the resizes through the resharder:
//!
//! * two stream shards aggregating one reel and a resize writing its
//!   settings, all at once under the fault proxy's conflict model: nothing
//!   waits on anything else;
//! * a chunk planned before a shrink and sent after it is refused, planned
//!   again with the new settings, and counted once (on a shard that held
//!   likes before the shrink, and on one that never had an item);
//! * after a shrink and a grow back, aggregations land on the reopened
//!   shards and readers count them.

mod common;

use common::TestStack;
use common::stream_events::{ARN, batch_of, deliver};
use likes::aggregate::counter_shard;
use likes::keys::{self, ReelId};
use likes::reshard::{Progress, Resharder};
use likes::store::dynamodb::DynamoStore;
use likes::store::{AggregateStore, ChunkAdd, ChunkResult, ChunkWrite, CounterStore, RecentAdd};
use likes::token::RequestToken;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Stream mode with the resize waits shortened (as in `strays.rs`).
const ENV: &[(&str, &str)] = &[
    ("COUNTING", "stream"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("AUTO_RESHARD", "off"),
    ("AGGREGATE_CHUNK_REELS", "1"),
    ("SETTINGS_TTL_MS", "100"),
    ("CACHE_TTL_MS", "0"),
    ("REQUEST_TIMEOUT_MS", "1000"),
    ("REQUEST_BUDGET_MS", "800"),
    ("RESIZE_MARGIN_MS", "0"),
    ("DDB_OPERATION_TIMEOUT_MS", "1000"),
    ("RESHARD_MAX_WAIT_MS", "5000"),
];

async fn stack(extra: &[(&str, &str)]) -> TestStack {
    let mut env = ENV.to_vec();
    env.extend_from_slice(extra);
    let t = TestStack::start(&env).await;
    // Only the batches a test hands over reach the aggregator.
    t.stack.streams[0].pause(true);
    t
}

fn seq(n: u64) -> String {
    (100_000_000_000_000_000_000u128 + u128::from(n)).to_string()
}

/// Stream shard `shard`'s batch: one like of `reel` per (sequence, user).
fn batch(shard: &str, reel: &str, likes: &[(u64, &str)]) -> Value {
    let records: Vec<Value> = likes
        .iter()
        .map(|(n, user)| {
            let keys = json!({"user_id": {"S": user}, "reel_id": {"S": reel}});
            json!({
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "eventSourceARN": ARN,
                "dynamodb": {
                    "Keys": keys,
                    "NewImage": {"user_id": {"S": user}, "reel_id": {"S": reel}, "cm": {"S": "s"}},
                    "SequenceNumber": seq(*n),
                    "ApproximateCreationDateTime": 1_800_000_000u64,
                    "StreamViewType": "NEW_IMAGE",
                },
            })
        })
        .collect();
    batch_of(shard, &records)
}

/// A stream shard id whose chunks add to shard `want` of a reel writing
/// to `shards` shards, other than those in `not`.
fn stream_shard(want: u32, shards: u32, not: &[&str]) -> String {
    (0..10_000)
        .map(|i| format!("shardId-{i:05}"))
        .find(|id| {
            !not.contains(&id.as_str())
                && counter_shard(&keys::aggregate_checkpoint_key(ARN, id), shards, 0) == want
        })
        .expect("some stream shard maps there")
}

async fn drive(r: &Resharder<DynamoStore>, reel: &ReelId) {
    let started = Instant::now();
    loop {
        match r.advance(reel).await.expect("advance") {
            Progress::Stable(_) => return,
            Progress::Waiting { .. } => tokio::time::sleep(Duration::from_millis(100)).await,
            Progress::Interrupted => unreachable!("no limit"),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "resize stuck");
    }
}

/// Whether shard `shard` of `reel` is a retired shard's tombstone.
async fn closed(t: &TestStack, reel: &str, shard: u32) -> bool {
    t.stack
        .client
        .get_item()
        .table_name(&t.stack.config.counters_table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("{shard:03}#reel#{reel}#likes")),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .is_some_and(|i| i.contains_key("closed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregations_of_one_reel_and_its_resize_do_not_wait_on_each_other() {
    // The proxy's conflict model: each transaction holds its items 1.5 s
    // after its answer, as a slow one in flight would.
    let t = stack(&[("FAULTS", "seed=21,conflict_hold_ms=1500")]).await;
    t.set_shards("pop", 4, 4).await;
    let a = stream_shard(0, 4, &[]);
    let b = stream_shard(1, 4, &[]);
    let started = Instant::now();
    deliver(&t, &batch(&a, "pop", &[(10, "u1")])).await;
    // Another stream shard's chunk for the same reel, and the resharder
    // writing the reel's settings, while the first chunk holds its items.
    deliver(&t, &batch(&b, "pop", &[(10, "u2")])).await;
    let id = ReelId::parse("pop").unwrap();
    t.stack.app.reshard.begin(&id, 8).await.expect("grow");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "inside the hold"
    );
    let s = t.stack.proxy.as_ref().expect("FAULTS").stats();
    let m = &s.modeled_conflicts;
    assert!(m.holds >= 2, "{m:?}");
    assert!(m.refused.is_empty(), "nothing met a held item: {m:?}");
    assert_eq!(t.shards("pop").await, vec![(0, 1), (1, 1)]);
    t.stop().await;
}

/// A chunk of stream shard `key` adding `delta` to `shard` of `reel`,
/// moving its checkpoint from `from` to `to`.
fn stale_chunk(key: &str, reel: &str, shard: u32, from: Option<u64>, to: u64) -> ChunkWrite {
    let pad = |n: u64| format!("{:0>40}", seq(n));
    ChunkWrite {
        checkpoint_key: key.to_owned(),
        shard_id: "stale".into(),
        token: RequestToken::for_fields("test-stale", &[key, reel, &to.to_string()]),
        expected: from.map(pad),
        next: pad(to),
        adds: vec![ChunkAdd {
            reel: ReelId::parse(reel).unwrap(),
            shard,
            delta: 1,
            recent: vec![RecentAdd {
                start_ms: 1_000,
                delta: 1,
                removals: 0,
            }],
        }],
        records: 1,
        now_ms: 1,
        expires_at: 4_000_000_000,
        width_ms: 250,
        prune: vec![500],
        turn: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_planned_before_a_shrink_is_refused_after_it_and_counted_once() {
    let t = stack(&[]).await;
    let r = &t.stack.app.reshard;
    let store = t.stack.app.aggregate.store();
    // "held": shard 3 takes likes before the shrink; "bare": it never has
    // an item, and the stale chunk would be the first to create one.
    for reel in ["held", "bare"] {
        t.set_shards(reel, 4, 4).await;
    }
    let s3 = stream_shard(3, 4, &[]);
    let key = keys::aggregate_checkpoint_key(ARN, &s3);
    deliver(&t, &batch(&s3, "held", &[(10, "u1"), (11, "u2")])).await;
    assert_eq!(t.shards("held").await, vec![(3, 2)]);
    // Planned now, under four write shards: shard 3 of each reel.
    let held = stale_chunk(&key, "held", 3, Some(11), 12);
    let other = keys::aggregate_checkpoint_key(ARN, "bare-shard");
    let bare = stale_chunk(&other, "bare", 3, None, 10);
    for reel in ["held", "bare"] {
        let id = ReelId::parse(reel).unwrap();
        r.begin(&id, 1).await.expect("shrink");
        drive(r, &id).await;
        let s = store.settings(std::slice::from_ref(&id)).await.unwrap()[&id];
        assert_eq!((s.write_shards, s.read_shards), (1, 1));
        assert!(closed(&t, reel, 3).await, "{reel}: shard 3 retired");
    }
    // Sent after the shrink: refused, nothing written.
    for write in [&held, &bare] {
        assert_eq!(
            store.apply_chunk(write).await.unwrap(),
            ChunkResult::SettingsChanged
        );
    }
    assert_eq!(t.shard_sum("bare").await, 0);
    // Lambda delivers them again: planned with the new settings, counted.
    deliver(
        &t,
        &batch(&s3, "held", &[(10, "u1"), (11, "u2"), (12, "u3")]),
    )
    .await;
    deliver(&t, &batch("bare-shard", "bare", &[(10, "u1")])).await;
    assert_eq!(t.http_count("held").await, 3);
    assert_eq!(t.http_count("bare").await, 1);
    assert_eq!(
        (t.shard_sum("held").await, t.shard_sum("bare").await),
        (3, 1)
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_shrink_and_a_grow_back_aggregations_land_and_are_read() {
    let t = stack(&[]).await;
    let r = &t.stack.app.reshard;
    let id = ReelId::parse("again").unwrap();
    t.set_shards("again", 4, 4).await;
    let s3 = stream_shard(3, 4, &[]);
    deliver(&t, &batch(&s3, "again", &[(10, "u1")])).await;
    r.begin(&id, 1).await.expect("shrink");
    drive(r, &id).await;
    assert!(closed(&t, "again", 3).await);
    assert_eq!(t.http_count("again").await, 1);
    r.begin(&id, 4).await.expect("grow");
    drive(r, &id).await;
    for s in 1..4 {
        assert!(!closed(&t, "again", s).await, "shard {s} reopened");
    }
    // The same stream shard adds to shard 3 again, and readers count it.
    deliver(&t, &batch(&s3, "again", &[(11, "u2"), (12, "u3")])).await;
    assert_eq!(t.shards("again").await, vec![(1, 0), (2, 0), (3, 2)]);
    assert_eq!(t.http_count("again").await, 3);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_shard_cancelled_by_a_conflict_moves_to_the_next_shard_and_stays() {
    use likes::aggregate::Aggregator;
    use likes::aggregate::records::StreamEvent;
    // Each transaction holds its items 1.5 s past its answer.
    let t = stack(&[("FAULTS", "seed=22,conflict_hold_ms=1500")]).await;
    t.set_shards("pop", 4, 4).await;
    // Two stream shards whose home is the same shard of the reel.
    let a = stream_shard(0, 4, &[]);
    let b = stream_shard(0, 4, &[&a]);
    let started = Instant::now();
    deliver(&t, &batch(&a, "pop", &[(10, "u1")])).await;
    // b's first attempt meets a's held item, is cancelled, and its retry
    // goes to the next shard instead of waiting for the hold to end.
    deliver(&t, &batch(&b, "pop", &[(10, "u2")])).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "b did not wait out a's hold"
    );
    assert_eq!(t.shards("pop").await, vec![(0, 1), (1, 1)]);
    let store = t.stack.app.aggregate.store();
    let key = keys::aggregate_checkpoint_key(ARN, &b);
    assert_eq!(store.checkpoint(&key).await.unwrap().turn, 1);
    // b's next batch, taken by another instance (nothing in memory) once
    // the holds ended, goes where b went: the turn is on its checkpoint.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let other = Aggregator::new(store.clone(), &t.stack.config);
    let next: StreamEvent =
        serde_json::from_value(batch(&b, "pop", &[(10, "u2"), (11, "u3")])).unwrap();
    let out = other.handle(&next, None).await.expect("applied");
    assert_eq!((out.applied, out.retries), (1, 0), "{out:?}");
    assert_eq!(t.shards("pop").await, vec![(0, 1), (1, 2)]);
    assert_eq!(t.http_count("pop").await, 3);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_shards_meeting_on_a_reel_double_its_shards() {
    use likes::store::Phase;
    // Before: the aggregator moved on to another shard and nothing else,
    // so a reel written by more stream shards than it has shards kept two
    // or more of them on each shard, meeting whenever their batches came at
    // the same moment (7.6 % of stream-scale's transactions conflicted).
    let t = stack(&[
        ("FAULTS", "seed=23,conflict_hold_ms=1500"),
        ("AUTO_RESHARD", "on"),
        ("CONTENTION_GROW_EVENTS", "2"),
    ])
    .await;
    t.set_shards("pop", 4, 4).await;
    let pop = ReelId::parse("pop").unwrap();
    let a = stream_shard(0, 4, &[]);
    let b = stream_shard(0, 4, &[&a]);
    let c = stream_shard(0, 4, &[&a, &b]);
    deliver(&t, &batch(&a, "pop", &[(10, "u1")])).await;
    // One stream shard meeting another is not a crowd yet.
    deliver(&t, &batch(&b, "pop", &[(10, "u2")])).await;
    let s = t.stack.app.reshard.state(&pop).await.unwrap();
    assert_eq!(
        (s.phase, s.read_shards, s.write_shards),
        (Phase::Stable, 4, 4)
    );
    // A second one is: the reel's shards double, readers first.
    deliver(&t, &batch(&c, "pop", &[(10, "u3")])).await;
    let s = t.stack.app.reshard.state(&pop).await.unwrap();
    assert_eq!(
        (s.phase, s.read_shards, s.write_shards),
        (Phase::Growing, 8, 4)
    );
    drive(&t.stack.app.reshard, &pop).await;
    let s = t.stack.app.reshard.state(&pop).await.unwrap();
    assert_eq!(
        (s.phase, s.read_shards, s.write_shards),
        (Phase::Stable, 8, 8)
    );
    assert_eq!(t.http_count("pop").await, 3);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_shards_in_instances_of_their_own_still_make_a_crowd() {
    use likes::aggregate::Aggregator;
    use likes::aggregate::records::StreamEvent;
    use likes::store::Phase;
    // On Lambda each stream shard's batches run in whichever instance is
    // free. Before, the crowd was counted in each instance's memory, so
    // three stream shards meeting on a reel, each in an instance of its
    // own, were never a crowd (issue 35: a reel at one shard stayed there,
    // 84 % of the aggregator's transactions conflicting).
    let t = stack(&[
        ("FAULTS", "seed=23,conflict_hold_ms=1500"),
        ("AUTO_RESHARD", "on"),
        ("CONTENTION_GROW_EVENTS", "2"),
    ])
    .await;
    t.set_shards("pop", 4, 4).await;
    let pop = ReelId::parse("pop").unwrap();
    let a = stream_shard(0, 4, &[]);
    let b = stream_shard(0, 4, &[&a]);
    let c = stream_shard(0, 4, &[&a, &b]);
    let store = t.stack.app.aggregate.store();
    let mut users = 0;
    for shard in [&a, &b, &c] {
        // A cold start for each: nothing shared but the tables.
        let instance = Aggregator::new(store.clone(), &t.stack.config);
        users += 1;
        let event: StreamEvent =
            serde_json::from_value(batch(shard, "pop", &[(10, &format!("u{users}"))])).unwrap();
        let out = instance.handle(&event, None).await.expect("applied");
        assert_eq!(out.applied, 1, "{out:?}");
    }
    let s = t.stack.app.reshard.state(&pop).await.unwrap();
    assert_eq!(
        (s.phase, s.read_shards, s.write_shards),
        (Phase::Growing, 8, 4),
        "two stream shards met a third's transaction, in three instances"
    );
    // The crowd was claimed once: a fourth instance meeting the reel while
    // it is quiet asks for nothing more.
    drive(&t.stack.app.reshard, &pop).await;
    let d = stream_shard(0, 4, &[&a, &b, &c]);
    let instance = Aggregator::new(store.clone(), &t.stack.config);
    let event: StreamEvent = serde_json::from_value(batch(&d, "pop", &[(10, "u9")])).unwrap();
    instance.handle(&event, None).await.expect("applied");
    let s = t.stack.app.reshard.state(&pop).await.unwrap();
    assert_eq!(
        (s.phase, s.read_shards, s.write_shards),
        (Phase::Stable, 8, 8)
    );
    assert_eq!(t.http_count("pop").await, 4);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cool_reel_keeps_a_shard_for_each_stream_shard_still_writing_it() {
    // Before: the schedule read the shards' `w` as likes a second, but in
    // stream mode it counts chunks, about one a second per stream shard
    // carrying the reel: far below COOL_LIKES_PER_SEC however viral the
    // reel, so the shards the aggregator grew for its stream shards were
    // folded back to one every COOL_DOWN_SECS (this test's second run
    // started that shrink).
    let t = stack(&[
        ("AUTO_RESHARD", "on"),
        ("COOL_DOWN_SECS", "0"),
        ("COOL_LIKES_PER_SEC", "1000"),
        ("HOT_LIKES_PER_SEC", "2000"),
        ("MAX_SHARDS", "64"),
    ])
    .await;
    let pop = ReelId::parse("pop").unwrap();
    let r = &t.stack.app.reshard;
    r.begin(&pop, 8).await.expect("grow");
    drive(r, &pop).await;
    // The first run only takes a sample of `w`.
    assert_eq!(r.run_scheduled(None).await.unwrap().shrinks_started, 0);
    // Eight stream shards, each with two batches of the reel: 16 chunks,
    // more than 4 a second unless the two runs are 4 s apart (they are
    // well under one): the reel keeps at least 8 shards.
    let mut likes = 0;
    for n in 1..=2u64 {
        for i in 0..8u64 {
            let shard = format!("shardId-{i:05}");
            deliver(&t, &batch(&shard, "pop", &[(n, &format!("u{i}-{n}"))])).await;
            likes += 1;
        }
    }
    let summary = r.run_scheduled(None).await.unwrap();
    assert_eq!(summary.shrinks_started, 0, "{summary:?}");
    let s = r.state(&pop).await.unwrap();
    assert_eq!((s.read_shards, s.write_shards), (8, 8), "{s:?}");
    // Quiet now (no chunk since the last sample): it folds back to one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let summary = r.run_scheduled(None).await.unwrap();
    assert_eq!(summary.shrinks_started, 1, "{summary:?}");
    drive(r, &pop).await;
    let s = r.state(&pop).await.unwrap();
    assert_eq!((s.read_shards, s.write_shards), (1, 1), "{s:?}");
    assert_eq!(t.http_count("pop").await, likes);
    t.stop().await;
}
