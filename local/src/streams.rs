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
//! `seed=7,redeliver=0.2,lost=0.1`): `redeliver` delivers a batch that
//! succeeded once more (at-least-once delivery), `lost` takes a successful
//! invocation's answer away (an invocation that crashed after doing its
//! work), which Lambda treats as a function error.

use anyhow::{Context, Result, anyhow};
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{AttributeValue, Record, ShardIteratorType};
use base64::Engine;
use likes::App;
use serde_json::{Map, Value, json};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::template::StreamSourceDef;

/// How often an idle shard is polled (Lambda polls each shard about four
/// times a second).
const POLL: Duration = Duration::from_millis(250);
/// How often the stream is described again, for new shards.
const DESCRIBE_EVERY: Duration = Duration::from_secs(5);

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
}

impl SourceFaults {
    /// `seed=N,redeliver=P,lost=P` (probabilities in 0..=1); empty: none.
    pub fn parse(spec: &str) -> Result<Self> {
        let mut f = SourceFaults::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| anyhow!("{part:?}: expected name=value"))?;
            match k.trim() {
                "seed" => f.seed = v.trim().parse().context("seed")?,
                "redeliver" | "lost" => {
                    let p: f64 = v.trim().parse().with_context(|| k.to_owned())?;
                    if !(0.0..=1.0).contains(&p) {
                        anyhow::bail!("{k}={p}: a probability is between 0 and 1");
                    }
                    if k.trim() == "lost" {
                        f.lost = p;
                    } else {
                        f.redeliver = p;
                    }
                }
                other => anyhow::bail!("unknown stream fault {other:?} (seed, redeliver, lost)"),
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
        stats: stats.clone(),
    });
    let task = tokio::spawn(mapping.run(stopped));
    (source, task)
}

struct Mapping {
    app: Arc<App>,
    client: Client,
    def: StreamSourceDef,
    stream_arn: String,
    timeout: Duration,
    faults: SourceFaults,
    rng: Mutex<fastrand::Rng>,
    stats: Arc<StreamSourceStats>,
}

/// A shard as `DescribeStream` lists it.
#[derive(Clone, Debug)]
struct ShardInfo {
    id: String,
    parent: Option<String>,
}

impl Mapping {
    async fn run(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
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
            let outcome = self.invoke(shard, &records).await;
            let (rest, error) = match outcome {
                Invocation::Done => {
                    self.mark_done(shard, &records);
                    if self.chance(self.faults.redeliver) {
                        self.stats.redelivered.fetch_add(1, Ordering::Relaxed);
                        // The answer is not looked at: a second delivery
                        // must change nothing.
                        let _ = self.invoke(shard, &records).await;
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

    async fn invoke(&self, shard: &str, records: &[Record]) -> Invocation {
        self.stats.invocations.fetch_add(1, Ordering::Relaxed);
        self.stats
            .delivered
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        let event = self.event(shard, records);
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

    /// Lambda's event for `records` of `shard`.
    fn event(&self, shard: &str, records: &[Record]) -> Value {
        let records: Vec<Value> = records.iter().map(|r| self.record(r)).collect();
        let mut event = Map::new();
        event.insert("Records".into(), Value::Array(records));
        if self.def.tumbling_window_secs > 0 {
            let span = i64::from(self.def.tumbling_window_secs);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let start = now - now.rem_euclid(span);
            event.insert("shardId".into(), json!(shard));
            event.insert("eventSourceARN".into(), json!(self.stream_arn));
            event.insert(
                "window".into(),
                json!({ "start": rfc3339(start), "end": rfc3339(start + span) }),
            );
            event.insert("state".into(), json!({}));
            event.insert("isFinalInvokeForWindow".into(), json!(false));
            event.insert("isWindowTerminatedEarly".into(), json!(false));
        }
        Value::Object(event)
    }

    fn record(&self, r: &Record) -> Value {
        let d = r.dynamodb();
        let image =
            |m: Option<&std::collections::HashMap<String, AttributeValue>>| -> Map<String, Value> {
                m.into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), attribute(v)))
                    .collect()
            };
        let keys = image(d.and_then(|d| d.keys()));
        let new_image = d.and_then(|d| d.new_image()).map(|m| image(Some(m)));
        json!({
            "eventID": r.event_id(),
            "eventName": r.event_name().map(|n| n.as_str()),
            "eventVersion": r.event_version(),
            "eventSource": r.event_source(),
            "awsRegion": r.aws_region(),
            "eventSourceARN": self.stream_arn,
            "dynamodb": {
                "ApproximateCreationDateTime": d
                    .and_then(|d| d.approximate_creation_date_time())
                    .map(|t| t.as_secs_f64()),
                "Keys": keys,
                "NewImage": new_image,
                "SequenceNumber": d.and_then(|d| d.sequence_number()),
                "SizeBytes": d.and_then(|d| d.size_bytes()),
                "StreamViewType": d.and_then(|d| d.stream_view_type()).map(|v| v.as_str()),
            },
        })
    }
}

enum Invocation {
    Done,
    FailedFrom(String),
    Error,
}

fn sequence(r: &Record) -> Option<&str> {
    r.dynamodb().and_then(|d| d.sequence_number())
}

/// An attribute in DynamoDB JSON: the scalar types a like row holds (the
/// aggregator reads nothing else).
fn attribute(v: &AttributeValue) -> Value {
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::B(b) => {
            json!({ "B": base64::engine::general_purpose::STANDARD.encode(b.as_ref()) })
        }
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        _ => json!({ "NULL": true }),
    }
}

/// `secs` (Unix) as an RFC 3339 UTC timestamp, as Lambda writes windows.
fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_written_as_lambda_writes_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_607_497_440), "2020-12-09T07:04:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn faults_parse() {
        assert_eq!(SourceFaults::parse("").unwrap(), SourceFaults::default());
        let f = SourceFaults::parse("seed=3, redeliver=0.5,lost=0.25").unwrap();
        assert_eq!((f.seed, f.redeliver, f.lost), (3, 0.5, 0.25));
        assert!(SourceFaults::parse("lost=2").is_err());
        assert!(SourceFaults::parse("drop=0.1").is_err());
    }
}
