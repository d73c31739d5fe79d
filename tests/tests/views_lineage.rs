//! A copy of a views record that comes several reshards later is still
//! recognised (issue 35's platform run: views over-counted when Kinesis
//! was split and merged faster than a retry came back). The aggregator
//! read its shard's parents' and grandparents' seen items only; a copy on
//! a great-grandchild was counted twice.

mod common;

use common::TestStack;
use common::views_events::{Log, config, event, now_ms, view};
use common::views_log::views_of;
use likes::store::dynamodb::DynamoViews;
use likes::store::{LogPut, LogPutResult, LogRead, LogStore, NextRecords, ReadFrom};
use likes::views::aggregate::ViewAggregator;
use std::sync::Arc;

/// The log of [`Log`], whose shard `shard-{n}` was split from
/// `shard-{n-1}`: a chain of reshards.
#[derive(Default)]
struct Chain(Log);

impl LogStore for Chain {
    async fn put(&self, p: &[LogPut]) -> Result<Vec<LogPutResult>, likes::Error> {
        self.0.put(p).await
    }
    async fn parents(&self, _: &str, shard: &str) -> Result<Vec<String>, likes::Error> {
        let n: u32 = shard.trim_start_matches("shard-").parse().unwrap_or(0);
        Ok(if n == 0 {
            Vec::new()
        } else {
            vec![format!("shard-{}", n - 1)]
        })
    }
    async fn children(&self, _: &str, shard: &str) -> Result<Vec<String>, likes::Error> {
        let n: u32 = shard.trim_start_matches("shard-").parse().unwrap_or(0);
        Ok(vec![format!("shard-{}", n + 1)])
    }
    async fn read_range(
        &self,
        a: &str,
        shard: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<LogRead>, likes::Error> {
        self.0.read_range(a, shard, from, to).await
    }
    async fn next_records(
        &self,
        a: &str,
        shard: &str,
        from: ReadFrom<'_>,
        n: usize,
        at: i64,
    ) -> Result<NextRecords, likes::Error> {
        self.0.next_records(a, shard, from, n, at).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_several_reshards_later_counts_once() {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0")]).await;
    let aggregator = || {
        ViewAggregator::new(
            DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
            Arc::new(Chain::default()),
            &t.stack.config,
            config(),
        )
    };
    let at = now_ms();
    // Event 7 applied on shard-0; its copy (a retry) lands on shard-4, four
    // reshards later, within the dedup window.
    let record = view(7, "v1", &["r"], 1, at).encode();
    let out = aggregator()
        .handle(&event("shard-0", &[(1, record.clone(), at)]), None)
        .await
        .unwrap();
    assert_eq!(out.failed_from, None);
    assert_eq!(views_of(&t, "r").await, 1);
    let out = aggregator()
        .handle(&event("shard-4", &[(2, record, at + 2_000)]), None)
        .await
        .unwrap();
    assert_eq!(out.failed_from, None);
    assert_eq!(views_of(&t, "r").await, 1, "the copy counted once");
    t.stop().await;
}
