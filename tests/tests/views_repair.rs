//! Repairs of given-up views ranges (`likes::views::repair`) against the
//! embedded emulator, the log played by hand: the two ways a copy of a
//! record could be counted twice, and a message naming another stream.
//!
//! * a copy of a given-up record, in the shard's next batch, not yet
//!   applied when the repair is asked for: the repair waits
//!   (`repair_too_early`) until the shard's aggregator has applied it, then
//!   leaves the record out;
//! * the same with the copy on a child shard (the range's shard split
//!   right after it);
//! * a record and its copy in two given-up ranges: the second repair finds
//!   the first's ids and leaves the copy out; while another repair holds
//!   the stream's lease, a repair waits (`repair_in_progress`).
//!
//! The records arrived 20 minutes ago: past `VIEWS_REPAIR_AFTER_SECS` and
//! the dedup window, well within `VIEWS_MAX_RECORD_AGE_SECS`, so only the
//! aggregator's checkpoint can say that what followed a range is applied.
//! tests/tests/views.rs repairs ranges given up by the local event source.

mod common;

use base64::Engine;
use common::TestStack;
use common::views_log::{ARN, seq};
use likes::keys::ReelId;
use likes::store::dynamodb::DynamoViews;
use likes::store::{LogPut, LogPutResult, LogRead, LogStore, NextRecords, ReadFrom, ViewStore};
use likes::views::ViewsConfig;
use likes::views::aggregate::ViewAggregator;
use likes::views::record::{KinesisEvent, ViewRecord};
use likes::views::repair::GivenUp;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Each shard's records by sequence number, with their arrival (Unix ms);
/// each shard's children.
#[derive(Default)]
struct Log(
    BTreeMap<String, BTreeMap<String, (i64, ViewRecord)>>,
    BTreeMap<String, Vec<String>>,
);

impl LogStore for Log {
    async fn put(&self, _: &[LogPut]) -> Result<Vec<LogPutResult>, likes::Error> {
        Err(likes::Error::Internal)
    }
    async fn parents(&self, _: &str, _: &str) -> Result<Vec<String>, likes::Error> {
        Ok(Vec::new())
    }
    async fn children(&self, _: &str, shard: &str) -> Result<Vec<String>, likes::Error> {
        Ok(self.1.get(shard).cloned().unwrap_or_default())
    }
    async fn read_range(
        &self,
        _: &str,
        shard: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<LogRead>, likes::Error> {
        Ok(self.0[shard]
            .range(from.to_owned()..=to.to_owned())
            .map(|(s, (at, r))| read(s, *at, r))
            .collect())
    }
    async fn next_records(
        &self,
        _: &str,
        shard: &str,
        from: ReadFrom<'_>,
        n: usize,
        _: i64,
    ) -> Result<NextRecords, likes::Error> {
        let records: Vec<LogRead> = self.0[shard]
            .iter()
            .filter(|(s, _)| match from {
                ReadFrom::Oldest => true,
                ReadFrom::At(a) => s.as_str() >= a,
                ReadFrom::After(a) => s.as_str() > a,
            })
            .take(n)
            .map(|(s, (at, r))| read(s, *at, r))
            .collect();
        // Fewer than asked for: read to the tip of an open shard.
        let rest_after = records.len() < n;
        Ok(NextRecords {
            records,
            ended: false,
            rest_after,
        })
    }
}

fn read(seq: &str, at: i64, r: &ViewRecord) -> LogRead {
    LogRead {
        sequence: seq.to_owned(),
        arrival_ms: at,
        data: r.encode(),
    }
}

/// Event `id` of `viewer` watching `reel` `n` times.
fn view(id: u64, viewer: &str, reel: &str, n: u32, at_ms: i64) -> ViewRecord {
    ViewRecord {
        id,
        viewer: viewer.into(),
        at_ms,
        views: vec![(ReelId::parse(reel).unwrap(), n)],
    }
}

/// Lambda's Kinesis event for records `ns` of `shard` in `log`.
fn event(log: &Log, shard: &str, ns: &[u64]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "Records": ns.iter().map(|n| {
            let (at, r) = &log.0[shard][&seq(*n)];
            json!({
                "kinesis": {
                    "sequenceNumber": seq(*n),
                    "data": b64.encode(r.encode()),
                    "approximateArrivalTimestamp": (*at as f64) / 1000.0,
                },
                "eventID": format!("{shard}:{}", seq(*n)),
                "eventSourceARN": ARN,
            })
        }).collect::<Vec<_>>()
    })
}

/// Lambda's OnFailure invocation record of records `from..=to` of `shard`,
/// given up 16 minutes ago.
fn given_up(shard: &str, from: u64, to: u64) -> Value {
    let at = aws_sdk_kinesis::primitives::DateTime::from_millis(now_ms() - 16 * 60_000)
        .fmt(aws_sdk_kinesis::primitives::DateTimeFormat::DateTime)
        .unwrap();
    json!({
        "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 11},
        "version": "1.0",
        "timestamp": at,
        "KinesisBatchInfo": {
            "shardId": shard,
            "startSequenceNumber": seq(from),
            "endSequenceNumber": seq(to),
            "batchSize": to - from + 1,
            "streamArn": ARN,
        }
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

struct Repairs {
    t: TestStack,
    aggregator: ViewAggregator<DynamoViews, Log>,
}

impl Repairs {
    async fn start(log: Log) -> Repairs {
        let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0"), ("METRICS", "off")]).await;
        let mut config = ViewsConfig::from_lookup(|_| None).unwrap();
        config.table = Some("ViewsTable".into());
        config.stream = Some("ViewsStream".into());
        let store = DynamoViews::new(t.stack.client.clone(), "ViewsTable");
        let aggregator = ViewAggregator::new(store, Arc::new(log), &t.stack.config, config);
        Repairs { t, aggregator }
    }

    async fn repair(
        &self,
        record: &Value,
    ) -> Result<likes::views::repair::RepairOutcome, likes::Error> {
        self.aggregator
            .repair(&GivenUp::parse(record).unwrap(), None)
            .await
    }

    async fn views(&self, reel: &str) -> u64 {
        common::views_log::views_of(&self.t, reel).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_not_yet_applied_makes_the_repair_wait_then_count_nothing_twice() {
    // Before: the repair read the seen ids once and counted the given-up
    // record; the shard's aggregator then applied its copy, which did not
    // see the repair's id: two views for one.
    let at = now_ms() - 20 * 60_000;
    let s = "shardId-000000000001";
    let mut log = Log::default();
    let shard = log.0.entry(s.into()).or_default();
    shard.insert(seq(10), (at, view(1, "u1", "a", 1, at)));
    // The producer put it again 2 s later (its answer was lost).
    shard.insert(seq(30), (at + 2_000, view(1, "u1", "a", 1, at)));
    shard.insert(seq(40), (at + 3_000, view(2, "u2", "b", 4, at)));
    let next = event(&log, s, &[30, 40]);
    let r = Repairs::start(log).await;
    // Lambda gave 10 up and has 30.. in hand, not yet applied.
    let early = r.repair(&given_up(s, 10, 10)).await.unwrap_err();
    assert_eq!(early.code(), "repair_too_early", "{early}");
    assert_eq!(r.views("a").await, 0, "a refused repair writes nothing");
    let e: KinesisEvent = serde_json::from_value(next).unwrap();
    r.aggregator.handle(&e, None).await.unwrap();
    assert_eq!((r.views("a").await, r.views("b").await), (1, 4));
    let out = r.repair(&given_up(s, 10, 10)).await.unwrap();
    assert!(out.complete, "{out:?}");
    assert_eq!((out.found, out.counted_before, out.applied_now), (1, 1, 0));
    assert_eq!(
        r.views("a").await,
        1,
        "the copy counted, the original not again"
    );
    r.t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_and_its_copy_in_two_given_up_ranges_count_once() {
    // Before: each repair wrote its ids to a seen partition of its own,
    // which the other did not read: both counted the event.
    let at = now_ms() - 20 * 60_000;
    let s = "shardId-000000000002";
    let mut log = Log::default();
    let shard = log.0.entry(s.into()).or_default();
    shard.insert(seq(10), (at, view(5, "u5", "c", 3, at)));
    shard.insert(seq(20), (at + 1_000, view(5, "u5", "c", 3, at)));
    shard.insert(seq(30), (at + 2_000, view(6, "u6", "d", 1, at)));
    let next = event(&log, s, &[30]);
    let r = Repairs::start(log).await;
    // 10 and 20 given up as two batches; 30 applied.
    let e: KinesisEvent = serde_json::from_value(next).unwrap();
    r.aggregator.handle(&e, None).await.unwrap();
    // Another repair of the stream holds the lease: this one waits.
    let store = DynamoViews::new(r.t.stack.client.clone(), "ViewsTable");
    let lease = likes::keys::views_repair_lease_key(ARN);
    assert!(
        store
            .take_lease(&lease, "other", now_ms(), now_ms() + 60_000)
            .await
            .unwrap()
    );
    let busy = r.repair(&given_up(s, 10, 10)).await.unwrap_err();
    assert_eq!(busy.code(), "repair_in_progress", "{busy}");
    assert_eq!(r.views("c").await, 0);
    store.release_lease(&lease, "other").await.unwrap();
    // A lease never given back (a crashed repair) lapses.
    let then = now_ms() - 120_000;
    assert!(
        store
            .take_lease(&lease, "crashed", then, then + 60_000)
            .await
            .unwrap()
    );
    let first = r.repair(&given_up(s, 10, 10)).await.unwrap();
    assert_eq!((first.applied_now, first.views_now), (1, 3), "{first:?}");
    let second = r.repair(&given_up(s, 20, 20)).await.unwrap();
    assert_eq!(
        (second.counted_before, second.applied_now),
        (1, 0),
        "{second:?}"
    );
    assert_eq!(r.views("c").await, 3);
    // Each invoked again: the same answers, nothing counted.
    let again = r.repair(&given_up(s, 10, 10)).await.unwrap();
    assert_eq!(
        (again.counted_before, again.applied_now),
        (1, 0),
        "{again:?}"
    );
    assert!(again.complete);
    assert_eq!(r.repair(&given_up(s, 20, 20)).await.unwrap(), second);
    assert_eq!((r.views("c").await, r.views("d").await), (3, 1));
    // A message naming another stream is refused: its keys would find
    // nothing counted.
    let mut other = given_up(s, 10, 10);
    other["KinesisBatchInfo"]["streamArn"] =
        json!("arn:aws:kinesis:us-east-1:123456789012:stream/Other");
    let e = r.repair(&other).await.unwrap_err();
    assert_eq!(e.code(), "invalid_invocation_record");
    r.t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_on_a_child_shard_is_waited_for_too() {
    let at = now_ms() - 20 * 60_000;
    let (s, child) = ("shardId-000000000003", "shardId-000000000004");
    let mut log = Log::default();
    log.0
        .entry(s.into())
        .or_default()
        .insert(seq(10), (at, view(7, "u7", "e", 2, at)));
    // The shard split right after 10: the producer's copy went to a child.
    log.0
        .entry(child.into())
        .or_default()
        .insert(seq(50), (at + 2_000, view(7, "u7", "e", 2, at)));
    log.1.insert(s.into(), vec![child.into()]);
    let next = event(&log, child, &[50]);
    let r = Repairs::start(log).await;
    let early = r.repair(&given_up(s, 10, 10)).await.unwrap_err();
    assert_eq!(early.code(), "repair_too_early", "{early}");
    let e: KinesisEvent = serde_json::from_value(next).unwrap();
    r.aggregator.handle(&e, None).await.unwrap();
    let out = r.repair(&given_up(s, 10, 10)).await.unwrap();
    assert_eq!((out.counted_before, out.applied_now), (1, 0), "{out:?}");
    assert_eq!(r.views("e").await, 2);
    r.t.stop().await;
}
