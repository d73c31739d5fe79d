//! Compaction of sealed writers (`likes::views::compact`, issue 35 point
//! 2), through the real SDK against the emulators:
//!
//! * a reel viewed while the views stream (kinesis-mock, through the local
//!   Kinesis event source and the views aggregator) is split and merged
//!   again and again keeps few all-time items: its live writers', the
//!   base, and a small constant; and its sum is exact;
//! * folds of one reel run twice at once, and one whose answer is lost and
//!   is then retried, leave the sums and the unique-viewer estimates as
//!   they were, each sealed item folded exactly once.

mod common;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::AttributeValue;
use common::TestStack;
use faultproxy::{Faults, Proxy};
use likes::keys::{self, ReelId};
use likes::store::dynamodb::DynamoViews;
use likes::store::{ViewFoldResult, ViewStore};
use likes::views::compact::{self, fold_reel};
use likes::views::read::{ViewCounts, ViewReader};
use likes::views::sketch::Sketch;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TABLE: &str = "ViewsTable";

/// Every item of partition `pk` whose sort key starts with `prefix`, read
/// consistently: (sort key, views, fold version).
async fn items(t: &TestStack, pk: &str, prefix: &str) -> Vec<(String, u64, u64)> {
    let out = t
        .stack
        .client
        .query()
        .table_name(TABLE)
        .key_condition_expression("pk = :pk AND begins_with(sk, :p)")
        .expression_attribute_values(":pk", AttributeValue::S(pk.into()))
        .expression_attribute_values(":p", AttributeValue::S(prefix.into()))
        .consistent_read(true)
        .send()
        .await
        .expect("Query");
    let num = |i: &std::collections::HashMap<String, AttributeValue>, n: &str| {
        i.get(n)
            .and_then(|v| v.as_n().ok())
            .map_or(0, |v| v.parse().unwrap())
    };
    out.items()
        .iter()
        .map(|i| (i["sk"].as_s().unwrap().clone(), num(i, "v"), num(i, "fv")))
        .collect()
}

/// `reel`'s figures as a fresh reader sees them (no cache).
async fn figures(t: &TestStack, reel: &str) -> Arc<ViewCounts> {
    let reader = ViewReader::new(
        DynamoViews::new(t.stack.client.clone(), TABLE),
        Duration::ZERO,
        10,
        likes::views::system_clock(),
    );
    reader.counts(&ReelId::parse(reel).unwrap()).await.unwrap()
}

/// The sum of metric `name` of the views aggregator flushed so far.
fn metric(t: &TestStack, name: &str) -> u64 {
    t.stack.config.metrics.flush(None);
    t.stack
        .config
        .metrics
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|d| d["Function"] == "aggregate-views")
        .filter_map(|d| d[name].as_u64())
        .sum()
}

// ---- Reads bounded across reshards ------------------------------------

/// Waits until the views stream is `ACTIVE` again after a reshard.
async fn active(t: &TestStack) {
    let views = t.stack.views.as_ref().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let s = views
            .client
            .describe_stream_summary()
            .stream_name(&views.def.stream)
            .send()
            .await
            .expect("DescribeStreamSummary");
        let summary = s.stream_description_summary().unwrap();
        if summary.stream_status().as_str() == "ACTIVE" {
            return;
        }
        assert!(Instant::now() < until, "the stream never came back ACTIVE");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The stream's open shards: (id, first hash key), in hash key order.
async fn open_shards(t: &TestStack) -> Vec<(String, u128, u128)> {
    let views = t.stack.views.as_ref().unwrap();
    let listed = views
        .client
        .list_shards()
        .stream_name(&views.def.stream)
        .send()
        .await
        .expect("ListShards");
    let mut open: Vec<(String, u128, u128)> = listed
        .shards()
        .iter()
        .filter(|s| {
            s.sequence_number_range()
                .is_none_or(|r| r.ending_sequence_number().is_none())
        })
        .map(|s| {
            let r = s.hash_key_range().unwrap();
            (
                s.shard_id().to_owned(),
                r.starting_hash_key().parse().unwrap(),
                r.ending_hash_key().parse().unwrap(),
            )
        })
        .collect();
    open.sort_by_key(|s| s.1);
    open
}

/// Splits the one open shard in two.
async fn split(t: &TestStack) {
    let views = t.stack.views.as_ref().unwrap();
    let open = open_shards(t).await;
    assert_eq!(open.len(), 1, "{open:?}");
    let (id, lo, hi) = &open[0];
    views
        .client
        .split_shard()
        .stream_name(&views.def.stream)
        .shard_to_split(id)
        .new_starting_hash_key((lo + (hi - lo) / 2).to_string())
        .send()
        .await
        .expect("SplitShard");
    active(t).await;
}

/// Merges the two open shards back into one.
async fn merge(t: &TestStack) {
    let views = t.stack.views.as_ref().unwrap();
    let open = open_shards(t).await;
    assert_eq!(open.len(), 2, "{open:?}");
    views
        .client
        .merge_shards()
        .stream_name(&views.def.stream)
        .shard_to_merge(&open[0].0)
        .adjacent_shard_to_merge(&open[1].0)
        .send()
        .await
        .expect("MergeShards");
    active(t).await;
}

/// Sends `n` batches of views of `reel`, each from a viewer of its own
/// (spread over every open shard); returns the views acknowledged.
async fn send(t: &TestStack, reel: &str, phase: usize, n: usize) -> u64 {
    let mut sent = 0;
    for b in 0..n {
        let count = 1 + (b as u64 % 5);
        let body = json!({"views": [{"reel_id": reel, "count": count}]});
        let mut done = false;
        for _ in 0..30 {
            let r = t
                .http
                .post(t.url("/views"))
                .header("x-user-id", format!("viewer-{phase}-{b}"))
                .header("idempotency-key", format!("p{phase}-b{b}"))
                .json(&body)
                .send()
                .await
                .expect("the gateway answers");
            match r.status().as_u16() {
                202 => {
                    done = true;
                    break;
                }
                429 | 503 => tokio::time::sleep(Duration::from_millis(50)).await,
                other => panic!("POST /views answered {other}"),
            }
        }
        assert!(done, "a batch was never acknowledged");
        sent += count;
    }
    sent
}

/// Waits until every record in the views stream was handed over for good.
async fn drain(t: &TestStack) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !t.stack.views_drained().await.expect("reading the stream") {
        assert!(
            Instant::now() < deadline,
            "the views stream was not drained"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Without compaction this reel's partition holds an all-time item per
/// shard that ever counted it: 1 + 3 a round, 13 after four rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reel_viewed_across_reshards_keeps_few_items_and_an_exact_sum() {
    let t = TestStack::start(&[
        ("LOCAL_VIEWS", "on"),
        ("LOCAL_VIEWS_SHARDS", "1"),
        ("CACHE_TTL_MS", "0"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("METRICS", "memory"),
    ])
    .await;
    let reel = "long-lived";
    let pk = keys::views_reel_key(&ReelId::parse(reel).unwrap());
    let mut sent = send(&t, reel, 0, 30).await;
    drain(&t).await;
    const ROUNDS: usize = 4;
    for round in 0..ROUNDS {
        split(&t).await;
        sent += send(&t, reel, 1 + 2 * round, 40).await;
        drain(&t).await;
        merge(&t).await;
        sent += send(&t, reel, 2 + 2 * round, 30).await;
        drain(&t).await;
    }
    let all = items(&t, &pk, keys::VIEWS_ALL_PREFIX).await;
    let live = open_shards(&t).await.len();
    eprintln!("{live} live shards; all-time items {all:?}");
    assert!(
        all.len() <= live + 1 + 2,
        "{} all-time items for {live} live writers: {all:?}",
        all.len()
    );
    assert!(
        all.iter()
            .any(|(sk, ..)| *sk == keys::views_all_sort(keys::VIEWS_BASE_WRITER)),
        "{all:?}"
    );
    let days = items(&t, &pk, "d#").await;
    // Per day, as many (two days if one began during the test).
    assert!(days.len() <= 2 * (live + 1 + 2), "{days:?}");
    let f = figures(&t, reel).await;
    assert_eq!(f.views, sent, "every view counted once");
    assert_eq!(f.views_7d, sent);
    // Every writer's all-time and today's items but the live one's,
    // folded by the aggregator's batches.
    let writers = 1 + 3 * ROUNDS as u64;
    // (More if a UTC day began during the test: two day items each.)
    assert!(metric(&t, "ViewItemsFolded") >= 2 * (writers - live as u64));
    assert!(metric(&t, "ViewFolds") > 0);
    t.stop().await;
}

// ---- Folds racing, and a lost answer -----------------------------------

/// A view item of `writer` (all time if `day` is `None`) with `views` and
/// the viewers `viewers`.
async fn put_item(t: &TestStack, pk: &str, sk: &str, views: u64, viewers: std::ops::Range<u32>) {
    let mut s = Sketch::new();
    for v in viewers {
        s.add(&format!("viewer-{v}"));
    }
    let mut put = t
        .stack
        .client
        .put_item()
        .table_name(TABLE)
        .item("pk", AttributeValue::S(pk.into()))
        .item("sk", AttributeValue::S(sk.into()))
        .item("v", AttributeValue::N(views.to_string()))
        .item(
            "hll",
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(s.to_bytes())),
        );
    if sk.starts_with("d#") {
        put = put.item("expires_at", AttributeValue::N("4000000000".into()));
    }
    put.send().await.expect("PutItem");
}

/// Writers `names`' all-time and today's items on `pk`, the views of each
/// `views`, their viewers overlapping.
async fn writers(t: &TestStack, pk: &str, today: &str, names: &[&str], from: u32) {
    for (i, w) in names.iter().enumerate() {
        let lo = from + 700 * i as u32;
        put_item(
            t,
            pk,
            &keys::views_all_sort(w),
            10 + i as u64,
            lo..lo + 1_000,
        )
        .await;
        put_item(
            t,
            pk,
            &keys::views_day_sort(today, w),
            3 + i as u64,
            lo..lo + 300,
        )
        .await;
    }
}

/// A client of `endpoint` with no SDK retries, so a lost answer is seen.
fn raw_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "test"))
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(Duration::from_millis(400))
                .build(),
        )
        .build();
    aws_sdk_dynamodb::Client::from_conf(conf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folds_racing_or_losing_their_answer_fold_each_item_once() {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0")]).await;
    let reel = "folded";
    let pk = keys::views_reel_key(&ReelId::parse(reel).unwrap());
    let now = (likes::views::system_clock())();
    let today = keys::utc_day(now);
    let store = DynamoViews::new(t.stack.client.clone(), TABLE);
    // Four sealed writers and a live one.
    writers(&t, &pk, &today, &["wa", "wb", "wc", "wd", "wlive"], 0).await;
    for w in ["wa", "wb", "wc", "wd"] {
        store.seal(w, now).await.unwrap();
        store.seal(w, now).await.unwrap(); // once is enough; twice changes nothing
    }
    let before = figures(&t, reel).await;

    // Two folds at once: one lands, the other is cancelled and reads again.
    let other = DynamoViews::new(t.stack.client.clone(), TABLE);
    let (a, b) = tokio::join!(
        fold_reel(&store, &pk, None, now),
        fold_reel(&other, &pk, None, now + 1)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a.items + b.items,
        8,
        "each sealed item folded once: {a:?} {b:?}"
    );
    let after = figures(&t, reel).await;
    assert_eq!(
        (
            after.views,
            after.unique_viewers,
            after.views_7d,
            after.unique_viewers_7d
        ),
        (
            before.views,
            before.unique_viewers,
            before.views_7d,
            before.unique_viewers_7d
        )
    );
    let all = items(&t, &pk, keys::VIEWS_ALL_PREFIX).await;
    assert_eq!(
        all,
        [
            ("all#base".to_owned(), 10 + 11 + 12 + 13, 1),
            ("all#wlive".to_owned(), 14, 0)
        ]
    );
    assert_eq!(items(&t, &pk, "d#").await.len(), 2);
    // Nothing left to fold.
    assert_eq!(
        fold_reel(&store, &pk, None, now).await.unwrap(),
        Default::default()
    );

    // Two more writers sealed, folded through a proxy that loses the
    // answer of every transaction: the fold landed all the same.
    writers(&t, &pk, &today, &["we", "wf"], 5_000).await;
    store.seal("we", now).await.unwrap();
    store.seal("wf", now).await.unwrap();
    let before = figures(&t, reel).await;
    let proxy = Proxy::start(
        "127.0.0.1:0",
        &t.stack.dynamo_endpoint,
        Faults::parse("seed=3,TransactWriteItems.lost=1,stall_ms=1000").unwrap(),
    )
    .await
    .expect("proxy");
    let lossy = DynamoViews::new(raw_client(&proxy.url), TABLE);
    let e = fold_reel(&lossy, &pk, None, now + 2).await;
    assert!(e.is_err(), "the answer was lost: {e:?}");
    assert_eq!(
        items(&t, &pk, keys::VIEWS_ALL_PREFIX).await,
        [
            ("all#base".to_owned(), 46 + 10 + 11, 2),
            ("all#wlive".to_owned(), 14, 0)
        ],
        "the fold landed although its answer was lost"
    );
    // Retried: a fold that reads again finds nothing left to fold.
    proxy.set_faults(Faults::default());
    assert_eq!(
        fold_reel(&lossy, &pk, None, now + 3).await.unwrap(),
        Default::default()
    );
    let after = figures(&t, reel).await;
    assert_eq!(
        (
            after.views,
            after.unique_viewers,
            after.views_7d,
            after.unique_viewers_7d
        ),
        (
            before.views,
            before.unique_viewers,
            before.views_7d,
            before.unique_viewers_7d
        )
    );

    // And the same transaction sent again after its answer was lost (the
    // SDK's retry, with its token): replayed, not applied twice.
    writers(&t, &pk, &today, &["wg", "wh"], 9_000).await;
    store.seal("wg", now).await.unwrap();
    store.seal("wh", now).await.unwrap();
    let before = figures(&t, reel).await;
    let (from, to) = keys::views_day_range(&keys::utc_day(now - 6 * 86_400_000), &today);
    let found = store.fold_items(&pk, (&from, &to)).await.unwrap();
    let sealed: HashSet<String> = ["wg", "wh"].map(str::to_owned).into();
    let folds = compact::plan(&pk, &found, &sealed, now + 4);
    assert_eq!(folds.len(), 1);
    proxy.set_faults(Faults::parse("seed=4,TransactWriteItems.lost=1,stall_ms=1000").unwrap());
    assert!(
        lossy.fold_views(&folds[0]).await.is_err(),
        "the answer was lost"
    );
    proxy.set_faults(Faults::default());
    assert_eq!(
        lossy.fold_views(&folds[0]).await.unwrap(),
        ViewFoldResult::Folded,
        "replayed by its token"
    );
    let after = figures(&t, reel).await;
    assert_eq!(
        (
            after.views,
            after.unique_viewers,
            after.views_7d,
            after.unique_viewers_7d
        ),
        (
            before.views,
            before.unique_viewers,
            before.views_7d,
            before.unique_viewers_7d
        )
    );
    assert_eq!(
        items(&t, &pk, keys::VIEWS_ALL_PREFIX).await,
        [
            ("all#base".to_owned(), 67 + 10 + 11, 3),
            ("all#wlive".to_owned(), 14, 0)
        ],
        "each item folded once"
    );
    assert_eq!(items(&t, &pk, "d#").await.len(), 2);
    t.stop().await;
}
