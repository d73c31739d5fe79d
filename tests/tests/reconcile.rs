//! Reconciliation through the real store against the local stack: drift
//! injected by editing shard items (over, under, a negative shard, shards
//! without rows, rows without shards) is repaired exactly in one run and the
//! next run finds none; a reel liked and unliked during the run is deferred,
//! not "corrected", while quiet reels in the same run are; a run interrupted
//! after some segments resumes from its checkpoints without scanning a
//! finished segment again; overlapping runs never apply a correction twice;
//! a reel shrunk during the run is deferred; a run resumed after
//! `RECONCILE_SEGMENTS` changed keeps its own segment count; a dry run
//! reports the drift and leaves both tables byte-for-byte unchanged.

mod common;

use common::TestStack;
use futures::StreamExt;
use likes::keys::ReelId;
use likes::reconcile::{Mode, Options, Summary};
use likes::store::{CorrectResult, ReconcileStore};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// Small pages and frequent checkpoints so that a few hundred rows make
/// many pages; a reel counts as written during the run if a like was
/// stamped within 1.5 s before it started.
async fn stack(extra: &[(&str, &str)]) -> TestStack {
    let mut env = vec![
        ("CACHE_TTL_MS", "0"),
        ("SETTINGS_TTL_MS", "0"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("DDB_OPERATION_TIMEOUT_MS", "500"),
        ("RECONCILE_CLOCK_SKEW_MS", "0"),
        ("RECONCILE_SEGMENTS", "4"),
        ("RECONCILE_PAGE_ITEMS", "7"),
        ("RECONCILE_CHECKPOINT_PAGES", "2"),
        ("RECONCILE_MAX_READ_UNITS", "100000"),
        ("RECONCILE_MAX_WRITE_UNITS", "100000"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
    ];
    env.retain(|(k, _)| !extra.iter().any(|(x, _)| x == k));
    env.extend_from_slice(extra);
    TestStack::start(&env).await
}

async fn likes(t: &TestStack, reel: &str, users: std::ops::Range<usize>) {
    futures::stream::iter(users)
        .for_each_concurrent(16, |i| async move {
            let r = t.like(&format!("{reel}-fan-{i}"), reel).await;
            assert_eq!(r.status, 200, "{}", r.body);
        })
        .await;
}

/// Lets every stamp age past the deferral margin (request timeout +
/// operation timeout + skew = 1.5 s here).
async fn quiet() {
    tokio::time::sleep(Duration::from_millis(1700)).await;
}

async fn run(t: &TestStack, opts: Options) -> Summary {
    t.stack.app.reconcile.run(&opts).await.expect("reconcile")
}

fn reel(s: &str) -> ReelId {
    ReelId::parse(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_drift_is_repaired_exactly_in_one_run() {
    let t = stack(&[]).await;
    // over: 20 likes, shard 0 edited to 25.
    likes(&t, "over", 0..20).await;
    t.put_shard("over", 0, 25).await;
    // under with a negative shard: 15 likes over 3 shards, shard 1 set to -7.
    t.set_shards("under", 3, 3).await;
    likes(&t, "under", 0..15).await;
    let shard1 = t
        .shards("under")
        .await
        .iter()
        .find(|(s, _)| *s == 1)
        .map_or(0, |x| x.1);
    t.put_shard("under", 1, -7).await;
    // shards without rows, rows without shards, and one that agrees.
    t.put_shard("ghost", 0, 4).await;
    likes(&t, "orphan", 0..6).await;
    t.stack
        .client
        .delete_item()
        .table_name(&t.stack.config.counters_table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("000#reel#orphan#likes".into()),
        )
        .send()
        .await
        .unwrap();
    likes(&t, "fine", 0..5).await;
    quiet().await;

    let s = run(&t, Options::default()).await;
    assert!(s.complete, "{s:?}");
    assert_eq!(s.rows_scanned, 20 + 15 + 6 + 5);
    assert_eq!(s.reels_corrected, 4, "{s:?}");
    assert_eq!(s.reels_deferred, 0, "{s:?}");
    let drift_under = 7 + shard1;
    assert_eq!(s.total_abs_drift as i64, 5 + drift_under + 4 + 6, "{s:?}");
    for r in ["over", "under", "ghost", "orphan", "fine"] {
        let rows = t.like_rows(r).await as i64;
        assert_eq!(t.shard_sum(r).await, rows, "{r}");
        assert_eq!(t.http_count(r).await, rows, "{r}");
    }
    // The next run finds nothing to do.
    let s = run(&t, Options::default()).await;
    assert_eq!((s.reels_corrected, s.total_abs_drift), (0, 0), "{s:?}");
    assert_eq!(s.reels_checked, 5, "{s:?}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reel_written_during_the_run_is_deferred_and_quiet_ones_are_corrected() {
    // Reads slowed down so that the run overlaps the writers for a while.
    let t = stack(&[("RECONCILE_MAX_READ_UNITS", "200")]).await;
    likes(&t, "quiet-1", 0..30).await;
    t.put_shard("quiet-1", 0, 33).await;
    likes(&t, "busy", 0..40).await;
    let base = t.shard_sum("busy").await;
    t.put_shard("busy", 0, base + 3).await;
    quiet().await;

    let stop = AtomicBool::new(false);
    let net = AtomicI64::new(0);
    let writers = async {
        futures::stream::iter(0..)
            .take_while(|_| std::future::ready(!stop.load(Ordering::SeqCst)))
            .for_each_concurrent(4, |i| {
                let (t, net) = (&t, &net);
                async move {
                    let user = format!("busy-live-{i}");
                    let r = t.like(&user, "busy").await;
                    assert_eq!(r.status, 200);
                    if r.body["changed"] == true {
                        net.fetch_add(1, Ordering::SeqCst);
                    }
                    if i % 2 == 0 {
                        let r = t.unlike(&user, "busy").await;
                        assert_eq!(r.status, 200);
                        if r.body["changed"] == true {
                            net.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                }
            })
            .await;
    };
    let reconcile = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s = run(&t, Options::default()).await;
        stop.store(true, Ordering::SeqCst);
        s
    };
    let ((), s) = tokio::join!(writers, reconcile);
    assert!(s.complete, "{s:?}");
    assert!(s.deferred_reels.contains(&"busy".to_owned()), "{s:?}");
    assert!(s.corrected_reels.contains(&"quiet-1".to_owned()), "{s:?}");
    assert!(!s.corrected_reels.contains(&"busy".to_owned()), "{s:?}");
    assert_eq!(t.shard_sum("quiet-1").await, 30);
    // Every acknowledged like is there; the injected +3 is still there too.
    let rows = t.like_rows("busy").await as i64;
    assert_eq!(rows, 40 + net.load(Ordering::SeqCst));
    assert_eq!(t.shard_sum("busy").await, rows + 3);
    // Once the reel is quiet, the next run corrects it.
    quiet().await;
    let s = run(&t, Options::default()).await;
    assert_eq!(s.corrected_reels, ["busy"], "{s:?}");
    assert_eq!(t.shard_sum("busy").await, rows);
    assert_eq!(t.http_count("busy").await, rows);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_resumes_from_its_checkpoints() {
    let t = stack(&[]).await;
    let mut expected = HashMap::new();
    for r in 0..12 {
        let name = format!("reel-{r}");
        likes(&t, &name, 0..(5 + r * 3)).await;
        expected.insert(name.clone(), (5 + r * 3) as i64);
        if r % 3 == 0 {
            t.put_shard(&name, 0, 1000).await;
        }
    }
    let total: i64 = expected.values().sum();
    quiet().await;

    // The first invocation dies after scanning two whole segments (and none
    // of the others); the next one dies two pages into each segment left.
    let first = run(
        &t,
        Options {
            stop_after_segments: Some(2),
            ..Options::default()
        },
    )
    .await;
    assert!(!first.complete, "{first:?}");
    assert_eq!(
        (first.segments_done, first.segments_scanned),
        (2, 2),
        "{first:?}"
    );
    let second = run(
        &t,
        Options {
            stop_after_pages: Some(2),
            ..Options::default()
        },
    )
    .await;
    assert!(!second.complete, "{second:?}");
    assert_eq!(
        second.run_id, first.run_id,
        "a start resumes the run in progress"
    );
    assert_eq!(
        second.segments_scanned, 2,
        "finished segments are not scanned again"
    );
    assert_eq!(first.reels_corrected + second.reels_corrected, 0);
    // A resume-only invocation (the continuation schedule) finishes it from
    // the checkpoints, again only in the unfinished segments.
    let third = run(
        &t,
        Options {
            mode: Mode::Resume,
            ..Options::default()
        },
    )
    .await;
    assert!(third.complete, "{third:?}");
    assert_eq!(third.run_id, first.run_id);
    assert_eq!(third.invocations, 3);
    assert_eq!(third.segments_scanned, 2, "{third:?}");
    // Each row was counted exactly once across the three invocations.
    assert_eq!(third.rows_scanned as i64, total);
    assert_eq!(third.reels_corrected, 4, "{third:?}");
    for (name, n) in &expected {
        assert_eq!(t.shard_sum(name).await, *n, "{name}");
    }
    // Nothing left to resume.
    let idle = run(
        &t,
        Options {
            mode: Mode::Resume,
            ..Options::default()
        },
    )
    .await;
    assert_eq!(idle.invocation, "idle");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_runs_never_apply_a_correction_twice() {
    let t = stack(&[]).await;
    for r in 0..6 {
        let name = format!("o-{r}");
        likes(&t, &name, 0..10).await;
        t.put_shard(&name, 0, 50).await;
    }
    quiet().await;
    let (a, b) = tokio::join!(run(&t, Options::default()), run(&t, Options::default()));
    // One holds the run and the other is told so (or, had the first already
    // finished, the second ran a run of its own and found nothing).
    let invocations = [a.invocation, b.invocation];
    assert!(
        invocations.contains(&"busy") || a.run_id != b.run_id,
        "{invocations:?}"
    );
    for r in 0..6 {
        assert_eq!(t.shard_sum(&format!("o-{r}")).await, 10);
    }
    // The ledger guard itself: a correction computed from a ledger state
    // that has moved on is refused.
    let store = t.stack.app.reconcile.store();
    let id = reel("o-0");
    let view = store.reel_view(&id).await.unwrap();
    assert_eq!(view.ledger.corrections, 1);
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(
        store.correct(&id, 5, 0, "another-run", at).await.unwrap(),
        CorrectResult::LedgerChanged
    );
    assert_eq!(t.shard_sum("o-0").await, 10);
    // One correction sent again (its answer lost, or it was still in
    // flight): a replay under its token, not a ledger that moved on.
    // Before: the body carried the clock of each attempt, so the second
    // was another body under the same token, refused, and the run counted
    // a correction it had made as deferred.
    for _ in 0..2 {
        assert_eq!(
            store.correct(&id, 1, 1, "replayed-run", at).await.unwrap(),
            CorrectResult::Applied
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(t.shard_sum("o-0").await, 11);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_reports_and_changes_nothing() {
    let t = stack(&[]).await;
    likes(&t, "d1", 0..8).await;
    t.put_shard("d1", 0, 2).await;
    t.put_shard("d-ghost", 0, 9).await;
    quiet().await;
    let before = (
        t.scan(&t.stack.config.counters_table).await,
        t.scan(&t.stack.config.likes_table).await,
    );
    let s = run(
        &t,
        Options {
            dry_run: true,
            ..Options::default()
        },
    )
    .await;
    assert!(s.dry_run && s.complete, "{s:?}");
    assert_eq!(s.reels_corrected, 2, "drifted reels reported: {s:?}");
    assert_eq!(s.total_abs_drift, 6 + 9);
    assert_eq!(s.largest_drift, -9);
    let after = (
        t.scan(&t.stack.config.counters_table).await,
        t.scan(&t.stack.config.likes_table).await,
    );
    // Items as sorted (attribute, value) lists, sorted: order-free.
    let sorted = |v: Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>| {
        let mut items: Vec<Vec<(String, String)>> = v
            .into_iter()
            .map(|i| {
                let mut attrs: Vec<(String, String)> =
                    i.into_iter().map(|(k, v)| (k, format!("{v:?}"))).collect();
                attrs.sort();
                attrs
            })
            .collect();
        items.sort();
        items
    };
    assert_eq!(sorted(before.0), sorted(after.0), "counters table changed");
    assert_eq!(sorted(before.1), sorted(after.1), "likes table changed");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reel_resized_during_the_run_is_deferred() {
    let t = stack(&[("RESIZE_MARGIN_MS", "0"), ("RESHARD_MAX_WAIT_MS", "5000")]).await;
    t.set_shards("moving", 4, 4).await;
    likes(&t, "moving", 0..30).await;
    likes(&t, "still", 0..5).await;
    t.put_shard("still", 0, 9).await;
    quiet().await;
    // The run scans part of the table, then the reel shrinks 4 -> 1 (folds
    // move counts into its base item), then the run finishes.
    let first = run(
        &t,
        Options {
            stop_after_segments: Some(1),
            ..Options::default()
        },
    )
    .await;
    assert!(!first.complete);
    let r = &t.stack.app.reshard;
    r.begin(&reel("moving"), 1).await.unwrap();
    tokio::time::sleep(r.wait() + Duration::from_millis(50)).await;
    assert!(matches!(
        r.advance(&reel("moving")).await.unwrap(),
        likes::reshard::Progress::Stable(_)
    ));
    let s = run(&t, Options::default()).await;
    assert!(s.complete, "{s:?}");
    assert!(s.deferred_reels.contains(&"moving".to_owned()), "{s:?}");
    assert_eq!(s.corrected_reels, ["still"], "{s:?}");
    assert_eq!(t.shard_sum("moving").await, 30);
    assert_eq!(t.shard_sum("still").await, 5);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumed_under_another_segment_count_keeps_its_own() {
    let t = stack(&[]).await;
    likes(&t, "seg", 0..40).await;
    t.put_shard("seg", 0, 1).await;
    quiet().await;
    let first = run(
        &t,
        Options {
            stop_after_segments: Some(1),
            ..Options::default()
        },
    )
    .await;
    assert_eq!((first.complete, first.segments), (false, 4));
    // The next invocation runs with RECONCILE_SEGMENTS=2 (a redeploy).
    let mut config = t.stack.config.clone();
    config.reconcile.segments = 2;
    let other = likes::reconcile::Reconciler::new(
        likes::store::dynamodb::DynamoStore::new(t.stack.client.clone(), &config),
        &config,
    );
    let s = other.run(&Options::default()).await.unwrap();
    assert!(s.complete, "{s:?}");
    assert_eq!((s.segments, s.rows_scanned), (4, 40), "{s:?}");
    assert_eq!(t.shard_sum("seg").await, 40);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_mode_drops_stale_buckets_and_keeps_the_count() {
    use aws_sdk_dynamodb::types::AttributeValue;
    // Recent-change buckets of another width (a bucket width changed
    // since) on a shard: a run drops them, in a transaction of one, since
    // the template lets no function change a shard item outside one
    // (before: a plain UpdateItem, which IAM refuses in AWS; no test ran
    // this path at all).
    let t = stack(&[
        ("COUNTING", "stream"),
        ("RECONCILE_STREAM_SETTLE_SECS", "1"),
    ])
    .await;
    t.stack.streams[0].pause(true);
    let key = "000#reel#old#likes";
    t.stack
        .client
        .put_item()
        .table_name(&t.stack.config.counters_table)
        .item("pk", AttributeValue::S(key.into()))
        .item("n", AttributeValue::N("0".into()))
        .item("d1000_5", AttributeValue::N("3".into()))
        .item("x1000_5", AttributeValue::N("1".into()))
        .send()
        .await
        .unwrap();
    let s = run(&t, Options::default()).await;
    assert!(s.complete, "{s:?}");
    let item = t
        .stack
        .client
        .get_item()
        .table_name(&t.stack.config.counters_table)
        .key("pk", AttributeValue::S(key.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the shard is kept");
    let mut names: Vec<&String> = item.keys().collect();
    names.sort();
    assert_eq!(names, ["n", "pk"], "{item:?}");
    assert_eq!(t.shard_sum("old").await, 0);
    t.stop().await;
}
