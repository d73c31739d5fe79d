//! The playground behind `make serve`: a page at `/` that walks through the
//! design on the real stack (a heart, a viral burst, a resize, a lost shard,
//! no cache), and the local-only control routes it uses under `/__local/`.
//! None of this is deployed and no Lambda handler sees it: the local stack
//! answers these paths before its gateway.
//!
//! * `GET /`, `GET /__local/playground/{app.js,chart.js,style.css}`: the
//!   page, one file per concern in `local/playground/`, embedded;
//! * `GET /__local/state?reel=ID`: the counting mode, the cache TTL, the
//!   lost shards, and what reads of the reel's counter items cost so far;
//! * `PUT /__local/cache` `{"ttl_ms": N}`: a new cold start of the
//!   functions with `CACHE_TTL_MS=N` (0: no count cache);
//! * `PUT /__local/lost-shard` `{"reel": ID, "shard": N}`: the fault layer
//!   makes that shard item unreadable (`DELETE`: every item readable again).
//!
//! Bad input gets a 4xx JSON answer, in the API's error shape.

use crate::apps::Apps;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use faultproxy::Proxy;
use likes::Counting;
use likes::keys::{MAX_SHARDS, ReelId, shard_key};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The longest cache TTL the control accepts (the configuration's bound).
const MAX_CACHE_TTL_MS: u64 = 3_600_000;

/// What the control routes act on.
#[derive(Clone)]
pub(crate) struct Controls {
    /// The function instance the gateway invokes.
    pub apps: Arc<Apps>,
    /// The fault layer between the functions and DynamoDB.
    pub proxy: Option<Arc<Proxy>>,
    pub counting: Counting,
    pub counters_table: String,
}

/// The page's routes and the control routes; everything else falls through
/// to the gateway.
pub(crate) fn router(controls: Controls) -> Router {
    Router::new()
        .route("/", get(|| asset("index.html")).fallback(not_allowed))
        .route(
            "/__local/playground/{file}",
            get(file).fallback(not_allowed),
        )
        .route("/__local/state", get(state).fallback(not_allowed))
        .route("/__local/cache", put(cache).fallback(not_allowed))
        .route(
            "/__local/lost-shard",
            put(lose_shard).delete(restore_shards).fallback(not_allowed),
        )
        .route("/__local", any(not_found))
        .route("/__local/{*rest}", any(not_found))
        .with_state(controls)
}

const PAGE: [(&str, &str, &str); 4] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../playground/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../playground/app.js"),
    ),
    (
        "chart.js",
        "text/javascript; charset=utf-8",
        include_str!("../../playground/chart.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../playground/style.css"),
    ),
];

async fn asset(name: &str) -> Response {
    match PAGE.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, text)) => (
            [
                (header::CONTENT_TYPE, *kind),
                (header::CACHE_CONTROL, "no-store"),
            ],
            *text,
        )
            .into_response(),
        None => error(StatusCode::NOT_FOUND, "not_found", "no such file"),
    }
}

async fn file(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    // The page itself is served at `/` only.
    if name == "index.html" {
        return error(StatusCode::NOT_FOUND, "not_found", "no such file");
    }
    asset(&name).await
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    json_answer(
        status,
        &json!({ "error": { "code": code, "message": message } }),
    )
}

fn json_answer(status: StatusCode, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such local route")
}

async fn not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this local route",
    )
}

fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "bad_request", message)
}

const BAD_REEL: &str = "reel: expected a reel id (letters, digits, _ and -)";

/// The reel named by `?reel=`, if any; else the message of the 400.
fn reel_of(uri: &Uri) -> Result<Option<ReelId>, &'static str> {
    let raw = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == "reel")
        .map(|(_, v)| v);
    match raw {
        None => Ok(None),
        Some(v) => ReelId::parse(v).map(Some).map_err(|_| BAD_REEL),
    }
}

/// The shard an unreadable key names: `NNN#reel#ID#likes`.
fn lost_shard(key: &str) -> Option<Value> {
    let (n, rest) = key.split_once("#reel#")?;
    let reel = rest.strip_suffix("#likes")?;
    let shard: u32 = n.parse().ok()?;
    Some(json!({ "reel": reel, "shard": shard }))
}

/// Everything the page shows besides what the API answers.
fn state_of(c: &Controls, reel: Option<&ReelId>) -> Value {
    let app = c.apps.current();
    let mut out = json!({
        "counting": c.counting.as_str(),
        "cache_ttl_ms": app.config.cache_ttl.as_millis() as u64,
        "fault_layer": c.proxy.is_some(),
        "lost_shards": [],
        "reads_refused": 0,
    });
    let Some(proxy) = &c.proxy else {
        return out;
    };
    let stats = proxy.stats();
    if let Some(f) = &stats.faults {
        out["lost_shards"] = f.unreadable.iter().filter_map(|k| lost_shard(k)).collect();
    }
    out["reads_refused"] = json!(stats.injected_of("unreadable"));
    if let Some(reel) = reel {
        // Items of this reel's counts (shards and base) on the counters
        // table, read through the fault layer since the stack started.
        let prefix = format!("{}/", c.counters_table);
        let suffix = format!("#reel#{reel}#likes");
        let items_read: u64 = proxy
            .key_loads()
            .iter()
            .filter(|l| {
                l.partition
                    .strip_prefix(&prefix)
                    .is_some_and(|key| key.ends_with(&suffix))
            })
            .map(|l| l.items_read)
            .sum();
        out["reel"] = json!({ "reel_id": reel.as_str(), "shard_items_read": items_read });
    }
    out
}

async fn state(State(c): State<Controls>, uri: Uri) -> Response {
    match reel_of(&uri) {
        Ok(reel) => json_answer(StatusCode::OK, &state_of(&c, reel.as_ref())),
        Err(message) => bad_request(message),
    }
}

/// The body as a JSON object, if it is one.
fn object(body: &Bytes) -> Option<serde_json::Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

const NOT_AN_OBJECT: &str = "expected a JSON object body";

async fn cache(State(c): State<Controls>, body: Bytes) -> Response {
    let Some(m) = object(&body) else {
        return bad_request(NOT_AN_OBJECT);
    };
    let Some(ttl) = m
        .get("ttl_ms")
        .and_then(Value::as_u64)
        .filter(|t| *t <= MAX_CACHE_TTL_MS)
    else {
        return bad_request("ttl_ms: expected a whole number of milliseconds, 0 to 3600000");
    };
    c.apps.restart_with_cache_ttl(Duration::from_millis(ttl));
    json_answer(StatusCode::OK, &state_of(&c, None))
}

async fn lose_shard(State(c): State<Controls>, body: Bytes) -> Response {
    let Some(m) = object(&body) else {
        return bad_request(NOT_AN_OBJECT);
    };
    let Some(reel) = m
        .get("reel")
        .and_then(Value::as_str)
        .and_then(|r| ReelId::parse(r).ok())
    else {
        return bad_request(BAD_REEL);
    };
    let Some(shard) = m
        .get("shard")
        .and_then(Value::as_u64)
        .and_then(|s| u32::try_from(s).ok())
        .filter(|s| *s < MAX_SHARDS)
    else {
        return bad_request("shard: expected a shard number, 0 to 999");
    };
    let Some(proxy) = &c.proxy else {
        return error(StatusCode::CONFLICT, "no_fault_layer", "no fault layer");
    };
    let mut faults = proxy.stats().faults.unwrap_or_default();
    faults.unreadable.insert(shard_key(&reel, shard));
    proxy.set_faults(faults);
    json_answer(StatusCode::OK, &state_of(&c, Some(&reel)))
}

async fn restore_shards(State(c): State<Controls>) -> Response {
    let Some(proxy) = &c.proxy else {
        return error(StatusCode::CONFLICT, "no_fault_layer", "no fault layer");
    };
    let mut faults = proxy.stats().faults.unwrap_or_default();
    faults.unreadable.clear();
    proxy.set_faults(faults);
    json_answer(StatusCode::OK, &state_of(&c, None))
}
