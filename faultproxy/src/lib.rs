//! A fault-injection proxy for the DynamoDB JSON protocol, and for Kinesis
//! Data Streams'.
//!
//! Local emulators are kind: they answer every request, never throttle and
//! never cancel a transaction for a conflict. Real DynamoDB does all of
//! that, and the ambiguous case (the write committed, the answer was lost)
//! is exactly where a counter double counts or loses a like. This proxy sits
//! between the SDK (`AWS_ENDPOINT_URL_DYNAMODB` points at it) and a local
//! emulator and makes those faults happen, on a seeded random schedule, per
//! operation (`X-Amz-Target` names it):
//!
//! * **lost answers** after the request was forwarded and committed: the
//!   connection is dropped, held past the client's timeout, or answered 500;
//! * **throttling** before forwarding, and a **per-partition-key capacity
//!   model**: write (or read) units per key per second above a cap are
//!   refused, the way one DynamoDB partition refuses a hot key;
//! * **transaction conflicts**: `TransactionCanceledException` with
//!   `TransactionConflict` reasons, at random, or by the **conflict model**
//!   (`conflict_hold_ms`): a request on an item that a transaction in
//!   flight holds gets DynamoDB's documented conflict answer;
//! * **500/503** server errors and **added latency**;
//! * **`UnprocessedKeys`** on `BatchGetItem`.
//!
//! A retried request (same `ClientRequestToken`) goes through to the
//! emulator, whose token handling answers it (a replay of the committed
//! transaction, or `IdempotentParameterMismatch` for another body), and the
//! proxy counts which of those each retry got. Everything it did is counted
//! in [`Stats`] (`GET /__proxy/stats` on the proxy's own port).
//!
//! The same proxy stands in front of a Kinesis emulator (kinesis-mock):
//! requests whose `X-Amz-Target` is `Kinesis_20131202.*` take the Kinesis
//! classes instead ([`KinesisRates`]: throttles, lost answers and
//! `PutRecords`' per-record failures), counted in [`Stats::injected`] as
//! `kinesis_*` and per record in [`Stats::kinesis`]. One proxy forwards to
//! one upstream, so a stack with both runs two, each started with
//! [`Proxy::start`] and the same spec syntax.
//!
//! # Layout
//!
//! * [`config`]: what to inject ([`Faults`]), and its one text form.
//! * `protocol`: operations, the items a request touches and what they cost,
//!   DynamoDB's error bodies.
//! * `schema`: the tables' key schemas, learned with `DescribeTable`: the
//!   partition and the item a key is on.
//! * `kinesis`: the Kinesis classes, and `PutRecords`' split and merge.
//! * `conflicts`: the conflict model, which requests conflict with a
//!   transaction in flight and what they get, citing the AWS documents.
//! * `state`: the schedule, the capacity model, the conflict model's holds
//!   and the counters, behind one lock that is never held across an await.
//! * `stats`: what the counters are ([`Stats`], the Kinesis ones too).
//! * this file: the HTTP server and the forwarding, which releases a
//!   transaction's holds when its answer is back.

pub mod config;
mod conflicts;
mod kinesis;
mod protocol;
mod schema;
mod state;
mod stats;

pub use config::{Faults, KinesisRates, Rates};
pub use conflicts::ModeledConflicts;
pub use stats::{KeyLoad, KinesisStats, Stats, TokenStats};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use state::{Lost, Plan, Shared};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy. Dropping it does not stop it; call [`Proxy::shutdown`].
pub struct Proxy {
    /// `http://host:port` of the proxy: the endpoint to give the SDK.
    pub url: String,
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The error a request's service future ends with when the proxy loses the
/// answer on purpose: hyper then closes the connection without a response.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("answer dropped by the fault schedule")
    }
}

impl std::error::Error for Dropped {}

/// A transaction's hold on its items (the conflict model), released when
/// this is dropped: when its answer is back, or when its request is
/// abandoned (the client hung up) before that.
struct Held {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.release(self.id);
    }
}

impl Proxy {
    /// Listens on `listen` (port 0 = any free port) and forwards to
    /// `upstream` (e.g. `http://127.0.0.1:8000`).
    pub async fn start(listen: &str, upstream: &str, faults: Faults) -> Result<Proxy> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the fault proxy on {listen}"))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(upstream.trim_end_matches('/'), faults));
        let (stop, mut stopped) = watch::channel(false);
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = stopped.wait_for(|v| *v) => break,
                };
                let Ok((stream, _)) = accepted else { continue };
                let s = s.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| serve(s.clone(), req));
                    // An error here is usually a connection dropped on
                    // purpose; nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Proxy {
            url: format!("http://{addr}"),
            addr,
            shared,
            stop,
            task,
        })
    }

    /// What the proxy has done so far.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Every partition key's load since the last reset (`stats()` keeps
    /// only the 20 hottest).
    pub fn key_loads(&self) -> Vec<KeyLoad> {
        self.shared.key_loads()
    }

    /// Replaces the fault configuration; the counters stay.
    pub fn set_faults(&self, faults: Faults) {
        self.shared.set_faults(faults);
    }

    /// Zeroes the counters and the capacity windows.
    pub fn reset_stats(&self) {
        self.shared.reset();
    }

    /// Stops accepting connections (open ones finish their requests).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Stops accepting connections and waits for the accept loop to end.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

type Answer = Response<Full<Bytes>>;

fn json_answer(status: u16, body: &Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    r
}

async fn serve(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Answer, Dropped> {
    // The proxy's own routes, beside the DynamoDB protocol (which is always
    // POST /).
    match (req.method().as_str(), req.uri().path()) {
        ("GET", "/__proxy/stats") => {
            let stats = serde_json::to_value(shared.stats()).unwrap_or(Value::Null);
            return Ok(json_answer(200, &stats));
        }
        ("POST", "/__proxy/reset") => {
            shared.reset();
            return Ok(json_answer(200, &json!({"reset": true})));
        }
        ("PUT", "/__proxy/faults") => {
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            let spec = body
                .ok()
                .and_then(|b| String::from_utf8(b.to_vec()).ok())
                .unwrap_or_default();
            return Ok(match Faults::parse(&spec) {
                Ok(f) => {
                    shared.set_faults(f.clone());
                    json_answer(200, &serde_json::to_value(f).unwrap_or(Value::Null))
                }
                Err(e) => json_answer(400, &json!({"error": e})),
            });
        }
        _ => {}
    }
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let op = protocol::operation(target.as_deref());
    let headers = req.headers().clone();
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return Err(Dropped);
    };
    if kinesis::is_kinesis(target.as_deref()) {
        return kinesis::serve(&shared, &op, &headers, body).await;
    }
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // The items the request touches, worked out once for both the schema
    // lookup and the plan.
    let touches = protocol::touches(&op, &parsed);
    shared.learn_tables(&touches, &headers).await;

    let plan = shared.plan(&op, &parsed, &touches);
    // Made before any await, so an abandoned request releases its hold too.
    let (held, hold) = match plan.held {
        Some((id, hold)) => (
            Some(Held {
                shared: shared.clone(),
                id,
            }),
            hold,
        ),
        None => (None, Duration::ZERO),
    };
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    let (forward_body, unprocessed) = match plan.plan {
        Plan::Refuse { status, body } => return Ok(json_answer(status, &body)),
        Plan::Forward {
            body: Some(b),
            unprocessed,
        } => (Bytes::from(b.to_string()), unprocessed),
        Plan::Forward {
            body: None,
            unprocessed,
        } => (body.clone(), unprocessed),
    };
    let upstream = shared.forward(&headers, forward_body).await;
    // The conflict model's transaction takes its hold before its answer
    // (see conflicts.rs), and is over once the answer goes out, even if the
    // schedule then loses that answer.
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    drop(held);
    let (status, up_headers, up_body) = match upstream {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, op, "upstream unreachable");
            let (s, b) = protocol::error(500, "InternalServerError", "upstream unreachable");
            return Ok(json_answer(s, &b));
        }
    };
    shared.after_forward(&op, &parsed, &body, status, &up_body);

    match plan.lost {
        Some(Lost::Dropped) => return Err(Dropped),
        Some(Lost::Stalled(d)) => {
            tokio::time::sleep(d).await;
            return Err(Dropped);
        }
        Some(Lost::ServerError) => {
            let (s, b) = protocol::error(
                500,
                "InternalServerError",
                "Internal server error (the request may have been applied)",
            );
            return Ok(json_answer(s, &b));
        }
        None => {}
    }

    let (out_body, modified) = match unprocessed {
        Some(keys) if status == 200 => (add_unprocessed(&up_body, keys), true),
        _ => (up_body, false),
    };
    Ok(upstream_answer(status, &up_headers, out_body, modified))
}

/// The emulator's answer with `body` (`modified`: the proxy changed it) and
/// the emulator's headers.
fn upstream_answer(
    status: StatusCode,
    headers: &hyper::HeaderMap,
    body: Bytes,
    modified: bool,
) -> Answer {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    for (name, value) in headers.iter() {
        // A body the proxy changed no longer matches the emulator's CRC.
        let skip = matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) || (modified && name.as_str() == "x-amz-crc32");
        if !skip {
            r.headers_mut().append(name.clone(), value.clone());
        }
    }
    r
}

/// Puts `keys` (table → the request's spec with the keys left unread) into
/// the answer's `UnprocessedKeys`.
fn add_unprocessed(body: &Bytes, keys: Map<String, Value>) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        return body.clone();
    };
    let Some(obj) = v.as_object_mut() else {
        return body.clone();
    };
    let entry = obj
        .entry("UnprocessedKeys")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(map) = entry.as_object_mut() {
        for (table, spec) in keys {
            match map.get_mut(&table) {
                Some(existing) => {
                    if let (Some(have), Some(more)) = (
                        existing.get_mut("Keys").and_then(Value::as_array_mut),
                        spec.get("Keys").and_then(Value::as_array),
                    ) {
                        have.extend(more.iter().cloned());
                    }
                }
                None => {
                    map.insert(table, spec);
                }
            }
        }
    }
    Bytes::from(v.to_string())
}

#[cfg(test)]
mod tests {
    //! The forwarding's part in the conflict model, against a stand-in
    //! emulator that is slow to answer transactions: the hold starts when
    //! the proxy forwards and lasts until the answer plus the hold.

    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers `DescribeTable` with a `pk` hash key and everything else
    /// with `{}`, transactions after `slow`; counts the transactions.
    async fn emulator(slow: Duration) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let count = count.clone();
                        async move {
                            let op = protocol::operation(
                                req.headers()
                                    .get("x-amz-target")
                                    .and_then(|v| v.to_str().ok()),
                            );
                            let body = match op.as_str() {
                                "DescribeTable" => json!({"Table": {"KeySchema": [
                                    {"AttributeName": "pk", "KeyType": "HASH"}
                                ]}}),
                                "TransactWriteItems" => {
                                    count.fetch_add(1, Ordering::SeqCst);
                                    tokio::time::sleep(slow).await;
                                    json!({})
                                }
                                _ => json!({}),
                            };
                            Ok::<_, std::convert::Infallible>(json_answer(200, &body))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (url, seen)
    }

    fn update(pk: &str) -> Value {
        json!({"Update": {"TableName": "T", "Key": {"pk": {"S": pk}}, "UpdateExpression": "ADD n :one"}})
    }

    /// Sends `op` with `body` through the proxy: (status, answer).
    async fn send(proxy: &Proxy, op: &str, body: Value) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/", proxy.url))
            .header("x-amz-target", format!("DynamoDB_20120810.{op}"))
            .header("content-type", "application/x-amz-json-1.0")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    fn tx(pks: &[&str]) -> Value {
        json!({"TransactItems": pks.iter().map(|pk| update(pk)).collect::<Vec<_>>()})
    }

    fn codes(answer: &Value) -> Vec<String> {
        answer["CancellationReasons"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|r| r["Code"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn a_transaction_holds_its_items_until_its_held_back_answer_goes_out() {
        let (upstream, seen) = emulator(Duration::from_millis(300)).await;
        let faults = Faults::parse("conflict_hold_ms=500").unwrap();
        let proxy = Arc::new(
            Proxy::start("127.0.0.1:0", &upstream, faults)
                .await
                .unwrap(),
        );
        let p = proxy.clone();
        let first = tokio::spawn(async move { send(&p, "TransactWriteItems", tx(&["a"])).await });
        while seen.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // In flight at the emulator: a transaction on a is cancelled at a,
        // a single write to a conflicts, and other items are free.
        let (status, answer) = send(&proxy, "TransactWriteItems", tx(&["b", "a"])).await;
        assert_eq!(status, 400);
        assert_eq!(codes(&answer), ["None", "TransactionConflict"]);
        let single = json!({"TableName": "T", "Key": {"pk": {"S": "a"}}});
        let (status, answer) = send(&proxy, "UpdateItem", single.clone()).await;
        assert_eq!(status, 400);
        assert!(
            answer["__type"]
                .as_str()
                .unwrap()
                .ends_with("#TransactionConflictException")
        );
        assert_eq!(send(&proxy, "GetItem", single).await.0, 200);
        // Answered by the emulator (300 ms), its answer held back for the
        // hold: the items are still held.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!first.is_finished(), "the answer is held back");
        let (status, _) = send(&proxy, "TransactWriteItems", tx(&["a"])).await;
        assert_eq!(status, 400, "held until the answer goes out");
        assert_eq!(first.await.unwrap().0, 200);
        // The caller's next transaction, sent on the answer, is free.
        assert_eq!(send(&proxy, "TransactWriteItems", tx(&["a"])).await.0, 200);
        assert_eq!(
            seen.load(Ordering::SeqCst),
            2,
            "refusals were not forwarded"
        );

        let stats = proxy.stats();
        let m = &stats.modeled_conflicts;
        assert_eq!(m.refused["TransactWriteItems"], 2);
        assert_eq!(m.refused["UpdateItem"], 1);
        assert_eq!(m.holds, 2);
        assert_eq!(stats.failures_injected, 3);
        assert_eq!(
            stats.injected_of("conflict"),
            0,
            "the random class is apart"
        );

        // Off (the default), overlapping transactions all go through.
        proxy.set_faults(Faults::default());
        let (a, b) = tokio::join!(
            send(&proxy, "TransactWriteItems", tx(&["a"])),
            send(&proxy, "TransactWriteItems", tx(&["a"]))
        );
        assert_eq!((a.0, b.0), (200, 200));
        assert_eq!(seen.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_unreadable_item_fails_every_read_of_it_and_no_write() {
        let (upstream, _) = emulator(Duration::ZERO).await;
        let faults = Faults::parse("unreadable=lost").unwrap();
        let proxy = Proxy::start("127.0.0.1:0", &upstream, faults)
            .await
            .unwrap();
        let key = |pk: &str| json!({"pk": {"S": pk}});
        let get = |pk: &str| json!({"TableName": "T", "Key": key(pk)});
        let batch = |pks: &[&str]| json!({"RequestItems": {"T": {"Keys": pks.iter().map(|p| key(p)).collect::<Vec<_>>()}}});
        let (status, answer) = send(&proxy, "GetItem", get("lost")).await;
        assert_eq!(status, 500);
        assert!(
            answer["__type"]
                .as_str()
                .unwrap()
                .ends_with("#InternalServerError")
        );
        assert_eq!(send(&proxy, "GetItem", get("kept")).await.0, 200);
        assert_eq!(
            send(&proxy, "BatchGetItem", batch(&["kept", "lost"]))
                .await
                .0,
            500
        );
        assert_eq!(send(&proxy, "BatchGetItem", batch(&["kept"])).await.0, 200);
        let tx_get = json!({"TransactItems": [{"Get": get("lost")}]});
        assert_eq!(send(&proxy, "TransactGetItems", tx_get).await.0, 500);
        // Writes go through.
        assert_eq!(send(&proxy, "UpdateItem", get("lost")).await.0, 200);
        assert_eq!(
            send(&proxy, "TransactWriteItems", tx(&["lost"])).await.0,
            200
        );

        let stats = proxy.stats();
        assert_eq!(stats.injected_of("unreadable"), 3);
        assert_eq!(stats.failures_injected, 3);
        let loads = proxy.key_loads();
        let load = |p: &str| loads.iter().find(|l| l.partition == p).unwrap();
        assert_eq!(load("T/kept").items_read, 2);
        assert_eq!(load("T/lost").items_read, 0);
        assert_eq!(load("T/lost").items_written, 2);

        // Back to readable once the fault is gone.
        proxy.set_faults(Faults::default());
        assert_eq!(send(&proxy, "GetItem", get("lost")).await.0, 200);
    }
}
