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

/// Waits, if the hour ends within `secs`, until the next one has begun: a
/// test that counts a sketch's puts or an hour's reads must not straddle
/// an hour's turn (a new hour puts and reads one more).
async fn clear_of_hour_turn(secs: u64) {
    let hour_ms = 3_600_000;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let left = hour_ms - now_ms.rem_euclid(hour_ms);
    if left < secs as i64 * 1_000 {
        tokio::time::sleep(Duration::from_millis(left as u64 + 1_000)).await;
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

/// The likes' trending sketch items (`top#likes#…`) in the views table.
async fn likes_sketch_items(
    t: &TestStack,
) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    let views = t.stack.config.writers_table.clone().expect("WRITERS_TABLE");
    t.scan(&views)
        .await
        .into_iter()
        .filter(|i| {
            i.get("pk")
                .and_then(|v| v.as_s().ok())
                .is_some_and(|pk| pk.starts_with("top#likes#"))
        })
        .collect()
}

/// An item's size as DynamoDB counts it, near enough: names and values.
fn item_bytes(
    item: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
) -> usize {
    use aws_sdk_dynamodb::types::AttributeValue as V;
    item.iter()
        .map(|(k, v)| {
            k.len()
                + match v {
                    V::S(s) => s.len(),
                    V::N(n) => n.len(),
                    V::B(b) => b.as_ref().len(),
                    _ => 8,
                }
        })
        .sum()
}

/// A writer's sketch is an item of its own, never part of its checkpoint:
/// DynamoDB charges an update by the whole item's size, and every chunk
/// updates the checkpoint. Before: the sketch (several KB with many
/// reels) rode in the checkpoint item, so each chunk paid its KB in write
/// units whether it wrote the sketch or not; the checkpoint here was
/// about 4 KB. Another instance finds the stored sketch by the hour the
/// checkpoint names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_sketch_stays_out_of_its_checkpoint() {
    let t = TestStack::start(&[
        ("COUNTING", "stream"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("CACHE_TTL_MS", "0"),
    ])
    .await;
    // Many reels with long ids: a full sketch of several KB.
    for i in 0..160 {
        let reel = format!("a-reel-with-a-rather-long-id-{i:04}");
        assert_eq!(t.like(&format!("u{i}"), &reel).await.status, 200);
    }
    common::drained(&t, Duration::from_secs(60)).await;
    let checkpoints = t.scan_prefix("agg#").await;
    assert!(!checkpoints.is_empty());
    for c in &checkpoints {
        let bytes = item_bytes(c);
        let names: Vec<&String> = c.keys().collect();
        assert!(bytes < 300, "a checkpoint of {bytes} bytes: {names:?}");
        assert!(!c.contains_key("fi"), "the sketch is in the checkpoint");
    }
    // The sketch is in the hour's top# item, as big as it is.
    let sketches = likes_sketch_items(&t).await;
    assert_eq!(sketches.len(), checkpoints.len(), "one per writer");
    assert!(
        sketches.iter().any(|s| item_bytes(s) > 1_500),
        "{:?}",
        sketches.iter().map(item_bytes).collect::<Vec<_>>()
    );
    // Another instance reads it back by the hour its checkpoint names.
    use likes::store::AggregateStore;
    let key = checkpoints[0]["pk"].as_s().unwrap();
    let hour: i64 = checkpoints[0]["fh"].as_n().unwrap().parse().unwrap();
    let other = instance(&t);
    let stored = other
        .aggregate
        .store()
        .stored_sketch(key, hour)
        .await
        .unwrap()
        .expect("the stored sketch");
    assert_eq!(stored.hour, hour);
    let (names, _) = likes::trending::sketch::candidates([stored.bytes.as_slice()]);
    assert!(!names.is_empty());
    t.stop().await;
}

/// Transactional mode runs no stream aggregator: each like function
/// instance keeps a sketch of the likes it committed and puts it as a
/// writer of its own (`fn#…`): with the hour's first like, then with a
/// like at most every `FLUSH_MS`. The list ranks by the exact windowed
/// counts the like transactions keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_mode_ranks_likes_from_the_like_instances_sketches() {
    let t = TestStack::start(&[
        ("COUNTING", "transactional"),
        ("LOCAL_VIEWS", "on"),
        ("CACHE_TTL_MS", "0"),
        ("LOCAL_SCHEDULE_SECS", "0"),
    ])
    .await;
    clear_of_hour_turn(60).await;
    // The first like of the hour is put at once: "cold" is named before
    // any other reel is liked.
    assert_eq!(t.like("fan-0", "cold").await.status, 200);
    for (reel, likes) in [("hot", 6), ("warm", 3)] {
        for u in 0..likes {
            assert_eq!(t.like(&format!("fan-{u}"), reel).await.status, 200);
        }
    }
    assert_eq!(t.unlike("fan-0", "warm").await.status, 200);
    let top = "/trending?metric=likes&window=1h&limit=3";
    let first = reels(&until(&t, top, |b| !reels(b).is_empty()).await);
    assert_eq!(
        first,
        [("cold".to_owned(), 1)],
        "only the hour's first like is put before FLUSH_MS"
    );
    // A like FLUSH_MS later puts what the instance held meanwhile.
    tokio::time::sleep(Duration::from_millis(
        likes::trending::live::FLUSH_MS as u64 + 100,
    ))
    .await;
    assert_eq!(t.like("fan-9", "tail").await.status, 200);
    let body = until(&t, top, |b| {
        reels(b)
            == [
                ("hot".to_owned(), 6),
                ("warm".to_owned(), 2),
                ("cold".to_owned(), 1),
            ]
    })
    .await;
    assert_eq!(body["ranked_by"], "instance");
    // One writer, the like function instance, under a key of its own.
    let writers: Vec<String> = likes_sketch_items(&t)
        .await
        .into_iter()
        .map(|i| i["sk"].as_s().unwrap().clone())
        .collect();
    assert_eq!(writers.len(), 1, "{writers:?}");
    assert!(writers[0].starts_with("fn#"), "{writers:?}");
    t.stop().await;
}

/// A 24-hour list merges 25 hours of sketches; the hours that ended a
/// while ago change only by late puts, so an instance keeps their merge
/// (`trending::ENDED_HOUR_TTL`) and ranks again reading about one hour's
/// sketches instead of 25. Before, every ranking queried every hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ranking_reads_only_the_hours_that_still_change() {
    let t = TestStack::start(&[
        // A fault that never fires: the proxy, to count the queries.
        ("FAULTS", "Scan.latency=0.01,max_latency_ms=1"),
        ("LOCAL_VIEWS", "on"),
        ("LOCAL_SCHEDULE_SECS", "0"),
    ])
    .await;
    let proxy = t.stack.proxy.clone().expect("a proxy");
    let queries = || proxy.stats().requests.get("Query").copied().unwrap_or(0);
    // The stack's own instance: its store goes through the proxy.
    let app = &t.stack.app;
    use likes::keys::window::Window;
    use likes::trending::Metric;
    clear_of_hour_turn(20).await;
    let before = queries();
    likes::warmer::rank::rank(app, Metric::Views, Window::Day)
        .await
        .unwrap();
    let first = queries() - before;
    assert!(
        (25..=26).contains(&first),
        "{first} queries, 25 hours: {:?}",
        proxy.stats().requests
    );
    let before = queries();
    likes::warmer::rank::rank(app, Metric::Views, Window::Day)
        .await
        .unwrap();
    let again = queries() - before;
    assert!(again <= 2, "{again} queries ranking again");
    // Another metric's hours are its own.
    let before = queries();
    likes::warmer::rank::rank(app, Metric::Likes, Window::Hour)
        .await
        .unwrap();
    assert!(queries() - before >= 1);
    t.stop().await;
}
