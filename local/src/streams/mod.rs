//! The local stack's stream event source (stream mode): what Lambda's event
//! source mapping does for the aggregate function in AWS, against the
//! emulator's Streams API (`DescribeStream`, `GetShardIterator`,
//! `GetRecords`), with the mapping's settings read from `template.yaml`.
//!
//! Lambda's semantics, as far as the aggregator can tell them apart:
//!
//! * one batch per stream shard at a time, in stream order
//!   (`ParallelizationFactor: 1`), of up to `BatchSize` records gathered for
//!   up to `MaximumBatchingWindowInSeconds`;
//! * with `TumblingWindowInSeconds`, the event names its shard (`shardId`)
//!   and carries the window fields;
//! * `batchItemFailures` (`ReportBatchItemFailures`): the records from the
//!   lowest failed sequence number on are delivered again, the ones before
//!   are done;
//! * a function error (or a timeout) delivers the batch again, split in two
//!   first with `BisectBatchOnFunctionError`; after `MaximumRetryAttempts`
//!   retries the records go to the `OnFailure` destination (here: the log
//!   and [`StreamSourceStats::discarded`]) and the shard moves on;
//! * a closed shard is read to its end before its children.
//!
//! And its faults, on demand (`LOCAL_STREAM_FAULTS`, e.g.
//! `seed=7,redeliver=0.2,lost=0.1,reorder=0.5`): `redeliver` delivers a
//! batch that succeeded once more (at-least-once delivery), `lost` takes a
//! successful invocation's answer away (an invocation that crashed after
//! doing its work), which Lambda treats as a function error, and `reorder`
//! shuffles a batch handed over again (a retry, a bisected half, a
//! redelivery): "If records are processed more than once, they might be
//! processed out of order" (Lambda developer guide, tumbling windows).
//!
//! This file holds the source's handle, its settings and counters; the
//! mapping's loop (polling, batching, invoking, acting on the answer) is
//! `mapping`, and the event it hands the function is `event`.

mod event;
mod mapping;

use anyhow::{Context, Result, anyhow};
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use event::sequence;
use likes::App;
use mapping::Mapping;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Batches handed over again shuffled, by the `reorder` fault.
    pub reordered: AtomicU64,
    /// Records sent to the `OnFailure` destination: never applied.
    pub discarded: AtomicU64,
    /// The last sequence number handed to the function with no failure
    /// reported after it, per shard: what Lambda's checkpoint would be.
    pub done: Mutex<Vec<(String, String)>>,
    /// While set, records are read but not delivered (an aggregator that
    /// is down or far behind: records in flight).
    pub paused: std::sync::atomic::AtomicBool,
}

impl StreamSourceStats {
    /// Records the function has not been handed successfully yet.
    pub fn discarded(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }
}

/// The `LOCAL_STREAM_FAULTS` of the local event source.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SourceFaults {
    seed: u64,
    redeliver: f64,
    lost: f64,
    reorder: f64,
}

impl SourceFaults {
    /// `seed=N,redeliver=P,lost=P,reorder=P` (probabilities in 0..=1);
    /// empty: none.
    pub fn parse(spec: &str) -> Result<Self> {
        let mut f = SourceFaults::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| anyhow!("{part:?}: expected name=value"))?;
            match k.trim() {
                "seed" => f.seed = v.trim().parse().context("seed")?,
                name @ ("redeliver" | "lost" | "reorder") => {
                    let p: f64 = v.trim().parse().with_context(|| k.to_owned())?;
                    if !(0.0..=1.0).contains(&p) {
                        anyhow::bail!("{k}={p}: a probability is between 0 and 1");
                    }
                    match name {
                        "lost" => f.lost = p,
                        "reorder" => f.reorder = p,
                        _ => f.redeliver = p,
                    }
                }
                other => {
                    anyhow::bail!("unknown stream fault {other:?} (seed, redeliver, lost, reorder)")
                }
            }
        }
        Ok(f)
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

    /// Whether every record now in the stream has been handed to the
    /// function for good (applied, or discarded after its retries): read
    /// with `client`, which should reach the stream directly.
    pub async fn caught_up(&self, client: &Client) -> Result<bool> {
        let done = self
            .stats
            .done
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
            let mut it = client
                .get_shard_iterator()
                .stream_arn(&self.stream_arn)
                .shard_id(id)
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
            let Some(last) = last else { continue };
            let handed = done.iter().find(|(s, _)| s == id).map(|(_, q)| q.as_str());
            let behind = match handed.and_then(likes::aggregate::records::SequenceNumber::parse) {
                Some(h) => {
                    likes::aggregate::records::SequenceNumber::parse(&last).is_some_and(|l| h < l)
                }
                None => true,
            };
            if behind {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Starts the event source of `def` on the stream `stream_arn`, invoking the
/// aggregate function's entry point of `app` with `timeout` per invocation,
/// until `stopped`.
pub fn spawn(
    app: Arc<App>,
    client: Client,
    def: StreamSourceDef,
    stream_arn: String,
    timeout: Duration,
    faults: SourceFaults,
    stopped: watch::Receiver<bool>,
) -> (StreamSource, JoinHandle<()>) {
    let stats = Arc::new(StreamSourceStats::default());
    let source = StreamSource {
        stats: stats.clone(),
        stream_arn: stream_arn.clone(),
    };
    let mapping = Arc::new(Mapping {
        app,
        client,
        def,
        stream_arn,
        timeout,
        faults,
        rng: Mutex::new(fastrand::Rng::with_seed(faults.seed)),
        reorder_rng: Mutex::new(fastrand::Rng::with_seed(!faults.seed)),
        stats: stats.clone(),
    });
    let task = tokio::spawn(mapping.run(stopped));
    (source, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse() {
        assert_eq!(SourceFaults::parse("").unwrap(), SourceFaults::default());
        let f = SourceFaults::parse("seed=3, redeliver=0.5,lost=0.25,reorder=1").unwrap();
        assert_eq!(
            (f.seed, f.redeliver, f.lost, f.reorder),
            (3, 0.5, 0.25, 1.0)
        );
        assert!(SourceFaults::parse("lost=2").is_err());
        assert!(SourceFaults::parse("drop=0.1").is_err());
    }
}
