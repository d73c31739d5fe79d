//! What the DynamoDB stream source brings to the delivery loop both
//! sources share (`batch`): its records, its event (with the tumbling
//! window's fields), the aggregate function with its deadline, the `state`
//! Lambda requires in a windowed answer, and the window's final
//! invocation. The lane's records that `reorder` may append come with
//! each batch's shard (see `mapping`).

use super::StreamSourceStats;
use super::batch::{self, Counter, Counters, Rules, Source, StreamRecord};
use super::event::{event, final_window, sequence};
use super::faults::SourceFaults;
use super::lanes::POLL;
use crate::template::StreamSourceDef;
use aws_sdk_dynamodbstreams::types::Record;
use futures::future::BoxFuture;
use likes::aggregate::records::SequenceNumber;
use serde_json::Value;
use std::cmp::Ordering;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// The function an event source invokes: the event, the invocation's
/// deadline; its answer, or the error it failed with.
pub(super) type Handler =
    Arc<dyn Fn(Value, Option<Instant>) -> BoxFuture<'static, Result<Value, String>> + Send + Sync>;

/// The function end of the DynamoDB stream source, shared by its lanes.
pub(super) type Delivery = batch::Delivery<Aggregate>;

/// The aggregate function behind a DynamoDB stream's event source.
pub(super) struct Aggregate {
    pub(super) handler: Handler,
    pub(super) def: StreamSourceDef,
    pub(super) stream_arn: String,
}

/// The delivery of `def`'s source on `stream_arn` to `handler`, which
/// has `timeout` per invocation.
pub(super) fn delivery(
    handler: Handler,
    def: StreamSourceDef,
    stream_arn: String,
    timeout: Duration,
    faults: SourceFaults,
    stats: Arc<StreamSourceStats>,
) -> Delivery {
    let rules = Rules {
        max_retries: def.max_retries,
        bisect: def.bisect,
        report_failures: def.report_failures,
        // Negative: no limit.
        max_record_age: u64::try_from(def.max_record_age_secs)
            .ok()
            .map(Duration::from_secs),
        timeout,
        poll: POLL,
    };
    let source = Aggregate {
        handler,
        def,
        stream_arn,
    };
    batch::Delivery::new(source, rules, faults, stats)
}

impl StreamRecord for Record {
    fn sequence(&self) -> Option<&str> {
        sequence(self)
    }

    fn compare(a: &str, b: &str) -> Option<Ordering> {
        Some(SequenceNumber::parse(a)?.cmp(&SequenceNumber::parse(b)?))
    }

    /// By the record's `ApproximateCreationDateTime`; a record without
    /// one never ages.
    fn older_than(&self, oldest: Duration) -> bool {
        let oldest = oldest.as_millis() as i64;
        self.dynamodb()
            .and_then(|d| d.approximate_creation_date_time())
            .is_some_and(|t| t.to_millis().is_ok_and(|ms| ms < oldest))
    }
}

impl Counters for StreamSourceStats {
    fn counter(&self, counter: Counter) -> Option<&AtomicU64> {
        Some(match counter {
            Counter::Invocations => &self.invocations,
            Counter::Delivered => &self.delivered,
            Counter::Retries => &self.retries,
            Counter::Bisections => &self.bisections,
            Counter::Partial => &self.partial,
            Counter::Redelivered => &self.redelivered,
            Counter::Lost => &self.lost,
            Counter::Reordered => &self.reordered,
            Counter::Appended => &self.appended,
            Counter::Duplicated => &self.duplicated,
            Counter::FinalWindows => &self.final_windows,
            Counter::LateCommits => &self.late_commits,
            Counter::LateOverlaps => &self.late_overlaps,
            Counter::Discarded => &self.discarded,
            Counter::Outstanding => &self.outstanding,
        })
    }

    fn checkpoint(&self, shard: &str, sequence: &str) {
        if let Ok(mut done) = self.done.lock() {
            match done.iter_mut().find(|(s, _)| s == shard) {
                Some(entry) => entry.1 = sequence.to_owned(),
                None => done.push((shard.to_owned(), sequence.to_owned())),
            }
        }
    }
}

impl Source for Aggregate {
    type Record = Record;
    type Stats = StreamSourceStats;
    const FUNCTION: &'static str = "aggregate";

    fn event(&self, shard: &str, records: &[Record]) -> Value {
        event(
            &self.stream_arn,
            self.def.tumbling_window_secs,
            shard,
            records,
        )
    }

    fn call(&self, event: Value, deadline: Instant) -> BoxFuture<'static, Result<Value, String>> {
        (self.handler)(event, Some(deadline))
    }

    /// "If the response does not contain a state property, Lambda
    /// considers this a failed invocation" (tumbling windows:
    /// <https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-windows.html>).
    fn refuses(&self, answer: &Value) -> Option<&'static str> {
        (self.def.tumbling_window_secs > 0 && !answer["state"].is_object())
            .then_some("answer without state")
    }

    fn windowed(&self) -> bool {
        self.def.tumbling_window_secs > 0
    }

    fn final_window(&self, shard: &str) -> Option<Value> {
        self.windowed()
            .then(|| final_window(&self.stream_arn, self.def.tumbling_window_secs, shard))
    }
}
