//! Resizing a reel's shards, through the local stack (real handlers, real
//! SDK, embedded dynoxide), with the waits shortened by configuration:
//!
//! * grow 1 → 20 and shrink 20 → 1 while likes (then likes and unlikes) run
//!   and a reader polls: the final count equals the like rows and every
//!   acknowledged change, and during the likes-only run the total the
//!   reader sees never decreases;
//! * a run that dies after any single write is finished by the next
//!   scheduled run with the exact count;
//! * concurrent resize requests: one target wins, the others join or get
//!   409; concurrent runs on one reel do not double fold;
//! * a fold racing a like on the shard being folded loses nothing;
//! * automatic grow under a burst above the threshold (observed by the read
//!   path) and automatic shrink after the cool-down (the scheduled run);
//! * the admin routes validate their input, and `make serve`'s local
//!   schedule completes a resize on its own.

mod common;

use common::TestStack;
use futures::StreamExt;
use likes::keys::{Action, ReelId, UserId};
use likes::reshard::{Progress, Resharder};
use likes::store::dynamodb::DynamoStore;
use likes::store::{CounterStore, FoldResult, LikeTx, Phase, ResizeStore, TxResult};
use likes::token::RequestToken;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// Waits of about two seconds between steps instead of 22 s: settings cached
/// 100 ms, requests cut at 1 s, DynamoDB calls at 1 s, no margin. No background schedule and no
/// automatic resizing unless a test asks for them.
const FAST: &[(&str, &str)] = &[
    ("SETTINGS_TTL_MS", "100"),
    ("REQUEST_TIMEOUT_MS", "1000"),
    ("REQUEST_BUDGET_MS", "800"),
    ("RESIZE_MARGIN_MS", "0"),
    ("DDB_OPERATION_TIMEOUT_MS", "1000"),
    ("CACHE_TTL_MS", "0"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("AUTO_RESHARD", "off"),
    // A scheduled run may sleep for a step due within 5 s, so one run
    // completes what it starts (the production default, 0, never sleeps).
    ("RESHARD_MAX_WAIT_MS", "5000"),
];

async fn fast(extra: &[(&str, &str)]) -> TestStack {
    let mut env: Vec<(&str, &str)> = FAST.to_vec();
    env.retain(|(k, _)| !extra.iter().any(|(x, _)| x == k));
    env.extend_from_slice(extra);
    TestStack::start(&env).await
}

fn reel(s: &str) -> ReelId {
    ReelId::parse(s).unwrap()
}

/// Takes every step of the reel's resize, sleeping until each is due.
async fn drive(r: &Resharder<DynamoStore>, reel: &ReelId) {
    let started = Instant::now();
    loop {
        match r.advance(reel).await.expect("advance") {
            Progress::Stable(_) => return,
            Progress::Waiting { due_ms, .. } => {
                let now = likes_now_ms();
                tokio::time::sleep(Duration::from_millis((due_ms - now).max(0) as u64 + 5)).await;
            }
            Progress::Interrupted => unreachable!("no limit"),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "resize stuck");
    }
}

fn likes_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn post_shards(t: &TestStack, reel: &str, shards: u32) -> common::Reply {
    t.send(
        "POST",
        &format!("/admin/reels/{reel}/shards"),
        None,
        &[("content-type", "application/json")],
        Some(json!({ "shards": shards }).to_string().into_bytes()),
    )
    .await
}

/// Counts the acknowledged changes of a set of concurrent writers.
#[derive(Default)]
struct Acked {
    net: AtomicI64,
}

/// Users `prefix-0..`, each liking `reel` once (and, with `unlikes`, every
/// third one unliking again), until `stop`. Every reply must be 200.
async fn writers(
    t: &TestStack,
    reel: &str,
    prefix: &str,
    unlikes: bool,
    stop: &AtomicBool,
    acked: &Acked,
) {
    futures::stream::iter(0..)
        .take_while(|_| std::future::ready(!stop.load(Ordering::SeqCst)))
        .for_each_concurrent(8, |i| async move {
            let user = format!("{prefix}-{i}");
            let r = t.like(&user, reel).await;
            assert_eq!(r.status, 200, "{}", r.body);
            if r.body["changed"] == true {
                acked.net.fetch_add(1, Ordering::SeqCst);
            }
            if unlikes && i % 3 == 0 {
                let r = t.unlike(&user, reel).await;
                assert_eq!(r.status, 200, "{}", r.body);
                if r.body["changed"] == true {
                    acked.net.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })
        .await;
}

/// Polls the count until `stop`; returns what it saw, in order.
async fn reader(t: &TestStack, reel: &str, stop: &AtomicBool) -> Vec<i64> {
    let mut seen = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        seen.push(t.http_count(reel).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen
}

async fn state(t: &TestStack, reel: &str) -> serde_json::Value {
    let r = t
        .send(
            "GET",
            &format!("/admin/reels/{reel}/shards"),
            None,
            &[],
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grow_and_shrink_under_load_keep_the_count_exact_and_never_decreasing() {
    let t = fast(&[]).await;
    let r = &t.stack.app.reshard;
    for (name, unlikes) in [("steady", false), ("churn", true)] {
        let id = reel(name);
        let stop = AtomicBool::new(false);
        let acked = Acked::default();
        let resize = async {
            // Let some likes land on the single shard first.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let g = post_shards(&t, name, 20).await;
            assert_eq!(
                (g.status, g.body["phase"].as_str()),
                (202, Some("growing")),
                "{}",
                g.body
            );
            drive(r, &id).await;
            let s = state(&t, name).await;
            assert_eq!(
                (s["read_shards"].as_u64(), s["write_shards"].as_u64()),
                (Some(20), Some(20))
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            let atomic_reads = r.store().stats().fold_group_reads.load(Ordering::SeqCst);
            let g = post_shards(&t, name, 1).await;
            assert_eq!(
                (g.status, g.body["phase"].as_str()),
                (202, Some("draining")),
                "{}",
                g.body
            );
            drive(r, &id).await;
            // While it drained, the reader's sums read the fold group as
            // one snapshot (the base item's fold counter around its shards).
            assert!(r.store().stats().fold_group_reads.load(Ordering::SeqCst) > atomic_reads);
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.store(true, Ordering::SeqCst);
        };
        let ((), (), seen) = tokio::join!(
            resize,
            writers(&t, name, name, unlikes, &stop, &acked),
            reader(&t, name, &stop)
        );
        let rows = t.like_rows(name).await as i64;
        assert!(rows > 50, "{name}: only {rows} likes landed");
        assert_eq!(
            rows,
            acked.net.load(Ordering::SeqCst),
            "{name}: rows vs acknowledged"
        );
        assert_eq!(t.shard_sum(name).await, rows, "{name}");
        assert_eq!(t.http_count(name).await, rows, "{name}");
        // Folded and cleaned up: shard 000 alone holds likes (the others
        // are empty tombstones), one shard, out of the index.
        let shards = t.shards(name).await;
        assert!(
            shards.iter().all(|(s, n)| *s == 0 || *n == 0),
            "{name}: {shards:?}"
        );
        let s = state(&t, name).await;
        assert_eq!(
            (
                s["read_shards"].as_u64(),
                s["write_shards"].as_u64(),
                s["phase"].as_str()
            ),
            (Some(1), Some(1), Some("stable"))
        );
        assert!(
            !t.stack
                .app
                .reshard
                .store()
                .indexed_reels()
                .await
                .unwrap()
                .contains(&id)
        );
        assert!(
            seen.len() > 20,
            "{name}: the reader polled {} times",
            seen.len()
        );
        if !unlikes {
            for w in seen.windows(2) {
                assert!(
                    w[1] >= w[0],
                    "{name}: the total went down: {} then {}",
                    w[0],
                    w[1]
                );
            }
        }
    }
    t.stop().await;
}

/// Seeds `reel` with `likes` real likes spread over `shards` shards.
async fn seed(t: &TestStack, reel: &str, shards: u32, likes: usize) {
    t.set_shards(reel, shards, shards).await;
    futures::stream::iter(0..likes)
        .for_each_concurrent(16, |i| async move {
            let r = t.like(&format!("{reel}-u{i}"), reel).await;
            assert_eq!(r.status, 200);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_dies_after_any_write_is_finished_by_the_next() {
    let t = fast(&[]).await;
    let app = &t.stack.app;
    // A shrink 4 -> 1 writes at most: 3 folds, the cleanup step, 3 closes
    // and the stable step (8); a grow writes one step. Crash after k writes
    // for every k, each on its own reel, all resizes started together.
    let mut cases = Vec::new();
    for k in 0..=8u32 {
        let name = format!("shrink-{k}");
        seed(&t, &name, 4, 40).await;
        cases.push((name, k, 1u32));
    }
    for k in 0..=1u32 {
        let name = format!("grow-{k}");
        seed(&t, &name, 1, 10).await;
        cases.push((name, k, 6u32));
    }
    for (name, _, target) in &cases {
        let (_, s) = app.reshard.begin(&reel(name), *target).await.unwrap();
        assert_ne!(s.phase, Phase::Stable);
    }
    tokio::time::sleep(app.reshard.wait() + Duration::from_millis(50)).await;
    for (name, k, _) in &cases {
        let p = app
            .reshard
            .advance_limited(&reel(name), Some(*k))
            .await
            .unwrap();
        if *k < 8 && name.starts_with("shrink") || *k < 1 {
            assert_eq!(p, Progress::Interrupted, "{name}");
        }
        // Whatever the crash left, readers see the exact count.
        assert_eq!(
            t.http_count(name).await,
            t.like_rows(name).await as i64,
            "{name} after the crash"
        );
    }
    // The next scheduled run (a new invocation: a fresh resharder) finds
    // them through the index and finishes every one.
    let next = Resharder::new(
        DynamoStore::new(t.stack.client.clone(), &t.stack.config),
        &t.stack.config,
    );
    let summary = next.run_scheduled(None).await.unwrap();
    assert_eq!(summary.errors, 0, "{summary:?}");
    for (name, _, target) in &cases {
        let s = next.state(&reel(name)).await.unwrap();
        assert_eq!(
            (s.phase, s.write_shards, s.read_shards),
            (Phase::Stable, *target, *target),
            "{name}"
        );
        let rows = t.like_rows(name).await as i64;
        assert_eq!(t.shard_sum(name).await, rows, "{name}");
        assert_eq!(t.http_count(name).await, rows, "{name}");
        if *target == 1 {
            assert!(
                t.shards(name).await.iter().all(|(s, n)| *s == 0 || *n == 0),
                "{name}: retired shards emptied (kept as closed tombstones)"
            );
        }
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_resizes_of_one_reel_one_wins_and_runs_do_not_double_fold() {
    let t = fast(&[]).await;
    seed(&t, "contested", 1, 30).await;
    let replies: Vec<_> = futures::stream::iter(0..12u32)
        .map(|i| post_shards(&t, "contested", if i % 2 == 0 { 5 } else { 9 }))
        .buffer_unordered(12)
        .collect()
        .await;
    let started: Vec<_> = replies
        .iter()
        .filter(|r| r.body["outcome"] == "started")
        .collect();
    assert_eq!(
        started.len(),
        1,
        "{replies:?}",
        replies = replies.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    let winner = started[0].body["target"].as_u64().unwrap();
    for r in &replies {
        if r.status == 202 {
            assert_eq!(r.body["target"].as_u64(), Some(winner), "{}", r.body);
            assert!(r.body["outcome"] == "started" || r.body["outcome"] == "joined");
        } else {
            assert_eq!(
                (r.status, r.body["error"]["code"].as_str()),
                (409, Some("resize_in_progress"))
            );
        }
    }
    let id = reel("contested");
    drive(&t.stack.app.reshard, &id).await;
    // Shrink with four runs at once: each fold happens exactly once.
    seed_more(&t, "contested", 200).await;
    post_shards(&t, "contested", 1).await;
    tokio::time::sleep(t.stack.app.reshard.wait() + Duration::from_millis(50)).await;
    let runs: Vec<_> =
        futures::future::join_all((0..4).map(|_| t.stack.app.reshard.advance(&id))).await;
    for r in runs {
        assert!(matches!(r, Ok(Progress::Stable(_))), "{r:?}");
    }
    let rows = t.like_rows("contested").await as i64;
    assert_eq!(rows, 230);
    assert_eq!(t.shard_sum("contested").await, rows);
    assert!(
        t.shards("contested")
            .await
            .iter()
            .all(|(s, n)| *s == 0 || *n == 0)
    );
    t.stop().await;
}

async fn seed_more(t: &TestStack, reel: &str, likes: usize) {
    futures::stream::iter(0..likes)
        .for_each_concurrent(16, |i| async move {
            assert_eq!(t.like(&format!("{reel}-more-{i}"), reel).await.status, 200);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_racing_a_like_on_the_folded_shard_loses_nothing() {
    let t = fast(&[]).await;
    seed(&t, "raced", 4, 60).await;
    let id = reel("raced");
    let r = &t.stack.app.reshard;
    let store = r.store();
    r.begin(&id, 1).await.unwrap();
    tokio::time::sleep(r.wait() + Duration::from_millis(50)).await;
    let settings = r.state(&id).await.unwrap();
    assert_eq!(settings.phase, Phase::Draining);
    // The fold reads shard 3...
    let seen = store.shard(&id, 3).await.unwrap().unwrap_or_default();
    // ...a like lands on shard 3 (a writer that chose it from old settings;
    // the real like transaction: like row + shard increment)...
    let user = UserId::parse("late-liker").unwrap();
    let tx = LikeTx {
        user: user.clone(),
        reel: id.clone(),
        action: Action::Like,
        token: RequestToken::for_fields("test", &["late"]),
        shard: Some(3),
        now_ms: likes_now_ms(),
        record: None,
    };
    assert_eq!(
        store.write_like(&tx).await.unwrap(),
        TxResult::Committed { replayed: false }
    );
    // ...so the fold of what was read is refused, and nothing moved.
    let before = (t.shards("raced").await, t.base("raced").await);
    assert_eq!(
        store.fold(&id, 3, seen, settings.version, 1).await.unwrap(),
        FoldResult::ShardChanged
    );
    assert_eq!((t.shards("raced").await, t.base("raced").await), before);
    // A fold under a stale settings version is refused too.
    let now = store.shard(&id, 3).await.unwrap().unwrap();
    assert_eq!(
        store
            .fold(&id, 3, now, settings.version + 1, 1)
            .await
            .unwrap(),
        FoldResult::SettingsChanged
    );
    // The run reads again and folds the new value: the like is counted.
    drive(r, &id).await;
    assert_eq!(t.like_rows("raced").await, 61);
    assert_eq!(t.shard_sum("raced").await, 61);
    assert_eq!(t.http_count("raced").await, 61);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hot_reels_grow_automatically_and_cool_ones_shrink() {
    // Thresholds scaled down: hot at 20 writes/s, 10 writes/s per shard,
    // cool below 2 writes/s, no cool-down period.
    let t = fast(&[
        ("AUTO_RESHARD", "on"),
        ("HOT_LIKES_PER_SEC", "20"),
        ("SHARD_WRITES_PER_SEC", "10"),
        ("SHARD_HEADROOM", "1"),
        ("COOL_LIKES_PER_SEC", "2"),
        ("COOL_DOWN_SECS", "0"),
        ("CACHE_TTL_MS", "200"),
    ])
    .await;
    let app = &t.stack.app;
    let id = reel("viral");
    // A quiet reel next to it stays at one shard.
    seed_more(&t, "quiet", 3).await;
    // A burst of likes for ~2.5 s while a feed reads the count: the read
    // path sees the write rate cross the threshold and starts a grow.
    let stop = AtomicBool::new(false);
    let acked = Acked::default();
    let burst = async {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        stop.store(true, Ordering::SeqCst);
    };
    let ((), (), _) = tokio::join!(
        burst,
        writers(&t, "viral", "fan", false, &stop, &acked),
        reader(&t, "viral", &stop)
    );
    let s = app.reshard.state(&id).await.unwrap();
    assert_eq!(s.phase, Phase::Growing, "{s:?}");
    assert!(s.target >= 2, "{s:?}");
    let target = s.target;
    // The scheduled run completes it (sleeping for the due step).
    let summary = app.reshard.run_scheduled(None).await.unwrap();
    assert!(summary.completed >= 1, "{summary:?}");
    let s = app.reshard.state(&id).await.unwrap();
    assert_eq!((s.phase, s.write_shards), (Phase::Stable, target));
    let q = app.reshard.state(&reel("quiet")).await.unwrap();
    assert_eq!(q.write_shards, 1);

    // Quiet now: once a run has a sample to compare with, it sees a rate
    // below the cool-down threshold and folds the reel back to one shard
    // (in the same run: the drain wait is within RESHARD_MAX_WAIT_MS).
    let mut shrinks = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        shrinks += app
            .reshard
            .run_scheduled(None)
            .await
            .unwrap()
            .shrinks_started;
        if app.reshard.state(&id).await.unwrap().write_shards == 1 {
            break;
        }
    }
    assert_eq!(shrinks, 1);
    let s = app.reshard.state(&id).await.unwrap();
    assert_eq!(
        (s.phase, s.write_shards, s.read_shards),
        (Phase::Stable, 1, 1),
        "{s:?}"
    );
    let rows = t.like_rows("viral").await as i64;
    assert_eq!(rows, acked.net.load(Ordering::SeqCst));
    assert_eq!(t.shard_sum("viral").await, rows);
    assert_eq!(t.http_count("viral").await, rows);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_validate_input_and_change_nothing_on_error() {
    let t = fast(&[("MAX_SHARDS", "64")]).await;
    let path = "/admin/reels/r1/shards";
    let bad: &[(&[u8], &str)] = &[
        (br#"{"shards": 0}"#, "invalid_shards"),
        (br#"{"shards": 65}"#, "invalid_shards"),
        (br#"{"shards": -3}"#, "invalid_shards"),
        (br#"{"shards": 2.5}"#, "invalid_shards"),
        (br#"{"shards": "4"}"#, "invalid_shards"),
        (br#"{"shards": 99999999999}"#, "invalid_shards"),
        (br#"{}"#, "invalid_body"),
        (br#"{"shards": 4, "force": true}"#, "invalid_body"),
        (b"shards=4", "invalid_body"),
        (b"", "invalid_body"),
        (b"\xff\xfe", "invalid_body"),
    ];
    for (body, code) in bad {
        let r = t.send("POST", path, None, &[], Some(body.to_vec())).await;
        assert_eq!(
            (r.status, r.body["error"]["code"].as_str()),
            (400, Some(*code)),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    let r = t
        .send(
            "POST",
            "/admin/reels/bad%23id/shards",
            None,
            &[],
            Some(br#"{"shards": 2}"#.to_vec()),
        )
        .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("invalid_reel_id"))
    );
    let r = t.send("DELETE", path, None, &[], None).await;
    assert_eq!(
        (
            r.status,
            r.headers.get("allow").and_then(|v| v.to_str().ok())
        ),
        (405, Some("GET, POST"))
    );
    // Nothing was written by any of those.
    assert!(t.scan(&t.stack.config.counters_table).await.is_empty());
    // An unknown reel is fine: it simply has one shard.
    let s = state(&t, "never-liked").await;
    assert_eq!(
        s,
        json!({"reel_id": "never-liked", "read_shards": 1, "write_shards": 1, "target": 1,
               "phase": "stable", "phase_since_ms": 0, "version": 0})
    );
    let r = post_shards(&t, "never-liked", 1).await;
    assert_eq!(
        (r.status, r.body["outcome"].as_str()),
        (200, Some("unchanged"))
    );
    let r = post_shards(&t, "never-liked", 64).await;
    assert_eq!(
        (
            r.status,
            r.body["outcome"].as_str(),
            r.body["read_shards"].as_u64()
        ),
        (202, Some("started"), Some(64))
    );
    // A settings item written by hand (no version, no index key) is
    // registered by asking for the count it already has.
    t.set_shards("legacy", 4, 4).await;
    let store = t.stack.app.reshard.store();
    assert!(
        !store
            .indexed_reels()
            .await
            .unwrap()
            .contains(&reel("legacy"))
    );
    let r = post_shards(&t, "legacy", 4).await;
    assert_eq!(
        (
            r.status,
            r.body["outcome"].as_str(),
            r.body["version"].as_u64()
        ),
        (200, Some("unchanged"), Some(1))
    );
    assert!(
        store
            .indexed_reels()
            .await
            .unwrap()
            .contains(&reel("legacy"))
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_schedule_completes_a_resize_started_over_http() {
    let t = fast(&[("LOCAL_SCHEDULE_SECS", "0.5")]).await;
    seed_more(&t, "scheduled", 25).await;
    let r = post_shards(&t, "scheduled", 6).await;
    assert_eq!(r.status, 202);
    let started = Instant::now();
    loop {
        let s = state(&t, "scheduled").await;
        if s["phase"] == "stable" {
            assert_eq!(
                (s["write_shards"].as_u64(), s["read_shards"].as_u64()),
                (Some(6), Some(6))
            );
            break;
        }
        // While it resizes, the hot-reel listing shows it in its phase.
        let list = t.send("GET", "/admin/reels", None, &[], None).await;
        assert_eq!(list.status, 200, "{}", list.body);
        assert!(
            list.body["reels"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["reel_id"] == "scheduled" && r["target"] == 6),
            "{}",
            list.body
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not completed: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    post_shards(&t, "scheduled", 1).await;
    let started = Instant::now();
    while state(&t, "scheduled").await["phase"] != "stable" {
        assert!(started.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(t.http_count("scheduled").await, 25);
    assert!(
        t.shards("scheduled")
            .await
            .iter()
            .all(|(s, n)| *s == 0 || *n == 0)
    );
    // Back at one shard: no longer listed.
    let list = t.send("GET", "/admin/reels", None, &[], None).await;
    assert_eq!(list.body["count"], 0, "{}", list.body);
    t.stop().await;
}
