//! The playground's local-only routes on a stack started as `make serve`
//! starts it (`StackOptions::playground`): the page and its files, the
//! control routes' answers to good and bad input, and what a lost shard
//! and a dropped cache do to the API's count (the browser test,
//! scripts/playground-test.sh, drives the same through the page).

use likes_local::{Stack, StackOptions};
use serde_json::{Value, json};
use std::path::Path;

async fn stack() -> Stack {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut opts = StackOptions::isolated(root.join("template.yaml"));
    opts.playground = true;
    opts.env.insert("LOCAL_SCHEDULE_SECS".into(), "0".into());
    Stack::start(opts).await.expect("stack starts")
}

/// (status, content type, body) of one request.
async fn send(
    s: &Stack,
    method: &str,
    path: &str,
    user: Option<&str>,
    body: Option<&str>,
) -> (u16, String, String) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", s.base_url));
    if let Some(u) = user {
        req = req.header("x-user-id", u);
    }
    if let Some(b) = body {
        req = req.body(b.to_owned());
    }
    let r = req.send().await.unwrap();
    let kind = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), kind, r.text().await.unwrap())
}

async fn json(
    s: &Stack,
    method: &str,
    path: &str,
    user: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let (status, kind, text) = send(s, method, path, user, body).await;
    assert_eq!(kind, "application/json", "{method} {path}: {text}");
    (status, serde_json::from_str(&text).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_its_files_are_served_and_nothing_else_changes() {
    let s = stack().await;
    let (status, kind, page) = send(&s, "GET", "/", None, None).await;
    assert_eq!((status, kind.as_str()), (200, "text/html; charset=utf-8"));
    for file in ["app.js", "chart.js", "style.css"] {
        assert!(
            page.contains(&format!("/__local/playground/{file}")),
            "{file}"
        );
        let (status, _, text) = send(
            &s,
            "GET",
            &format!("/__local/playground/{file}"),
            None,
            None,
        )
        .await;
        assert_eq!(status, 200, "{file}");
        assert!(!text.is_empty());
    }
    let (status, body) = json(&s, "GET", "/__local/playground/nope.js", None, None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    // The API's routes are the gateway's, as before.
    let (status, body) = json(&s, "PUT", "/reels/r1/like", Some("u1"), None).await;
    assert_eq!((status, body["count"].as_i64()), (200, Some(1)), "{body}");
    let (status, _) = json(&s, "GET", "/nope", None, None).await;
    assert_eq!(status, 404);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_the_control_routes_is_a_4xx_json_answer() {
    let s = stack().await;
    for (method, path, body, status) in [
        ("PUT", "/__local/cache", Some("x"), 400),
        ("PUT", "/__local/cache", Some("[]"), 400),
        ("PUT", "/__local/cache", Some(r#"{"ttl_ms": -1}"#), 400),
        ("PUT", "/__local/cache", Some(r#"{"ttl_ms": 1.5}"#), 400),
        ("PUT", "/__local/cache", Some(r#"{"ttl_ms": 3600001}"#), 400),
        ("PUT", "/__local/cache", None, 400),
        (
            "PUT",
            "/__local/lost-shard",
            Some(r#"{"reel": "a b", "shard": 0}"#),
            400,
        ),
        (
            "PUT",
            "/__local/lost-shard",
            Some(r#"{"reel": "r1", "shard": 1000}"#),
            400,
        ),
        ("PUT", "/__local/lost-shard", Some(r#"{"reel": "r1"}"#), 400),
        ("GET", "/__local/state?reel=a%20b", None, 400),
        ("POST", "/__local/cache", None, 405),
        ("GET", "/__local/lost-shard", None, 405),
        ("POST", "/", None, 405),
        ("GET", "/__local/nope", None, 404),
        ("GET", "/__local", None, 404),
    ] {
        let (got, body) = json(&s, method, path, None, body).await;
        assert_eq!(got, status, "{method} {path} {body:?}");
        assert!(body["error"]["code"].is_string(), "{method} {path}: {body}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shard_is_served_from_the_cache_then_unavailable_without_it() {
    let s = stack().await;
    for u in ["u1", "u2"] {
        assert_eq!(
            json(&s, "PUT", "/reels/r1/like", Some(u), None).await.0,
            200
        );
    }
    let count = || json(&s, "GET", "/reels/r1/likes", Some("u1"), None);
    assert_eq!(count().await.1["count"], 2);
    let (_, state) = json(&s, "GET", "/__local/state?reel=r1", None, None).await;
    assert_eq!(state["counting"], "transactional");
    assert_eq!(state["cache_ttl_ms"], 2000);
    assert_eq!(state["fault_layer"], true);
    let read_before = state["reel"]["shard_items_read"].as_u64().unwrap();
    assert!(read_before >= 1, "{state}");

    let (status, state) = json(
        &s,
        "PUT",
        "/__local/lost-shard",
        None,
        Some(r#"{"reel": "r1", "shard": 0}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(state["lost_shards"], json!([{"reel": "r1", "shard": 0}]));
    // The cached sum is still served...
    let (status, body) = count().await;
    assert_eq!((status, body["count"].as_i64()), (200, Some(2)), "{body}");
    // ...and with no cache, the read fails: the trade, measured.
    let (status, state) = json(&s, "PUT", "/__local/cache", None, Some(r#"{"ttl_ms": 0}"#)).await;
    assert_eq!((status, state["cache_ttl_ms"].as_u64()), (200, Some(0)));
    let (status, body) = count().await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    let (_, state) = json(&s, "GET", "/__local/state?reel=r1", None, None).await;
    assert!(state["reads_refused"].as_u64().unwrap() >= 1, "{state}");

    // Every shard readable again: every read sums the shards (no cache).
    let (status, state) = json(&s, "DELETE", "/__local/lost-shard", None, None).await;
    assert_eq!((status, state["lost_shards"].clone()), (200, json!([])));
    for _ in 0..3 {
        assert_eq!(count().await.1["count"], 2);
    }
    let (_, state) = json(&s, "GET", "/__local/state?reel=r1", None, None).await;
    let read_after = state["reel"]["shard_items_read"].as_u64().unwrap();
    assert!(
        read_after >= read_before + 3,
        "{read_before} -> {read_after}"
    );
    s.shutdown().await;
}
