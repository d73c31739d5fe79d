//! The views aggregator (`likes::views::aggregate`) where the storage or
//! the log misbehave in ways the other views tests do not reach (issue 35),
//! against the embedded emulator, fed Lambda's Kinesis events by hand:
//!
//! * throttled reads while planning a chunk (the checkpoint's `GetItem`,
//!   the seen items' `Query`, the sketches' `BatchGetItem`) are retried
//!   within the invocation: the batch is applied in one invocation, once;
//! * the `BatchGetItem` backoff never sleeps past the deadline's margin;
//! * a record in a format newer than this reader's is handed back (the
//!   checkpoint stays below it) and counted once a reader of it comes; a
//!   record that is no view record at all is skipped and counted
//!   (`ViewRecordsMalformed`);
//! * the checkpoint carries a TTL, refreshed by each chunk;
//! * views counted by a repair are in `ViewsApplied`; a repair stops
//!   below a record of a newer format, and one by a reader of it finishes
//!   the range, once.
//!
//! Each test failed before the change (issue 35).

mod common;

use common::TestStack;
use common::views_events::{Log, config, event, newer_format, now_ms, view};
use common::views_log::{ARN, seq, views_of as views};
use likes::store::dynamodb::DynamoViews;
use likes::store::{ChunkResult, SeenItem, ViewChunkWrite, ViewItem, ViewStore};
use likes::views::aggregate::ViewAggregator;
use likes::views::repair::GivenUp;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The views table, with the first `throttles` of each planning read
/// (checkpoint, seen items, view items) answered `Throttled`.
struct Throttling {
    inner: DynamoViews,
    throttles: u32,
    /// Calls of each read: checkpoint, seen items, view items.
    calls: Arc<[AtomicU32; 3]>,
}

impl Throttling {
    fn new(inner: DynamoViews, throttles: u32) -> Self {
        Throttling {
            inner,
            throttles,
            calls: Arc::default(),
        }
    }

    fn throttle(&self, read: usize) -> Result<(), likes::Error> {
        if self.calls[read].fetch_add(1, Ordering::SeqCst) < self.throttles {
            Err(likes::Error::Throttled)
        } else {
            Ok(())
        }
    }
}

impl ViewStore for Throttling {
    async fn view_checkpoint(&self, key: &str) -> Result<likes::store::Checkpoint, likes::Error> {
        self.throttle(0)?;
        self.inner.view_checkpoint(key).await
    }
    async fn seen_after(&self, key: &str, after: &str) -> Result<Vec<SeenItem>, likes::Error> {
        self.throttle(1)?;
        self.inner.seen_after(key, after).await
    }
    async fn seen_between(
        &self,
        key: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<SeenItem>, likes::Error> {
        self.inner.seen_between(key, from, to).await
    }
    async fn take_lease(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<bool, likes::Error> {
        self.inner.take_lease(key, holder, now_ms, until_ms).await
    }
    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), likes::Error> {
        self.inner.release_lease(key, holder).await
    }
    async fn view_items(
        &self,
        keys: &[(String, String)],
    ) -> Result<(Vec<(String, ViewItem)>, Vec<(String, String)>), likes::Error> {
        self.throttle(2)?;
        self.inner.view_items(keys).await
    }
    async fn apply_views(&self, write: &ViewChunkWrite) -> Result<ChunkResult, likes::Error> {
        self.inner.apply_views(write).await
    }
    async fn reel_views(
        &self,
        pk: &str,
        days: (&str, &str),
    ) -> Result<(Vec<ViewItem>, Vec<ViewItem>), likes::Error> {
        self.inner.reel_views(pk, days).await
    }
}

async fn stack(env: &[(&str, &str)]) -> TestStack {
    let mut all = vec![("LOCAL_SCHEDULE_SECS", "0"), ("METRICS", "memory")];
    all.extend_from_slice(env);
    TestStack::start(&all).await
}

fn aggregator<S: ViewStore>(t: &TestStack, store: S, log: Log) -> ViewAggregator<S, Log> {
    ViewAggregator::new(store, Arc::new(log), &t.stack.config, config())
}

/// The sum of metric `name` of the views aggregator over every record
/// flushed to memory so far in this process.
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

/// The checkpoint item of `shard`, as stored.
async fn checkpoint_item(
    t: &TestStack,
    shard: &str,
) -> Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    use aws_sdk_dynamodb::types::AttributeValue;
    t.stack
        .client
        .get_item()
        .table_name("ViewsTable")
        .key(
            "pk",
            AttributeValue::S(likes::keys::views_checkpoint_key(ARN, shard)),
        )
        .key(
            "sk",
            AttributeValue::S(likes::keys::VIEWS_SINGLE_SORT.into()),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_planning_reads_are_retried_within_the_invocation() {
    // Before: the first throttled read failed the whole invocation (one of
    // Lambda's 10 retries spent, the batch's views late).
    let t = stack(&[]).await;
    let store = Throttling::new(DynamoViews::new(t.stack.client.clone(), "ViewsTable"), 2);
    let calls = store.calls.clone();
    let a = aggregator(&t, store, Log::default());
    let at = now_ms();
    let s = "shardId-000000000001";
    let e = event(
        s,
        &[
            (1, view(1, "u1", &["t1", "t2"], 2, at).encode(), at),
            (2, view(2, "u2", &["t1"], 5, at).encode(), at + 10),
            (3, view(3, "u3", &["t2"], 1, at).encode(), at + 20),
        ],
    );
    let out = a.handle(&e, None).await.expect("applied in one invocation");
    assert_eq!(
        (out.applied, out.failed_from.as_deref()),
        (3, None),
        "{out:?}"
    );
    let calls: Vec<u32> = calls.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    assert!(
        calls.iter().all(|c| *c > 2),
        "each read throttled twice: {calls:?}"
    );
    assert_eq!((views(&t, "t1").await, views(&t, "t2").await), (7, 3));
    // Delivered again: nothing counted twice.
    let again = a.handle(&e, None).await.unwrap();
    assert_eq!((again.applied, again.skipped), (0, 3), "{again:?}");
    assert_eq!((views(&t, "t1").await, views(&t, "t2").await), (7, 3));
    assert!(metric(&t, "ViewReadThrottlesRetried") >= 6);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_get_backoff_never_sleeps_past_the_deadline_margin() {
    // Before: the sketches' BatchGetItem looped on unprocessed keys for up
    // to 8 rounds, sleeping up to 1.6 s each, whatever the deadline.
    let t = stack(&[("FAULTS", "seed=7,BatchGetItem.unprocessed=1")]).await;
    let proxy = t.stack.proxy.clone().expect("the fault proxy");
    let client = aws_sdk_dynamodb::Client::from_conf(
        t.stack
            .client
            .config()
            .to_builder()
            .endpoint_url(proxy.url.clone())
            .build(),
    );
    let a = aggregator(&t, DynamoViews::new(client, "ViewsTable"), Log::default());
    let at = now_ms();
    let reels: Vec<String> = (0..40).map(|i| format!("d{i}")).collect();
    let reels: Vec<&str> = reels.iter().map(String::as_str).collect();
    let e = event(
        "shardId-000000000002",
        &[(1, view(1, "u1", &reels, 1, at).encode(), at)],
    );
    // 80 items, each left unprocessed half the time: rounds upon rounds.
    let margin = likes::aggregate::core::DEADLINE_SAFETY;
    let deadline = Instant::now() + margin + Duration::from_millis(60);
    let result = a.handle(&e, Some(deadline)).await;
    let over = Instant::now().saturating_duration_since(deadline - margin);
    assert!(
        // One BatchGetItem's time, on a busy machine.
        over < Duration::from_millis(250),
        "ran {over:?} into the deadline's margin: {result:?}"
    );
    // Whatever it did not apply is applied once the reads go through.
    proxy.set_faults(faultproxy::Faults::default());
    let out = a.handle(&e, None).await.unwrap();
    assert_eq!(out.failed_from, None, "{out:?}");
    for r in ["d0", "d17", "d39"] {
        assert_eq!(views(&t, r).await, 1, "{r}");
    }
    assert_eq!(a.handle(&e, None).await.unwrap().applied, 0);
    assert_eq!(views(&t, "d0").await, 1);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_a_newer_format_is_handed_back_not_skipped() {
    // Before: it was applied as nothing and the checkpoint passed it: the
    // views it carried, acknowledged to the client, were lost for good.
    let t = stack(&[]).await;
    let a = aggregator(
        &t,
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        Log::default(),
    );
    let at = now_ms();
    let s = "shardId-000000000003";
    let first = (1, view(1, "u1", &["n1"], 2, at).encode(), at);
    let third = (3, view(3, "u3", &["n1"], 5, at).encode(), at + 20);
    let e = event(
        s,
        &[first.clone(), (2, newer_format(2), at + 10), third.clone()],
    );
    let out = a.handle(&e, None).await.unwrap();
    assert_eq!(out.failed_from, Some(seq(2)), "{out:?}");
    assert_eq!(views(&t, "n1").await, 2, "only what lies below it");
    assert!(metric(&t, "ViewRecordsNewerFormat") >= 1);
    // Lambda hands it back, again and again, until a reader of its format
    // comes: the record is read (here: as this version's format) and
    // counted, the checkpoint having stayed below it.
    let again = event(s, &[(2, newer_format(2), at + 10), third.clone()]);
    let out = a.handle(&again, None).await.unwrap();
    assert_eq!(out.failed_from, Some(seq(2)), "{out:?}");
    let read = event(
        s,
        &[(2, view(2, "u9", &["n1"], 3, at).encode(), at + 10), third],
    );
    let out = a.handle(&read, None).await.unwrap();
    assert_eq!(
        (out.applied, out.failed_from.as_deref()),
        (2, None),
        "{out:?}"
    );
    assert_eq!(views(&t, "n1").await, 2 + 3 + 5);
    assert_eq!(a.handle(&read, None).await.unwrap().applied, 0);
    assert_eq!(views(&t, "n1").await, 10);
    // A batch that starts with one: nothing applied, all of it handed back.
    let e = event("shardId-000000000013", &[(7, newer_format(7), at)]);
    let out = a.handle(&e, None).await.unwrap();
    assert_eq!(
        (out.applied, out.failed_from.clone()),
        (0, Some(seq(7))),
        "{out:?}"
    );
    assert!(checkpoint_item(&t, "shardId-000000000013").await.is_none());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_is_skipped_and_counted() {
    // Before: skipped without a trace in the metrics.
    let t = stack(&[]).await;
    let a = aggregator(
        &t,
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        Log::default(),
    );
    let at = now_ms();
    let s = "shardId-000000000004";
    let e = event(
        s,
        &[
            (1, view(1, "u1", &["m1"], 2, at).encode(), at),
            (2, b"not a view record".to_vec(), at + 10),
            (3, br#"{"f":0,"id":"x"}"#.to_vec(), at + 15),
            (4, view(4, "u4", &["m1"], 1, at).encode(), at + 20),
        ],
    );
    let out = a.handle(&e, None).await.unwrap();
    assert_eq!(out.failed_from, None, "{out:?}");
    assert_eq!(views(&t, "m1").await, 3);
    assert_eq!(metric(&t, "ViewRecordsMalformed"), 2);
    // Delivered again: skipped as below the checkpoint, not counted again.
    a.handle(&e, None).await.unwrap();
    assert_eq!(metric(&t, "ViewRecordsMalformed"), 2);
    assert_eq!(views(&t, "m1").await, 3);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_expire_long_after_any_redelivery() {
    // Before: a checkpoint was kept forever, every closed shard's too.
    let t = stack(&[]).await;
    let a = aggregator(
        &t,
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        Log::default(),
    );
    let at = now_ms();
    let s = "shardId-000000000005";
    let expiry = |item: &std::collections::HashMap<_, _>| -> i64 {
        match item.get("expires_at") {
            Some(aws_sdk_dynamodb::types::AttributeValue::N(n)) => n.parse().unwrap(),
            other => panic!("no expires_at: {other:?}"),
        }
    };
    let year = 365 * 86_400;
    a.handle(
        &event(s, &[(1, view(1, "u1", &["k1"], 1, at).encode(), at)]),
        None,
    )
    .await
    .unwrap();
    let first = expiry(&checkpoint_item(&t, s).await.unwrap());
    assert!(first > now_ms() / 1000 + year, "{first}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    a.handle(
        &event(s, &[(2, view(2, "u1", &["k1"], 1, at).encode(), at)]),
        None,
    )
    .await
    .unwrap();
    let second = expiry(&checkpoint_item(&t, s).await.unwrap());
    assert!(
        second > first,
        "refreshed by each chunk: {first} → {second}"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_counted_by_a_repair_are_in_views_applied() {
    // Before: `ViewsApplied` counted the aggregator's batches only, so it
    // fell short of `ViewsAccepted` by every repaired view.
    let at = now_ms() - 20 * 60_000;
    let s = "shardId-000000000006";
    let mut log = Log::default();
    let shard = log.0.entry(s.into()).or_default();
    shard.insert(seq(10), (at, view(61, "u1", &["p1"], 4, at).encode()));
    shard.insert(
        seq(11),
        (at + 5, view(62, "u2", &["p1", "p2"], 3, at).encode()),
    );
    let t = stack(&[]).await;
    let a = aggregator(
        &t,
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        log,
    );
    let given_up = aws_sdk_kinesis::primitives::DateTime::from_millis(now_ms() - 16 * 60_000)
        .fmt(aws_sdk_kinesis::primitives::DateTimeFormat::DateTime)
        .unwrap();
    let record = json!({
        "version": "1.0",
        "timestamp": given_up,
        "KinesisBatchInfo": {
            "shardId": s,
            "startSequenceNumber": seq(10),
            "endSequenceNumber": seq(11),
            "batchSize": 2,
            "streamArn": ARN,
        }
    });
    let before = metric(&t, "ViewsApplied");
    let out = a
        .repair(&GivenUp::parse(&record).unwrap(), None)
        .await
        .unwrap();
    assert_eq!((out.applied_now, out.views_now), (2, 10), "{out:?}");
    assert_eq!(views(&t, "p1").await, 7);
    assert_eq!(metric(&t, "ViewsApplied") - before, 10);
    // Invoked again: nothing counted, nothing more in the metric.
    a.repair(&GivenUp::parse(&record).unwrap(), None)
        .await
        .unwrap();
    assert_eq!(metric(&t, "ViewsApplied") - before, 10);

    // (In this test, as `ViewsApplied` is summed over the process.) A
    // given-up range holding a record of a newer format: counted below it,
    // left incomplete from it, and finished by a repair that reads it.
    let s = "shardId-000000000016";
    let range = |log: &Log| {
        let mut record = record.clone();
        record["KinesisBatchInfo"]["shardId"] = json!(s);
        record["KinesisBatchInfo"]["startSequenceNumber"] = json!(seq(20));
        record["KinesisBatchInfo"]["endSequenceNumber"] = json!(seq(22));
        assert_eq!(log.0[s].len(), 3);
        GivenUp::parse(&record).unwrap()
    };
    let mut log = Log::default();
    let shard = log.0.entry(s.into()).or_default();
    shard.insert(seq(20), (at, view(71, "u1", &["q1"], 1, at).encode()));
    shard.insert(seq(21), (at + 5, newer_format(72)));
    shard.insert(seq(22), (at + 9, view(73, "u3", &["q1"], 4, at).encode()));
    let given_up = range(&log);
    let old = aggregator(
        &t,
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        log,
    );
    let out = old.repair(&given_up, None).await.unwrap();
    assert!(!out.complete, "{out:?}");
    assert_eq!(out.failed_from, Some(seq(21)), "{out:?}");
    assert_eq!((out.applied_now, out.views_now), (1, 1), "{out:?}");
    assert_eq!(views(&t, "q1").await, 1);
    assert_eq!(metric(&t, "ViewsApplied") - before, 11);
    // An aggregator that reads it (played here by its record in this
    // version's format) repairs the range again: the rest, once.
    let mut log = Log::default();
    let shard = log.0.entry(s.into()).or_default();
    shard.insert(seq(20), (at, view(71, "u1", &["q1"], 1, at).encode()));
    shard.insert(seq(21), (at + 5, view(72, "u9", &["q1"], 3, at).encode()));
    shard.insert(seq(22), (at + 9, view(73, "u3", &["q1"], 4, at).encode()));
    let new = aggregator(
        &t,
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        log,
    );
    let out = new.repair(&given_up, None).await.unwrap();
    assert!(out.complete, "{out:?}");
    assert_eq!((out.applied_now, out.views_now), (2, 7), "{out:?}");
    assert_eq!(views(&t, "q1").await, 8);
    let again = new.repair(&given_up, None).await.unwrap();
    assert_eq!((again.applied_now, again.complete), (0, true), "{again:?}");
    assert_eq!(views(&t, "q1").await, 8);
    assert_eq!(metric(&t, "ViewsApplied") - before, 18);
    t.stop().await;
}
