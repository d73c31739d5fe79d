//! The viral-burst demo (docs/local.md; the README's tour runs it), run against a test stack: distinct
//! users, double taps and Idempotency-Key retries end in exactly one count
//! per user, spread over every write shard.

mod common;

use common::TestStack;
use likes_local::demo::{DemoOptions, run};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viral_burst_counts_each_user_once() {
    let t = TestStack::start(&[("CACHE_TTL_MS", "300")]).await;
    let opts = DemoOptions {
        base_url: t.stack.base_url.clone(),
        users: 350,
        shards: 8,
        concurrency: 32,
        cache_ttl: Duration::from_millis(300),
    };
    let report = run(&opts, &t.stack.client, &t.stack.config.counters_table)
        .await
        .expect("demo succeeds");
    assert_eq!(report.count, 350);
    assert_eq!(report.shards.len(), 8);
    assert!(report.shards.iter().all(|&n| n > 0), "{:?}", report.shards);
    assert_eq!(
        report.duplicates_absorbed, 70,
        "every 5th user double-tapped"
    );
    assert_eq!(
        report.retries_replayed, 50,
        "every 7th user retried with its key"
    );
    assert_eq!(report.sent, 350 + 70 + 50);
    assert_eq!(t.like_rows(&report.reel).await, 350);
    t.stop().await;
}
