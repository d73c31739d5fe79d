//! Reads cost what they return (issue 36): `GET /counts` of 100 ids
//! nobody ever liked or viewed reads almost nothing once the instance
//! holds the known reels (`likes::known`), counted by the fault proxy;
//! before, each id cost its settings, shards and two views queries
//! (~300 read units). And what the set must never do: hide a count. A reel
//! counted before registrations began (backfilled), one liked, one only
//! viewed, and one liked through another instance after this one answered
//! it zero are all answered as they are.

mod common;

use common::TestStack;
use common::views_log::views_of;
use likes::App;
use likes::store::KnownStore;
use likes::store::dynamodb::DynamoStore;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// `GET /counts` of `ids` through the stack's gateway (its one instance).
async fn feed(t: &TestStack, ids: &[String]) -> serde_json::Value {
    let r = t
        .send(
            "GET",
            &format!("/counts?reel_ids={}", ids.join(",")),
            None,
            &[],
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.get("unavailable").is_none(), "{}", r.body);
    r.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_of_ids_never_counted_reads_almost_nothing_and_hides_no_count() {
    let t = TestStack::start(&[
        ("LOCAL_VIEWS", "on"),
        ("LOCAL_VIEWS_SHARDS", "1"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        // The proxy in between, only to count the read units.
        ("FAULTS", "read_cap=1000000"),
    ])
    .await;
    let proxy = t.stack.proxy.as_ref().expect("FAULTS");
    // Counted before any registration: written straight into the table,
    // as a deployment's older release left it. Only the backfill finds it.
    t.put_shard("old", 0, 5).await;
    assert_eq!(t.like("u1", "liked").await.status, 200);
    let r = t
        .send(
            "POST",
            "/views",
            Some("v1"),
            &[("content-type", "application/json")],
            Some(br#"{"views": [{"reel_id": "viewed", "count": 3}]}"#.to_vec()),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let started = Instant::now();
    while views_of(&t, "viewed").await < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "views not applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The scheduled fold (the cache warmer's run): with the backfill's
    // delay 0 (the local stack's), one run scans both tables and makes the
    // set complete.
    likes::triggers::handle_warm_event(&t.stack.app, &serde_json::json!({"rounds": 1}), None)
        .await
        .expect("warm run");
    let store = DynamoStore::new(t.stack.client.clone(), &t.stack.config);
    let meta = store.known_meta().await.unwrap().expect("a meta item");
    assert!(meta.complete && !meta.full, "{meta:?}");

    // The instance learns that the set is complete within META_RECHECK
    // of its last look, and loads it (its cost is the instance's, once:
    // one unit per 4 KB of the set).
    let known = t.stack.app.known.as_ref().expect("WRITERS_TABLE is set");
    let started = Instant::now();
    let mut i = 0;
    while known.stats().absent.load(Ordering::Relaxed) == 0 {
        assert!(
            started.elapsed() < likes::known::META_RECHECK + Duration::from_secs(5),
            "the instance never trusted the set"
        );
        feed(&t, &[format!("never{i}")]).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 100 ids never counted: zeros, for at most one refresh of the set.
    let ids: Vec<String> = (0..100).map(|i| format!("nobody{i}")).collect();
    let before = proxy.stats().total_read_units();
    let body = feed(&t, &ids).await;
    let spent = proxy.stats().total_read_units() - before;
    for id in &ids {
        let c = &body["counts"][id.as_str()];
        assert_eq!(
            (c["likes"].as_i64(), c["views"].as_i64()),
            (Some(0), Some(0)),
            "{id}"
        );
    }
    println!("read units of GET /counts of 100 ids never counted: {spent}");
    assert!(
        spent <= 30.0,
        "read units of 100 ids never counted: {spent}"
    );

    // Known reels among them are read, and answered as they are.
    let mut mixed = ids[..97].to_vec();
    mixed.extend(["old", "liked", "viewed"].map(String::from));
    let body = feed(&t, &mixed).await;
    assert_eq!(body["counts"]["old"]["likes"], 5, "{body}");
    assert_eq!(body["counts"]["liked"]["likes"], 1, "{body}");
    assert_eq!(body["counts"]["viewed"]["views"], 3, "{body}");

    // Another instance likes a reel this one just answered zero: this one
    // answers it within CACHE_TTL_MS (its set refreshed, its zero expired).
    assert_eq!(t.http_count("late").await, 0);
    let other = App::new(
        t.stack.config.clone(),
        DynamoStore::new(t.stack.client.clone(), &t.stack.config),
    );
    let liked_at = Instant::now();
    let resp = likes::http::handle(
        &other,
        likes::http::Function::Like,
        like_request("u2", "late"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let ttl = t.stack.config.cache_ttl;
    loop {
        if t.http_count("late").await == 1 {
            break;
        }
        assert!(
            liked_at.elapsed() < ttl + Duration::from_secs(1),
            "a like through another instance unseen after {:?}",
            liked_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.stop().await;
}

/// `PUT /reels/{reel}/like` by `user`, as API Gateway hands it over.
fn like_request(user: &str, reel: &str) -> lambda_http::Request {
    let mut event: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("../events/like.json").unwrap()).unwrap();
    event["rawPath"] = format!("/reels/{reel}/like").into();
    event["pathParameters"]["reel_id"] = reel.into();
    event["requestContext"]["http"]["path"] = format!("/reels/{reel}/like").into();
    let headers = event["headers"].as_object_mut().unwrap();
    headers.remove("idempotency-key");
    headers.insert("x-user-id".into(), user.into());
    let claims = &mut event["requestContext"]["authorizer"]["jwt"]["claims"];
    claims["sub"] = user.into();
    claims["username"] = user.into();
    lambda_http::request::from_str(&event.to_string()).unwrap()
}
