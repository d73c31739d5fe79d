//! The proxy's state: the seeded schedule, the per-key capacity model, the
//! conflict model's holds, the learned key schemas and the counters. One
//! `std` mutex guards it; it is never held across an await, so a stalled
//! answer stalls nobody else.

use crate::config::Faults;
use crate::conflicts::{Holds, ModeledConflicts};
use crate::protocol::{self, Touch};
use crate::schema::KeySchemas;
use crate::stats::{KeyLoad, Stats};
use bytes::Bytes;
use hyper::HeaderMap;
use serde_json::{Map, Value, json};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What to do with one request.
pub(crate) struct Planned {
    /// Latency to add before anything else.
    pub delay: Duration,
    pub plan: Plan,
    /// Whether (and how) to lose the answer after forwarding.
    pub lost: Option<Lost>,
    /// The conflict model's hold on a transaction to forward (`Held`),
    /// and how long its answer is held back.
    pub held: Option<(u64, Duration)>,
}

pub(crate) enum Plan {
    /// Answer this without forwarding.
    Refuse { status: u16, body: Value },
    /// Forward this body (or the original, `None`); for a `BatchGetItem`,
    /// add these keys (table → request spec) to `UnprocessedKeys`.
    Forward {
        body: Option<Value>,
        unprocessed: Option<Map<String, Value>>,
    },
}

/// A request answered `answer` without being forwarded.
fn refused(delay: Duration, (status, body): (u16, Value)) -> Planned {
    Planned {
        delay,
        plan: Plan::Refuse { status, body },
        lost: None,
        held: None,
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Lost {
    /// Close the connection without an answer.
    Dropped,
    /// Hold the answer this long, then close the connection.
    Stalled(Duration),
    /// Answer 500 although the request was applied.
    ServerError,
}

#[derive(Default)]
struct Window {
    second: u64,
    write: f64,
    read: f64,
    load: KeyLoad,
}

impl Window {
    /// Starts a new one-second window when `second` moved on.
    fn roll(&mut self, second: u64) {
        if self.second != second {
            self.second = second;
            self.write = 0.0;
            self.read = 0.0;
        }
    }

    fn charge(&mut self, t: &Touch) {
        if self.write == 0.0 && self.read == 0.0 {
            self.load.active_seconds += 1;
        }
        self.write += t.write_units;
        self.read += t.read_units;
        self.load.write_units += t.write_units;
        self.load.read_units += t.read_units;
        self.load.items_read += u64::from(t.read_units > 0.0);
        self.load.items_written += u64::from(t.write_units > 0.0);
        self.load.max_write_units_per_sec = self.load.max_write_units_per_sec.max(self.write);
        self.load.max_read_units_per_sec = self.load.max_read_units_per_sec.max(self.read);
    }
}

#[derive(Default)]
struct Token {
    forwarded: u32,
    committed: bool,
    body: u64,
}

pub(crate) struct Inner {
    pub(crate) faults: Faults,
    pub(crate) rng: fastrand::Rng,
    started: Instant,
    /// The tables' key schemas, learned with DescribeTable.
    schemas: KeySchemas,
    windows: HashMap<String, Window>,
    tokens: HashMap<String, Token>,
    holds: Holds,
    pub(crate) stats: Stats,
}

pub(crate) struct Shared {
    upstream: String,
    client: reqwest::Client,
    inner: Mutex<Inner>,
}

pub(crate) fn bump(map: &mut BTreeMap<String, u64>, key: &str) {
    *map.entry(key.to_owned()).or_default() += 1;
}

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl Inner {
    fn new(faults: Faults) -> Inner {
        Inner {
            rng: fastrand::Rng::with_seed(faults.seed),
            faults,
            started: Instant::now(),
            schemas: KeySchemas::default(),
            windows: HashMap::new(),
            tokens: HashMap::new(),
            holds: Holds::default(),
            stats: Stats::default(),
        }
    }

    fn loads(&self) -> Vec<KeyLoad> {
        self.windows.values().map(|w| w.load.clone()).collect()
    }

    pub(crate) fn inject(&mut self, class: &str, op: &str) {
        bump(self.stats.injected.entry(class.to_owned()).or_default(), op);
    }
}

const THROTTLE_MESSAGE: &str = "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling your table or index so please try again shortly.";

impl Shared {
    pub(crate) fn new(upstream: &str, faults: Faults) -> Shared {
        Shared {
            upstream: upstream.to_owned(),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .unwrap_or_default(),
            inner: Mutex::new(Inner::new(faults)),
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the counters in a
        // state worse than slightly off; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_faults(&self, faults: Faults) {
        let mut g = self.lock();
        g.rng = fastrand::Rng::with_seed(faults.seed);
        g.faults = faults;
    }

    pub(crate) fn reset(&self) {
        let mut g = self.lock();
        g.stats = Stats::default();
        g.windows.clear();
        g.tokens.clear();
        // Holds of transactions in flight stay: they are not counters.
        g.holds.stats = ModeledConflicts::default();
        g.started = Instant::now();
    }

    pub(crate) fn stats(&self) -> Stats {
        let g = self.lock();
        let mut s = g.stats.clone();
        s.faults = Some(g.faults.clone());
        s.seconds = g.started.elapsed().as_secs_f64();
        s.failures_injected = s
            .injected
            .iter()
            .filter(|(class, _)| class.as_str() != "latency")
            .flat_map(|(_, m)| m.values())
            .sum::<u64>()
            + g.holds.stats.total();
        s.modeled_conflicts = g.holds.stats.clone();
        let mut keys = g.loads();
        keys.sort_by(|a, b| {
            b.max_write_units_per_sec
                .total_cmp(&a.max_write_units_per_sec)
                .then(
                    b.max_read_units_per_sec
                        .total_cmp(&a.max_read_units_per_sec),
                )
                .then(a.partition.cmp(&b.partition))
        });
        keys.truncate(20);
        s.hot_keys = keys;
        s
    }

    /// The transaction of hold `id` has its answer (or was abandoned).
    pub(crate) fn release(&self, id: u64) {
        self.lock().holds.release(id, Instant::now());
    }

    /// Every partition key's load since the last reset, in no order: for
    /// callers that attribute units to their own traffic (the benchmark's
    /// units per like), which the 20 hottest keys of [`Stats`] cannot.
    pub(crate) fn key_loads(&self) -> Vec<KeyLoad> {
        self.lock().loads()
    }

    /// Learns the key schema of every table in `touches`, with a
    /// DescribeTable to the emulator the first time a table is seen.
    pub(crate) async fn learn_tables(&self, touches: &[Touch], headers: &HeaderMap) {
        let tables: Vec<String> = {
            let g = self.lock();
            let mut t: Vec<String> = touches
                .iter()
                .map(|t| t.table.clone())
                .filter(|t| !g.schemas.looked_up(t))
                .collect();
            t.sort();
            t.dedup();
            t
        };
        for table in tables {
            let mut h = HeaderMap::new();
            for name in ["authorization", "x-amz-date", "x-amz-security-token"] {
                if let Some(v) = headers.get(name) {
                    h.insert(name, v.clone());
                }
            }
            h.insert(
                "x-amz-target",
                hyper::header::HeaderValue::from_static("DynamoDB_20120810.DescribeTable"),
            );
            h.insert(
                "content-type",
                hyper::header::HeaderValue::from_static("application/x-amz-json-1.0"),
            );
            let body = Bytes::from(json!({ "TableName": table }).to_string());
            let described = match self.forward(&h, body).await {
                Ok((status, _, b)) if status.is_success() => {
                    serde_json::from_slice::<Value>(&b).ok()
                }
                Ok((status, _, b)) => {
                    tracing::warn!(%table, %status, answer = %String::from_utf8_lossy(&b), "DescribeTable failed: every key of the table counts as its own partition");
                    None
                }
                Err(e) => {
                    tracing::warn!(%table, error = %e, "DescribeTable failed: every key of the table counts as its own partition");
                    None
                }
            };
            self.lock().schemas.learn(table, described.as_ref());
        }
    }

    /// Decides what happens to one request: the fault draw, then the
    /// capacity model; charges the capacity of what will be forwarded.
    pub(crate) fn plan(&self, op: &str, body: &Value, touches: &[Touch]) -> Planned {
        let mut g = self.lock();
        let g = &mut *g;
        bump(&mut g.stats.requests, op);
        let rates = g.faults.rates_for(op);
        let mut delay = Duration::ZERO;
        if rates.latency > 0.0 && g.rng.f64() < rates.latency {
            delay = g.faults.max_latency.mul_f64(g.rng.f64());
            g.inject("latency", op);
        }
        // An unreadable item fails every read of it, before the refusal draw (so
        // the rest of the schedule is the same with or without it).
        if !g.faults.unreadable.is_empty()
            && touches.iter().any(|t| {
                t.read_units > 0.0 && {
                    let p = g.schemas.partition(t);
                    let value = p.split_once('/').map_or(p.as_str(), |(_, v)| v);
                    g.faults.unreadable.contains(value)
                }
            })
        {
            g.inject("unreadable", op);
            return refused(
                delay,
                protocol::error(
                    500,
                    "InternalServerError",
                    "Internal server error (the item is unreadable)",
                ),
            );
        }
        let tx = protocol::is_transaction(op);
        let n_items = if tx {
            protocol::transaction_items(body)
        } else {
            0
        };

        let u = g.rng.f64();
        let mut edge = rates.throttle;
        if u < edge {
            g.inject("throttle", op);
            let answer = match g.rng.u8(0..3) {
                0 if tx => {
                    let hit = g.rng.usize(0..n_items.max(1));
                    protocol::cancelled(n_items, &[hit], "ThrottlingError", THROTTLE_MESSAGE)
                }
                1 => protocol::throttling(),
                _ => protocol::throughput_exceeded(),
            };
            return refused(delay, answer);
        }
        edge += rates.server_error;
        if u < edge {
            g.inject("server_error", op);
            let answer = if g.rng.bool() {
                protocol::error(500, "InternalServerError", "Internal server error")
            } else {
                protocol::error(503, "ServiceUnavailable", "Service unavailable")
            };
            return refused(delay, answer);
        }
        if tx {
            edge += rates.conflict;
            if u < edge {
                g.inject("conflict", op);
                let hit = g.rng.usize(0..n_items.max(1));
                return refused(delay, protocol::conflict_cancelled(n_items, &[hit]));
            }
        }
        edge += rates.lost;
        let lost = (u < edge).then(|| match g.rng.u8(0..3) {
            0 => Lost::Dropped,
            1 => Lost::Stalled(g.faults.stall),
            _ => Lost::ServerError,
        });

        // The conflict model: after the random refusals (a request they
        // refuse never reaches DynamoDB's transaction coordinator) and
        // before the capacity model (so a refused request costs nothing).
        if g.faults.conflict_hold.is_some()
            && let Some(answer) = g.holds.check(op, body, touches, &g.schemas, Instant::now())
        {
            return refused(delay, answer);
        }

        // The capacity model.
        let second = g.started.elapsed().as_secs();
        let partitions: Vec<String> = touches.iter().map(|t| g.schemas.partition(t)).collect();
        let mut want: HashMap<&str, (f64, f64)> = HashMap::new();
        for (t, p) in touches.iter().zip(&partitions) {
            let e = want.entry(p.as_str()).or_default();
            e.0 += t.write_units;
            e.1 += t.read_units;
        }
        let (write_cap, read_cap) = (g.faults.write_cap, g.faults.read_cap);
        let over = |g: &mut Inner, p: &str, w: f64, r: f64| -> bool {
            let win = g.windows.entry(p.to_owned()).or_default();
            win.roll(second);
            (w > 0.0 && write_cap.is_some_and(|cap| win.write + w > cap))
                || (r > 0.0 && read_cap.is_some_and(|cap| win.read + r > cap))
        };
        let batch_get = op == "BatchGetItem";
        let mut unread: Vec<usize> = Vec::new();
        if batch_get {
            // Keys over the read cap, and (as a fault) a random part of the
            // rest, come back unprocessed.
            let fault = rates.unprocessed > 0.0 && g.rng.f64() < rates.unprocessed;
            for (i, (t, p)) in touches.iter().zip(&partitions).enumerate() {
                if over(g, p, t.write_units, t.read_units) {
                    g.inject("capacity_throttle", op);
                    if let Some(w) = g.windows.get_mut(p) {
                        w.load.throttled += 1;
                    }
                    unread.push(i);
                } else if fault && g.rng.bool() {
                    unread.push(i);
                }
            }
            if fault && unread.is_empty() && !touches.is_empty() {
                unread.push(g.rng.usize(0..touches.len()));
            }
            if fault {
                g.inject("unprocessed", op);
            }
            if !touches.is_empty() && unread.len() == touches.len() {
                return refused(delay, protocol::throughput_exceeded());
            }
        } else {
            let hot: Vec<String> = want
                .iter()
                .filter(|&(p, &(w, r))| over(g, p, w, r))
                .map(|(p, _)| (*p).to_owned())
                .collect();
            if !hot.is_empty() {
                g.inject("capacity_throttle", op);
                for p in &hot {
                    if let Some(w) = g.windows.get_mut(p) {
                        w.load.throttled += 1;
                    }
                }
                let answer = if tx {
                    let hit: Vec<usize> = partitions
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| hot.contains(p))
                        .map(|(i, _)| i)
                        .collect();
                    protocol::cancelled(n_items, &hit, "ThrottlingError", THROTTLE_MESSAGE)
                } else {
                    protocol::throughput_exceeded()
                };
                return refused(delay, answer);
            }
        }
        for (i, (t, p)) in touches.iter().zip(&partitions).enumerate() {
            if unread.contains(&i) {
                continue;
            }
            let win = g.windows.entry(p.clone()).or_default();
            if win.load.partition.is_empty() {
                win.load.partition = p.clone();
            }
            win.roll(second);
            win.charge(t);
            *g.stats.write_units.entry(op.to_owned()).or_default() += t.write_units;
            *g.stats.read_units.entry(op.to_owned()).or_default() += t.read_units;
        }
        if let Some(l) = lost {
            let class = match l {
                Lost::Dropped => "lost_dropped",
                Lost::Stalled(_) => "lost_stalled",
                Lost::ServerError => "lost_500",
            };
            g.inject(class, op);
        }
        // Past every refusal: a transaction to forward holds its items.
        let held = (g.faults.conflict_hold)
            .filter(|_| op == "TransactWriteItems")
            .map(|hold| (g.holds.hold(body, touches, &g.schemas), hold));
        let (body, unprocessed) = if unread.is_empty() {
            (None, None)
        } else {
            let (b, u) = split_batch(body, touches, &unread);
            (Some(b), Some(u))
        };
        Planned {
            delay,
            plan: Plan::Forward { body, unprocessed },
            lost,
            held,
        }
    }

    /// Sends `body` to the emulator with the request's headers.
    pub(crate) async fn forward(
        &self,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<(hyper::StatusCode, HeaderMap, Bytes), reqwest::Error> {
        let mut req = self.client.post(format!("{}/", self.upstream));
        for (name, value) in headers {
            if !matches!(
                name.as_str(),
                "host" | "content-length" | "connection" | "transfer-encoding"
            ) {
                req = req.header(name.clone(), value.clone());
            }
        }
        let resp = req.body(body).send().await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await?;
        Ok((status, headers, bytes))
    }

    /// Counts a forwarded request and, for a transaction with a token,
    /// which answer a reuse of that token got.
    pub(crate) fn after_forward(
        &self,
        op: &str,
        body: &Value,
        raw: &Bytes,
        status: hyper::StatusCode,
        answer: &Bytes,
    ) {
        let mut g = self.lock();
        let g = &mut *g;
        bump(&mut g.stats.forwarded, op);
        if op == "Query" && status.is_success() {
            // A query's units depend on what it returned: charged here,
            // once the answer is back (a request alone cannot say).
            let answer: Value = serde_json::from_slice(answer).unwrap_or(Value::Null);
            if let Some((t, items)) = protocol::query_read(body, &answer) {
                let p = g.schemas.partition(&t);
                let second = g.started.elapsed().as_secs();
                let win = g.windows.entry(p.clone()).or_default();
                if win.load.partition.is_empty() {
                    win.load.partition = p;
                }
                win.roll(second);
                win.charge(&t);
                win.load.items_read += items.saturating_sub(1);
                *g.stats.read_units.entry(op.to_owned()).or_default() += t.read_units;
            }
            return;
        }
        if op != "TransactWriteItems" {
            return;
        }
        let Some(token) = protocol::client_token(body) else {
            return;
        };
        let h = hash(raw);
        let t = g.tokens.entry(token.to_owned()).or_default();
        let s = &mut g.stats.tokens;
        s.forwarded += 1;
        if t.forwarded == 0 {
            t.body = h;
        } else {
            s.reused += 1;
            if t.body != h {
                s.reused_with_other_body += 1;
            }
            if t.committed {
                if status.is_success() {
                    s.replayed_after_commit += 1;
                } else if protocol::error_kind(answer).as_deref()
                    == Some("IdempotentParameterMismatchException")
                {
                    s.mismatch_after_commit += 1;
                } else {
                    s.other_after_commit += 1;
                }
            } else {
                s.reused_before_commit += 1;
            }
        }
        t.forwarded += 1;
        if status.is_success() {
            t.committed = true;
        }
    }
}

/// Splits a `BatchGetItem` body: the request without the keys at `unread`
/// (indexes into `touches`, in the order `protocol::touches` lists them),
/// and those keys as `UnprocessedKeys` entries carrying the request's read
/// options.
fn split_batch(body: &Value, touches: &[Touch], unread: &[usize]) -> (Value, Map<String, Value>) {
    let mut out = body.clone();
    let mut unprocessed = Map::new();
    let mut removed: HashMap<&str, Vec<&Map<String, Value>>> = HashMap::new();
    for &i in unread {
        if let Some(t) = touches.get(i) {
            removed.entry(t.table.as_str()).or_default().push(&t.key);
        }
    }
    if let Some(items) = out.get_mut("RequestItems").and_then(Value::as_object_mut) {
        for (table, gone) in removed {
            let Some(spec) = items.get_mut(table) else {
                continue;
            };
            let mut left_out = spec.clone();
            if let Some(keys) = spec.get_mut("Keys").and_then(Value::as_array_mut) {
                keys.retain(|k| !gone.iter().any(|g| k.as_object() == Some(*g)));
            }
            left_out["Keys"] =
                Value::Array(gone.into_iter().map(|k| Value::Object(k.clone())).collect());
            unprocessed.insert(table.to_owned(), left_out);
        }
        items.retain(|_, spec| {
            spec.get("Keys")
                .and_then(Value::as_array)
                .is_some_and(|k| !k.is_empty())
        });
    }
    (out, unprocessed)
}
