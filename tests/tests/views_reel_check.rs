//! A deployment's reel check applies to views as to likes: a batch naming
//! an id the check refuses is answered 404 `reel_not_found` and nothing of
//! it reaches the log, so views of invented ids are never stored (each
//! would be a partition of its own, for ever).
//!
//! The function instance is built as a deployment's `main.rs` builds it,
//! with its own check, and handed API Gateway events as Lambda hands them
//! (the event is `events/views.json`, its body and viewer replaced); the
//! views go through the local stack's Kinesis and aggregator.

mod common;

use common::TestStack;
use common::views_log::views_of;
use futures::future::BoxFuture;
use likes::App;
use likes::error::Error;
use likes::http::Function;
use likes::keys::ReelId;
use likes::service::ReelCheck;
use likes::store::dynamodb::DynamoStore;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Knows the reels whose ids start with `pub`; counts its lookups.
#[derive(Default)]
struct Catalogue {
    lookups: AtomicU32,
}

impl ReelCheck for Catalogue {
    fn exists<'a>(&'a self, reel: &'a ReelId) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            self.lookups.fetch_add(1, Ordering::Relaxed);
            Ok(reel.as_str().starts_with("pub"))
        })
    }
}

/// `POST /views` of `body` by `viewer`, as API Gateway hands it over.
async fn post(app: &App, viewer: &str, body: Value) -> (u16, Value) {
    let mut event: Value =
        serde_json::from_str(&std::fs::read_to_string("../events/views.json").unwrap()).unwrap();
    event["body"] = Value::String(body.to_string());
    event["isBase64Encoded"] = Value::Bool(false);
    let headers = event["headers"].as_object_mut().unwrap();
    headers.remove("idempotency-key");
    headers.insert("x-user-id".into(), Value::String(viewer.into()));
    let claims = &mut event["requestContext"]["authorizer"]["jwt"]["claims"];
    claims["sub"] = Value::String(viewer.into());
    claims["username"] = Value::String(viewer.into());
    let req = lambda_http::request::from_str(&event.to_string()).unwrap();
    let resp = likes::http::handle(app, Function::View, req).await;
    let status = resp.status().as_u16();
    let bytes = match resp.into_body() {
        lambda_http::Body::Text(t) => t.into_bytes(),
        lambda_http::Body::Binary(b) => b,
        _ => Vec::new(),
    };
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_batch_naming_an_unknown_reel_is_refused_whole() {
    let t = TestStack::start(&[
        ("LOCAL_VIEWS", "on"),
        ("LOCAL_VIEWS_SHARDS", "1"),
        ("LOCAL_SCHEDULE_SECS", "0"),
    ])
    .await;
    let config = t.stack.config.clone();
    let catalogue = Arc::new(Catalogue::default());
    let app = App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    )
    .with_views_of(&t.stack.app)
    .with_reel_check(catalogue.clone());

    let (status, body) = post(
        &app,
        "v1",
        json!({"views": [{"reel_id": "pub-a", "count": 3}]}),
    )
    .await;
    assert_eq!((status, &body), (202, &json!({"accepted": 3})));
    let (status, body) = post(
        &app,
        "v2",
        json!({"views": [{"reel_id": "pub-a", "count": 1}, {"reel_id": "invented", "count": 1000}]}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "reel_not_found", "{body}");
    // Known reels are looked up once per instance.
    let (status, _) = post(
        &app,
        "v3",
        json!({"views": [{"reel_id": "pub-a", "count": 2}]}),
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        catalogue.lookups.load(Ordering::Relaxed),
        2,
        "pub-a once, invented once"
    );

    // What was accepted is counted; nothing of the refused batch is.
    let started = Instant::now();
    while views_of(&t, "pub-a").await < 5 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "views not applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(views_of(&t, "pub-a").await, 5);
    assert_eq!(views_of(&t, "invented").await, 0);
    t.stop().await;
}
