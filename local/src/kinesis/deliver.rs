//! One shard's batch handed to the function: Lambda's answers (done,
//! `batchItemFailures`, error or timeout) with its retry, bisection and
//! `OnFailure` rules, and the source's faults drawn on the way (the
//! classes of `crate::streams::faults`). The DynamoDB stream source's
//! `deliver` does the same for its records; this one works on Kinesis
//! records, whose sequence numbers are longer than that one's number type.

use super::Handler;
use super::KinesisSourceStats;
use super::def::KinesisSourceDef;
use super::event::{KinesisRecord, before, compare_sequences, event};
use super::mapping::POLL;
use crate::streams::faults::{Dice, SourceFaults, duplicate_at, out_of_order};
use futures::future::BoxFuture;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The function end of one event source, shared by its shard readers.
pub(super) struct Delivery {
    pub(super) handler: Handler,
    pub(super) def: KinesisSourceDef,
    pub(super) stream_arn: String,
    pub(super) faults: SourceFaults,
    pub(super) dice: Dice,
    pub(super) stats: Arc<KinesisSourceStats>,
    /// Invocations started per shard, to tell whether a late commit's
    /// invocation outlived the start of its retry.
    pub(super) started: Arc<Mutex<HashMap<String, u64>>>,
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

fn count(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Delivery {
    /// Hands `batch` (in shard order) to the function until every record
    /// is done or discarded.
    pub(super) async fn deliver(&self, shard: &str, batch: Vec<KinesisRecord>) {
        let mut queue: VecDeque<(Vec<KinesisRecord>, i64)> = VecDeque::from([(batch, 0)]);
        while let Some((records, retries)) = queue.pop_front() {
            let records = self.drop_aged(shard, records);
            if records.is_empty() {
                continue;
            }
            let handed = self.perturb(&records, retries > 0);
            let (rest, error) = match self.invoke(shard, &handed).await {
                Invocation::Done => {
                    self.mark_done(shard, &records);
                    if self.dice.chance(self.faults.redeliver) {
                        count(&self.stats.redelivered, 1);
                        // The answer is not looked at: a second delivery
                        // must change nothing.
                        let again = self.perturb(&records, true);
                        let _ = self.invoke(shard, &again).await;
                    }
                    continue;
                }
                Invocation::FailedFrom(seq) => {
                    // Lambda goes on from the failed record's sequence
                    // number: by number, as a reordered batch's positions
                    // say nothing.
                    let (done, rest): (Vec<KinesisRecord>, Vec<KinesisRecord>) =
                        records.into_iter().partition(|r| before(&r.sequence, &seq));
                    if !done.is_empty() {
                        count(&self.stats.partial, 1);
                    }
                    self.mark_done(shard, &done);
                    (rest, false)
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
            count(&self.stats.retries, 1);
            // Lambda sends a failed batch again at its next poll of the
            // shard, not at once.
            tokio::time::sleep(POLL).await;
            if error && self.def.bisect && rest.len() > 1 {
                count(&self.stats.bisections, 1);
                let mut left = rest;
                let right = left.split_off(left.len() / 2);
                queue.push_front((right, retries + 1));
                queue.push_front((left, retries + 1));
            } else {
                queue.push_front((rest, retries + 1));
            }
        }
    }

    /// `records` as this delivery hands them over: as they are, unless a
    /// fault strikes. `again`: not the first time, so `reorder` may hand
    /// them out of order ("Records are always processed in order the first
    /// time"); `duplicate` repeats one record.
    fn perturb(&self, records: &[KinesisRecord], again: bool) -> Vec<KinesisRecord> {
        let mut handed = records.to_vec();
        if again && records.len() > 1 && self.dice.chance(self.faults.reorder) {
            count(&self.stats.reordered, 1);
            handed = out_of_order(records.len(), &self.dice)
                .into_iter()
                .filter_map(|i| records.get(i).cloned())
                .collect();
        }
        if !handed.is_empty() && self.dice.chance(self.faults.duplicate) {
            count(&self.stats.duplicated, 1);
            let (from, to) = duplicate_at(handed.len(), &self.dice);
            if let Some(copy) = handed.get(from).cloned() {
                handed.insert(to, copy);
            }
        }
        handed
    }

    /// Counts an invocation of `shard`; returns how many it has had.
    fn start(&self, shard: &str) -> u64 {
        count(&self.stats.invocations, 1);
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        let n = started.entry(shard.to_owned()).or_default();
        *n += 1;
        *n
    }

    async fn invoke(&self, shard: &str, handed: &[KinesisRecord]) -> Invocation {
        let nth = self.start(shard);
        count(&self.stats.delivered, handed.len() as u64);
        let run = (self.handler)(event(&self.stream_arn, handed));
        if self.dice.chance(self.faults.late_commit) {
            self.abandon(shard, nth, run);
            return Invocation::Error;
        }
        let answer = match tokio::time::timeout(self.def.timeout, run).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                tracing::warn!(shard, error = %e, "views invocation failed");
                return Invocation::Error;
            }
            Err(_) => {
                // Lambda stops a function at its timeout: the invocation
                // is dropped here, none of it runs on.
                tracing::warn!(shard, "views invocation timed out");
                return Invocation::Error;
            }
        };
        if self.dice.chance(self.faults.lost) {
            count(&self.stats.lost, 1);
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
            .filter(|s| compare_sequences(s, s).is_some())
            .min_by(|a, b| compare_sequences(a, b).unwrap_or(std::cmp::Ordering::Equal))
            .map(str::to_owned);
        let malformed = answer["batchItemFailures"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            && failed.is_none();
        match failed {
            // An identifier that is no record of the batch fails it whole.
            Some(seq)
                if handed.iter().any(|r| {
                    compare_sequences(&r.sequence, &seq) == Some(std::cmp::Ordering::Equal)
                }) =>
            {
                Invocation::FailedFrom(seq)
            }
            Some(_) => Invocation::Error,
            None if malformed => Invocation::Error,
            None => Invocation::Done,
        }
    }

    /// `late_commit`: the source takes the invocation as timed out without
    /// waiting and will deliver the batch again, while the invocation runs
    /// on, started up to two polls late, so that it may finish after its
    /// retry started, or after it ended.
    fn abandon(&self, shard: &str, nth: u64, run: BoxFuture<'static, anyhow::Result<Value>>) {
        count(&self.stats.late_commits, 1);
        tracing::warn!(
            shard,
            "views invocation taken as timed out; it runs on (late_commit)"
        );
        let delay = POLL.mul_f64(2.0 * self.dice.fraction());
        let (started, shard) = (self.started.clone(), shard.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = run.await;
            let later = started
                .lock()
                .map(|s| s.get(&shard).copied().unwrap_or(0) > nth)
                .unwrap_or(false);
            tracing::debug!(shard, overlapped = later, "late views invocation ended");
        });
    }

    /// `records` are handed over for good: Lambda's checkpoint moves past
    /// them.
    fn mark_done(&self, shard: &str, records: &[KinesisRecord]) {
        self.stats
            .outstanding
            .fetch_sub(records.len() as u64, Ordering::SeqCst);
        let Some(last) = records.last() else {
            return;
        };
        if let Ok(mut done) = self.stats.done.lock() {
            done.insert(shard.to_owned(), last.sequence.clone());
        }
    }

    /// `records` without those older than `MaximumRecordAgeInSeconds`
    /// (by their arrival in the stream), which Lambda sends to the
    /// `OnFailure` destination instead of to the function.
    fn drop_aged(&self, shard: &str, records: Vec<KinesisRecord>) -> Vec<KinesisRecord> {
        let Some(age) = self.def.max_record_age else {
            return records;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let oldest = now.saturating_sub(age).as_secs_f64();
        let (aged, young): (Vec<KinesisRecord>, Vec<KinesisRecord>) =
            records.into_iter().partition(|r| r.arrival < oldest);
        if !aged.is_empty() {
            self.discard_because(shard, &aged, "older than MaximumRecordAgeInSeconds");
        }
        young
    }

    fn discard(&self, shard: &str, records: &[KinesisRecord]) {
        self.discard_because(shard, records, "retries exhausted");
    }

    fn discard_because(&self, shard: &str, records: &[KinesisRecord], why: &str) {
        count(&self.stats.discarded, records.len() as u64);
        tracing::error!(
            shard,
            records = records.len(),
            first = records.first().map(|r| r.sequence.as_str()),
            last = records.last().map(|r| r.sequence.as_str()),
            why,
            "views records sent to the OnFailure destination"
        );
        self.mark_done(shard, records);
    }
}
