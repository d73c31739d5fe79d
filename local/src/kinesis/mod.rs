//! The local stack's Kinesis side: the emulator (kinesis-mock, a Node
//! child process, `emulator`) with the views stream of `template.yaml`
//! (`def`), and an event source that does what Lambda's Kinesis event
//! source mapping does for the views function:
//!
//! * `ListShards`, then per shard `GetShardIterator` (`TRIM_HORIZON`, or
//!   `AFTER_SEQUENCE_NUMBER` to resume after the last record read) and
//!   `GetRecords`; a parent shard (a split's or a merge's) is read to its
//!   end and delivered before its children are read at all;
//! * one batch per shard in flight (`ParallelizationFactor: 1`), shards
//!   side by side, of up to `BatchSize` records gathered for up to
//!   `MaximumBatchingWindowInSeconds`, in shard order;
//! * `batchItemFailures` (`ReportBatchItemFailures`): the records from the
//!   lowest failed sequence number on are delivered again, the ones before
//!   are done; an identifier that is no record of the batch fails it whole;
//! * a function error (or a timeout) delivers the batch again, split in two
//!   first with `BisectBatchOnFunctionError`; after `MaximumRetryAttempts`
//!   retries the records go to the `OnFailure` destination (here: the log
//!   and [`KinesisSourceStats::discarded`]) and the shard moves on, as do
//!   records older than `MaximumRecordAgeInSeconds`;
//! * that destination's queue is an SQS event source of the same function
//!   (the repairs of given-up ranges), as the template makes it: `repairs`
//!   (off with `LOCAL_VIEWS_REPAIRS=off`, for repairs by hand);
//! * faults on demand (`LOCAL_VIEWS_FAULTS`, else `LOCAL_STREAM_FAULTS`):
//!   the DynamoDB stream source's classes (`crate::streams::faults`, where
//!   AWS's words for each are): `redeliver`, `lost`, `reorder`,
//!   `duplicate`, `late_commit` (`final_window` has no meaning without
//!   tumbling windows and is ignored).
//!
//! The function is any [`Handler`]: the event JSON in, the answer out, an
//! `Err` for a function error. Rooms: `mapping` the loops, `deliver` what
//! this source brings to one batch's way to the function and back (the
//! way itself is the DynamoDB stream source's too), `event` the event's
//! format.

mod def;
mod deliver;
mod emulator;
mod event;
mod mapping;
mod repairs;
#[cfg(test)]
mod tests;

pub use def::{FUNCTION_ID, KinesisSourceDef, STREAM_ID};
pub use emulator::{KinesisEmulator, create_stream, kinesis_client, node_available, package_dir};
pub use event::{KinesisRecord, compare_sequences, event, stream_arn};

use crate::streams::faults::SourceFaults;
use anyhow::{Context, Result};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use futures::future::BoxFuture;
use mapping::Mapping;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The function an event source invokes: Lambda's Kinesis event in, the
/// function's answer out (`{"batchItemFailures": [...]}` or anything
/// else for "all done"); an `Err` is a function error.
pub type Handler = Arc<dyn Fn(Value) -> BoxFuture<'static, anyhow::Result<Value>> + Send + Sync>;

/// What the event source did, for tests, the log and a bench that waits
/// for the stream to drain.
#[derive(Debug, Default)]
pub struct KinesisSourceStats {
    /// Invocations of the function.
    pub invocations: AtomicU64,
    /// Batches cut from the shards (each counted once, however often it is
    /// delivered).
    pub batches: AtomicU64,
    /// Records handed to the function, counting every redelivery.
    pub delivered: AtomicU64,
    /// Records read from the stream.
    pub read: AtomicU64,
    /// Batches delivered again after a failure report or a function error.
    pub retries: AtomicU64,
    /// Batches split in two after a function error.
    pub bisections: AtomicU64,
    /// Invocations that reported a failure past the first record: the
    /// start of the batch was done, the rest delivered again.
    pub partial: AtomicU64,
    /// Batches delivered once more by the `redeliver` fault.
    pub redelivered: AtomicU64,
    /// Answers taken away by the `lost` fault.
    pub lost: AtomicU64,
    /// Batches handed over again out of shard order (`reorder`).
    pub reordered: AtomicU64,
    /// Batches in which `duplicate` repeated a record.
    pub duplicated: AtomicU64,
    /// Invocations taken as timed out and left running (`late_commit`).
    pub late_commits: AtomicU64,
    /// Records sent to the `OnFailure` destination: never applied.
    pub discarded: AtomicU64,
    /// The invocation records sent to the `OnFailure` destination, as
    /// Lambda writes them (`KinesisBatchInfo`), oldest first.
    pub on_failure: Mutex<Vec<serde_json::Value>>,
    /// Invocations by the OnFailure queue's event source (repairs).
    pub repair_invocations: AtomicU64,
    /// The queue's messages done with: repaired, or dropped by the
    /// function (deleted from the queue).
    pub repaired: AtomicU64,
    /// The queue's messages delivered again (named in
    /// `batchItemFailures`, or of a failed invocation).
    pub repair_retries: AtomicU64,
    /// The queue's messages moved to its dead-letter queue after
    /// `maxReceiveCount` receives, as given up (the invocation records).
    pub dead_letters: Mutex<Vec<serde_json::Value>>,
    /// Records read and not yet handed to the function for good.
    pub outstanding: AtomicU64,
    /// Per shard: the last sequence number handed to the function with no
    /// failure reported after it (what Lambda's checkpoint would be).
    pub done: Mutex<BTreeMap<String, String>>,
    /// Per shard: the last sequence number read.
    pub read_to: Mutex<BTreeMap<String, String>>,
    /// The shards as they were first read, each with its parents.
    pub shards: Mutex<Vec<(String, Vec<String>)>>,
    /// Shards read to their end (closed) and delivered.
    pub finished: Mutex<Vec<String>>,
    /// While set, records are read but not delivered.
    pub paused: AtomicBool,
}

impl KinesisSourceStats {
    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }

    /// Given-up ranges whose repair is not done: in the OnFailure queue
    /// (neither repaired nor dead-lettered).
    pub fn repairs_pending(&self) -> u64 {
        let sent = self.on_failure.lock().map_or(0, |v| v.len()) as u64;
        let dead = self.dead_letters.lock().map_or(0, |v| v.len()) as u64;
        sent.saturating_sub(Self::get(&self.repaired) + dead)
    }
}

/// The local event source's own settings, beyond the template's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KinesisSettings {
    /// `LOCAL_VIEWS_FAULTS`, else `LOCAL_STREAM_FAULTS`.
    pub faults: SourceFaults,
    /// `LOCAL_VIEWS_REPAIRS=off`: the OnFailure queue's records are kept
    /// ([`KinesisSourceStats::on_failure`]) and never delivered, for
    /// repairs by hand (the fallback the runbook keeps).
    pub hold_repairs: bool,
    /// `LOCAL_VIEWS_REPAIR_VISIBILITY_SECS`: the OnFailure queue's
    /// visibility timeout (the delay of a repair's next attempt) instead of
    /// the template's, for tests.
    pub repair_visibility: Option<std::time::Duration>,
}

impl KinesisSettings {
    /// From the variables `lookup` finds; unset: no faults.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let (name, spec) = ["LOCAL_VIEWS_FAULTS", "LOCAL_STREAM_FAULTS"]
            .into_iter()
            .find_map(|k| lookup(k).filter(|v| !v.trim().is_empty()).map(|v| (k, v)))
            .unwrap_or(("LOCAL_VIEWS_FAULTS", String::new()));
        let set = |k: &str| {
            lookup(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let hold_repairs = match set("LOCAL_VIEWS_REPAIRS").as_deref() {
            None | Some("on" | "1" | "true") => false,
            Some("off" | "0" | "false") => true,
            Some(other) => anyhow::bail!("LOCAL_VIEWS_REPAIRS={other}: on or off"),
        };
        // Unset: the template's `VisibilityTimeout`.
        let repair_visibility = set("LOCAL_VIEWS_REPAIR_VISIBILITY_SECS")
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|s| (0.0..=43_200.0).contains(s))
                    .map(std::time::Duration::from_secs_f64)
                    .with_context(|| {
                        format!("LOCAL_VIEWS_REPAIR_VISIBILITY_SECS={v}: 0 to 43200 seconds")
                    })
            })
            .transpose()?;
        Ok(KinesisSettings {
            faults: SourceFaults::parse(&spec).context(name)?,
            hold_repairs,
            repair_visibility,
        })
    }
}

/// One Kinesis event source mapping, running.
pub struct KinesisSource {
    /// What it did so far.
    pub stats: Arc<KinesisSourceStats>,
    /// The stream it reads.
    pub stream: String,
    task: JoinHandle<()>,
    /// The OnFailure queue's event source, when the template has one.
    repairs: Option<JoinHandle<()>>,
}

impl KinesisSource {
    /// Starts reading `def.stream` with `client` and handing its batches
    /// to `handler`, until `stopped` says so (or [`KinesisSource::stop`]).
    pub fn spawn(
        client: Client,
        def: KinesisSourceDef,
        settings: KinesisSettings,
        handler: Handler,
        stopped: watch::Receiver<bool>,
    ) -> KinesisSource {
        let stats = Arc::new(KinesisSourceStats::default());
        let stream = def.stream.clone();
        let repairs = match (&def.repairs, settings.hold_repairs) {
            (Some(q), false) => Some(tokio::spawn(repairs::run(
                q.clone(),
                settings.repair_visibility.unwrap_or(q.visibility),
                handler.clone(),
                stats.clone(),
                stopped.clone(),
            ))),
            _ => None,
        };
        let mapping = Arc::new(Mapping {
            client,
            delivery: Arc::new(deliver::delivery(
                handler,
                &def,
                stream_arn(&def.stream),
                settings.faults,
                stats.clone(),
                mapping::POLL,
            )),
            def,
            stats: stats.clone(),
        });
        let task = tokio::spawn(mapping.run(stopped));
        KinesisSource {
            stats,
            stream,
            task,
            repairs,
        }
    }

    /// Holds deliveries back (`true`) or lets them go on (`false`).
    pub fn pause(&self, paused: bool) {
        self.stats.paused.store(paused, Ordering::Relaxed);
    }

    /// Waits for the source's loops to end (after `stopped` was set), up
    /// to five seconds.
    pub async fn stop(self) {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.task).await;
        if let Some(r) = self.repairs {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), r).await;
        }
    }

    /// Whether every record now in the stream has been handed to the
    /// function for good (applied, or discarded after its retries): asks
    /// every shard, with `client` (which should reach the emulator
    /// directly), for a record after the last one the source read.
    pub async fn drained(&self, client: &Client) -> Result<bool> {
        // Read before `outstanding`: the reader counts records in flight
        // before it moves its read position past them.
        let read = self
            .stats
            .read_to
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default();
        for shard in mapping::list_shards(client, &self.stream).await? {
            let it = client
                .get_shard_iterator()
                .stream_name(&self.stream)
                .shard_id(&shard.id);
            let it = match read.get(&shard.id) {
                Some(seq) => it
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .starting_sequence_number(seq),
                None => it.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let Some(it) = it.send().await.context("GetShardIterator")?.shard_iterator else {
                continue;
            };
            let page = client
                .get_records()
                .shard_iterator(it)
                .limit(1)
                .send()
                .await
                .context("GetRecords")?;
            if !page.records().is_empty() {
                return Ok(false);
            }
        }
        Ok(self.stats.outstanding.load(Ordering::SeqCst) == 0)
    }
}

/// Whether a test that needs kinesis-mock is to be skipped: Node.js is not
/// there (said on stderr). Under `CI=true` a missing Node.js fails the
/// test instead: CI must run them.
#[cfg(test)]
pub(crate) fn skip_without_node() -> bool {
    if node_available() {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: the Kinesis tests need Node.js 20+ (node on PATH)"
    );
    eprintln!("SKIPPED: the Kinesis tests need Node.js 20+ (node on PATH)");
    true
}
