//! Reads of a reel being shrunk while writers with older settings still like
//! its retired shards. In DynamoDB a `TransactGetItems` is cancelled by any
//! write in flight on its items; the emulator never cancels, so the fault
//! proxy cancels every `TransactGetItems` of the functions for a conflict
//! for the whole wait (while such writers may land), and a fifth of them
//! once the folds run (only folds in flight contend then).
//! Proves: single and batch reads of the draining reel (and of a quiet reel
//! in the same batch) all answer 200 through the whole shrink, folds
//! included; the counts never exceed the truth; and the final count is
//! exact.

mod common;

use common::TestStack;
use likes::keys::{Action, ReelId, UserId};
use likes::reshard::Progress;
use likes::service::{LikeService, WriteRequest};
use likes::store::Phase;
use likes::store::dynamodb::DynamoStore;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shrink_under_likes_and_batch_reads_answers_every_read() {
    let t = TestStack::start(&[
        ("FAULTS", "seed=3,TransactGetItems.conflict=1"),
        ("SETTINGS_TTL_MS", "600"),
        ("CACHE_TTL_MS", "0"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("RESIZE_MARGIN_MS", "0"),
        ("DDB_OPERATION_TIMEOUT_MS", "1000"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("RESHARD_MAX_WAIT_MS", "5000"),
    ])
    .await;
    t.set_shards("drain", 8, 8).await;
    for i in 0..40 {
        assert_eq!(t.like(&format!("early-{i}"), "drain").await.status, 200);
    }
    assert_eq!(t.like("q", "quiet").await.status, 200);
    // Another instance (its own settings cache, straight to the emulator)
    // that read the settings before the shrink: it keeps liking shards
    // 2..8 until its cached copy expires.
    let old = LikeService::new(
        DynamoStore::new(t.stack.client.clone(), &t.stack.config),
        &t.stack.config,
    );
    let reel = ReelId::parse("drain").unwrap();
    old.settings(&reel).await.unwrap();

    let r = &t.stack.app.reshard;
    r.begin(&reel, 2).await.expect("shrink");
    let stop = AtomicBool::new(false);
    let liked = AtomicU64::new(40);
    let (reads, draining_reads) = (AtomicU64::new(0), AtomicU64::new(0));
    let old_writer = async {
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            let out = old
                .write(WriteRequest {
                    user: UserId::parse(&format!("old-{i}")).unwrap(),
                    reel: reel.clone(),
                    action: Action::Like,
                    idempotency_key: None,
                    request_id: Some(format!("old-req-{i}")),
                })
                .await
                .expect("old writer's like");
            if out.changed {
                liked.fetch_add(1, Ordering::SeqCst);
            }
            i += 1;
        }
    };
    let new_writer = async {
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            let r = t.like(&format!("new-{i}"), "drain").await;
            assert_eq!(r.status, 200, "{}", r.body);
            if r.body["changed"] == true {
                liked.fetch_add(1, Ordering::SeqCst);
            }
            i += 1;
        }
    };
    let reader = async {
        while !stop.load(Ordering::SeqCst) {
            let phase = r.state(&reel).await.unwrap().phase;
            let batch = t
                .send("GET", "/likes?reel_ids=drain,quiet", None, &[], None)
                .await;
            assert_eq!(
                batch.status, 200,
                "batch read during {phase:?}: {}",
                batch.body
            );
            assert_eq!(batch.body["counts"]["quiet"], 1, "{}", batch.body);
            let one = t.send("GET", "/reels/drain/likes", None, &[], None).await;
            assert_eq!(one.status, 200, "read during {phase:?}: {}", one.body);
            let truth = liked.load(Ordering::SeqCst) as i64;
            // Likes only: a count above every like acknowledged or in
            // flight (at most one per writer) would be counted twice.
            for n in [&batch.body["counts"]["drain"], &one.body["count"]] {
                assert!(n.as_i64().unwrap() <= truth + 2, "{n} > {truth} + 2");
            }
            reads.fetch_add(1, Ordering::SeqCst);
            if phase == Phase::Draining {
                draining_reads.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let proxy = t.stack.proxy.clone().expect("a proxy");
    let resize = async {
        let started = Instant::now();
        // When the wait ends (epoch ms), once the drain's wait has begun.
        let (mut wait_ends, mut switched) = (None::<i64>, false);
        loop {
            if let Some(due) = wait_ends.filter(|_| !switched) {
                // The folds start with the first advance once the wait is
                // over: from then on no writer with older settings is left,
                // and only the folds in flight cancel a transactional read
                // (a reader falls back to one while folds land back to
                // back), a fifth of them here. So the faults change before
                // any advance that may fold, however late a loaded machine
                // wakes this task: not on a later poll that might come only
                // after the folds.
                let now = epoch_ms();
                if now + 60 < due {
                    let nap = (due - 60 - now).clamp(1, 50) as u64;
                    tokio::time::sleep(Duration::from_millis(nap)).await;
                    continue;
                }
                proxy.set_faults(
                    faultproxy::Faults::parse("seed=4,TransactGetItems.conflict=0.2").unwrap(),
                );
                switched = true;
            }
            match r.advance(&reel).await.expect("advance") {
                Progress::Stable(s) => {
                    assert_eq!(s.read_shards, 2);
                    break;
                }
                Progress::Waiting { settings, due_ms } => {
                    if !switched && settings.phase == Phase::Draining && settings.phase_at_ms > 0 {
                        wait_ends = Some(due_ms);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Progress::Interrupted => unreachable!(),
            }
            assert!(started.elapsed() < Duration::from_secs(60), "shrink stuck");
        }
        // A little longer under the stable settings, then stop.
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::SeqCst);
    };
    tokio::join!(old_writer, new_writer, reader, resize);
    assert!(
        draining_reads.load(Ordering::SeqCst) >= 3,
        "{draining_reads:?} of {reads:?}"
    );
    let rows = t.like_rows("drain").await as i64;
    assert_eq!(rows, liked.load(Ordering::SeqCst) as i64);
    assert_eq!(t.shard_sum("drain").await, rows);
    assert_eq!(t.http_count("drain").await, rows);
    t.stop().await;
}

/// Now, in milliseconds since the Unix epoch (the resharder's clock).
fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
