//! `GET /trending` on the local stack (issue 37), stream mode with the
//! views pipeline: the stream shards' and Kinesis shards' hourly sketches
//! (in their checkpoints, kept by the chunk transactions) name the
//! candidates, and the list ranks them by their exact windowed counts;
//! bad queries and a window longer than the sketches are kept for are
//! refused.

mod common;

use common::TestStack;
use serde_json::Value;
use std::time::{Duration, Instant};

/// `GET path` until `ok` holds of its answer (lists are ranked once per
/// instance every 10 s, and the aggregators apply within seconds).
async fn until(t: &TestStack, path: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let r = t.send("GET", path, None, &[], None).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        if ok(&r.body) {
            return r.body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{path}: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The list as (reel, count) pairs.
fn reels(body: &Value) -> Vec<(String, i64)> {
    body["reels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["reel_id"].as_str().unwrap().to_owned(),
                r["count"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_reels_are_ranked_by_their_exact_windowed_counts() {
    let t = TestStack::start(&[
        ("COUNTING", "stream"),
        ("LOCAL_VIEWS", "on"),
        ("CACHE_TTL_MS", "0"),
        ("LOCAL_SCHEDULE_SECS", "0"),
    ])
    .await;
    for (reel, likes, views) in [("hot", 8, 9), ("warm", 4, 5), ("cold", 1, 1)] {
        for u in 0..likes {
            assert_eq!(t.like(&format!("fan-{u}"), reel).await.status, 200);
        }
        for v in 0..views {
            let r = t
                .send(
                    "POST",
                    "/views",
                    Some(&format!("viewer-{v}")),
                    &[("content-type", "application/json")],
                    Some(
                        format!(r#"{{"views": [{{"reel_id": "{reel}", "count": 1}}]}}"#)
                            .into_bytes(),
                    ),
                )
                .await;
            assert_eq!(r.status, 202, "{}", r.body);
        }
    }
    // An unlike takes one off the exact count (the sketch only names).
    assert_eq!(t.unlike("fan-0", "warm").await.status, 200);
    let likes = until(&t, "/trending?metric=likes&window=1h&limit=2", |b| {
        reels(b) == [("hot".to_owned(), 8), ("warm".to_owned(), 3)]
    })
    .await;
    assert_eq!(likes["metric"], "likes");
    assert_eq!(likes["window"], "1h");
    assert_eq!(likes["reels"][0]["rank"], 1);
    let as_of = likes["as_of"].as_i64().unwrap();
    assert!(
        as_of - likes["from"].as_i64().unwrap() >= 3_600_000,
        "{likes}"
    );
    let views = until(&t, "/trending?metric=views&window=24h&limit=3", |b| {
        reels(b)
            == [
                ("hot".to_owned(), 9),
                ("warm".to_owned(), 5),
                ("cold".to_owned(), 1),
            ]
    })
    .await;
    assert_eq!(views["max_error"], 0, "exact while few reels: {views}");
    // Defaults: likes over the last hour, ten at most.
    let r = t.send("GET", "/trending", None, &[], None).await;
    assert_eq!(
        (r.status, &r.body["metric"], &r.body["window"]),
        (200, &"likes".into(), &"1h".into())
    );
    for (query, code) in [
        ("metric=shares", "invalid_metric"),
        ("window=7d", "invalid_window"),
        ("window=30m", "invalid_window"),
        ("limit=0", "invalid_limit"),
        ("limit=101", "invalid_limit"),
        ("limit=ten", "invalid_limit"),
        ("metric=likes&metric=views", "bad_request"),
    ] {
        let r = t
            .send("GET", &format!("/trending?{query}"), None, &[], None)
            .await;
        assert_eq!(
            (r.status, r.body["error"]["code"].as_str()),
            (400, Some(code)),
            "{query}"
        );
    }
    t.stop().await;
}

/// Another function instance over the stack's tables, caches empty.
fn instance(t: &TestStack) -> likes::App {
    let config = t.stack.config.clone();
    likes::App::new(
        config.clone(),
        likes::store::dynamodb::DynamoStore::new(t.stack.client.clone(), &config),
    )
    .with_views_of(&t.stack.app)
}

/// Shard items this instance has read for sums.
fn shard_reads(app: &likes::App) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let s = app.service.store().stats();
    s.shard_reads_batch.load(Relaxed) + s.shard_reads_transactional.load(Relaxed)
}

/// The cache warmer (issue 37): one run ranks the lists once for every
/// instance and keeps the listed reels' totals; a fresh instance reads a
/// warm reel's likes and views from one item instead of summing them,
/// `GET /trending` serves the warmer's list with each reel's totals, and
/// a figure too old to cache is not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warmer_keeps_the_trending_reels_totals_for_every_instance() {
    let t = TestStack::start(&[
        ("COUNTING", "stream"),
        ("LOCAL_VIEWS", "on"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("CACHE_TTL_MS", "4000"),
    ])
    .await;
    for (reel, n) in [("hot", 6), ("cold", 1)] {
        for u in 0..n {
            assert_eq!(t.like(&format!("fan-{u}"), reel).await.status, 200);
            let r = t
                .send(
                    "POST",
                    "/views",
                    Some(&format!("viewer-{u}")),
                    &[("content-type", "application/json")],
                    Some(
                        format!(r#"{{"views": [{{"reel_id": "{reel}", "count": 1}}]}}"#)
                            .into_bytes(),
                    ),
                )
                .await;
            assert_eq!(r.status, 202, "{}", r.body);
        }
    }
    until(&t, "/trending?metric=likes&window=1h", |b| {
        reels(b) == [("hot".to_owned(), 6), ("cold".to_owned(), 1)]
    })
    .await;
    until(&t, "/trending?metric=views&window=1h", |b| {
        reels(b) == [("hot".to_owned(), 6), ("cold".to_owned(), 1)]
    })
    .await;
    // Nothing is warm before the warmer runs: a fresh instance sums.
    let before = instance(&t);
    let hot = likes::keys::ReelId::parse("hot").unwrap();
    assert_eq!(before.service.count(&hot).await.unwrap().count, 6);
    assert_eq!(before.service.warm_hits(), 0);
    assert!(shard_reads(&before) > 0);

    let summary =
        likes::triggers::handle_warm_event(&t.stack.app, &serde_json::json!({"rounds": 1}), None)
            .await
            .unwrap();
    assert_eq!(
        (
            &summary["rounds"],
            &summary["lists"],
            &summary["reels"],
            &summary["figures"],
            &summary["errors"]
        ),
        (&1.into(), &4.into(), &2.into(), &2.into(), &0.into()),
        "{summary}"
    );
    assert_eq!(t.scan_prefix("warm#").await.len(), 2);
    // Four lists and the warm set.
    assert_eq!(t.scan_prefix("trending#").await.len(), 5);

    // A fresh instance: the hot reel's likes and views from its warm item,
    // no shard, writer or view item read.
    let fresh = instance(&t);
    let count = fresh.service.count(&hot).await.unwrap();
    assert_eq!(count.count, 6);
    assert_eq!(count.windows.hour, 6, "the windows come warm too");
    assert_eq!(fresh.service.warm_hits(), 1);
    assert_eq!(shard_reads(&fresh), 0, "no sum");
    let reader = fresh.views.reader.as_ref().unwrap();
    let views = reader.counts(&hot).await.unwrap();
    assert_eq!((views.views, views.unique_viewers), (6, 6));
    assert_eq!((reader.warm_hits(), reader.reads()), (1, 0));
    // A reel that is not warm costs its sum, not an extra read.
    let cold = likes::keys::ReelId::parse("unseen").unwrap();
    assert_eq!(fresh.service.count(&cold).await.unwrap().count, 0);
    assert_eq!(fresh.service.warm_hits(), 1);

    // The warmer's list, with each reel's totals, once the instance's own
    // list (ranked above) has expired.
    tokio::time::sleep(likes::trending::LIST_TTL).await;
    let list = t
        .send("GET", "/trending?metric=views&window=1h", None, &[], None)
        .await;
    assert_eq!(list.status, 200);
    assert_eq!(list.body["ranked_by"], "warmer", "{}", list.body);
    assert_eq!(list.body["reels"][0]["reel_id"], "hot");
    assert_eq!(
        (
            &list.body["reels"][0]["likes"],
            &list.body["reels"][0]["views"]
        ),
        (&6.into(), &6.into()),
        "{}",
        list.body
    );
    // The figures are now older than CACHE_TTL_MS: never served.
    let late = instance(&t);
    assert_eq!(late.service.count(&hot).await.unwrap().count, 6);
    assert_eq!(late.service.warm_hits(), 0);
    assert!(shard_reads(&late) > 0);
    t.stop().await;
}
