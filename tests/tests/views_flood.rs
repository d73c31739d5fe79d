//! One viewer's flood of new reels on a shard, among another viewer's
//! views (issue 36): the flood writes its minute's allowance, and once it
//! is spent its parts take no transaction of their own before the other
//! viewer's records. A file of its own: the views aggregator's metrics are
//! the process's, and `views_bounds.rs` sums them.

mod common;

use common::TestStack;
use common::views_events::{Log, config, event, now_ms, view};
use common::views_log::views_of;
use likes::store::dynamodb::DynamoViews;
use likes::views::ViewsConfig;
use likes::views::aggregate::ViewAggregator;
use std::sync::Arc;

/// Feeds `shard` 20 batches, each by a cold instance: four records of a
/// viewer each naming 25 reels never seen (100 new reels a batch, 2,000 in
/// the minute) and one record of a calm viewer. Returns the transactions
/// the aggregator committed and how many of the flood's reels it counted.
async fn flood(t: &TestStack, config: &ViewsConfig, shard: &str) -> (usize, usize) {
    let at = now_ms();
    let mut n = 0u64;
    let mut chunks = 0;
    for batch in 0..20u64 {
        let mut records = Vec::new();
        for i in 0..5u64 {
            n += 1;
            let record = if i == 4 {
                view(n, "calm", &[&format!("calm{shard}")], 1, at)
            } else {
                let reels: Vec<String> = (0..25)
                    .map(|k| format!("f{}b{batch}i{i}k{k}", &shard[shard.len() - 2..]))
                    .collect();
                let reels: Vec<&str> = reels.iter().map(String::as_str).collect();
                view(n, "flooder", &reels, 1, at)
            };
            records.push((n, record.encode(), at + (batch * 5 + i) as i64));
        }
        let instance = ViewAggregator::new(
            DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
            Arc::new(Log::default()),
            &t.stack.config,
            config.clone(),
        );
        let out = instance
            .handle(&event(shard, &records), None)
            .await
            .unwrap();
        // The calm viewer's record is applied in the batch it came in:
        // nothing of the batch is handed back to wait for a retry.
        assert_eq!(out.failed_from, None, "{out:?}");
        chunks += out.chunks;
    }
    assert_eq!(
        views_of(t, &format!("calm{shard}")).await,
        20,
        "the calm viewer's views, each counted once"
    );
    let prefix = format!("v#f{}b", &shard[shard.len() - 2..]);
    let counted: std::collections::BTreeSet<String> = t
        .scan("ViewsTable")
        .await
        .iter()
        .filter_map(|i| i.get("pk").and_then(|v| v.as_s().ok()).cloned())
        .filter(|pk| pk.starts_with(&prefix))
        .collect();
    (chunks, counted.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_reels_writes_its_allowance_and_another_viewer_goes_through() {
    // One viewer's flood of new reels on a shard, and another viewer's
    // views among it: the flood writes its minute's 300 reels, not 2,000,
    // and the other viewer's records are applied in the batches they came
    // in, each batch past the flood's allowance in one transaction: the
    // round trips before the other viewer's records are that viewer's lag.
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0")]).await;
    let bounded = config();
    let (bounded_chunks, bounded_reels) = flood(&t, &bounded, "shardId-000000000031").await;
    // The same flood with the per-viewer bound lifted, as before it was
    // built: every new reel is two items written.
    let mut unbounded = config();
    unbounded.per_viewer = (u32::MAX, u32::MAX);
    let (unbounded_chunks, unbounded_reels) = flood(&t, &unbounded, "shardId-000000000032").await;
    assert_eq!(unbounded_reels, 2_000);
    assert_eq!(
        bounded_reels, bounded.per_viewer.1 as usize,
        "300 reels a minute"
    );
    eprintln!(
        "transactions for 20 batches: bounded {bounded_chunks}, unbounded {unbounded_chunks}"
    );
    // Before, a part the bound drops still took its place in a chunk: 80
    // transactions either way. Now, once its minute's reels are spent, a
    // batch of the flood costs the other viewer one transaction (its own).
    assert!(
        bounded_chunks * 2 < unbounded_chunks,
        "bounded {bounded_chunks} transactions, unbounded {unbounded_chunks}"
    );
    t.stop().await;
}
