//! The views aggregator (`likes::views::aggregate`) against the embedded
//! emulator, fed Lambda's Kinesis events by hand: exactly once whatever
//! Lambda and the producer do.
//!
//! * a batch delivered again out of order, reversed with newer records
//!   appended, or with a record twice, counts each record once;
//! * a record put twice by the producer (one event id, two sequence
//!   numbers) counts once, in one batch, in two, and across a split (the
//!   copy on a child shard, the first on its parent);
//! * a record naming 100 reels is applied whole;
//! * 100,000 distinct viewers over 4 shards are estimated within three
//!   relative standard errors, and viewers seen again raise nothing;
//! * a UTC day boundary splits the daily figures (an injected clock).

mod common;

use base64::Engine;
use common::TestStack;
use common::views_log::{ARN, seq};
use likes::keys::ReelId;
use likes::store::dynamodb::DynamoViews;
use likes::store::{LogPut, LogPutResult, LogStore};
use likes::views::ViewsConfig;
use likes::views::aggregate::ViewAggregator;
use likes::views::read::ViewReader;
use likes::views::record::{KinesisEvent, ViewRecord};
use likes::views::sketch::RELATIVE_STANDARD_ERROR;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// 2026-12-02T12:00:00Z.
const NOON: i64 = 1_796_212_800_000;

/// A log that only knows shards' parents (the tests put nothing).
#[derive(Default)]
struct Parents(HashMap<String, Vec<String>>);

impl LogStore for Parents {
    async fn put(&self, _: &[LogPut]) -> Result<Vec<LogPutResult>, likes::Error> {
        Err(likes::Error::Internal)
    }
    async fn parents(&self, _: &str, shard: &str) -> Result<Vec<String>, likes::Error> {
        Ok(self.0.get(shard).cloned().unwrap_or_default())
    }
    async fn children(&self, _: &str, _: &str) -> Result<Vec<String>, likes::Error> {
        Ok(Vec::new())
    }
    async fn read_range(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Vec<likes::store::LogRead>, likes::Error> {
        Ok(Vec::new())
    }
    async fn next_records(
        &self,
        _: &str,
        _: &str,
        _: likes::store::ReadFrom<'_>,
        _: usize,
        _: i64,
    ) -> Result<likes::store::NextRecords, likes::Error> {
        Ok(likes::store::NextRecords::default())
    }
}

fn reel(i: usize) -> ReelId {
    ReelId::parse(&format!("r{i}")).unwrap()
}

/// A record: event `id` of `viewer` watching `reels` once each at `at_ms`.
fn view(n: u64, id: u64, viewer: &str, reels: &[ReelId], at_ms: i64) -> (u64, ViewRecord) {
    (
        n,
        ViewRecord {
            id,
            viewer: viewer.into(),
            at_ms,
            views: reels.iter().map(|r| (r.clone(), 1)).collect(),
        },
    )
}

/// Lambda's Kinesis event for `records` of `shard`, in the order given.
fn event(shard: &str, records: &[(u64, ViewRecord)]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "Records": records.iter().map(|(n, r)| json!({
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": r.viewer,
                "sequenceNumber": seq(*n),
                "data": b64.encode(r.encode()),
                "approximateArrivalTimestamp": (r.at_ms as f64) / 1000.0,
            },
            "eventSource": "aws:kinesis",
            "eventID": format!("{shard}:{}", seq(*n)),
            "eventSourceARN": ARN,
        })).collect::<Vec<_>>()
    })
}

struct Views {
    t: TestStack,
    aggregator: ViewAggregator<DynamoViews, Parents>,
    clock_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl Views {
    async fn start(parents: Parents) -> Views {
        let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0"), ("METRICS", "off")]).await;
        let clock_ms = Arc::new(std::sync::atomic::AtomicI64::new(NOON));
        let c = clock_ms.clone();
        let mut config = ViewsConfig::from_lookup(|_| None).unwrap();
        config.table = Some("ViewsTable".into());
        config.clock = Arc::new(move || c.load(std::sync::atomic::Ordering::Relaxed));
        let store = DynamoViews::new(t.stack.client.clone(), "ViewsTable");
        let aggregator = ViewAggregator::new(store, Arc::new(parents), &t.stack.config, config);
        Views {
            t,
            aggregator,
            clock_ms,
        }
    }

    /// Hands `event` over; all of it must be applied.
    async fn deliver(&self, event: &Value) -> likes::aggregate::BatchOutcome {
        let e: KinesisEvent = serde_json::from_value(event.clone()).unwrap();
        let out = self.aggregator.handle(&e, None).await.expect("applied");
        assert_eq!(out.failed_from, None, "{out:?}");
        out
    }

    /// A fresh reader's figures (no cache), by the injected clock.
    async fn figures(&self, r: &ReelId) -> likes::views::read::ViewCounts {
        let c = self.clock_ms.clone();
        let reader = ViewReader::new(
            DynamoViews::new(self.t.stack.client.clone(), "ViewsTable"),
            Duration::ZERO,
            10,
            Arc::new(move || c.load(std::sync::atomic::Ordering::Relaxed)),
        );
        (*reader.counts(r).await.unwrap()).clone()
    }

    async fn views(&self, r: &ReelId) -> u64 {
        self.figures(r).await.views
    }
}

/// Records of 40 reels each: one record a transaction, so a batch of two is
/// two checkpoint moves.
fn wide(n: u64, id: u64, from: usize) -> (u64, ViewRecord) {
    let reels: Vec<ReelId> = (from..from + 40).map(reel).collect();
    view(n, id, "u1", &reels, NOON)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivered_batches_count_each_record_once_in_any_order() {
    let v = Views::start(Parents::default()).await;
    // Out of order, twice: 30 → reels 0..40, 20 → reels 40..80.
    let reordered = event("shardId-000000000001", &[wide(30, 1, 0), wide(20, 2, 40)]);
    let first = v.deliver(&reordered).await;
    assert!(first.out_of_order);
    v.deliver(&reordered).await;
    assert_eq!((v.views(&reel(0)).await, v.views(&reel(40)).await), (1, 1));
    // Again reversed, with newer records appended, and one twice inside.
    let again = event(
        "shardId-000000000001",
        &[
            wide(50, 4, 0),
            wide(40, 3, 40),
            wide(40, 3, 40),
            wide(30, 1, 0),
            wide(20, 2, 40),
        ],
    );
    let out = v.deliver(&again).await;
    assert!(out.out_of_order);
    assert_eq!(out.applied, 2, "{out:?}");
    v.deliver(&again).await;
    assert_eq!((v.views(&reel(0)).await, v.views(&reel(40)).await), (2, 2));
    assert_eq!(v.views(&reel(79)).await, 2);
    // Four records of 40 views each counted, whatever was delivered.
    assert_eq!(v.aggregator.views_applied(), 160);
    v.t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_producer_put_twice_counts_once_even_across_a_split() {
    let parents = Parents(HashMap::from([(
        "shardId-000000000005".to_owned(),
        vec!["shardId-000000000001".to_owned()],
    )]));
    let v = Views::start(parents).await;
    let a = reel(1);
    // One batch holding a record and its copy (a lost answer, put again).
    v.deliver(&event(
        "shardId-000000000001",
        &[
            view(1, 77, "u1", std::slice::from_ref(&a), NOON),
            view(2, 77, "u1", std::slice::from_ref(&a), NOON),
        ],
    ))
    .await;
    assert_eq!(v.views(&a).await, 1);
    // The copy in a later batch of the same shard.
    v.deliver(&event(
        "shardId-000000000001",
        &[view(3, 77, "u1", std::slice::from_ref(&a), NOON)],
    ))
    .await;
    assert_eq!(v.views(&a).await, 1);
    // A new event of the same viewer counts.
    v.deliver(&event(
        "shardId-000000000001",
        &[view(4, 78, "u1", std::slice::from_ref(&a), NOON)],
    ))
    .await;
    assert_eq!(v.views(&a).await, 2);
    // The copy on a child of that shard after a split.
    v.deliver(&event(
        "shardId-000000000005",
        &[view(9, 77, "u1", std::slice::from_ref(&a), NOON)],
    ))
    .await;
    assert_eq!(v.views(&a).await, 2);
    // Past the window, the id is another event (documented).
    let later = NOON + 600_000;
    v.deliver(&event(
        "shardId-000000000005",
        &[view(10, 77, "u1", std::slice::from_ref(&a), later)],
    ))
    .await;
    assert_eq!(v.views(&a).await, 3);
    v.t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_naming_100_reels_is_applied_whole_and_once() {
    let v = Views::start(Parents::default()).await;
    let reels: Vec<ReelId> = (0..100).map(reel).collect();
    let big = event("shardId-000000000001", &[view(1, 5, "u1", &reels, NOON)]);
    let out = v.deliver(&big).await;
    assert!(out.chunks >= 3, "{out:?}");
    v.deliver(&big).await;
    for r in &reels {
        let f = v.figures(r).await;
        assert_eq!((f.views, f.unique_viewers, f.views_7d), (1, 1, 1), "{r:?}");
    }
    v.t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_viewers_are_estimated_within_the_stated_error() {
    let v = Views::start(Parents::default()).await;
    let r = reel(7);
    const VIEWERS: u64 = 100_000;
    const BATCH: u64 = 2_000;
    let mut n = 0u64;
    for round in 0..2u64 {
        // The second round: every viewer again (new events).
        for from in (0..VIEWERS).step_by(BATCH as usize) {
            let shard = format!("shardId-00000000000{}", from / BATCH % 4);
            let records: Vec<(u64, ViewRecord)> = (from..from + BATCH)
                .map(|i| {
                    n += 1;
                    view(
                        n,
                        round * VIEWERS + i,
                        &format!("viewer-{i}"),
                        std::slice::from_ref(&r),
                        NOON,
                    )
                })
                .collect();
            v.deliver(&event(&shard, &records)).await;
        }
        let f = v.figures(&r).await;
        assert_eq!(f.views, (round + 1) * VIEWERS);
        let err = (f.unique_viewers as f64 - VIEWERS as f64).abs() / VIEWERS as f64;
        assert!(
            err <= 3.0 * RELATIVE_STANDARD_ERROR,
            "round {round}: {} distinct viewers estimated as {} ({:.2} %)",
            VIEWERS,
            f.unique_viewers,
            err * 100.0
        );
        assert_eq!(f.unique_viewers_7d, f.unique_viewers);
    }
    v.t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_utc_day_boundary_splits_the_daily_figures() {
    let v = Views::start(Parents::default()).await;
    let r = reel(3);
    let midnight = NOON + 12 * 3_600_000;
    let before = midnight - 1;
    v.deliver(&event(
        "shardId-000000000001",
        &[
            view(1, 1, "a", std::slice::from_ref(&r), before),
            view(2, 2, "b", std::slice::from_ref(&r), before),
            view(3, 3, "a", std::slice::from_ref(&r), midnight),
            // Eight days before: all time, not the last seven days.
            view(
                4,
                4,
                "c",
                std::slice::from_ref(&r),
                midnight - 8 * 86_400_000,
            ),
        ],
    ))
    .await;
    let at = |ms: i64| v.clock_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    // Before midnight, the new day's view is not in the last seven days.
    let f = v.figures(&r).await;
    assert_eq!((f.views, f.unique_viewers), (4, 3));
    assert_eq!((f.views_7d, f.unique_viewers_7d), (2, 2));
    // An hour after midnight: both days, not the one eight days back.
    at(midnight + 3_600_000);
    let f = v.figures(&r).await;
    assert_eq!((f.views_7d, f.unique_viewers_7d), (3, 2));
    // The last moment the day before midnight is among the last seven.
    at(midnight + 6 * 86_400_000 - 1);
    assert_eq!(v.figures(&r).await.views_7d, 3);
    // A millisecond later only midnight's day is.
    at(midnight + 6 * 86_400_000);
    let f = v.figures(&r).await;
    assert_eq!((f.views_7d, f.unique_viewers_7d), (1, 1));
    assert_eq!((f.views, f.unique_viewers), (4, 3));
    v.t.stop().await;
}
