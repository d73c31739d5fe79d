//! Reads: a reel's count is the sum of its read shards (missing shards count
//! 0, negative shards count as they are), served from a per-instance cache
//! for CACHE_TTL_MS with its age; batch reads answer up to 100 reels at once;
//! `liked_by_me` appears with an identity; /healthz tells readiness. Shards
//! beyond `read_shards` are ignored, batch reads span BatchGetItem's
//! 100-key chunks, and a missing table is a 503 without internal detail.

mod common;

use common::TestStack;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_sums_every_read_shard_including_negative_ones() {
    let t = TestStack::uncached().await;
    t.set_shards("summed", 5, 8).await;
    for (shard, n) in [(0, 10), (3, -2), (7, 5)] {
        t.put_shard("summed", shard, n).await;
    }
    // Shard 8 is outside read_shards: not summed.
    t.put_shard("summed", 8, 1000).await;
    assert_eq!(t.http_count("summed").await, 13);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_reels_count_zero() {
    let t = TestStack::uncached().await;
    let r = t
        .send("GET", "/reels/never-liked/likes", None, &[], None)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["count"], 0);
    assert_eq!(r.body["reel_id"], "never-liked");
    assert!(
        r.body.get("liked_by_me").is_none(),
        "no identity, no liked_by_me"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liked_by_me_follows_the_callers_own_like() {
    let t = TestStack::uncached().await;
    t.like("me", "mine").await;
    let r = t
        .send("GET", "/reels/mine/likes", Some("me"), &[], None)
        .await;
    assert_eq!(
        (r.body["count"].as_i64(), r.body["liked_by_me"].as_bool()),
        (Some(1), Some(true))
    );
    let r = t
        .send("GET", "/reels/mine/likes", Some("not-me"), &[], None)
        .await;
    assert_eq!(r.body["liked_by_me"], false);
    t.unlike("me", "mine").await;
    let r = t
        .send("GET", "/reels/mine/likes", Some("me"), &[], None)
        .await;
    assert_eq!(
        (r.body["count"].as_i64(), r.body["liked_by_me"].as_bool()),
        (Some(0), Some(false))
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_sums_are_served_with_their_age_until_the_ttl_passes() {
    let t = TestStack::start(&[("CACHE_TTL_MS", "2000"), ("SETTINGS_TTL_MS", "0")]).await;
    assert_eq!(t.http_count("cached").await, 0);
    // Likes through another instance (written straight to a shard here)
    // are not seen until the cached sum expires...
    t.put_shard("cached", 0, 5).await;
    let r = t.send("GET", "/reels/cached/likes", None, &[], None).await;
    assert_eq!(r.body["count"], 0, "served from the cache");
    let age = r.body["age_ms"].as_u64().unwrap();
    assert!(age < 2000, "age {age}");
    // ...while this instance's own like adjusts the cached sum at once,
    // without extending its life: it still expires 2 s after the read.
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let r = t.like("u1", "cached").await;
    assert_eq!(r.body["count"], 1);
    let r = t.send("GET", "/reels/cached/likes", None, &[], None).await;
    assert_eq!(r.body["count"], 1, "own change applied to the cached sum");
    assert!(
        r.body["age_ms"].as_u64().unwrap() >= age,
        "the age is still that of the read"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = t.send("GET", "/reels/cached/likes", None, &[], None).await;
    assert_eq!(
        r.body["count"], 6,
        "re-summed after the TTL, despite the adjustment"
    );
    assert!(r.body["age_ms"].as_u64().unwrap() < 2000);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_read_answers_many_reels_in_one_call() {
    let t = TestStack::uncached().await;
    t.set_shards("b", 3, 3).await;
    for u in 0..3 {
        t.like(&format!("u{u}"), "a").await;
    }
    t.like("u0", "b").await;
    let r = t
        .send("GET", "/likes?reel_ids=a,b,c,a", None, &[], None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["counts"],
        serde_json::json!({"a": 3, "b": 1, "c": 0})
    );
    assert!(r.body["age_ms"].is_u64());
    // 100 reels at once, 100 shards for one of them: several BatchGetItem chunks.
    t.set_shards("wide", 100, 100).await;
    t.put_shard("wide", 99, 7).await;
    let mut ids: Vec<String> = (0..99).map(|i| format!("r{i}")).collect();
    ids.push("wide".into());
    let r = t
        .send(
            "GET",
            &format!("/likes?reel_ids={}", ids.join(",")),
            None,
            &[],
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let counts = r.body["counts"].as_object().unwrap();
    assert_eq!(counts.len(), 100);
    assert_eq!(counts["wide"], 7);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_reports_ready_when_tables_are_reachable() {
    let t = TestStack::uncached().await;
    let r = t.send("GET", "/healthz", None, &[], None).await;
    assert_eq!((r.status, r.body["status"].as_str()), (200, Some("ok")));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_reads_answer_503_when_a_table_is_missing() {
    let t = TestStack::start(&[("LIKES_TABLE", "no-such-table"), ("CACHE_TTL_MS", "0")]).await;
    // The stack created "no-such-table" from the template; drop it.
    t.stack
        .client
        .delete_table()
        .table_name("no-such-table")
        .send()
        .await
        .unwrap();
    let r = t.send("GET", "/healthz", None, &[], None).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "unavailable");
    assert!(r.headers.get("retry-after").is_some());
    let text = r.body.to_string();
    assert!(
        !text.contains("no-such-table") && !text.contains("ResourceNotFound"),
        "no internal detail: {text}"
    );
    let r = t.like("u1", "x").await;
    assert_eq!(r.status, 503, "{}", r.body);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_read_of_hot_reels_spends_at_most_its_read_budget() {
    // Nothing cached, and the proxy in between to count the read units.
    let t = TestStack::start(&[
        ("CACHE_TTL_MS", "0"),
        ("SETTINGS_TTL_MS", "0"),
        ("FEED_READ_ITEMS", "1000"),
        ("FAULTS", "read_cap=1000000"),
    ])
    .await;
    let reels: Vec<String> = (0..20).map(|i| format!("hot{i}")).collect();
    for r in &reels {
        t.set_shards(r, 100, 100).await;
        t.put_shard(r, 7, 1).await;
    }
    let proxy = t.stack.proxy.as_ref().expect("FAULTS");
    // The instance's first read loads its known reels (`likes::known`, a
    // few units once): not the feed's cost.
    t.http_count("another").await;
    let before = proxy.stats().total_read_units();
    let r = t
        .send(
            "GET",
            &format!("/likes?reel_ids={}", reels.join(",")),
            None,
            &[],
            None,
        )
        .await;
    let spent = proxy.stats().total_read_units() - before;
    assert_eq!(r.status, 200, "{}", r.body);
    // Before: all 20 reels summed, 2,000 shard items + 20 settings.
    // After: the first ten (1,000 items) and the settings of the twenty.
    let counts = r.body["counts"].as_object().unwrap();
    assert_eq!(counts.len(), 10, "{}", r.body);
    for reel in &reels[..10] {
        assert_eq!(counts[reel.as_str()], 1, "{reel}");
    }
    let unavailable: Vec<&str> = r.body["unavailable"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        unavailable,
        reels[10..].iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(spent <= 1_020.0, "read units spent: {spent}");
    assert_eq!(
        r.headers.get("cache-control").and_then(|v| v.to_str().ok()),
        Some("no-store")
    );
    t.stop().await;
}
