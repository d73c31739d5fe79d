//! One event source mapping at work: it follows the stream's shards
//! (parents before children), polls each into batches (`BatchSize`,
//! `MaximumBatchingWindowInSeconds`), invokes the aggregate function, and
//! acts on the answer (done, `batchItemFailures`, error) with Lambda's
//! retry, bisection and `OnFailure` rules. The rules are listed in the
//! parent module; this file is their loop.

use super::event::{event, sequence};
use super::{SourceFaults, StreamSourceStats};
use crate::template::StreamSourceDef;
use anyhow::{Context, Result};
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{Record, ShardIteratorType};
use likes::App;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often an idle shard is polled (Lambda polls each shard about four
/// times a second).
const POLL: Duration = Duration::from_millis(250);
/// How often the stream is described again, for new shards.
const DESCRIBE_EVERY: Duration = Duration::from_secs(5);

/// The state of one running mapping, shared by its shard pollers; built
/// by [`super::spawn`].
pub(super) struct Mapping {
    pub(super) app: Arc<App>,
    pub(super) client: Client,
    pub(super) def: StreamSourceDef,
    pub(super) stream_arn: String,
    /// The function's `Timeout`, per invocation.
    pub(super) timeout: Duration,
    pub(super) faults: SourceFaults,
    /// Draws the faults, seeded so that a run can be repeated.
    pub(super) rng: Mutex<fastrand::Rng>,
    /// Draws the `reorder` fault and its shuffles: apart, so that turning
    /// it on leaves the other faults' draws as they were.
    pub(super) reorder_rng: Mutex<fastrand::Rng>,
    pub(super) stats: Arc<StreamSourceStats>,
}

/// A shard as `DescribeStream` lists it.
#[derive(Clone, Debug)]
struct ShardInfo {
    id: String,
    parent: Option<String>,
}

impl Mapping {
    /// Follows the stream until `stopped`: a poller per shard, started as
    /// shards appear.
    pub(super) async fn run(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let mut started: HashSet<String> = HashSet::new();
        let finished: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut pollers: Vec<JoinHandle<()>> = Vec::new();
        loop {
            match self.shards().await {
                Ok(shards) => {
                    let known: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
                    for shard in &shards {
                        if started.contains(&shard.id) {
                            continue;
                        }
                        // Children wait for a parent still listed (Lambda
                        // reads a parent to its end first).
                        let parent = shard.parent.clone().filter(|p| known.contains(p.as_str()));
                        started.insert(shard.id.clone());
                        pollers.push(tokio::spawn(self.clone().poll_shard(
                            shard.clone(),
                            parent,
                            finished.clone(),
                            stopped.clone(),
                        )));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "describing the stream failed; retrying"),
            }
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(DESCRIBE_EVERY) => {}
            }
        }
        for p in pollers {
            let _ = tokio::time::timeout(Duration::from_secs(5), p).await;
        }
    }

    async fn shards(&self) -> Result<Vec<ShardInfo>> {
        let mut out = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let d = self
                .client
                .describe_stream()
                .stream_arn(&self.stream_arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await
                .context("DescribeStream")?;
            let Some(desc) = d.stream_description else {
                break;
            };
            for s in desc.shards() {
                if let Some(id) = s.shard_id() {
                    out.push(ShardInfo {
                        id: id.to_owned(),
                        parent: s.parent_shard_id().map(str::to_owned),
                    });
                }
            }
            match desc.last_evaluated_shard_id {
                Some(id) => start = Some(id),
                None => break,
            }
        }
        Ok(out)
    }

    /// Reads one shard to its end (or forever, while it is open), handing
    /// its records to the function batch after batch.
    async fn poll_shard(
        self: Arc<Self>,
        shard: ShardInfo,
        parent: Option<String>,
        finished: Arc<Mutex<HashSet<String>>>,
        mut stopped: watch::Receiver<bool>,
    ) {
        if let Some(p) = &parent {
            while !finished.lock().map(|f| f.contains(p)).unwrap_or(true) {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        }
        let mut iterator = None;
        let mut last: Option<String> = None;
        let mut pending: Vec<Record> = Vec::new();
        let mut first_at: Option<Instant> = None;
        let window = Duration::from_secs(self.def.batching_window_secs.into());
        loop {
            if *stopped.borrow() {
                return;
            }
            if iterator.is_none() {
                match self.iterator(&shard.id, last.as_deref()).await {
                    Ok(it) => iterator = it,
                    Err(e) => {
                        tracing::warn!(shard = %shard.id, error = %e, "GetShardIterator failed; retrying");
                        tokio::time::sleep(POLL).await;
                        continue;
                    }
                }
                if iterator.is_none() {
                    break;
                }
            }
            let want = (self.def.batch_size as usize)
                .saturating_sub(pending.len())
                .max(1);
            let page = self
                .client
                .get_records()
                .shard_iterator(iterator.clone().unwrap_or_default())
                .limit(want.min(1000) as i32)
                .send()
                .await;
            let closed = match page {
                Ok(page) => {
                    iterator = page.next_shard_iterator.clone();
                    let got = page.records.unwrap_or_default();
                    if !got.is_empty() && first_at.is_none() {
                        first_at = Some(Instant::now());
                    }
                    if let Some(seq) = got
                        .last()
                        .and_then(|r| r.dynamodb())
                        .and_then(|d| d.sequence_number())
                    {
                        last = Some(seq.to_owned());
                    }
                    pending.extend(got);
                    iterator.is_none()
                }
                Err(e) => {
                    // An expired or refused iterator: start again after the
                    // last record read.
                    tracing::warn!(shard = %shard.id, error = %aws_sdk_dynamodbstreams::error::DisplayErrorContext(&e), "GetRecords failed; retrying");
                    iterator = None;
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            let full = pending.len() >= self.def.batch_size as usize;
            let waited = first_at.is_some_and(|t| t.elapsed() >= window);
            let paused = self.stats.paused.load(Ordering::Relaxed);
            if !paused && !pending.is_empty() && (full || waited || closed) {
                let batch = std::mem::take(&mut pending);
                first_at = None;
                self.deliver(&shard.id, batch).await;
            }
            if closed && pending.is_empty() {
                break;
            }
            if !full {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        }
        if let Ok(mut f) = finished.lock() {
            f.insert(shard.id.clone());
        }
    }

    async fn iterator(&self, shard: &str, after: Option<&str>) -> Result<Option<String>> {
        let mut req = self
            .client
            .get_shard_iterator()
            .stream_arn(&self.stream_arn)
            .shard_id(shard);
        req = match after {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
            None if self.def.starting_position == "TRIM_HORIZON" => {
                req.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            None => req.shard_iterator_type(ShardIteratorType::Latest),
        };
        Ok(req.send().await.context("GetShardIterator")?.shard_iterator)
    }

    fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.rng.lock().map(|mut r| r.f64() < p).unwrap_or(false)
    }

    /// Hands `batch` to the function until every record is done or
    /// discarded, with Lambda's retry, failure-report and bisection rules.
    async fn deliver(&self, shard: &str, batch: Vec<Record>) {
        let mut queue: VecDeque<(Vec<Record>, i64)> = VecDeque::from([(batch, 0)]);
        while let Some((records, retries)) = queue.pop_front() {
            let outcome = self.invoke(shard, &records, retries > 0).await;
            let (rest, error) = match outcome {
                Invocation::Done => {
                    self.mark_done(shard, &records);
                    if self.chance(self.faults.redeliver) {
                        self.stats.redelivered.fetch_add(1, Ordering::Relaxed);
                        // The answer is not looked at: a second delivery
                        // must change nothing.
                        let _ = self.invoke(shard, &records, true).await;
                    }
                    continue;
                }
                Invocation::FailedFrom(seq) => {
                    let at = records
                        .iter()
                        .position(|r| sequence(r) == Some(seq.as_str()))
                        .unwrap_or(0);
                    if at > 0 {
                        self.stats.partial.fetch_add(1, Ordering::Relaxed);
                    }
                    self.mark_done(shard, &records[..at]);
                    (records[at..].to_vec(), false)
                }
                Invocation::Error => (records, true),
            };
            if rest.is_empty() {
                continue;
            }
            if self.def.max_retries >= 0 && retries >= self.def.max_retries {
                self.discard(shard, &rest);
                continue;
            }
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
            // Lambda sends a failed batch again at its next poll of the
            // shard, not at once.
            tokio::time::sleep(POLL).await;
            if error && self.def.bisect && rest.len() > 1 {
                self.stats.bisections.fetch_add(1, Ordering::Relaxed);
                let mut left = rest;
                let right = left.split_off(left.len() / 2);
                queue.push_front((right, retries + 1));
                queue.push_front((left, retries + 1));
            } else {
                queue.push_front((rest, retries + 1));
            }
        }
    }

    /// Hands `records` (in stream order) to the function; `again`: not
    /// for the first time, so the `reorder` fault may shuffle them. The
    /// answer is read against `records` as they are.
    async fn invoke(&self, shard: &str, records: &[Record], again: bool) -> Invocation {
        self.stats.invocations.fetch_add(1, Ordering::Relaxed);
        self.stats
            .delivered
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        let mut handed = records.to_vec();
        if again
            && handed.len() > 1
            && self.faults.reorder > 0.0
            && let Ok(mut rng) = self.reorder_rng.lock()
            && rng.f64() < self.faults.reorder
        {
            self.stats.reordered.fetch_add(1, Ordering::Relaxed);
            rng.shuffle(&mut handed);
        }
        let event = event(
            &self.stream_arn,
            self.def.tumbling_window_secs,
            shard,
            &handed,
        );
        let deadline = Instant::now() + self.timeout;
        let run = likes::triggers::handle_aggregate_event(&self.app, event, Some(deadline));
        let answer = match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                tracing::warn!(shard, error = e.code(), "aggregate invocation failed");
                return Invocation::Error;
            }
            Err(_) => {
                tracing::warn!(shard, "aggregate invocation timed out");
                return Invocation::Error;
            }
        };
        if self.chance(self.faults.lost) {
            self.stats.lost.fetch_add(1, Ordering::Relaxed);
            return Invocation::Error;
        }
        if !self.def.report_failures {
            return Invocation::Done;
        }
        let failed = answer["batchItemFailures"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["itemIdentifier"].as_str())
            .filter_map(|s| likes::aggregate::records::SequenceNumber::parse(s).map(|n| (n, s)))
            .min_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, s)| s.to_owned());
        match failed {
            // An identifier that is no record of the batch fails it whole.
            Some(seq) if records.iter().any(|r| sequence(r) == Some(seq.as_str())) => {
                Invocation::FailedFrom(seq)
            }
            Some(_) => Invocation::Error,
            None => Invocation::Done,
        }
    }

    fn mark_done(&self, shard: &str, records: &[Record]) {
        let Some(seq) = records.last().and_then(sequence) else {
            return;
        };
        if let Ok(mut done) = self.stats.done.lock() {
            match done.iter_mut().find(|(s, _)| s == shard) {
                Some(entry) => entry.1 = seq.to_owned(),
                None => done.push((shard.to_owned(), seq.to_owned())),
            }
        }
    }

    fn discard(&self, shard: &str, records: &[Record]) {
        self.stats
            .discarded
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        tracing::error!(
            shard,
            records = records.len(),
            first = records.first().and_then(sequence),
            last = records.last().and_then(sequence),
            "stream records sent to the OnFailure destination: retries exhausted"
        );
        self.mark_done(shard, records);
    }
}

/// How an invocation went, as the mapping acts on it.
enum Invocation {
    /// Every record is done.
    Done,
    /// `batchItemFailures`: the records from this sequence number on are
    /// to be delivered again.
    FailedFrom(String),
    /// A function error or a timeout: the whole batch failed.
    Error,
}
