//! One virtual shard's batch handed to the function: Lambda's answers
//! (done, `batchItemFailures`, error or timeout) with its retry, bisection
//! and `OnFailure` rules, and the source's faults drawn on the way (see
//! `faults`). Apart from the lanes because it is what happens to one
//! batch, whichever shard it comes from.

use super::StreamSourceStats;
use super::event::{event, final_window, sequence};
use super::faults::{Dice, SourceFaults, duplicate_at, out_of_order};
use super::lanes::{Lane, POLL};
use crate::template::StreamSourceDef;
use aws_sdk_dynamodbstreams::types::Record;
use futures::future::BoxFuture;
use likes::aggregate::records::SequenceNumber;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The function an event source invokes: the event, the invocation's
/// deadline; its answer, or the error it failed with.
pub(super) type Handler =
    Arc<dyn Fn(Value, Option<Instant>) -> BoxFuture<'static, Result<Value, String>> + Send + Sync>;

/// The function end of one event source, shared by its lanes.
pub(super) struct Delivery {
    pub(super) handler: Handler,
    pub(super) def: StreamSourceDef,
    pub(super) stream_arn: String,
    /// The function's `Timeout`, per invocation.
    pub(super) timeout: Duration,
    pub(super) faults: SourceFaults,
    pub(super) dice: Dice,
    pub(super) stats: Arc<StreamSourceStats>,
    /// Invocations started per shard id, to tell whether a late commit's
    /// invocation outlived the start of its retry.
    pub(super) started: Arc<Mutex<HashMap<String, u64>>>,
}

/// The virtual shard a batch belongs to.
pub(super) struct Shard<'a> {
    pub(super) id: &'a str,
    pub(super) lane: &'a Lane,
    pub(super) generation: u64,
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

fn count(counter: &std::sync::atomic::AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Delivery {
    /// Hands `batch` (in stream order) to the function until every record
    /// is done or discarded, with Lambda's retry, failure-report and
    /// bisection rules.
    pub(super) async fn deliver(&self, shard: &Shard<'_>, batch: Vec<Record>) {
        let mut queue: VecDeque<(Vec<Record>, i64)> = VecDeque::from([(batch, 0)]);
        while let Some((records, retries)) = queue.pop_front() {
            let records = self.drop_aged(shard.id, records);
            if records.is_empty() {
                continue;
            }
            let handed = self.perturb(shard, &records, retries > 0, &queue);
            let (rest, error) = match self.invoke(shard.id, &handed).await {
                Invocation::Done => {
                    self.mark_done(shard.id, &records);
                    if self.dice.chance(self.faults.redeliver) {
                        count(&self.stats.redelivered, 1);
                        // The answer is not looked at: a second delivery
                        // must change nothing.
                        let again = self.perturb(shard, &records, true, &queue);
                        let _ = self.invoke(shard.id, &again).await;
                    }
                    if self.def.tumbling_window_secs > 0
                        && self.dice.chance(self.faults.final_window)
                    {
                        self.final_invoke(shard.id).await;
                    }
                    continue;
                }
                Invocation::FailedFrom(seq) => {
                    // Lambda goes on from the failed record's sequence
                    // number: by number, as a reordered batch's positions
                    // say nothing.
                    let failed = SequenceNumber::parse(&seq);
                    let (done, rest): (Vec<Record>, Vec<Record>) =
                        records.into_iter().partition(|r| {
                            let s = sequence(r).and_then(SequenceNumber::parse);
                            matches!((s, &failed), (Some(s), Some(f)) if s < *f)
                        });
                    if !done.is_empty() {
                        count(&self.stats.partial, 1);
                    }
                    self.mark_done(shard.id, &done);
                    (rest, false)
                }
                Invocation::Error => (records, true),
            };
            if rest.is_empty() {
                continue;
            }
            if self.def.max_retries >= 0 && retries >= self.def.max_retries {
                self.discard(shard.id, &rest);
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
    /// them out of order, followed (half the time) by records that follow
    /// them in the shard and were never handed over (from `pending`, the
    /// rest of this batch, then the lane); `duplicate` repeats one record.
    fn perturb(
        &self,
        shard: &Shard<'_>,
        records: &[Record],
        again: bool,
        pending: &VecDeque<(Vec<Record>, i64)>,
    ) -> Vec<Record> {
        let mut handed = records.to_vec();
        if again && records.len() > 1 && self.dice.chance(self.faults.reorder) {
            count(&self.stats.reordered, 1);
            handed = out_of_order(records.len(), &self.dice)
                .into_iter()
                .filter_map(|i| records.get(i).cloned())
                .collect();
            if self.dice.chance(0.5) {
                let want = 1 + self.dice.below(records.len());
                let mut more: Vec<Record> = pending
                    .iter()
                    .flat_map(|(piece, _)| piece.iter().cloned())
                    .take(want)
                    .collect();
                if more.len() < want {
                    more.extend(shard.lane.upcoming(shard.generation, want - more.len()));
                }
                count(&self.stats.appended, more.len() as u64);
                handed.extend(more);
            }
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

    async fn invoke(&self, shard: &str, handed: &[Record]) -> Invocation {
        let nth = self.start(shard);
        count(&self.stats.delivered, handed.len() as u64);
        let event = event(
            &self.stream_arn,
            self.def.tumbling_window_secs,
            shard,
            handed,
        );
        let deadline = Instant::now() + self.timeout;
        let run = (self.handler)(event, Some(deadline));
        if self.dice.chance(self.faults.late_commit) {
            self.abandon(shard, nth, run);
            return Invocation::Error;
        }
        let answer = match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                tracing::warn!(shard, error = e, "aggregate invocation failed");
                return Invocation::Error;
            }
            Err(_) => {
                // Lambda stops a function at its timeout: the invocation
                // is dropped here, none of it runs on.
                tracing::warn!(shard, "aggregate invocation timed out");
                return Invocation::Error;
            }
        };
        if self.dice.chance(self.faults.lost) {
            count(&self.stats.lost, 1);
            return Invocation::Error;
        }
        // "If the response does not contain a state property, Lambda
        // considers this a failed invocation" (tumbling windows:
        // https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-windows.html).
        if self.def.tumbling_window_secs > 0 && !answer["state"].is_object() {
            tracing::warn!(shard, "aggregate answer without state: a failed invocation");
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
            .filter_map(|s| SequenceNumber::parse(s).map(|n| (n, s)))
            .min_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, s)| s.to_owned());
        match failed {
            // An identifier that is no record of the batch fails it whole.
            Some(seq) if handed.iter().any(|r| sequence(r) == Some(seq.as_str())) => {
                Invocation::FailedFrom(seq)
            }
            Some(_) => Invocation::Error,
            None => Invocation::Done,
        }
    }

    /// `late_commit`: the source takes the invocation as timed out without
    /// waiting and will deliver the batch again, while the invocation runs
    /// on, started up to two polls late (its writes still on their way),
    /// so that it may commit after its retry started, or after it ended.
    fn abandon(&self, shard: &str, nth: u64, run: BoxFuture<'static, Result<Value, String>>) {
        count(&self.stats.late_commits, 1);
        tracing::warn!(
            shard,
            "aggregate invocation taken as timed out; it runs on (late_commit)"
        );
        let delay = POLL.mul_f64(2.0 * self.dice.fraction());
        let (stats, started, shard) = (self.stats.clone(), self.started.clone(), shard.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = run.await;
            let later = started
                .lock()
                .map(|s| s.get(&shard).copied().unwrap_or(0) > nth)
                .unwrap_or(false);
            if later {
                count(&stats.late_overlaps, 1);
            }
        });
    }

    /// `final_window`: the window's final invocation, with no records;
    /// Lambda holds the shard until it succeeds ("If the invocation fails,
    /// your Lambda function suspends further processing until a successful
    /// invocation", tumbling windows), here until the retries run out.
    async fn final_invoke(&self, shard: &str) {
        count(&self.stats.final_windows, 1);
        let mut retries = 0i64;
        loop {
            self.start(shard);
            let event = final_window(&self.stream_arn, self.def.tumbling_window_secs, shard);
            let run = (self.handler)(event, Some(Instant::now() + self.timeout));
            let ok = matches!(
                tokio::time::timeout(self.timeout, run).await,
                Ok(Ok(answer)) if answer["state"].is_object()
            );
            if ok {
                return;
            }
            if self.def.max_retries >= 0 && retries >= self.def.max_retries {
                tracing::error!(
                    shard,
                    "the window's final invocation kept failing; going on"
                );
                return;
            }
            retries += 1;
            count(&self.stats.retries, 1);
            tokio::time::sleep(POLL).await;
        }
    }

    /// `records` are handed over for good: Lambda's checkpoint moves past
    /// them.
    fn mark_done(&self, shard: &str, records: &[Record]) {
        self.stats
            .outstanding
            .fetch_sub(records.len() as u64, Ordering::SeqCst);
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

    /// `records` without those older than `MaximumRecordAgeInSeconds`,
    /// which Lambda sends to the `OnFailure` destination instead of to the
    /// function (reconciliation relies on that bound: see
    /// `likes::reconcile`).
    fn drop_aged(&self, shard: &str, records: Vec<Record>) -> Vec<Record> {
        let Ok(age) = u64::try_from(self.def.max_record_age_secs) else {
            return records;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let oldest = now.as_millis() as i64 - (age as i64) * 1000;
        let (aged, young): (Vec<Record>, Vec<Record>) = records.into_iter().partition(|r| {
            r.dynamodb()
                .and_then(|d| d.approximate_creation_date_time())
                .is_some_and(|t| t.to_millis().is_ok_and(|ms| ms < oldest))
        });
        if !aged.is_empty() {
            count(&self.stats.discarded, aged.len() as u64);
            tracing::error!(
                shard,
                records = aged.len(),
                first = aged.first().and_then(sequence),
                last = aged.last().and_then(sequence),
                "stream records sent to the OnFailure destination: older than MaximumRecordAgeInSeconds"
            );
            self.mark_done(shard, &aged);
        }
        young
    }

    fn discard(&self, shard: &str, records: &[Record]) {
        count(&self.stats.discarded, records.len() as u64);
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
