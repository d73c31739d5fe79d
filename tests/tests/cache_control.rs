//! `Cache-Control` on every answer: count answers may be kept by a browser or
//! CDN for what is left of the function's own cache lifetime (`public`, or
//! `private` when the body depends on the caller), everything else is
//! `no-store`; with no function cache (`CACHE_TTL_MS=0`) a count answer is
//! `max-age=0`.

mod common;

use common::TestStack;

fn cache_control(r: &common::Reply) -> &str {
    r.headers
        .get("cache-control")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// `max-age` of a `public|private, max-age=N` value.
fn max_age(v: &str, scope: &str) -> u64 {
    v.strip_prefix(&format!("{scope}, max-age="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not {scope} with a max-age: {v:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_answers_say_how_long_they_may_be_kept() {
    let t = TestStack::start(&[("CACHE_TTL_MS", "10000"), ("LOCAL_SCHEDULE_SECS", "0")]).await;
    let like = t.like("u1", "cc").await;
    assert_eq!((like.status, cache_control(&like)), (200, "no-store"));

    // Anonymous read: public, for what is left of the 10 s cache lifetime.
    let r = t.send("GET", "/reels/cc/likes", None, &[], None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let left = 10 - r.body["age_ms"].as_u64().unwrap().div_ceil(1000);
    assert_eq!(max_age(cache_control(&r), "public"), left, "{}", r.body);
    // With liked_by_me: the body is the caller's, so private.
    let r = t
        .send("GET", "/reels/cc/likes", Some("u1"), &[], None)
        .await;
    assert_eq!(r.body["liked_by_me"], true);
    assert!(max_age(cache_control(&r), "private") <= 10);
    // A batch: public, by its oldest sum.
    let r = t
        .send("GET", "/likes?reel_ids=cc,other", None, &[], None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(max_age(cache_control(&r), "public") <= 10);

    // Everything else is never kept.
    for (method, path) in [
        ("GET", "/healthz"),
        ("GET", "/admin/reels"),
        ("GET", "/nowhere"),
    ] {
        let r = t.send(method, path, None, &[], None).await;
        assert_eq!(cache_control(&r), "no-store", "{method} {path}");
    }
    let r = t
        .send("GET", "/reels/bad%20id/likes", None, &[], None)
        .await;
    assert_eq!((r.status, cache_control(&r)), (400, "no-store"));
    t.stop().await;

    // Without a function cache, a count may not be kept either.
    let t = TestStack::start(&[("CACHE_TTL_MS", "0"), ("LOCAL_SCHEDULE_SECS", "0")]).await;
    let r = t.send("GET", "/reels/cc/likes", None, &[], None).await;
    assert_eq!(cache_control(&r), "public, max-age=0");
    t.stop().await;
}
