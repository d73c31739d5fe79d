//! Stream mode: a reconciliation run whose likes scan lasts many settle
//! times (as a scan of 10⁸–10⁹ rows does at the default pace) still repairs
//! every reel that was quiet since a little after its cut.
//!
//! Time is scaled as `tests/tests/stream.rs` scales it: a settle time of
//! 2 s stands for the default two hours, so the recent-change buckets a
//! shard item keeps (four settle times) cover 8 s; the scan is paced by
//! `RECONCILE_MAX_READ_UNITS` so that it lasts well over that. Before the
//! reel's own last write bounded which buckets could be gone, the run
//! deferred every reel it reached more than four settle times after its
//! cut, and the drift below stayed.

mod common;

use common::{TestStack, drained};
use futures::StreamExt;
use std::time::Duration;

/// Reels liked before the run, and rows each.
const REELS: usize = 12;
const ROWS_PER_REEL: usize = 25;
/// Settle time of the scaled clock (ms), as set below.
const SETTLE_MS: i64 = 2_000;

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("COUNTING", "stream"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("RECONCILE_STREAM_SETTLE_SECS", "2"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("DDB_OPERATION_TIMEOUT_MS", "900"),
        ("RECONCILE_CLOCK_SKEW_MS", "0"),
        // Small pages, few read units a second: the likes scan of the
        // rows below takes several times the buckets' 8 s.
        ("RECONCILE_PAGE_ITEMS", "5"),
        ("RECONCILE_SEGMENTS", "2"),
        ("RECONCILE_MAX_READ_UNITS", "4"),
    ]
}

async fn like(t: &TestStack, user: &str, reel: &str) {
    for _ in 0..50 {
        let r = t.like(user, reel).await;
        if r.status == 200 {
            return;
        }
        assert!(r.status == 429 || r.status == 503, "like: {}", r.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("like of {reel} by {user} still refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_outlasting_the_settle_time_still_repairs_quiet_reels() {
    let t = TestStack::start(&env()).await;
    let reels: Vec<String> = (0..REELS).map(|r| format!("r{r:02}")).collect();
    let acts: Vec<(String, String)> = reels
        .iter()
        .flat_map(|r| (0..ROWS_PER_REEL).map(move |u| (format!("u{u}"), r.clone())))
        .collect();
    futures::stream::iter(acts)
        .for_each_concurrent(16, |(u, r)| {
            let t = &t;
            async move { like(t, &u, &r).await }
        })
        .await;
    drained(&t, Duration::from_secs(60)).await;
    assert_eq!(t.shard_sum("r00").await, ROWS_PER_REEL as i64);
    // Drift, as a batch given up to OnFailure or a hand edit leaves it: one
    // reel nobody touches again, and one liked once just after the cut.
    t.add_to_shard("r00", 0, 5).await;
    t.add_to_shard("r01", 0, -2).await;
    // The rows are older than the run's cut (a request timeout and a
    // bucket before its start).
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    let run = {
        let app = t.stack.app.clone();
        tokio::spawn(async move {
            likes::triggers::handle_reconcile_event(
                &app,
                &serde_json::json!({"mode": "start"}),
                None,
            )
            .await
            .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    like(&t, "late", "r01").await;
    let summary = run.await.unwrap();
    assert_eq!(summary["complete"], true, "{summary}");

    // The scan did outlast the buckets many times over.
    let cut = summary["cut_ms"].as_i64().expect("a cut");
    // The run may compare once a settle time (and a second) has passed
    // since its likes scan ended.
    let ready = summary["stream_ready_at_ms"]
        .as_i64()
        .expect("a ready time");
    let done = ready - SETTLE_MS - 1_000;
    assert!(
        done - cut >= 5 * SETTLE_MS,
        "the likes scan took {} ms, not several settle times: {summary}",
        done - cut
    );
    let corrected: Vec<&str> = summary["corrected_reels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert!(corrected.contains(&"r00"), "{summary}");
    assert!(corrected.contains(&"r01"), "{summary}");
    assert_eq!(summary["reels_deferred"], 0, "{summary}");
    assert_eq!(summary["total_abs_drift"], 5 + 2, "{summary}");
    drained(&t, Duration::from_secs(30)).await;
    for reel in &reels {
        assert_eq!(
            t.shard_sum(reel).await,
            t.like_rows(reel).await as i64,
            "{reel} exact"
        );
    }
    t.stop().await;
}
