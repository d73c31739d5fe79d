//! What the Kinesis source brings to the delivery loop it shares with the
//! DynamoDB stream source (`crate::streams::batch`, where Lambda's rules
//! are): its records, whose sequence numbers are longer than any integer
//! type, its event, and the views function. Nothing else: no tumbling
//! windows, and `reorder` appends no records.

use super::def::KinesisSourceDef;
use super::event::{KinesisRecord, compare_sequences, event};
use super::{Handler, KinesisSourceStats};
use crate::streams::batch::{self, Counter, Counters, Rules, Source, StreamRecord};
use crate::streams::faults::SourceFaults;
use futures::future::BoxFuture;
use serde_json::Value;
use std::cmp::Ordering;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// The function end of the Kinesis source, shared by its shard readers.
pub(super) type Delivery = batch::Delivery<Views>;

/// The views function behind a Kinesis stream's event source.
pub(super) struct Views {
    handler: Handler,
    stream_arn: String,
}

/// The delivery of `def`'s source on `stream_arn` to `handler`, sending a
/// failed batch again after `poll`: the mapping's next read of the shard,
/// as Lambda's next poll. The mapping owns that interval and passes it in,
/// since the mapping is what hands batches here, not the other way round.
pub(super) fn delivery(
    handler: Handler,
    def: &KinesisSourceDef,
    stream_arn: String,
    faults: SourceFaults,
    stats: Arc<KinesisSourceStats>,
    poll: Duration,
) -> Delivery {
    let rules = Rules {
        max_retries: def.max_retries,
        bisect: def.bisect,
        report_failures: def.report_failures,
        max_record_age: def.max_record_age,
        timeout: def.timeout,
        poll,
    };
    batch::Delivery::new(
        Views {
            handler,
            stream_arn,
        },
        rules,
        faults,
        stats,
    )
}

impl StreamRecord for KinesisRecord {
    fn sequence(&self) -> Option<&str> {
        Some(&self.sequence)
    }

    fn compare(a: &str, b: &str) -> Option<Ordering> {
        compare_sequences(a, b)
    }

    /// By `ApproximateArrivalTimestamp`.
    fn older_than(&self, oldest: Duration) -> bool {
        self.arrival < oldest.as_secs_f64()
    }
}

impl Counters for KinesisSourceStats {
    fn counter(&self, counter: Counter) -> Option<&AtomicU64> {
        match counter {
            Counter::Invocations => Some(&self.invocations),
            Counter::Delivered => Some(&self.delivered),
            Counter::Retries => Some(&self.retries),
            Counter::Bisections => Some(&self.bisections),
            Counter::Partial => Some(&self.partial),
            Counter::Redelivered => Some(&self.redelivered),
            Counter::Lost => Some(&self.lost),
            Counter::Reordered => Some(&self.reordered),
            Counter::Duplicated => Some(&self.duplicated),
            Counter::LateCommits => Some(&self.late_commits),
            Counter::Discarded => Some(&self.discarded),
            Counter::Outstanding => Some(&self.outstanding),
            // Nothing is appended, there are no windows, and a late
            // invocation's overlap is only logged.
            Counter::Appended | Counter::FinalWindows | Counter::LateOverlaps => None,
        }
    }

    fn checkpoint(&self, shard: &str, sequence: &str) {
        if let Ok(mut done) = self.done.lock() {
            done.insert(shard.to_owned(), sequence.to_owned());
        }
    }

    fn on_failure(&self, record: Value) {
        if let Ok(mut all) = self.on_failure.lock() {
            all.push(record);
        }
    }
}

impl Source for Views {
    type Record = KinesisRecord;
    type Stats = KinesisSourceStats;
    const FUNCTION: &'static str = "views";

    fn event(&self, _shard: &str, records: &[KinesisRecord]) -> Value {
        event(&self.stream_arn, records)
    }

    /// Lambda's invocation record of a given-up Kinesis batch: the
    /// `KinesisBatchInfo` names the range, not the records.
    fn invocation_record(
        &self,
        shard: &str,
        records: &[KinesisRecord],
        condition: &str,
    ) -> Option<Value> {
        let (first, last) = (records.first()?, records.last()?);
        let iso = |secs: f64| {
            aws_sdk_kinesis::primitives::DateTime::from_millis((secs * 1000.0) as i64)
                .fmt(aws_sdk_kinesis::primitives::DateTimeFormat::DateTime)
                .unwrap_or_default()
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        Some(serde_json::json!({
            "requestContext": {
                "requestId": format!("local-{}", fastrand::u64(..)),
                "functionArn": format!("arn:aws:lambda:{}:{}:function:views-aggregator", super::event::REGION, super::event::ACCOUNT),
                "condition": condition,
                "approximateInvokeCount": 1,
            },
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "version": "1.0",
            "timestamp": iso(now),
            "KinesisBatchInfo": {
                "shardId": shard,
                "startSequenceNumber": first.sequence,
                "endSequenceNumber": last.sequence,
                "approximateArrivalOfFirstRecord": iso(first.arrival),
                "approximateArrivalOfLastRecord": iso(last.arrival),
                "batchSize": records.len(),
                "streamArn": self.stream_arn,
            }
        }))
    }

    /// The views function has no deadline to be told.
    fn call(&self, event: Value, _deadline: Instant) -> BoxFuture<'static, Result<Value, String>> {
        let run = (self.handler)(event);
        Box::pin(async move { run.await.map_err(|e| e.to_string()) })
    }
}
