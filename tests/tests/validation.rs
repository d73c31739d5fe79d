//! Bad input: every class gets a 4xx JSON error with a stable code, and
//! changes nothing: after all of them the seeded reel still counts exactly
//! its likes, and no item was written for any other reel or user. Hostile
//! forwarding headers do not break the local gateway.

mod common;

use common::TestStack;

struct Case {
    method: &'static str,
    path: String,
    user: Option<&'static str>,
    headers: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
    status: u16,
    code: &'static str,
}

fn case(method: &'static str, path: impl Into<String>, status: u16, code: &'static str) -> Case {
    Case {
        method,
        path: path.into(),
        user: Some("attacker"),
        headers: vec![],
        body: None,
        status,
        code,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_class_is_a_4xx_json_error_and_changes_nothing() {
    let t = TestStack::uncached().await;
    t.like("fan", "good").await;
    let items_before = (
        t.scan(&t.stack.config.counters_table).await.len(),
        t.scan(&t.stack.config.likes_table).await.len(),
    );

    let long_id = "a".repeat(65);
    let many: Vec<String> = (0..101).map(|i| format!("r{i}")).collect();
    let mut cases = vec![
        // Reel ids outside [A-Za-z0-9_-]{1,64}, however they are spelled.
        case("PUT", "/reels/good%23x/like", 400, "invalid_reel_id"),
        case("PUT", "/reels/x%23reel%23good/like", 400, "invalid_reel_id"),
        case(
            "PUT",
            format!("/reels/{long_id}/like"),
            400,
            "invalid_reel_id",
        ),
        case("PUT", "/reels/%E2%80%8Bgood/like", 400, "invalid_reel_id"),
        case("PUT", "/reels/%EF%BD%87ood/like", 400, "invalid_reel_id"),
        case("PUT", "/reels/..%2Fgood/like", 400, "invalid_reel_id"),
        case("PUT", "/reels/.../like", 400, "invalid_reel_id"),
        // Clients resolve dot segments: this arrives as /like, no route.
        case("PUT", "/reels/%2e%2e/like", 404, "not_found"),
        case("PUT", "/reels/go%20od/like", 400, "invalid_reel_id"),
        case("PUT", "/reels/%ff/like", 400, "invalid_reel_id"),
        case("DELETE", "/reels/good%23/like", 400, "invalid_reel_id"),
        case("GET", "/reels/good%00/likes", 400, "invalid_reel_id"),
        // Batch reads.
        case("GET", "/likes", 400, "missing_reel_ids"),
        case("GET", "/likes?reel_ids=", 400, "invalid_reel_id"),
        case("GET", "/likes?reel_ids=a,,b", 400, "invalid_reel_id"),
        case("GET", "/likes?reel_ids=a,b%23c", 400, "invalid_reel_id"),
        case(
            "GET",
            format!("/likes?reel_ids={}", many.join(",")),
            400,
            "too_many_reel_ids",
        ),
        // Routes and methods.
        case("GET", "/nope", 404, "not_found"),
        case("GET", "/reels/good", 404, "not_found"),
        case("GET", "/reels/good/like/extra", 404, "not_found"),
        case("POST", "/reels/good/like", 405, "method_not_allowed"),
        case("GET", "/reels/good/like", 405, "method_not_allowed"),
        case("PUT", "/reels/good/likes", 405, "method_not_allowed"),
        case("DELETE", "/likes?reel_ids=good", 405, "method_not_allowed"),
        case("POST", "/healthz", 405, "method_not_allowed"),
    ];
    // Headers.
    let mut c = case("PUT", "/reels/good/like", 400, "invalid_idempotency_key");
    c.headers.push(("idempotency-key", "k".repeat(65)));
    cases.push(c);
    let mut c = case("PUT", "/reels/good/like", 400, "invalid_idempotency_key");
    c.headers.push(("idempotency-key", "has space".into()));
    cases.push(c);
    let mut c = case("PUT", "/reels/good/like", 400, "invalid_user_id");
    c.user = None;
    c.headers.push(("x-user-id", "u".repeat(257)));
    cases.push(c);
    // Identity.
    let mut c = case("PUT", "/reels/good/like", 401, "unauthorized");
    c.user = None;
    cases.push(c);
    // Bodies: over the handler's 1 KiB limit, and over the gateway's.
    let mut c = case("PUT", "/reels/good/like", 413, "payload_too_large");
    c.body = Some(vec![b'x'; 2048]);
    cases.push(c);
    let mut c = case("DELETE", "/reels/good/like", 413, "payload_too_large");
    c.body = Some(vec![0xff; 200 * 1024]);
    cases.push(c);

    for c in &cases {
        let headers: Vec<(&str, &str)> = c.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = t
            .send(c.method, &c.path, c.user, &headers, c.body.clone())
            .await;
        assert_eq!(r.status, c.status, "{} {}: {}", c.method, c.path, r.body);
        assert_eq!(
            r.body["error"]["code"], c.code,
            "{} {}: {}",
            c.method, c.path, r.body
        );
        assert!(
            r.body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert_eq!(
            r.headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{} {}",
            c.method,
            c.path
        );
        if c.status == 405 {
            assert!(
                r.headers.get("allow").is_some(),
                "405 names the allowed methods"
            );
        }
        // A body the gateway stopped reading leaves the connection unusable:
        // the answer says so, or a client reusing the connection fails its
        // next request (seen on a loaded machine before it did).
        if c.body.as_ref().is_some_and(|b| b.len() > 64 * 1024) {
            assert_eq!(
                r.headers.get("connection").and_then(|v| v.to_str().ok()),
                Some("close"),
                "{} {}",
                c.method,
                c.path
            );
        }
    }

    assert_eq!(t.http_count("good").await, 1);
    assert_eq!(t.like_rows("good").await, 1);
    let items_after = (
        t.scan(&t.stack.config.counters_table).await.len(),
        t.scan(&t.stack.config.likes_table).await.len(),
    );
    assert_eq!(
        items_before, items_after,
        "no item was written by any bad request"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_forwarding_headers_do_not_break_the_local_gateway() {
    let t = TestStack::uncached().await;
    let cases = [
        ("host", "bad host"),
        ("host", "a/b"),
        ("host", "[::1"),
        ("host", ""),
        ("x-forwarded-proto", "1"),
        ("x-forwarded-host", "a b"),
    ];
    for (name, value) in cases {
        let r = t
            .send("GET", "/healthz", None, &[(name, value)], None)
            .await;
        assert_eq!(r.status, 200, "{name}: {value:?}: {}", r.body);
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_bodies_and_unknown_query_parameters_are_tolerated() {
    let t = TestStack::uncached().await;
    let r = t
        .send(
            "PUT",
            "/reels/ok/like?utm=1",
            Some("u1"),
            &[("content-type", "application/json")],
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!((r.status, r.body["changed"].as_bool()), (200, Some(true)));
    let r = t
        .send(
            "GET",
            "/likes?reel_ids=ok&reel_ids=other&x=y",
            None,
            &[],
            None,
        )
        .await;
    assert_eq!(r.body["counts"], serde_json::json!({"ok": 1, "other": 0}));
    t.stop().await;
}
