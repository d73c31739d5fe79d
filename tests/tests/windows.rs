//! Windowed counts (issue 37) through the real store against the local
//! stack: `GET /reels/{reel_id}/stats` answers a reel's net likes and views
//! over the last hour, 24 hours and 7 days with where each window starts;
//! a bucket past every window that an item kept (its own writes prune only
//! the ones that just expired) is never counted, and reconciliation drops
//! it. The exactly-once runs under faults assert the windows too
//! (`faults.rs`, `stream.rs`, `views.rs`), and the stream's writer folds
//! carry them into the base (`stream_writers.rs`).

mod common;

use aws_sdk_dynamodb::types::AttributeValue;
use common::TestStack;
use likes::keys::window::{self, Grain, Window};
use likes::reconcile::Options;
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The attribute names of shard 0 of `reel`.
async fn shard_attrs(t: &TestStack, reel: &str) -> Vec<String> {
    let out = t
        .stack
        .client
        .get_item()
        .table_name(&t.stack.config.counters_table)
        .key("pk", AttributeValue::S(format!("000#reel#{reel}#likes")))
        .consistent_read(true)
        .send()
        .await
        .expect("get shard");
    let mut names: Vec<String> = out.item.unwrap_or_default().into_keys().collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_buckets_are_never_counted_and_reconciliation_drops_them() {
    let t = TestStack::start(&[
        ("COUNTING", "transactional"),
        ("CACHE_TTL_MS", "0"),
        ("SETTINGS_TTL_MS", "0"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("RECONCILE_CLOCK_SKEW_MS", "0"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("DDB_OPERATION_TIMEOUT_MS", "500"),
    ])
    .await;
    for u in 0..4 {
        assert_eq!(t.like(&format!("fan-{u}"), "w").await.status, 200);
    }
    assert_eq!(t.unlike("fan-0", "w").await.status, 200);
    assert_eq!(t.like_windows("w").await, [3; 3]);
    // What an item not written for a while keeps: buckets past every
    // window, as a reel liked now and then leaves them (written here
    // directly, with values no window may show).
    let now = now_ms();
    let stale = [
        window::attr(Grain::Minutes5, now - 3 * 3_600_000),
        window::attr(Grain::Hour, now - 3 * 86_400_000),
        window::attr(Grain::Day, now - 40 * 86_400_000),
    ];
    let mut update = t
        .stack
        .client
        .update_item()
        .table_name(&t.stack.config.counters_table)
        .key("pk", AttributeValue::S("000#reel#w#likes".into()))
        .update_expression("ADD #a :big, #b :big, #c :big")
        .expression_attribute_values(":big", AttributeValue::N("1000".into()));
    for (p, name) in ["#a", "#b", "#c"].iter().zip(&stale) {
        update = update.expression_attribute_names(*p, name);
    }
    update.send().await.expect("stale buckets");
    let held = shard_attrs(&t, "w").await;
    assert!(stale.iter().all(|s| held.contains(s)), "{held:?}");
    assert_eq!(t.like_windows("w").await, [3; 3], "never counted");
    // A run's check phase reads every count item: it drops them.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let summary = t
        .stack
        .app
        .reconcile
        .run(&Options::default())
        .await
        .expect("reconcile");
    assert!(summary.complete, "{summary:?}");
    let left = shard_attrs(&t, "w").await;
    assert!(stale.iter().all(|s| !left.contains(s)), "dropped: {left:?}");
    assert_eq!(t.like_windows("w").await, [3; 3]);
    assert_eq!(t.http_count("w").await, 3);
    t.stop().await;
}

/// `GET path`, retried until the views of `reel` show `views` in the hour.
async fn stats_once_viewed(t: &TestStack, reel: &str, views: u64) -> Value {
    let started = Instant::now();
    loop {
        let r = t
            .send("GET", &format!("/reels/{reel}/stats"), None, &[], None)
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        if r.body["windows"]["1h"]["views"].as_u64() == Some(views) {
            return r.body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "views never showed: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reel_answers_its_likes_and_views_per_window() {
    let t = TestStack::start(&[
        ("CACHE_TTL_MS", "0"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("LOCAL_VIEWS", "on"),
    ])
    .await;
    let before = now_ms();
    for u in 0..3 {
        assert_eq!(t.like(&format!("fan-{u}"), "s").await.status, 200);
    }
    assert_eq!(t.unlike("fan-2", "s").await.status, 200);
    let r = t
        .send(
            "POST",
            "/views",
            Some("viewer-1"),
            &[("content-type", "application/json")],
            Some(br#"{"views": [{"reel_id": "s", "count": 4}]}"#.to_vec()),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    // Likes show once the stream has them (stream mode) or at once.
    let started = Instant::now();
    while t.like_windows("s").await != [2; 3] {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "likes never showed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = stats_once_viewed(&t, "s", 4).await;
    assert_eq!(body["reel_id"], "s");
    let as_of = body["as_of"].as_i64().expect("as_of");
    assert!(as_of >= before, "{body}");
    for w in Window::ALL {
        let f = &body["windows"][w.name()];
        assert_eq!(f["likes"], 2, "{body}");
        assert_eq!(f["views"], 4, "{body}");
        let from = f["from"].as_i64().expect("from");
        assert_eq!(from, w.from_ms(as_of), "{body}");
        assert!(as_of - from >= w.len_ms(), "{body}");
    }
    // A reel nobody liked or viewed: zeros, not an error.
    let r = t.send("GET", "/reels/nobody/stats", None, &[], None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["windows"]["7d"]["likes"], 0);
    assert_eq!(r.body["windows"]["7d"]["views"], 0);
    t.stop().await;
}
