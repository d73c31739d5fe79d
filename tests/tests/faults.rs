//! Exactly-once under faults. The functions reach DynamoDB through the
//! fault-injection proxy (`FAULTS`), which loses answers after committing
//! (dropped connections, stalls past the SDK's timeout, 500s), throttles,
//! cancels transactions for conflicts, answers 500/503, leaves BatchGetItem
//! keys unprocessed and adds latency, each at 10% of requests. Clients like,
//! unlike, double tap and retry, with and without `Idempotency-Key`.
//!
//! Proves: every request is answered 200, or 429/503 when the function gives
//! up, never 500, within its time bound; clients that retry after 429/503
//! get every action counted once: the like rows, the shard sums and the
//! served counts all equal what the clients were acknowledged, and with an
//! `Idempotency-Key` even each answer's `changed` is exact. A resize and a
//! reconciliation run under the same faults keep the counts exact.
//! The proxy's counts show each fault class and the token replays happened.

mod common;

use common::TestStack;
use faultproxy::{Faults, Stats};
use futures::StreamExt;
use likes::keys::ReelId;
use likes::reconcile::{Mode, Options};
use likes::reshard::Progress;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Every fault class at 10%: 40% of transaction attempts fail one way or
/// another, 30% of other calls. Stalls outlast the SDK's attempt timeout.
const FAULTS: &str = "seed=20261129,all=0.1,stall_ms=1200,max_latency_ms=25";

/// Reconciliation's share of faults (see the test).
const RECONCILE_FAULTS: &str = "seed=7,all=0.03,stall_ms=1200,max_latency_ms=25";

const ENV: &[(&str, &str)] = &[
    ("FAULTS", FAULTS),
    ("DDB_ATTEMPT_TIMEOUT_MS", "800"),
    ("DDB_OPERATION_TIMEOUT_MS", "3000"),
    ("CACHE_TTL_MS", "200"),
    ("SETTINGS_TTL_MS", "500"),
    ("AUTO_RESHARD", "off"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("METRICS", "memory"),
    // Stream mode (LIKES_TEST_COUNTING=stream): served counts catch up with
    // the shards soon after the stream is drained.
    ("STREAM_VISIBLE_MS", "500"),
];

/// The longest any request may take: the function's own bound
/// (`REQUEST_TIMEOUT_MS`, 12 s by default) plus slack for this machine.
const REQUEST_BOUND: Duration = Duration::from_secs(15);

/// One acknowledged (2xx) like or unlike.
#[derive(Clone, Debug)]
struct Ack {
    user: String,
    reel: String,
    like: bool,
    changed: bool,
    keyed: bool,
    /// A deliberate repeat of an acknowledged request (the client "lost" the
    /// answer): the same request, not a new action.
    repeat: bool,
}

#[derive(Default)]
struct Log {
    acks: Vec<Ack>,
    statuses: BTreeMap<u16, u64>,
    client_retries: u64,
    max_latency: Duration,
    requests: u64,
}

struct Clients<'a> {
    t: &'a TestStack,
    log: Mutex<Log>,
}

impl<'a> Clients<'a> {
    fn new(t: &'a TestStack) -> Self {
        Clients {
            t,
            log: Mutex::default(),
        }
    }

    /// One HTTP request; records its status and latency.
    async fn once(
        &self,
        method: &str,
        path: &str,
        user: Option<&str>,
        key: Option<&str>,
    ) -> common::Reply {
        let headers: Vec<(&str, &str)> = key.map(|k| ("idempotency-key", k)).into_iter().collect();
        let started = Instant::now();
        let r = self.t.send(method, path, user, &headers, None).await;
        let took = started.elapsed();
        let mut log = self.log.lock().unwrap();
        *log.statuses.entry(r.status).or_default() += 1;
        log.requests += 1;
        log.max_latency = log.max_latency.max(took);
        assert!(
            took <= REQUEST_BOUND,
            "{method} {path} took {took:?}: past its retry budget"
        );
        assert!(
            matches!(r.status, 200 | 429 | 503),
            "{method} {path}: {} {}",
            r.status,
            r.body
        );
        if r.status != 200 {
            assert!(
                r.headers.contains_key("retry-after"),
                "{} without Retry-After",
                r.status
            );
            let code = r.body["error"]["code"].as_str().unwrap_or("");
            assert!(
                matches!(code, "throttled" | "contended" | "unavailable"),
                "{}",
                r.body
            );
        }
        r
    }

    /// What a well-behaved client does: retries 429/503 (with the same
    /// `Idempotency-Key`, if it has one) until the request is acknowledged.
    async fn until_ok(
        &self,
        method: &str,
        path: &str,
        user: Option<&str>,
        key: Option<&str>,
    ) -> common::Reply {
        let mut seen = Vec::new();
        for attempt in 0..60u64 {
            let r = self.once(method, path, user, key).await;
            if r.status == 200 {
                return r;
            }
            seen.push(format!("{} {}", r.status, r.body["error"]["code"]));
            self.log.lock().unwrap().client_retries += 1;
            tokio::time::sleep(Duration::from_millis(5 + 5 * attempt.min(8))).await;
        }
        panic!("{method} {path} {user:?} {key:?}: not acknowledged after 60 attempts: {seen:?}");
    }

    /// A like or unlike until acknowledged, logged.
    async fn act(
        &self,
        user: &str,
        reel: &str,
        like: bool,
        key: Option<&str>,
        repeat: bool,
    ) -> Ack {
        let ack = self.act_unlogged(user, reel, like, key, repeat).await;
        self.log.lock().unwrap().acks.push(ack.clone());
        ack
    }

    async fn act_unlogged(
        &self,
        user: &str,
        reel: &str,
        like: bool,
        key: Option<&str>,
        repeat: bool,
    ) -> Ack {
        let method = if like { "PUT" } else { "DELETE" };
        let r = self
            .until_ok(method, &format!("/reels/{reel}/like"), Some(user), key)
            .await;
        assert_eq!(r.body["liked"].as_bool(), Some(like), "{}", r.body);
        assert!(
            r.body["count"].as_i64().is_some_and(|c| c >= 0),
            "{}",
            r.body
        );
        Ack {
            user: user.into(),
            reel: reel.into(),
            like,
            changed: r.body["changed"].as_bool().expect("changed"),
            keyed: key.is_some(),
            repeat,
        }
    }

    /// One user's session: `steps` random actions over `reels`.
    async fn session(&self, user: usize, keyed: bool, reels: &[String], steps: usize, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed ^ (user as u64) << 20);
        let name = format!("user{user}");
        let mut n = 0usize;
        let mut key = |rng: &mut fastrand::Rng| {
            n += 1;
            keyed.then(|| format!("{name}-{n}-{}", rng.u32(..)))
        };
        for _ in 0..steps {
            let reel = &reels[rng.usize(..reels.len())];
            let like = rng.f64() < 0.6;
            match rng.u8(..10) {
                // A double tap: the same action twice at once (two taps,
                // two keys). Logged in commit order: the one that changed
                // the state (if either did) went first.
                0 | 1 => {
                    let (k1, k2) = (key(&mut rng), key(&mut rng));
                    let (a, b) = futures::join!(
                        self.act_unlogged(&name, reel, like, k1.as_deref(), false),
                        self.act_unlogged(&name, reel, like, k2.as_deref(), false)
                    );
                    if keyed {
                        assert!(
                            !(a.changed && b.changed),
                            "{name} {reel}: a double tap changed twice"
                        );
                    }
                    let (a, b) = if b.changed { (b, a) } else { (a, b) };
                    self.log.lock().unwrap().acks.extend([a, b]);
                }
                // The client lost an acknowledged answer and sends the same
                // request again.
                2 | 3 => {
                    let k = key(&mut rng);
                    let first = self.act(&name, reel, like, k.as_deref(), false).await;
                    let again = self.act(&name, reel, like, k.as_deref(), true).await;
                    if keyed {
                        assert_eq!(
                            again.changed, first.changed,
                            "{name} {reel}: a keyed repeat answers as the first did"
                        );
                    } else {
                        assert!(
                            !again.changed,
                            "{name} {reel}: an unkeyed repeat changes nothing"
                        );
                    }
                }
                // Feed reads in between.
                4 => {
                    let ids = reels.join(",");
                    let r = self
                        .until_ok("GET", &format!("/likes?reel_ids={ids}"), Some(&name), None)
                        .await;
                    // Every reel answered, or listed as unavailable (its
                    // sum kept failing under the faults): never both,
                    // never neither.
                    let counts = r.body["counts"].as_object().expect("counts");
                    let unavailable: Vec<&str> = r.body["unavailable"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                        .unwrap_or_default();
                    assert_eq!(counts.len() + unavailable.len(), reels.len(), "{}", r.body);
                    assert!(
                        unavailable.iter().all(|u| !counts.contains_key(*u)),
                        "{}",
                        r.body
                    );
                    let r = self
                        .until_ok("GET", &format!("/reels/{reel}/likes"), Some(&name), None)
                        .await;
                    assert!(r.body["count"].as_i64().is_some_and(|c| c >= 0));
                }
                _ => {
                    let k = key(&mut rng);
                    self.act(&name, reel, like, k.as_deref(), false).await;
                }
            }
        }
    }

    /// The state each user was last acknowledged in, per reel: the count
    /// every reel must show.
    fn expected(&self) -> HashMap<String, i64> {
        let log = self.log.lock().unwrap();
        let mut last: HashMap<(&str, &str), bool> = HashMap::new();
        for a in &log.acks {
            last.insert((a.user.as_str(), a.reel.as_str()), a.like);
        }
        let mut out: HashMap<String, i64> = HashMap::new();
        for ((_, reel), liked) in last {
            *out.entry(reel.to_owned()).or_default() += liked as i64;
        }
        out
    }

    /// With an `Idempotency-Key`, `changed` is exact: per user and reel the
    /// changes alternate like, unlike, like... and end in the final state.
    fn check_keyed_changes(&self) {
        let log = self.log.lock().unwrap();
        let mut per: HashMap<(&str, &str), (bool, bool)> = HashMap::new();
        for a in log.acks.iter().filter(|a| a.keyed && !a.repeat) {
            let (liked, _) = per.entry((a.user.as_str(), a.reel.as_str())).or_default();
            if a.changed {
                assert_ne!(
                    *liked, a.like,
                    "{} {}: changed twice to {}",
                    a.user, a.reel, a.like
                );
                *liked = a.like;
            } else {
                assert_eq!(
                    *liked, a.like,
                    "{} {}: {} answered unchanged from the other state",
                    a.user, a.reel, a.like
                );
            }
        }
    }
}

async fn truth(t: &TestStack, reel: &str) -> (i64, i64) {
    (t.like_rows(reel).await as i64, t.shard_sum(reel).await)
}

fn proxy_stats(t: &TestStack) -> Stats {
    t.stack
        .proxy
        .as_ref()
        .expect("FAULTS starts the proxy")
        .stats()
}

/// Turns the faults off, for the final reads; in stream mode
/// (`LIKES_TEST_COUNTING=stream`) also waits until the aggregator has
/// applied the whole stream.
async fn calm(t: &TestStack) {
    if let Some(p) = &t.stack.proxy {
        p.set_faults(Faults::default());
    }
    let started = Instant::now();
    while !t
        .stack
        .streams_caught_up()
        .await
        .expect("reading the stream")
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the stream was not drained"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !t.stack.streams.is_empty() {
        // Past the own-change promise of stream mode (STREAM_VISIBLE_MS).
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
}

fn report(name: &str, value: Value) {
    eprintln!("{name}: {}", serde_json::to_string_pretty(&value).unwrap());
    let dir = common::repo_root().join("target").join("fault-reports");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{name}.json")), value.to_string());
}

fn write_paths(t: &TestStack) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    // The `Writes` counter by `WritePath`, as the EMF recorder flushed it;
    // `applied`, which it leaves out, from the likes and unlikes applied
    // less the other paths that applied one (docs/reference.md).
    let mut applied = 0;
    for line in t.stack.config.metrics.lines() {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(p) = v["WritePath"].as_str() {
            *out.entry(p.to_owned()).or_default() += v["Writes"].as_u64().unwrap_or(0);
        } else if v["Function"] == "like" {
            applied += v["LikesApplied"].as_u64().unwrap_or(0);
            applied += v["UnlikesApplied"].as_u64().unwrap_or(0);
        }
    }
    let other = ["replayed", "committed"].map(|p| out.get(p).copied().unwrap_or(0));
    out.insert("applied".into(), applied.saturating_sub(other.iter().sum()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_like_counts_once_under_every_fault() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TEST_LOG")
                .unwrap_or_else(|_| "off".into()),
        )
        .with_test_writer()
        .try_init();
    let mut env = ENV.to_vec();
    env.extend(common::UNBOUNDED_CALLERS);
    let t = TestStack::start(&env).await;
    let reels: Vec<String> = (0..6).map(|i| format!("faulty{i}")).collect();
    let clients = Clients::new(&t);
    let started = Instant::now();
    futures::stream::iter(0..32usize)
        .for_each_concurrent(None, |u| {
            let (c, reels) = (&clients, &reels);
            async move { c.session(u, u % 2 == 0, reels, 25, 7).await }
        })
        .await;
    let elapsed = started.elapsed();

    let stats = proxy_stats(&t);
    calm(&t).await;
    let expected = clients.expected();
    let mut counts = BTreeMap::new();
    for reel in &reels {
        let want = expected.get(reel).copied().unwrap_or(0);
        let (rows, sum) = truth(&t, reel).await;
        assert_eq!(rows, want, "{reel}: like rows vs acknowledged");
        assert_eq!(sum, rows, "{reel}: shard sum vs like rows");
        tokio::time::sleep(Duration::from_millis(250)).await; // past the cache
        assert_eq!(t.http_count(reel).await, rows, "{reel}: served count");
        // Every change was made within the hour: each window holds them
        // all, once (they ride on the same transactions).
        assert_eq!(t.like_windows(reel).await, [rows; 3], "{reel}: windows");
        counts.insert(reel.clone(), rows);
    }
    clients.check_keyed_changes();

    // Every fault class happened, and retried transactions reached the
    // emulator's token handling.
    for class in [
        "lost_dropped",
        "lost_stalled",
        "lost_500",
        "throttle",
        "conflict",
        "server_error",
        "unprocessed",
        "latency",
    ] {
        assert!(
            stats.injected_of(class) > 0,
            "no {class} injected: {stats:?}"
        );
    }
    assert!(stats.tokens.replayed_after_commit > 0, "{:?}", stats.tokens);
    let paths = write_paths(&t);
    // The handler's paths: the emulator's replay of a committed token, and
    // key records answering retries whose body changed.
    for path in [
        "applied",
        "replayed",
        "already_in_state",
        "resolved_by_record",
    ] {
        assert!(
            paths.get(path).is_some_and(|n| *n > 0),
            "no {path}: {paths:?}"
        );
    }

    let summary = {
        let log = clients.log.lock().unwrap();
        let likes_acked = log.acks.iter().filter(|a| a.like).count();
        json!({
            "faults": FAULTS,
            "seconds": elapsed.as_secs_f64(),
            "http_requests": log.requests,
            "statuses": log.statuses,
            "client_retries_after_429_503": log.client_retries,
            "acknowledged": { "likes": likes_acked, "unlikes": log.acks.len() - likes_acked },
            "max_request_ms": log.max_latency.as_millis() as u64,
            "final_counts": counts,
            "write_paths": paths,
            "proxy": stats,
        })
    };
    report("exactly_once", summary);
    t.stop().await;
}

/// Takes every step of a resize through the faulty proxy, as the scheduled
/// runs would: a failed step is simply tried again.
async fn resize(t: &TestStack, reel: &ReelId, target: u32) -> u32 {
    let r = &t.stack.app.reshard;
    let mut failures = 0;
    loop {
        match r.begin(reel, target).await {
            Ok(_) => break,
            Err(e) if e.status() >= 500 || e.status() == 429 => failures += 1,
            Err(e) => panic!("begin: {e:?}"),
        }
    }
    let started = Instant::now();
    loop {
        match r.advance(reel).await {
            Ok(Progress::Stable(s)) if s.write_shards == target && s.read_shards == target => {
                return failures;
            }
            Ok(Progress::Stable(s)) => panic!("resize ended at {s:?}"),
            Ok(Progress::Waiting { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(Progress::Interrupted) => {}
            Err(_) => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(90), "resize stuck");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resizing_and_reconciling_under_faults_stay_exact() {
    let mut env = ENV.to_vec();
    env.extend(common::UNBOUNDED_CALLERS);
    env.extend([
        // Short resize waits: the settings and request bounds they cover.
        ("REQUEST_TIMEOUT_MS", "4000"),
        ("REQUEST_BUDGET_MS", "3000"),
        ("RESIZE_MARGIN_MS", "200"),
        ("RECONCILE_PAGE_ITEMS", "50"),
        ("RECONCILE_CHECKPOINT_PAGES", "1"),
        ("RECONCILE_SEGMENTS", "4"),
        ("RECONCILE_CLOCK_SKEW_MS", "0"),
    ]);
    let t = TestStack::start(&env).await;
    let reels: Vec<String> = vec!["resized".into(), "steady".into()];
    let id = ReelId::parse("resized").unwrap();
    let clients = Clients::new(&t);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let load = async {
        let mut round = 0u64;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            futures::stream::iter(0..16usize)
                .for_each_concurrent(None, |u| {
                    let (c, reels) = (&clients, &reels);
                    async move {
                        c.session(u + 100 * round as usize, u % 2 == 0, reels, 5, round)
                            .await
                    }
                })
                .await;
            round += 1;
        }
    };
    let resizes = async {
        let grow = resize(&t, &id, 8).await;
        let shrink = resize(&t, &id, 1).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (grow, shrink)
    };
    let ((), (grow_failures, shrink_failures)) = tokio::join!(load, resizes);
    let folds = t
        .stack
        .app
        .reshard
        .store()
        .stats()
        .folds
        .load(std::sync::atomic::Ordering::SeqCst);
    // A shrink keeps each retired shard as a closed, empty tombstone (it
    // fences stream aggregation planned before it; see crate::reshard):
    // only shard 0 is open and holds a count.
    let left = t.shards("resized").await;
    let open: Vec<String> = t
        .scan(&t.stack.config.counters_table)
        .await
        .into_iter()
        .filter_map(|item| {
            let pk = item.get("pk")?.as_s().ok()?.clone();
            // Shard items only: the base item holds the folded counts.
            let shard =
                likes::keys::parse_shard_key(&pk).is_some_and(|(_, r)| r.as_str() == "resized");
            (shard && !item.contains_key(likes::keys::SHARD_CLOSED)).then_some(pk)
        })
        .collect();
    // Stream mode counts in writer items, not shards: its shard items
    // hold nothing to fold and nothing fences on them.
    if t.stack.config.counting == likes::config::Counting::Transactional {
        assert_eq!(open, ["000#reel#resized#likes"], "{left:?}");
        assert!(
            left.iter().all(|(s, n)| *s == 0 || *n == 0),
            "folded shards are emptied: {left:?}"
        );
    }

    // In stream mode the counts are the stream's, applied once it is read.
    calm(&t).await;
    let expected = clients.expected();
    for reel in &reels {
        let want = expected.get(reel).copied().unwrap_or(0);
        let (rows, sum) = truth(&t, reel).await;
        assert_eq!(rows, want, "{reel}: like rows vs acknowledged");
        assert_eq!(sum, rows, "{reel}: shard sum vs like rows after the resize");
        // The folds moved each shard's windowed buckets with its value.
        tokio::time::sleep(Duration::from_millis(250)).await; // past the cache
        assert_eq!(
            t.like_windows(reel).await,
            [rows; 3],
            "{reel}: windows after the resize"
        );
    }
    clients.check_keyed_changes();

    // Drift, then reconciliation runs through the faults until one
    // finishes: each reel corrected exactly once.
    t.put_shard("steady", 0, 1000).await;
    t.put_shard("ghost", 0, 7).await;
    let reconcile = &t.stack.app.reconcile;
    // A run makes hundreds of calls, every one of which must eventually
    // succeed; at 10% per class (30–40% of calls failing) almost every
    // invocation fails somewhere. It runs under 3% per class, with its
    // invocations handing the run over on failure.
    if let Some(p) = &t.stack.proxy {
        p.set_faults(Faults::parse(RECONCILE_FAULTS).unwrap());
    }
    // Nothing is written during the runs: no reel is deferred for being
    // written, once the deferral window (the request bound) has passed.
    tokio::time::sleep(Duration::from_millis(6200)).await;
    let mut attempts = 0;
    let mut errors = 0;
    let summary = loop {
        attempts += 1;
        assert!(attempts < 240, "reconciliation never finished");
        match reconcile
            .run(&Options {
                mode: Mode::Start,
                ..Options::default()
            })
            .await
        {
            Ok(s) if s.complete => break s,
            Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(_) => errors += 1,
        }
    };
    calm(&t).await;
    for reel in &reels {
        let want = expected.get(reel).copied().unwrap_or(0);
        assert_eq!(
            truth(&t, reel).await,
            (want, want),
            "{reel} after reconciling"
        );
    }
    assert_eq!(
        t.shard_sum("ghost").await,
        0,
        "a reel without likes reconciled to zero"
    );
    let stats = proxy_stats(&t);
    report(
        "resize_and_reconcile",
        json!({
            "faults": FAULTS,
            "resize_step_failures": { "grow": grow_failures, "shrink": shrink_failures },
            "folds": folds,
            "reconcile_faults": RECONCILE_FAULTS,
            "reconcile_invocations": attempts,
            "reconcile_failed_invocations": errors,
            "reconcile_last": {
                "invocation": summary.invocation,
                "reels_corrected": summary.reels_corrected,
                "corrected": summary.corrected_reels,
                "rows_scanned": summary.rows_scanned,
            },
            "statuses": clients.log.lock().unwrap().statuses,
            "proxy_failures_injected": stats.failures_injected,
            "proxy_injected": stats.injected,
        }),
    );
    t.stop().await;
}
