//! Repairs: a range of a views-log shard that Lambda gave up on, counted
//! once, from the invocation record Lambda sent to the OnFailure queue.
//!
//! # Why a repair is needed
//!
//! Lambda goes on past a batch that ran out of retries or grew older than
//! `MaximumRecordAgeInSeconds`, and sends an invocation record naming it
//! (`KinesisBatchInfo`: stream, shard, first and last sequence numbers) to
//! the OnFailure destination. The shard's later batches move its
//! checkpoint past the range, so handing the range to the aggregator again
//! counts nothing; and views have no truth table to recount from.
//!
//! # Why it is exact
//!
//! Part of the range may have been counted after all: the records below
//! the point where a batch was handed back, or all of it (an invocation
//! that did its work and lost its answer before Lambda gave up), and
//! copies of a record (one event id) on the shard, its parents or its
//! children. Each was counted by a transaction that also wrote its event id
//! into its shard's seen items, and seen items are kept a day past the
//! dedup window, as long as the log keeps the records. So a repair:
//!
//! 1. reads the range back from the log (`GetShardIterator` at its first
//!    sequence number, `GetRecords` to its last);
//! 2. reads the event ids counted on the shard, its parents and
//!    grandparents, children and grandchildren, by chunks whose records
//!    arrived from the dedup window (and the arrival skew) before the
//!    range's first record to [`LATE_CHUNK_MS`] past the window after its
//!    last;
//! 3. applies the parts whose ids are not among them, through the same core
//!    as the aggregator, under a checkpoint, seen partition and writer of
//!    its own ([`keys::views_repair_source`]): a repair invoked again (a
//!    lost answer, its deadline, an operator unsure) goes on from its
//!    checkpoint and counts nothing twice.
//!
//! Unreadable records count nothing, as in the aggregator.
//!
//! # Limits
//!
//! * Records past the stream's retention (24 hours after they arrived) are
//!   gone: the outcome says how many the record named and how many were
//!   found.
//! * A copy of a repaired record that reaches the shard *after* the repair
//!   is counted again: the shard's aggregator does not read the repair's
//!   seen partition. Copies come within the dedup window of the original
//!   (a producer's retry, a client's retry with its key); a repair, which
//!   follows the give-up and its alarm, comes later than that.
//! * A chunk's seen item is sorted by its newest record's arrival, so a
//!   copy counted in a chunk spanning more than [`LATE_CHUNK_MS`] of
//!   arrivals is not found (a backlog an hour deep on a quiet shard).

use super::aggregate::{ARRIVAL_SKEW_MS, ViewAggregator, ViewPlanning};
use super::chunk::{Part, parts, record_seq};
use super::record;
use crate::aggregate::core;
use crate::aggregate::records::SequenceNumber;
use crate::error::Error;
use crate::keys;
use crate::store::{LogStore, ViewStore};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashSet;
use std::time::Instant;

/// How far past the dedup window after a range's last record a chunk that
/// counted a copy of one of its records may have its newest record.
pub const LATE_CHUNK_MS: i64 = 3_600_000;

/// A range Lambda gave up on: the `KinesisBatchInfo` of an OnFailure
/// invocation record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GivenUp {
    /// The stream's ARN (`streamArn`).
    pub stream_arn: String,
    /// The shard (`shardId`).
    pub shard_id: String,
    /// The first record's sequence number (`startSequenceNumber`).
    pub start: String,
    /// The last record's sequence number (`endSequenceNumber`).
    pub end: String,
    /// Records in the batch (`batchSize`).
    pub batch_size: Option<u64>,
}

impl GivenUp {
    /// Whether `event` is an OnFailure invocation record of a Kinesis
    /// source (it has `KinesisBatchInfo`), not a batch of records.
    pub fn is_invocation_record(event: &Value) -> bool {
        event.get("KinesisBatchInfo").is_some()
    }

    /// The range `event` (an OnFailure invocation record) names; a 400 if
    /// a field is missing or is not what Lambda writes.
    pub fn parse(event: &Value) -> Result<Self, Error> {
        let info = &event["KinesisBatchInfo"];
        let text = |name: &'static str| -> Result<String, Error> {
            info[name]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| {
                    Error::bad_request(
                        "invalid_invocation_record",
                        format!("KinesisBatchInfo.{name} must be a non-empty string"),
                    )
                })
        };
        let g = GivenUp {
            stream_arn: text("streamArn")?,
            shard_id: text("shardId")?,
            start: text("startSequenceNumber")?,
            end: text("endSequenceNumber")?,
            batch_size: info["batchSize"].as_u64(),
        };
        let (Some(a), Some(b)) = (
            SequenceNumber::parse_kinesis(&g.start),
            SequenceNumber::parse_kinesis(&g.end),
        ) else {
            return Err(Error::bad_request(
                "invalid_invocation_record",
                "startSequenceNumber and endSequenceNumber must be sequence numbers",
            ));
        };
        if a > b {
            return Err(Error::bad_request(
                "invalid_invocation_record",
                "startSequenceNumber is after endSequenceNumber",
            ));
        }
        Ok(g)
    }
}

/// What a repair did, over all its invocations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepairOutcome {
    /// Records the invocation record named (`batchSize`).
    pub named: Option<u64>,
    /// Records of the range the log still holds.
    pub found: usize,
    /// Parts (a record's up to 40 reels each) counted before the repair,
    /// or copies of such: left out.
    pub counted_before: usize,
    /// Parts this repair counted, now and in its earlier invocations.
    pub repaired: usize,
    /// Views in those parts.
    pub views_repaired: u64,
    /// Parts counted by this invocation.
    pub applied_now: usize,
    /// Every part of the range found is counted; otherwise invoke the
    /// repair again with the same record (see `failed_from`).
    pub complete: bool,
    /// Where this invocation stopped (its deadline, its retries).
    pub failed_from: Option<String>,
}

impl<S: ViewStore, L: LogStore> ViewAggregator<S, L> {
    /// Counts once what of `range` was not counted (see the module notes).
    pub async fn repair(
        &self,
        range: &GivenUp,
        deadline: Option<Instant>,
    ) -> Result<RepairOutcome, Error> {
        let GivenUp {
            stream_arn,
            shard_id,
            ..
        } = range;
        let reads = self
            .log
            .read_range(stream_arn, shard_id, &range.start, &range.end)
            .await?;
        let batch = record::batch_of(stream_arn, shard_id, &reads);
        let mut out = RepairOutcome {
            named: range.batch_size,
            found: batch.records.len(),
            ..RepairOutcome::default()
        };
        let arrivals = batch.records.iter().map(|r| r.arrival_ms);
        let (Some(first), Some(last)) = (arrivals.clone().min(), arrivals.max()) else {
            out.complete = true;
            return Ok(out);
        };
        let counted = self
            .counted_around(stream_arn, shard_id, first, last)
            .await?;
        // Unreadable records (no id) count nothing, as in the aggregator.
        let (fresh, before): (Vec<Part>, Vec<Part>) = parts(&batch.records)
            .into_iter()
            .filter(|p| p.id.is_some())
            .partition(|p| p.id.is_some_and(|id| !counted.contains(&id)));
        out.counted_before = before.len();
        let name = keys::views_repair_source(shard_id, &range.start);
        let planning = ViewPlanning {
            aggregator: self,
            shard_id,
            writer: keys::views_writer(stream_arn, &name),
            seen_key: keys::views_seen_key(stream_arn, &name),
            ancestors: Vec::new(),
        };
        let key = keys::views_checkpoint_key(stream_arn, &name);
        let (run, checkpoint) = core::run(&planning, &self.backoff, &key, &fresh, deadline).await?;
        let done: Vec<&Part> = fresh
            .iter()
            .filter(|p| checkpoint.as_ref().is_some_and(|k| p.seq <= *k))
            .collect();
        out.repaired = done.len();
        out.views_repaired = done
            .iter()
            .flat_map(|p| p.views.iter().map(|(_, n)| u64::from(*n)))
            .sum();
        out.applied_now = run.applied;
        out.failed_from = run.failed_from.map(|s| record_seq(&s));
        out.complete = out.failed_from.is_none() && done.len() == fresh.len();
        Ok(out)
    }

    /// The event ids counted on `shard_id`, its parents and grandparents,
    /// and its children and grandchildren, by chunks whose newest record
    /// arrived from the dedup window before `first` to [`LATE_CHUNK_MS`]
    /// past the window after `last` (arrival times, Unix ms).
    async fn counted_around(
        &self,
        stream_arn: &str,
        shard_id: &str,
        first: i64,
        last: i64,
    ) -> Result<HashSet<u64>, Error> {
        let mut shards = vec![shard_id.to_owned()];
        for parent in self.log.parents(stream_arn, shard_id).await? {
            shards.extend(self.log.parents(stream_arn, &parent).await?);
            shards.push(parent);
        }
        for child in self.log.children(stream_arn, shard_id).await? {
            shards.extend(self.log.children(stream_arn, &child).await?);
            shards.push(child);
        }
        let window = self.config.dedup_window.as_millis() as i64;
        let from = keys::views_seen_from(first - window - ARRIVAL_SKEW_MS);
        let to = keys::views_seen_from(last + window + LATE_CHUNK_MS + 1);
        let mut counted = HashSet::new();
        for shard in &shards {
            let key = keys::views_seen_key(stream_arn, shard);
            for item in self.store.seen_between(&key, &from, &to).await? {
                counted.extend(item.ids);
            }
        }
        Ok(counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Lambda's example of a Kinesis OnFailure invocation record.
    fn record() -> Value {
        json!({
            "requestContext": {
                "requestId": "c9b8fa9f-5a7f-xmpl-af9c-0c604cde93a5",
                "functionArn": "arn:aws:lambda:us-east-2:123456789012:function:myfunction",
                "condition": "RetryAttemptsExhausted",
                "approximateInvokeCount": 1
            },
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "version": "1.0",
            "timestamp": "2019-11-14T00:38:06.021Z",
            "KinesisBatchInfo": {
                "shardId": "shardId-000000000001",
                "startSequenceNumber": "49601189658422359378836298521827638475320189012309704722",
                "endSequenceNumber": "49601189658422359378836298522902373528957594348623495186",
                "approximateArrivalOfFirstRecord": "2019-11-14T00:38:04.835Z",
                "approximateArrivalOfLastRecord": "2019-11-14T00:38:05.580Z",
                "batchSize": 500,
                "streamArn": "arn:aws:kinesis:us-east-2:123456789012:stream/mystream"
            }
        })
    }

    #[test]
    fn an_invocation_record_names_its_range() {
        let r = record();
        assert!(GivenUp::is_invocation_record(&r));
        assert!(!GivenUp::is_invocation_record(&json!({"Records": []})));
        let g = GivenUp::parse(&r).unwrap();
        assert_eq!(g.shard_id, "shardId-000000000001");
        assert_eq!(
            g.stream_arn,
            "arn:aws:kinesis:us-east-2:123456789012:stream/mystream"
        );
        assert_eq!(g.batch_size, Some(500));
        assert!(g.start < g.end);
    }

    #[test]
    fn a_record_missing_a_field_or_out_of_order_is_a_400() {
        for (field, value) in [
            ("shardId", json!(null)),
            ("streamArn", json!("")),
            ("startSequenceNumber", json!("not-a-number")),
            ("endSequenceNumber", json!(7)),
            // The end before the start.
            ("endSequenceNumber", json!("4960")),
        ] {
            let mut r = record();
            r["KinesisBatchInfo"][field] = value;
            let e = GivenUp::parse(&r).unwrap_err();
            assert_eq!(e.code(), "invalid_invocation_record", "{field}");
        }
    }
}
