//! The local stack's stream event source (stream mode): what Lambda's event
//! source mapping does for the aggregate function in AWS, against the
//! emulator's Streams API (`DescribeStream`, `GetShardIterator`,
//! `GetRecords`), with the mapping's settings read from `template.yaml`.
//!
//! Lambda's semantics, as far as the aggregator can tell them apart:
//!
//! * one batch per stream shard at a time, in stream order
//!   (`ParallelizationFactor: 1`), shards side by side, of up to `BatchSize` records gathered for
//!   up to `MaximumBatchingWindowInSeconds`;
//! * with `TumblingWindowInSeconds`, the event names its shard (`shardId`)
//!   and carries the window fields;
//! * `batchItemFailures` (`ReportBatchItemFailures`): the records from the
//!   lowest failed sequence number on are delivered again, the ones before
//!   are done; an identifier that is no record of the batch (or failures
//!   none of which names a sequence number) fails it whole;
//! * a function error (or a timeout) delivers the batch again, split in two
//!   first with `BisectBatchOnFunctionError`; after `MaximumRetryAttempts`
//!   retries the records go to the `OnFailure` destination (here: the log
//!   and [`StreamSourceStats::discarded`]) and the shard moves on;
//! * a closed shard is read to its end before its children;
//! * with `TumblingWindowInSeconds`, an answer without `state` is a failed
//!   invocation.
//!
//! Its shards are virtual (`LOCAL_STREAM_SHARDS=K`, `lanes`): the
//! emulator's one stream shard, cut by the rows' partition key into K
//! shards with their own ids and checkpoints, delivered side by side, and
//! rolling over into children (`LOCAL_STREAM_ROLL_RECORDS`).
//!
//! And its faults, on demand (`LOCAL_STREAM_FAULTS`, e.g.
//! `seed=7,redeliver=0.2,lost=0.1,reorder=0.3`): what Lambda may do under
//! failures, one class each (`faults`, where AWS's words for each are).
//!
//! Rooms: this file holds the source's handle, its settings and counters;
//! `mapping` the loops (following the real shards, reading them, one worker
//! per lane), `lanes` the virtual shards, `batch` one batch's way to the
//! function and back (the Kinesis source's too), `deliver` what this
//! source adds to it, `faults` the fault classes, and `event` the event the
//! function is handed.

pub(crate) mod batch;
mod deliver;
mod event;
pub(crate) mod faults;
mod lanes;
mod mapping;
#[cfg(test)]
mod tests;

pub use faults::SourceFaults;
pub use lanes::{Layout, lane_of_key};

use anyhow::{Context, Result};
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use deliver::Handler;
use event::sequence;
use likes::App;
use likes::aggregate::records::SequenceNumber;
use mapping::Mapping;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::template::StreamSourceDef;

/// What the event source did, for tests and the log.
#[derive(Debug, Default)]
pub struct StreamSourceStats {
    /// Invocations of the function.
    pub invocations: AtomicU64,
    /// Records delivered, counting every redelivery.
    pub delivered: AtomicU64,
    /// Batches delivered again after a failure report or a function error.
    pub retries: AtomicU64,
    /// Batches split in two after a function error.
    pub bisections: AtomicU64,
    /// Invocations that applied the start of their batch and reported the
    /// rest as failed (`batchItemFailures` past the first record): the
    /// rest was delivered again.
    pub partial: AtomicU64,
    /// Batches delivered once more by the `redeliver` fault.
    pub redelivered: AtomicU64,
    /// Answers taken away by the `lost` fault.
    pub lost: AtomicU64,
    /// Batches handed over again out of stream order (`reorder`).
    pub reordered: AtomicU64,
    /// Records `reorder` appended after such a batch: the ones following it
    /// in its shard, handed over for the first time.
    pub appended: AtomicU64,
    /// Batches in which `duplicate` repeated a record.
    pub duplicated: AtomicU64,
    /// End-of-window invocations without records (`final_window`).
    pub final_windows: AtomicU64,
    /// Invocations taken as timed out and left running (`late_commit`).
    pub late_commits: AtomicU64,
    /// Of those, the ones that were still running when a later invocation
    /// of their shard (their retry) started.
    pub late_overlaps: AtomicU64,
    /// Records sent to the `OnFailure` destination: never applied.
    pub discarded: AtomicU64,
    /// The last sequence number handed to the function with no failure
    /// reported after it, per (virtual) shard id: what Lambda's checkpoint
    /// would be.
    pub done: Mutex<Vec<(String, String)>>,
    /// The virtual shards opened so far, each with its parent (a shard it
    /// rolled over from), in the order their first records were read.
    pub shards: Mutex<Vec<(String, Option<String>)>>,
    /// The last sequence number read, per real shard id.
    pub read: Mutex<Vec<(String, String)>>,
    /// Records read and not yet handed to the function for good.
    pub outstanding: AtomicU64,
    /// While set, records are read but not delivered (an aggregator that
    /// is down or far behind: records in flight).
    pub paused: AtomicBool,
    /// Lanes (0–63, one bit each) held back as `paused` holds all: one
    /// stream shard behind the others.
    pub held_lanes: AtomicU64,
}

impl StreamSourceStats {
    /// Whether lane `lane` is held back ([`StreamSource::hold_lane`]).
    pub fn lane_held(&self, lane: u32) -> bool {
        lane < 64 && self.held_lanes.load(Ordering::Relaxed) & (1 << lane) != 0
    }

    /// Records the function has not been handed successfully yet.
    pub fn discarded(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }
}

/// The local event source's own settings, beyond the template's.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceSettings {
    /// Virtual shards per real shard (`LOCAL_STREAM_SHARDS`, 1..=256).
    pub lanes: u32,
    /// Records per virtual shard before it rolls over into a child
    /// (`LOCAL_STREAM_ROLL_RECORDS`; 0: never).
    pub roll_records: u64,
    /// `LOCAL_STREAM_FAULTS`.
    pub faults: SourceFaults,
    /// `LOCAL_STREAM_INSTANCES`: whether each virtual shard's batches go to
    /// a function instance of its own.
    pub instances: Instances,
}

/// Which function instance takes a batch (`LOCAL_STREAM_INSTANCES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instances {
    /// `per-shard` (the default): each stream shard's batches go to an
    /// instance of its own, which keeps nothing in memory with any other,
    /// as on Lambda, where a shard's batches run in whichever instance is
    /// free and no instance sees more than the shard it holds.
    PerShard,
    /// `shared`: every batch goes to the stack's one instance.
    Shared,
}

impl Default for SourceSettings {
    fn default() -> Self {
        SourceSettings {
            lanes: 1,
            roll_records: 0,
            faults: SourceFaults::default(),
            instances: Instances::PerShard,
        }
    }
}

/// More virtual shards than this is a typo, not a table.
const MAX_LANES: u32 = 256;

impl SourceSettings {
    /// From the `LOCAL_STREAM_*` variables `lookup` finds; unset: defaults.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut s = SourceSettings::default();
        if let Some(v) = lookup("LOCAL_STREAM_SHARDS").filter(|v| !v.trim().is_empty()) {
            s.lanes = v.trim().parse().context("LOCAL_STREAM_SHARDS")?;
            if !(1..=MAX_LANES).contains(&s.lanes) {
                anyhow::bail!("LOCAL_STREAM_SHARDS={}: 1 to {MAX_LANES}", s.lanes);
            }
        }
        if let Some(v) = lookup("LOCAL_STREAM_ROLL_RECORDS").filter(|v| !v.trim().is_empty()) {
            s.roll_records = v.trim().parse().context("LOCAL_STREAM_ROLL_RECORDS")?;
        }
        s.faults = SourceFaults::parse(&lookup("LOCAL_STREAM_FAULTS").unwrap_or_default())
            .context("LOCAL_STREAM_FAULTS")?;
        if let Some(v) = lookup("LOCAL_STREAM_INSTANCES").filter(|v| !v.trim().is_empty()) {
            s.instances = match v.trim() {
                "per-shard" => Instances::PerShard,
                "shared" => Instances::Shared,
                other => anyhow::bail!("LOCAL_STREAM_INSTANCES={other}: per-shard or shared"),
            };
        }
        Ok(s)
    }
}

/// One event source mapping, running.
pub struct StreamSource {
    /// What it did so far.
    pub stats: Arc<StreamSourceStats>,
    /// The stream it reads.
    pub stream_arn: String,
}

impl StreamSource {
    /// Holds deliveries back (`true`) or lets them go on (`false`).
    pub fn pause(&self, paused: bool) {
        self.stats.paused.store(paused, Ordering::Relaxed);
    }

    /// Holds lane `lane` (0–63) back (`true`) or lets it go on, the
    /// others as they are: records of one stream shard in flight while
    /// the others' are carried.
    pub fn hold_lane(&self, lane: u32, held: bool) {
        let bit = 1u64.checked_shl(lane).unwrap_or(0);
        if held {
            self.stats.held_lanes.fetch_or(bit, Ordering::Relaxed);
        } else {
            self.stats.held_lanes.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Whether every record now in the stream has been handed to the
    /// function for good (applied, or discarded after its retries): read
    /// with `client`, which should reach the stream directly.
    pub async fn caught_up(&self, client: &Client) -> Result<bool> {
        // Read before `outstanding`: the reader counts records in flight
        // before it moves its read position past them.
        let read = self
            .stats
            .read
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default();
        let d = client
            .describe_stream()
            .stream_arn(&self.stream_arn)
            .send()
            .await
            .context("DescribeStream")?;
        for shard in d
            .stream_description()
            .map(|s| s.shards())
            .unwrap_or_default()
        {
            let Some(id) = shard.shard_id() else { continue };
            let Some(last) = last_record(client, &self.stream_arn, id).await? else {
                continue;
            };
            let reached = read
                .iter()
                .find(|(s, _)| s == id)
                .and_then(|(_, q)| SequenceNumber::parse(q));
            let behind = match reached {
                Some(r) => SequenceNumber::parse(&last).is_some_and(|l| r < l),
                None => true,
            };
            if behind {
                return Ok(false);
            }
        }
        Ok(self.stats.outstanding.load(Ordering::SeqCst) == 0)
    }
}

/// The sequence number of the last record of `shard`, if it has any.
async fn last_record(client: &Client, stream_arn: &str, shard: &str) -> Result<Option<String>> {
    let mut it = client
        .get_shard_iterator()
        .stream_arn(stream_arn)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .context("GetShardIterator")?
        .shard_iterator;
    let mut last: Option<String> = None;
    while let Some(i) = it {
        let page = client
            .get_records()
            .shard_iterator(i)
            .send()
            .await
            .context("GetRecords")?;
        let records = page.records();
        if records.is_empty() {
            break;
        }
        if let Some(seq) = records.last().and_then(sequence) {
            last = Some(seq.to_owned());
        }
        it = page.next_shard_iterator;
    }
    Ok(last)
}

/// The aggregate function's entry point of `app`, as a [`Handler`]: with
/// [`Instances::PerShard`], of an instance per stream shard, each built as
/// a cold start of `app` (its configuration and store, nothing else).
fn aggregate(app: Arc<App>, instances: Instances) -> Handler {
    let own: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<App>>>> = Arc::default();
    Arc::new(move |event, deadline| {
        let app = match instances {
            Instances::Shared => app.clone(),
            Instances::PerShard => {
                let shard = event["shardId"].as_str().unwrap_or_default().to_owned();
                // A poisoned lock still holds whole instances.
                let mut all = own.lock().unwrap_or_else(|p| p.into_inner());
                all.entry(shard)
                    .or_insert_with(|| {
                        Arc::new(App::new(app.config.clone(), app.aggregate.store().clone()))
                    })
                    .clone()
            }
        };
        Box::pin(async move {
            let (records, bytes) = crate::meter::records_of(&event);
            let handled = likes::triggers::handle_aggregate_event(&app, event, deadline);
            crate::meter::invoke("aggregate", records, bytes, handled)
                .await
                .map_err(|e| e.code().to_owned())
        })
    })
}

/// Starts the event source of `def` on the stream `stream_arn` of a table
/// whose partition key is `partition_key`, invoking the aggregate
/// function's entry point of `app` with `timeout` per invocation, until
/// `stopped`.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    app: Arc<App>,
    client: Client,
    def: StreamSourceDef,
    stream_arn: String,
    partition_key: String,
    timeout: Duration,
    settings: SourceSettings,
    stopped: watch::Receiver<bool>,
) -> (StreamSource, JoinHandle<()>) {
    let stats = Arc::new(StreamSourceStats::default());
    let source = StreamSource {
        stats: stats.clone(),
        stream_arn: stream_arn.clone(),
    };
    let mapping = Arc::new(Mapping {
        client,
        stream_arn: stream_arn.clone(),
        from_oldest: def.starting_position == "TRIM_HORIZON",
        layout: Layout {
            lanes: settings.lanes,
            roll_records: settings.roll_records,
            partition_key,
        },
        delivery: Arc::new(deliver::delivery(
            aggregate(app, settings.instances),
            def,
            stream_arn,
            timeout,
            settings.faults,
            stats.clone(),
        )),
        stats,
    });
    let task = tokio::spawn(mapping.run(stopped));
    (source, task)
}

#[cfg(test)]
mod settings_tests {
    use super::*;

    #[test]
    fn settings_parse() {
        let none = SourceSettings::from_lookup(|_| None).unwrap();
        assert_eq!(none, SourceSettings::default());
        assert_eq!((none.lanes, none.roll_records), (1, 0), "today's source");
        let env = |k: &str| match k {
            "LOCAL_STREAM_SHARDS" => Some("4".to_owned()),
            "LOCAL_STREAM_ROLL_RECORDS" => Some("50".to_owned()),
            "LOCAL_STREAM_FAULTS" => Some("seed=2,reorder=0.5".to_owned()),
            _ => None,
        };
        let s = SourceSettings::from_lookup(env).unwrap();
        assert_eq!((s.lanes, s.roll_records), (4, 50));
        assert_eq!(s.faults, SourceFaults::parse("seed=2,reorder=0.5").unwrap());
        assert_eq!(none.instances, Instances::PerShard, "as on Lambda");
        let shared = SourceSettings::from_lookup(|k| {
            (k == "LOCAL_STREAM_INSTANCES").then(|| "shared".to_owned())
        })
        .unwrap();
        assert_eq!(shared.instances, Instances::Shared);
        assert!(
            SourceSettings::from_lookup(|k| {
                (k == "LOCAL_STREAM_INSTANCES").then(|| "each".to_owned())
            })
            .is_err()
        );
        for bad in ["0", "257", "-1", "four"] {
            let r = SourceSettings::from_lookup(|k| {
                (k == "LOCAL_STREAM_SHARDS").then(|| bad.to_owned())
            });
            assert!(r.is_err(), "{bad}");
        }
    }
}
