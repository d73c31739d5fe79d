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
