//! One viewer's views are bounded where they are counted, however many
//! function instances took its batches (issue 36): the views aggregator,
//! fed Lambda's Kinesis events by hand against the embedded emulator, each
//! batch by a cold instance of its own.
//!
//! Before, one viewer's 200 records of 1,000 views of one reel counted
//! 200,000 views (the view function's bounds live in one instance's
//! memory, and every batch may be another instance).

mod common;

use common::TestStack;
use common::views_events::{Log, config, event, now_ms, view};
use common::views_log::views_of;
use likes::store::dynamodb::DynamoViews;
use likes::views::aggregate::ViewAggregator;
use serde_json::Value;
use std::sync::Arc;

/// The sum of the views aggregator's metric `name` flushed so far.
fn metric(t: &TestStack, name: &str) -> u64 {
    t.stack.config.metrics.flush(None);
    t.stack
        .config
        .metrics
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|d| d["Function"] == "aggregate-views")
        .filter_map(|d| d[name].as_u64())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_thousand_views_from_one_viewer_count_its_allowance() {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0"), ("METRICS", "memory")]).await;
    let config = config();
    let (views_a_minute, reels_a_minute) = config.per_viewer;
    assert_eq!((views_a_minute, reels_a_minute), (600, 300), "the defaults");
    let shard = "shardId-000000000021";
    let at = now_ms();
    let mut n = 0u64;
    let mut honest = 0u64;
    // 20 batches, each by a cold instance: 10 records of the attacker
    // (1,000 views of the victim each) and 5 of an honest viewer (one view
    // each of the victim and of another reel), all within one minute.
    for batch in 0..20u64 {
        let mut records = Vec::new();
        for i in 0..15u64 {
            n += 1;
            let record = if i % 3 == 2 {
                honest += 1;
                view(n, "honest", &["victim", "other"], 1, at)
            } else {
                view(n, "attacker", &["victim"], 1_000, at)
            };
            records.push((n, record.encode(), at + (batch * 15 + i) as i64));
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
        assert_eq!(out.failed_from, None, "{out:?}");
    }
    assert_eq!(
        n - honest,
        200,
        "200 records of the attacker: 200,000 views"
    );
    assert_eq!(views_of(&t, "victim").await, 600 + honest);
    assert_eq!(views_of(&t, "other").await, honest);
    assert_eq!(metric(&t, "ViewsOverViewerBound"), 200_000 - 600);

    // A minute later the attacker has a new minute's allowance, no more.
    let later = at + 61_000;
    let records: Vec<_> = (1..=5u64)
        .map(|i| {
            let r = view(n + i, "attacker", &["victim"], 1_000, later);
            (n + i, r.encode(), later + i as i64)
        })
        .collect();
    let instance = ViewAggregator::new(
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        Arc::new(Log::default()),
        &t.stack.config,
        config.clone(),
    );
    instance
        .handle(&event(shard, &records), None)
        .await
        .unwrap();
    assert_eq!(views_of(&t, "victim").await, 2 * 600 + honest);
    t.stop().await;
}
