//! Stream mode's writer items (issue 35: no cross-shard conflicts by
//! construction, reads bounded at any age). Each stream shard adds to an
//! item of its own per reel; readers sum the reel's partition and fold
//! quiet items into its base.
//!
//! * eight stream shards, each in an instance of its own, counting a long
//!   tail of cold reels and a viral one under the fault proxy's conflict
//!   model: no transaction meets another stream shard's (what conflicts
//!   is a stream shard's own invocations overlapping, on its checkpoint),
//!   and every reel is exact. With
//!   shared shard items (before), chunks of different stream shards met on
//!   the reels' shards: the same load conflicted;
//! * a reel counted by many stream shards (as after many rolls): once their
//!   items are quiet, a read folds them into the base, and the reel is read
//!   from one item, exactly; a stream shard writing again after the fold
//!   recreates its item with its new likes alone;
//! * folds racing each other and the stream shards' own chunks: every like
//!   counted once;
//! * a reel counted only in writer items, its rows all gone, is met by
//!   reconciliation's scan and corrected;
//! * a reel whose writer items are written faster than `HOT_LIKES_PER_SEC`
//!   a second is spread over several partition keys: the base names them
//!   first, the stream shards then write there, and every read sums them
//!   all, exactly, across a redelivery and a fold.

mod common;

use common::TestStack;
use common::stream_events::{ARN, batch_of, deliver};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn seq(n: u64) -> String {
    (100_000_000_000_000_000_000u128 + u128::from(n)).to_string()
}

/// Stream shard `shard`'s batch: one like of `reel` per (sequence, user).
fn batch(shard: &str, reel: &str, likes: &[(u64, String)]) -> Value {
    batch_at(shard, reel, likes, 1_800_000_000)
}

/// The same, the records stamped `created` (Unix seconds).
fn batch_at(shard: &str, reel: &str, likes: &[(u64, String)], created: u64) -> Value {
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
                    "ApproximateCreationDateTime": created,
                    "StreamViewType": "NEW_IMAGE",
                },
            })
        })
        .collect();
    batch_of(shard, &records)
}

/// Stream mode, the stream's own source paused (only the batches a test
/// hands over count), a settle time of 1 s (writer items quiet for that
/// long are folded), and no cache in front of the reads.
async fn paused() -> TestStack {
    paused_with(&[]).await
}

/// [`paused`], with `extra` settings besides.
async fn paused_with(extra: &[(&str, &str)]) -> TestStack {
    let mut env = vec![
        ("COUNTING", "stream"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("RECONCILE_STREAM_SETTLE_SECS", "1"),
        ("CACHE_TTL_MS", "0"),
        ("STREAM_VISIBLE_MS", "0"),
    ];
    env.extend_from_slice(extra);
    let t = TestStack::start(&env).await;
    t.stack.streams[0].pause(true);
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_shards_in_instances_of_their_own_never_meet_on_an_item() {
    let t = TestStack::start(&[
        ("COUNTING", "stream"),
        ("LOCAL_STREAM_SHARDS", "8"),
        ("LOCAL_STREAM_INSTANCES", "per-shard"),
        ("FAULTS", "seed=9,conflict_hold_ms=30"),
        ("LOCAL_SCHEDULE_SECS", "0"),
    ])
    .await;
    // 48 users at a time, each liking the viral reel and four of 150 cold
    // ones: every stream shard's chunks carry the viral reel and dozens of
    // cold reels that other stream shards carry too.
    for wave in 0..8 {
        futures::future::join_all((0..48).map(|i| {
            let user = format!("u{wave}-{i}");
            let t = &t;
            async move {
                let mut reels = vec!["viral".to_owned()];
                reels.extend((0..4).map(|k| format!("c{}", ((wave * 48 + i) * 7 + k * 37) % 150)));
                for reel in reels {
                    let r = t.like(&user, &reel).await;
                    assert_eq!(r.status, 200, "{:?}", r.body);
                }
            }
        }))
        .await;
    }
    common::drained(&t, Duration::from_secs(90)).await;
    let proxy = t.stack.proxy.as_ref().expect("FAULTS");
    let modeled = proxy.stats().modeled_conflicts;
    let conflicts = modeled.total();
    // What was held when a transaction was refused: a stream shard's own
    // invocations overlapping (a batch handed over again while the first
    // still runs) both hold its checkpoint; another stream shard never
    // holds it, nor any item it writes.
    let on_checkpoints: u64 = modeled
        .refused_on
        .iter()
        .filter(|(item, _)| item.contains("agg#"))
        .map(|(_, n)| n)
        .sum();
    // The truth, reel by reel, from the like rows.
    let mut truth: BTreeMap<String, i64> = BTreeMap::new();
    for row in t.scan(&t.stack.config.likes_table).await {
        if let Some(r) = row.get("reel_id").and_then(|v| v.as_s().ok()) {
            *truth.entry(r.clone()).or_default() += 1;
        }
    }
    assert!(truth.len() > 100, "a long tail: {} reels", truth.len());
    for (reel, n) in &truth {
        assert_eq!(t.http_count(reel).await, *n, "{reel}");
    }
    assert_eq!(
        conflicts, on_checkpoints,
        "every refused transaction met its own stream shard's, on its checkpoint; \
         none met another stream shard's: {:?}",
        modeled.refused_on
    );
    // Every stream shard counted the viral reel on an item of its own.
    let viral = t.writers("viral").await;
    assert!(viral.len() >= 4, "{viral:?}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_writer_items_are_folded_and_the_reel_read_from_its_base() {
    let t = paused().await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Twelve stream shards (as after many rolls of a few), three likes each.
    for s in 0..12u64 {
        let likes: Vec<(u64, String)> = (0..3).map(|i| (s * 10 + i, format!("u{s}-{i}"))).collect();
        deliver(&t, &batch_at(&format!("shard-{s:02}"), "r", &likes, now)).await;
    }
    assert_eq!(t.writers("r").await.len(), 12);
    // Read at once: the items are not quiet yet, nothing is folded.
    assert_eq!(t.http_count("r").await, 36);
    assert_eq!(t.like_windows("r").await, [36; 3]);
    assert_eq!(t.writers("r").await.len(), 12);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    // Quiet now: the read folds them, and answers the same; the windowed
    // counts' buckets went into the base with the counts.
    assert_eq!(t.http_count("r").await, 36);
    let items = t.writers("r").await;
    assert_eq!(items, [("~base".to_owned(), 36)], "folded into the base");
    assert_eq!(t.http_count("r").await, 36);
    assert_eq!(t.like_windows("r").await, [36; 3]);
    // A stream shard that writes again creates its item anew, with its new
    // like alone.
    deliver(
        &t,
        &batch_at("shard-03", "r", &[(1_000, "late".into())], now),
    )
    .await;
    assert_eq!(t.http_count("r").await, 37);
    assert_eq!(t.like_windows("r").await, [37; 3]);
    let items = t.writers("r").await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(items.contains(&("~base".to_owned(), 36)), "{items:?}");
    // Records it applied before the fold, delivered again: skipped by its
    // checkpoint, not counted a second time.
    let likes: Vec<(u64, String)> = (0..3).map(|i| (30 + i, format!("u3-{i}"))).collect();
    deliver(&t, &batch_at("shard-03", "r", &likes, now)).await;
    assert_eq!(t.http_count("r").await, 37);
    assert_eq!(t.like_windows("r").await, [37; 3]);
    // A like the stream recorded two days ago (a late batch): in the count
    // and the week, not in the last hour or day.
    deliver(
        &t,
        &batch_at("shard-04", "r", &[(2_000, "old".into())], now - 2 * 86_400),
    )
    .await;
    assert_eq!(t.http_count("r").await, 38);
    assert_eq!(t.like_windows("r").await, [37, 37, 38]);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn folds_racing_each_other_and_the_stream_count_every_like_once() {
    let t = paused().await;
    let mut next = [0u64; 40];
    let mut total = 0i64;
    for (s, n) in next.iter_mut().enumerate() {
        let likes: Vec<(u64, String)> = (0..2).map(|i| (i, format!("a{s}-{i}"))).collect();
        deliver(&t, &batch(&format!("shard-{s:02}"), "hot", &likes)).await;
        *n = 2;
        total += 2;
    }
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    // Eight readers folding at once, while ten of the stream shards write
    // again: each fold lands whole or not at all.
    let readers = futures::future::join_all((0..8).map(|_| t.http_count("hot")));
    let writers = futures::future::join_all((0..10usize).map(|s| {
        let likes: Vec<(u64, String)> =
            (0..3).map(|i| (next[s] + i, format!("b{s}-{i}"))).collect();
        let event = batch(&format!("shard-{s:02}"), "hot", &likes);
        let t = &t;
        async move { deliver(t, &event).await }
    }));
    let (counts, _) = tokio::join!(readers, writers);
    total += 30;
    for c in counts {
        assert!((80..=total).contains(&c), "a read between: {c}");
    }
    // Whatever was folded, by whom: every like once.
    assert_eq!(t.http_count("hot").await, total);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(t.http_count("hot").await, total);
    let items = t.writers("hot").await;
    assert!(items.len() <= 3, "folded down: {items:?}");
    assert_eq!(items.iter().map(|(_, n)| n).sum::<i64>(), total);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_meets_a_reel_counted_only_in_writer_items() {
    let t = TestStack::start(&[
        ("COUNTING", "stream"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("RECONCILE_STREAM_SETTLE_SECS", "1"),
        ("RECONCILE_CLOCK_SKEW_MS", "0"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("DDB_OPERATION_TIMEOUT_MS", "900"),
        ("CACHE_TTL_MS", "0"),
        ("STREAM_VISIBLE_MS", "0"),
    ])
    .await;
    t.stack.streams[0].pause(true);
    // A like the stream carried whose row is gone (as a REMOVE given up
    // past Lambda's retries leaves it): the reel has no row and no item in
    // the counters table, only its writer item.
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 2;
    deliver(
        &t,
        &batch_at("shard-g", "ghost", &[(1, "nobody".into())], created),
    )
    .await;
    assert_eq!(t.http_count("ghost").await, 1);
    assert_eq!(t.like_rows("ghost").await, 0);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let summary =
        likes::triggers::handle_reconcile_event(&t.stack.app, &json!({"mode": "start"}), None)
            .await
            .unwrap();
    assert_eq!(summary["complete"], true, "{summary}");
    // Before, the counters scan never met the reel: its drift stayed.
    let corrected: Vec<&str> = summary["corrected_reels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert_eq!(corrected, ["ghost"], "{summary}");
    assert_eq!(t.http_count("ghost").await, 0);
    t.stop().await;
}

/// The writer items in part `part` of `reel`'s writer partitions:
/// (sort key, `n`), and part 0's base's `parts`.
async fn part_items(t: &TestStack, reel: &str, part: u32) -> (Vec<(String, i64)>, Option<i64>) {
    let table = t
        .stack
        .config
        .writers_table
        .as_deref()
        .expect("stream mode");
    let reel = likes::keys::ReelId::parse(reel).unwrap();
    let out = t
        .stack
        .client
        .query()
        .table_name(table)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(
            ":pk",
            aws_sdk_dynamodb::types::AttributeValue::S(likes::keys::likes_writers_part_key(
                &reel, part,
            )),
        )
        .consistent_read(true)
        .send()
        .await
        .expect("query a writer part");
    let int = |i: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
               name: &str| {
        i.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok())
    };
    let mut parts = None;
    let items = out
        .items()
        .iter()
        .map(|i| {
            if let Some(p) = int(i, likes::keys::LIKES_WRITER_PARTS_ATTR) {
                parts = Some(p);
            }
            let sk = i
                .get("sk")
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default();
            (sk, int(i, "n").unwrap_or(0))
        })
        .collect();
    (items, parts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reel_written_faster_than_a_key_takes_is_spread_and_read_whole() {
    // Two writer-item writes a second per key is "hot" here, and every
    // plan reads the spread registry afresh.
    let t = paused_with(&[
        ("HOT_LIKES_PER_SEC", "2"),
        ("COOL_LIKES_PER_SEC", "1"),
        ("SPREAD_REFRESH_MS", "0"),
    ])
    .await;
    let mut next = 0u64;
    let mut wave = |tag: &str| -> Vec<Value> {
        (0..16u64)
            .map(|s| {
                next += 1;
                batch(
                    &format!("shard-{s:02}"),
                    "hot",
                    &[(next, format!("{tag}-{s}"))],
                )
            })
            .collect()
    };
    // Sixteen stream shards write the reel; a read samples its writes.
    for b in wave("a") {
        deliver(&t, &b).await;
    }
    assert_eq!(t.http_count("hot").await, 16);
    assert_eq!(part_items(&t, "hot", 0).await.1, None, "one part so far");
    // Sixteen more writes a second or so later: ~14 a second, at 2 a
    // second per key, asks for 8 parts.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for b in wave("b") {
        deliver(&t, &b).await;
    }
    assert_eq!(t.http_count("hot").await, 32);
    let (_, parts) = part_items(&t, "hot", 0).await;
    assert_eq!(parts, Some(8), "the base names the parts first");
    // The stream shards now write to the parts their names pick.
    for b in wave("c") {
        deliver(&t, &b).await;
    }
    let mut spread_items = 0;
    for part in 1..8 {
        spread_items += part_items(&t, "hot", part).await.0.len();
    }
    assert!(
        spread_items >= 8,
        "most of 16 writers left part 0: {spread_items}"
    );
    assert_eq!(t.http_count("hot").await, 48);
    // A batch applied before, delivered again: its checkpoint skips it,
    // wherever its writer item now lives.
    deliver(&t, &batch("shard-05", "hot", &[(38, "c-5".into())])).await;
    assert_eq!(t.http_count("hot").await, 48);
    // Quiet, each part folds into its own base, and the sum holds.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(t.http_count("hot").await, 48);
    let mut writers_left = 0;
    for part in 0..8 {
        let (items, _) = part_items(&t, "hot", part).await;
        writers_left += items.iter().filter(|(sk, _)| sk.starts_with("w#")).count();
    }
    assert!(
        writers_left < 32,
        "folded part by part: {writers_left} writer items left"
    );
    assert_eq!(t.http_count("hot").await, 48);
    t.stop().await;
}
