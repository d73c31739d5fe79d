//! Warm handler overhead per request, without network.
//!
//! Every case goes from the invocation's event bytes (what the Runtime API
//! hands the function) to the response bytes (what it posts back), as the
//! `lambda_runtime`/`lambda_http` adapters do, minus the Runtime API's own
//! HTTP exchange, which is the same for every function:
//!
//! * `hello/json`: the `lambda_runtime` hello-world (bench/lambda/hello):
//!   the event parsed as a `serde_json::Value`, a JSON answer serialised.
//! * `hello-http/apigw`: the `lambda_http` hello-world: the event parsed as
//!   a `LambdaRequest`, a `Response` serialised as API Gateway's.
//! * `read/get_likes_uncached`: `events/read.json` (`GET /reels/{id}/likes`
//!   with a JWT `sub`) through `likes::http::handle(&app, Function::Read, ..)`
//!   with `CACHE_TTL_MS=0` and `SETTINGS_TTL_MS=0`, so every request makes
//!   all of its DynamoDB calls (settings, shards, the caller's like row).
//! * `read/get_likes_cached`: the same with the default TTLs, so after the
//!   first request the count and the settings come from the instance's
//!   caches; the caller's like row (`liked_by_me`) is still read, one call.
//! * `like/put_like`: `events/like.json` (`PUT /reels/{id}/like` with an
//!   `Idempotency-Key`) through `handle(&app, Function::Like, ..)`, caches
//!   off: settings read, the like transaction, the count read.
//!
//! DynamoDB is the real SDK client (same config as the functions: retries,
//! timeouts, SigV4 signing, request serialisation, response parsing) with
//! `aws_smithy_http_client::test_util::infallible_client_fn` as its HTTP
//! client: the canned responses below are returned in memory, so the figure
//! is the handler's and the SDK's CPU work, not DynamoDB's latency.
//!
//! `LAMBDA_BENCH_OUTPUT` picks what the functions write per request:
//! `deployed` (the default): `lambda_runtime`'s default subscriber with
//! `AWS_LAMBDA_LOG_FORMAT=JSON` at INFO (the template's `LogFormat: JSON`)
//! and `METRICS=emf`, both on stdout, which the script sends to /dev/null;
//! `quiet`: no subscriber and `METRICS=off`. The group is named
//! `handler-<output>`.
//!
//! `LAMBDA_BENCH_META`, when set, names a JSON file that gets, per case, the
//! DynamoDB calls one request made and the response it gave (checked here
//! before anything is measured).

use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_smithy_http_client::test_util::infallible_client_fn;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpResponse;
use lambda_http::request::LambdaRequest;
use lambda_http::{Body, Request, Response};
use likes::http::{Function, handle};
use likes::store::dynamodb::{DynamoStore, client, sdk_config_loader};
use likes::{App, Config};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const READ_EVENT: &[u8] = include_bytes!("../../../../events/read.json");
const LIKE_EVENT: &[u8] = include_bytes!("../../../../events/like.json");

const COUNTERS: &str = "likes-counters";
const LIKES: &str = "likes-likes";

/// Every DynamoDB call answered, by operation (`X-Amz-Target`).
static CALLS: AtomicU64 = AtomicU64::new(0);
/// Calls of an operation this benchmark has no canned answer for.
static UNEXPECTED: AtomicU64 = AtomicU64::new(0);

// The canned answers, as DynamoDB sends them. The reel of the events is
// `reel-8841`; with no settings item it has one shard, `000#...`.
const SETTINGS_MISSING: &str = r#"{"Responses":{"likes-counters":[]},"UnprocessedKeys":{}}"#;
const SHARDS: &str = r#"{"Responses":{"likes-counters":[{"pk":{"S":"000#reel#reel-8841#likes"},"n":{"N":"42"},"w":{"N":"42"},"updated_at":{"N":"1764338592418"}}]},"UnprocessedKeys":{}}"#;
const TX_COMMITTED: &str = r#"{"ConsumedCapacity":[{"TableName":"likes-counters","CapacityUnits":4.0,"WriteCapacityUnits":4.0},{"TableName":"likes-likes","CapacityUnits":2.0,"WriteCapacityUnits":2.0}]}"#;
const NO_ITEM: &str = "{}";
const BUDGET_FLUSHED: &str = r#"{"Attributes":{"u":{"N":"1"}}}"#;
const UNKNOWN: &str =
    r#"{"__type":"com.amazon.coral.service#UnknownOperationException","message":"not canned"}"#;

fn canned(req: http::Request<SdkBody>) -> http::Response<SdkBody> {
    CALLS.fetch_add(1, Ordering::Relaxed);
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (status, body) = match target {
        "DynamoDB_20120810.BatchGetItem" => {
            let settings = req
                .body()
                .bytes()
                .is_some_and(|b| b.windows(9).any(|w| w == b"#settings"));
            (200, if settings { SETTINGS_MISSING } else { SHARDS })
        }
        "DynamoDB_20120810.TransactWriteItems" => (200, TX_COMMITTED),
        "DynamoDB_20120810.GetItem" => (200, NO_ITEM),
        // The caller's read budget, flushed across instances now and then
        // (`service::budget`): the minute's units so far, far from spent.
        "DynamoDB_20120810.UpdateItem" => (200, BUDGET_FLUSHED),
        _ => {
            UNEXPECTED.fetch_add(1, Ordering::Relaxed);
            (400, UNKNOWN)
        }
    };
    http::Response::builder()
        .status(status)
        .header("content-type", "application/x-amz-json-1.0")
        .header(
            "x-amzn-requestid",
            "BENCH0000000000000000000000000000000000000000000000",
        )
        .body(SdkBody::from(Bytes::from_static(body.as_bytes())))
        .expect("a canned response")
}

/// The functions' `App`, configured as `App::from_env` would be with `env`,
/// over the canned HTTP client.
async fn app(env: &[(&str, &str)]) -> App {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let config = Config::from_lookup(|k| env.get(k).cloned()).expect("configuration");
    let sdk = sdk_config_loader(&config)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "AKIDBENCH",
            "bench-secret",
            None,
            None,
            "bench",
        ))
        .http_client(infallible_client_fn(canned))
        .load()
        .await;
    let store = DynamoStore::new(client(&sdk, &config), &config);
    App::new(config, store)
}

/// One invocation of a `lambda_http` function, bytes to bytes.
async fn invoke(app: &App, function: Function, event: &[u8]) -> Vec<u8> {
    let lambda_request: LambdaRequest =
        serde_json::from_slice(event).expect("an API Gateway event");
    let request: Request = lambda_request.into();
    let response = handle(app, function, request).await;
    apigw_bytes(response)
}

/// The response as `lambda_http` posts it for an API Gateway v2 event.
fn apigw_bytes(response: Response<Body>) -> Vec<u8> {
    let (parts, body) = response.into_parts();
    let mut out = ApiGatewayV2httpResponse::default();
    out.status_code = i64::from(parts.status.as_u16());
    out.is_base64_encoded = matches!(body, Body::Binary(_));
    out.headers = parts.headers;
    out.body = match body {
        Body::Empty => None,
        b => Some(b),
    };
    serde_json::to_vec(&out).expect("a serialisable response")
}

/// The `lambda_runtime` hello-world's handler, bytes to bytes.
fn hello_json(event: &[u8]) -> Vec<u8> {
    let payload: Value = serde_json::from_slice(event).expect("JSON");
    let path = payload
        .get("rawPath")
        .and_then(Value::as_str)
        .unwrap_or("/");
    serde_json::to_vec(&json!({ "message": format!("hello from {path}") })).expect("JSON")
}

/// The `lambda_http` hello-world's handler, bytes to bytes.
fn hello_http(event: &[u8]) -> Vec<u8> {
    let lambda_request: LambdaRequest =
        serde_json::from_slice(event).expect("an API Gateway event");
    let request: Request = lambda_request.into();
    let body = format!("{{\"message\":\"hello from {}\"}}", request.uri().path());
    let response = Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("a response");
    apigw_bytes(response)
}

/// One request of `case`, checked: the status and body it answered and the
/// DynamoDB calls it made.
async fn probe(app: &App, function: Function, event: &[u8], want: &str) -> Value {
    let before = CALLS.load(Ordering::Relaxed);
    let out: Value = serde_json::from_slice(&invoke(app, function, event).await).expect("JSON");
    let calls = CALLS.load(Ordering::Relaxed) - before;
    let status = out["statusCode"].as_i64().unwrap_or(0);
    let body = out["body"].as_str().unwrap_or("").to_owned();
    assert_eq!(status, 200, "unexpected answer: {out}");
    assert!(
        body.contains(want),
        "unexpected body {body} (wanted {want})"
    );
    assert_eq!(
        UNEXPECTED.load(Ordering::Relaxed),
        0,
        "a DynamoDB call was not canned"
    );
    json!({ "status": status, "body": body, "dynamodb_calls": calls })
}

fn handler(c: &mut Criterion) {
    let output = std::env::var("LAMBDA_BENCH_OUTPUT").unwrap_or_else(|_| "deployed".into());
    let deployed = match output.as_str() {
        "deployed" => true,
        "quiet" => false,
        other => panic!("LAMBDA_BENCH_OUTPUT={other:?}: expected deployed or quiet"),
    };
    if deployed {
        // What `lambda_runtime::tracing::init_default_subscriber()` reads.
        // SAFETY: set before any other thread exists.
        unsafe { std::env::set_var("AWS_LAMBDA_LOG_FORMAT", "JSON") };
        lambda_http::tracing::init_default_subscriber();
    }
    let metrics = if deployed { "emf" } else { "off" };
    let base = [
        ("COUNTERS_TABLE", COUNTERS),
        ("LIKES_TABLE", LIKES),
        ("METRICS", metrics),
    ];
    let uncached: Vec<(&str, &str)> = base
        .iter()
        .copied()
        .chain([("CACHE_TTL_MS", "0"), ("SETTINGS_TTL_MS", "0")])
        .collect();

    // The functions' runtime (`#[tokio::main]`).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let app_uncached = rt.block_on(app(&uncached));
    let app_cached = rt.block_on(app(&base));

    let mut meta = serde_json::Map::new();
    meta.insert("output".into(), json!(output));
    meta.insert(
        "read/get_likes_uncached".into(),
        rt.block_on(probe(
            &app_uncached,
            Function::Read,
            READ_EVENT,
            "\"count\":42",
        )),
    );
    // The first read fills the instance's caches; the second, recorded, is
    // what every measured iteration of the cached case does.
    rt.block_on(probe(
        &app_cached,
        Function::Read,
        READ_EVENT,
        "\"count\":42",
    ));
    meta.insert(
        "read/get_likes_cached".into(),
        rt.block_on(probe(
            &app_cached,
            Function::Read,
            READ_EVENT,
            "\"count\":42",
        )),
    );
    meta.insert(
        "like/put_like".into(),
        rt.block_on(probe(
            &app_uncached,
            Function::Like,
            LIKE_EVENT,
            "\"liked\":true",
        )),
    );
    let hello: Value = serde_json::from_slice(&hello_json(READ_EVENT)).expect("JSON");
    meta.insert(
        "hello/json".into(),
        json!({ "body": hello, "dynamodb_calls": 0 }),
    );
    let hello: Value = serde_json::from_slice(&hello_http(READ_EVENT)).expect("JSON");
    meta.insert(
        "hello-http/apigw".into(),
        json!({ "body": hello, "dynamodb_calls": 0 }),
    );
    if let Ok(path) = std::env::var("LAMBDA_BENCH_META") {
        let text = serde_json::to_string_pretty(&Value::Object(meta)).expect("JSON");
        std::fs::write(&path, text).expect("writing LAMBDA_BENCH_META");
    }

    let mut g = c.benchmark_group(format!("handler-{output}"));
    g.bench_function("hello/json", |b| {
        b.iter(|| hello_json(black_box(READ_EVENT)))
    });
    g.bench_function("hello-http/apigw", |b| {
        b.iter(|| hello_http(black_box(READ_EVENT)))
    });
    g.bench_function("read/get_likes_uncached", |b| {
        b.to_async(&rt)
            .iter(|| invoke(&app_uncached, Function::Read, black_box(READ_EVENT)))
    });
    g.bench_function("read/get_likes_cached", |b| {
        b.to_async(&rt)
            .iter(|| invoke(&app_cached, Function::Read, black_box(READ_EVENT)))
    });
    g.bench_function("like/put_like", |b| {
        b.to_async(&rt)
            .iter(|| invoke(&app_uncached, Function::Like, black_box(LIKE_EVENT)))
    });
    g.finish();
    assert_eq!(
        UNEXPECTED.load(Ordering::Relaxed),
        0,
        "a DynamoDB call was not canned"
    );
}

fn config() -> Criterion {
    let secs = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(default), Duration::from_millis)
    };
    Criterion::default()
        .warm_up_time(secs("LAMBDA_BENCH_WARMUP_MS", 1))
        .measurement_time(secs("LAMBDA_BENCH_MEASURE_MS", 3))
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = handler
}
criterion_main!(benches);
