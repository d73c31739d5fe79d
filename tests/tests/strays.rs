//! Items outside a reel's read range that are not empty (an outside edit, a
//! restore, a fold gone wrong): no reader counts them, and no resize may
//! start counting them. Through the real store against embedded dynoxide:
//! a grow from the admin route clears a stray shard before readers sum it,
//! and the count never moves; a grow asked for on the like/read path (which
//! may not delete items) is not started while such an item exists; a first
//! shrink clears a stray base item before readers add it. (Reconciliation
//! clearing them is in `reconcile_scale.rs`.)

mod common;

use common::TestStack;
use futures::StreamExt;
use likes::keys::ReelId;
use likes::reshard::{self, Progress};
use likes::store::{CounterStore, Phase};
use std::time::{Duration, Instant};

async fn stack() -> TestStack {
    TestStack::start(&[
        ("SETTINGS_TTL_MS", "100"),
        ("CACHE_TTL_MS", "0"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("RESIZE_MARGIN_MS", "0"),
        ("DDB_OPERATION_TIMEOUT_MS", "1000"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("RESHARD_MAX_WAIT_MS", "5000"),
    ])
    .await
}

async fn likes(t: &TestStack, reel: &str, n: usize) {
    futures::stream::iter(0..n)
        .for_each_concurrent(8, |i| async move {
            let r = t.like(&format!("{reel}-fan-{i}"), reel).await;
            assert_eq!(r.status, 200, "{}", r.body);
        })
        .await;
}

/// Takes every step of the reel's resize, checking the count shown before
/// each one.
async fn drive_checking(t: &TestStack, reel: &str, count: i64) {
    let r = &t.stack.app.reshard;
    let id = ReelId::parse(reel).unwrap();
    let started = Instant::now();
    loop {
        assert_eq!(
            t.http_count(reel).await,
            count,
            "the count shown never changes"
        );
        match r.advance(&id).await.expect("advance") {
            Progress::Stable(_) => break,
            Progress::Waiting { .. } => tokio::time::sleep(Duration::from_millis(100)).await,
            Progress::Interrupted => unreachable!(),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "resize stuck");
    }
    assert_eq!(t.http_count(reel).await, count);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_grow_clears_a_stray_shard_and_keeps_the_count() {
    let t = stack().await;
    likes(&t, "g", 25).await;
    t.put_shard("g", 1, -30).await;
    assert_eq!(t.http_count("g").await, 25);
    let r = t
        .send(
            "POST",
            "/admin/reels/g/shards",
            None,
            &[("content-type", "application/json")],
            Some(br#"{"shards": 4}"#.to_vec()),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    // Readers sum four shards from now on: shard 1 is already emptied.
    assert_eq!(t.shards("g").await, vec![(0, 25), (1, 0)]);
    drive_checking(&t, "g", 25).await;
    assert_eq!(t.shard_sum("g").await, 25);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_automatic_grow_is_not_started_over_a_stray_shard() {
    let t = stack().await;
    likes(&t, "a", 25).await;
    t.put_shard("a", 2, 40).await;
    let id = ReelId::parse("a").unwrap();
    let store = t.stack.app.service.store();
    assert!(!reshard::request_grow(store, &id, 4, "test").await.unwrap());
    let s = store.settings(std::slice::from_ref(&id)).await.unwrap()[&id];
    assert_eq!(
        (s.phase, s.read_shards, s.write_shards),
        (Phase::Stable, 1, 1)
    );
    assert_eq!(t.http_count("a").await, 25);
    // Without the stray item the same request grows the reel.
    t.stack
        .client
        .delete_item()
        .table_name(&t.stack.config.counters_table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("002#reel#a#likes".into()),
        )
        .send()
        .await
        .unwrap();
    assert!(reshard::request_grow(store, &id, 4, "test").await.unwrap());
    drive_checking(&t, "a", 25).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_shrink_clears_a_stray_base_item_and_keeps_the_count() {
    let t = stack().await;
    t.set_shards("s", 4, 4).await;
    likes(&t, "s", 30).await;
    // A base item before any shrink: no reader adds it yet.
    t.stack
        .client
        .put_item()
        .table_name(&t.stack.config.counters_table)
        .item(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("base#reel#s#likes".into()),
        )
        .item("n", aws_sdk_dynamodb::types::AttributeValue::N("7".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(t.http_count("s").await, 30);
    let id = ReelId::parse("s").unwrap();
    t.stack.app.reshard.begin(&id, 1).await.expect("shrink");
    drive_checking(&t, "s", 30).await;
    assert_eq!(t.shard_sum("s").await, 30);
    t.stop().await;
}
