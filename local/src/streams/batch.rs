//! One shard's batch handed to the function, for both local event sources
//! (the DynamoDB stream's and the Kinesis stream's): Lambda's answers
//! (done, `batchItemFailures`, error or timeout) with its retry, bisection
//! and `OnFailure` rules, and the source's faults drawn on the way (see
//! `faults`).
//!
//! One loop for both, because Lambda's rules are the same for both kinds
//! of stream: a rule fixed here is fixed for both sources, where two
//! copies drifted apart. What does differ comes in through two traits:
//! `StreamRecord` (how a record names its sequence number and its age)
//! and `Source` (the event, the function, the counters, and the DynamoDB
//! source's tumbling windows); the appended records of `reorder` come
//! with the `Shard`.

use super::faults::{Dice, SourceFaults, duplicate_at, out_of_order};
use futures::future::BoxFuture;
use serde_json::Value;
use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{self, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A stream record, as far as Lambda's rules look at it.
pub(crate) trait StreamRecord: Clone + Send + Sync + 'static {
    /// Its sequence number: how the stream, the checkpoint and
    /// `batchItemFailures` name it.
    fn sequence(&self) -> Option<&str>;
    /// How two of the stream's sequence numbers compare, as numbers (a
    /// reordered batch's positions say nothing); `None` if either is no
    /// sequence number.
    fn compare(a: &str, b: &str) -> Option<Ordering>;
    /// Whether it entered the stream before `oldest` (since the epoch):
    /// what `MaximumRecordAgeInSeconds` goes by.
    fn older_than(&self, oldest: Duration) -> bool;
}

/// The counters of `Counters`: the ones every source keeps, and the few
/// only one has.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    Invocations,
    Delivered,
    Retries,
    Bisections,
    Partial,
    Redelivered,
    Lost,
    Reordered,
    Appended,
    Duplicated,
    FinalWindows,
    LateCommits,
    LateOverlaps,
    Discarded,
    /// Records read and not yet handed over for good: counted down here.
    Outstanding,
}

/// A source's statistics, which stay its own public struct (tests and
/// benches read their fields by name).
pub(crate) trait Counters: Send + Sync + 'static {
    /// `counter`, if the source keeps it.
    fn counter(&self, counter: Counter) -> Option<&AtomicU64>;
    /// Lambda's checkpoint of `shard` moved to `sequence`.
    fn checkpoint(&self, shard: &str, sequence: &str);
    /// The invocation record Lambda sent to the OnFailure destination, for
    /// a source that keeps them.
    fn on_failure(&self, _record: Value) {}
}

/// The event source mapping's settings the loop follows.
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    /// `MaximumRetryAttempts`; negative: retry until the records expire.
    pub(crate) max_retries: i64,
    /// `BisectBatchOnFunctionError`.
    pub(crate) bisect: bool,
    /// `FunctionResponseTypes: [ReportBatchItemFailures]`.
    pub(crate) report_failures: bool,
    /// `MaximumRecordAgeInSeconds`; `None`: records never expire.
    pub(crate) max_record_age: Option<Duration>,
    /// The function's `Timeout`, per invocation.
    pub(crate) timeout: Duration,
    /// How long the source waits before it sends a failed batch again:
    /// its next poll of the shard.
    pub(crate) poll: Duration,
}

/// What one kind of stream brings to the loop.
pub(crate) trait Source: Send + Sync + 'static {
    type Record: StreamRecord;
    type Stats: Counters;
    /// The function, as the log names it.
    const FUNCTION: &'static str;
    /// The event that hands `records` of `shard` to the function.
    fn event(&self, shard: &str, records: &[Self::Record]) -> Value;
    /// Runs the function on `event`, to finish by `deadline`; its answer,
    /// or the function error.
    fn call(&self, event: Value, deadline: Instant) -> BoxFuture<'static, Result<Value, String>>;
    /// Why Lambda takes `answer` as a failed invocation although the
    /// function returned it, if it does.
    fn refuses(&self, _answer: &Value) -> Option<&'static str> {
        None
    }
    /// Whether the source has tumbling windows (and so final invocations).
    fn windowed(&self) -> bool {
        false
    }
    /// The event of the final invocation of `shard`'s tumbling window (no
    /// records); asked only of a windowed source.
    fn final_window(&self, _shard: &str) -> Option<Value> {
        None
    }
    /// The OnFailure invocation record of `records` (in shard order) of
    /// `shard`, given up for `condition` (`RetryAttemptsExhausted`,
    /// `RecordAgeExceeded`), for a source that writes one.
    fn invocation_record(
        &self,
        _shard: &str,
        _records: &[Self::Record],
        _condition: &str,
    ) -> Option<Value> {
        None
    }
}

/// The shard a batch belongs to.
pub(crate) struct Shard<'a, R> {
    pub(crate) id: &'a str,
    /// Up to n records that follow everything handed over from the shard,
    /// for `reorder` to append; `None`: the source appends none (and the
    /// dice are not asked whether to).
    pub(crate) upcoming: Option<&'a (dyn Fn(usize) -> Vec<R> + Send + Sync)>,
}

/// The function end of one event source, shared by its shards.
pub(crate) struct Delivery<S: Source> {
    pub(crate) source: S,
    pub(crate) rules: Rules,
    pub(crate) faults: SourceFaults,
    pub(crate) dice: Dice,
    pub(crate) stats: Arc<S::Stats>,
    /// Invocations started per shard id, to tell whether a late commit's
    /// invocation outlived the start of its retry.
    started: Arc<Mutex<HashMap<String, u64>>>,
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

fn count<C: Counters + ?Sized>(stats: &C, counter: Counter, n: u64) {
    if let Some(c) = stats.counter(counter) {
        c.fetch_add(n, atomic::Ordering::Relaxed);
    }
}

type Queue<R> = VecDeque<(Vec<R>, i64)>;

/// The `condition` of an OnFailure invocation record: the retries ran out.
const RETRY_ATTEMPTS_EXHAUSTED: &str = "RetryAttemptsExhausted";
/// The `condition` of an OnFailure invocation record: records too old.
const RECORD_AGE_EXCEEDED: &str = "RecordAgeExceeded";

impl<S: Source> Delivery<S> {
    /// The delivery of `source`, its faults drawn from `faults.seed`.
    pub(crate) fn new(source: S, rules: Rules, faults: SourceFaults, stats: Arc<S::Stats>) -> Self {
        Delivery {
            source,
            rules,
            dice: Dice::new(faults.seed),
            faults,
            stats,
            started: Arc::default(),
        }
    }

    fn count(&self, counter: Counter, n: u64) {
        count(&*self.stats, counter, n);
    }

    /// Hands `batch` (in stream order) to the function until every record
    /// is done or discarded, with Lambda's retry, failure-report and
    /// bisection rules.
    pub(crate) async fn deliver(&self, shard: &Shard<'_, S::Record>, batch: Vec<S::Record>) {
        let mut queue: Queue<S::Record> = VecDeque::from([(batch, 0)]);
        while let Some((records, retries)) = queue.pop_front() {
            let records = self.drop_aged(shard.id, records);
            if records.is_empty() {
                continue;
            }
            if self.dice.chance(self.faults.expire) {
                self.discard(shard.id, &records, RECORD_AGE_EXCEEDED);
                continue;
            }
            let handed = self.perturb(shard, &records, retries > 0, &queue);
            let (rest, error) = match self.invoke(shard.id, &handed).await {
                Invocation::Done => {
                    self.mark_done(shard.id, &records);
                    if self.dice.chance(self.faults.redeliver) {
                        self.count(Counter::Redelivered, 1);
                        // The answer is not looked at: a second delivery
                        // must change nothing.
                        let again = self.perturb(shard, &records, true, &queue);
                        let _ = self.invoke(shard.id, &again).await;
                    }
                    if self.source.windowed() && self.dice.chance(self.faults.final_window) {
                        self.final_invoke(shard.id).await;
                    }
                    continue;
                }
                Invocation::FailedFrom(seq) => {
                    // Lambda goes on from the failed record's sequence
                    // number: by number, as a reordered batch's positions
                    // say nothing.
                    let (done, rest): (Vec<S::Record>, Vec<S::Record>) =
                        records.into_iter().partition(|r| {
                            r.sequence().is_some_and(|s| {
                                S::Record::compare(s, &seq) == Some(Ordering::Less)
                            })
                        });
                    if !done.is_empty() {
                        self.count(Counter::Partial, 1);
                    }
                    self.mark_done(shard.id, &done);
                    (rest, false)
                }
                Invocation::Error => (records, true),
            };
            if rest.is_empty() {
                continue;
            }
            if self.rules.max_retries >= 0 && retries >= self.rules.max_retries {
                self.discard(shard.id, &rest, RETRY_ATTEMPTS_EXHAUSTED);
                continue;
            }
            self.count(Counter::Retries, 1);
            // Lambda sends a failed batch again at its next poll of the
            // shard, not at once.
            tokio::time::sleep(self.rules.poll).await;
            if error && self.rules.bisect && rest.len() > 1 {
                self.count(Counter::Bisections, 1);
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
    /// fault strikes. `again`: not the first time ("Records are always
    /// processed in order the first time"), so `reorder` may hand them out
    /// of order, followed (half the time, where the shard offers them) by
    /// records that follow them in the shard and were never handed over
    /// (from `pending`, the rest of this batch, then the shard's
    /// `upcoming`); `duplicate` repeats one record.
    fn perturb(
        &self,
        shard: &Shard<'_, S::Record>,
        records: &[S::Record],
        again: bool,
        pending: &Queue<S::Record>,
    ) -> Vec<S::Record> {
        let mut handed = records.to_vec();
        if again && records.len() > 1 && self.dice.chance(self.faults.reorder) {
            self.count(Counter::Reordered, 1);
            handed = out_of_order(records.len(), &self.dice)
                .into_iter()
                .filter_map(|i| records.get(i).cloned())
                .collect();
            if let Some(upcoming) = shard.upcoming
                && self.dice.chance(0.5)
            {
                let want = 1 + self.dice.below(records.len());
                let mut more: Vec<S::Record> = pending
                    .iter()
                    .flat_map(|(piece, _)| piece.iter().cloned())
                    .take(want)
                    .collect();
                if more.len() < want {
                    more.extend(upcoming(want - more.len()));
                }
                self.count(Counter::Appended, more.len() as u64);
                handed.extend(more);
            }
        }
        if !handed.is_empty() && self.dice.chance(self.faults.duplicate) {
            self.count(Counter::Duplicated, 1);
            let (from, to) = duplicate_at(handed.len(), &self.dice);
            if let Some(copy) = handed.get(from).cloned() {
                handed.insert(to, copy);
            }
        }
        handed
    }

    /// Counts an invocation of `shard`; returns how many it has had.
    fn start(&self, shard: &str) -> u64 {
        self.count(Counter::Invocations, 1);
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        let n = started.entry(shard.to_owned()).or_default();
        *n += 1;
        *n
    }

    async fn invoke(&self, shard: &str, handed: &[S::Record]) -> Invocation {
        let nth = self.start(shard);
        self.count(Counter::Delivered, handed.len() as u64);
        let event = self.source.event(shard, handed);
        let run = self.source.call(event, Instant::now() + self.rules.timeout);
        if self.dice.chance(self.faults.late_commit) {
            self.abandon(shard, nth, run);
            return Invocation::Error;
        }
        let function = S::FUNCTION;
        let answer = match tokio::time::timeout(self.rules.timeout, run).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                tracing::warn!(shard, error = %e, "{function} invocation failed");
                return Invocation::Error;
            }
            Err(_) => {
                // Lambda stops a function at its timeout: the invocation
                // is dropped here, none of it runs on.
                tracing::warn!(shard, "{function} invocation timed out");
                return Invocation::Error;
            }
        };
        if self.dice.chance(self.faults.lost) {
            self.count(Counter::Lost, 1);
            return Invocation::Error;
        }
        if let Some(why) = self.source.refuses(&answer) {
            tracing::warn!(shard, why, "{function} answer taken as a failed invocation");
            return Invocation::Error;
        }
        if !self.rules.report_failures {
            return Invocation::Done;
        }
        failures(&answer, handed)
    }

    /// `late_commit`: the source takes the invocation as timed out without
    /// waiting and will deliver the batch again, while the invocation runs
    /// on, started up to two polls late (its writes still on their way),
    /// so that it may commit after its retry started, or after it ended.
    fn abandon(&self, shard: &str, nth: u64, run: BoxFuture<'static, Result<Value, String>>) {
        self.count(Counter::LateCommits, 1);
        let function = S::FUNCTION;
        tracing::warn!(
            shard,
            "{function} invocation taken as timed out; it runs on (late_commit)"
        );
        let delay = self.rules.poll.mul_f64(2.0 * self.dice.fraction());
        let (stats, started, shard) = (self.stats.clone(), self.started.clone(), shard.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = run.await;
            let later = started
                .lock()
                .map(|s| s.get(&shard).copied().unwrap_or(0) > nth)
                .unwrap_or(false);
            if later {
                count(&*stats, Counter::LateOverlaps, 1);
            }
            tracing::debug!(
                shard,
                overlapped = later,
                "late {function} invocation ended"
            );
        });
    }

    /// `final_window`: the window's final invocation, with no records;
    /// Lambda holds the shard until it succeeds ("If the invocation fails,
    /// your Lambda function suspends further processing until a successful
    /// invocation", tumbling windows), here until the retries run out.
    async fn final_invoke(&self, shard: &str) {
        self.count(Counter::FinalWindows, 1);
        let mut retries = 0i64;
        loop {
            let Some(event) = self.source.final_window(shard) else {
                return;
            };
            self.start(shard);
            let run = self.source.call(event, Instant::now() + self.rules.timeout);
            let ok = matches!(
                tokio::time::timeout(self.rules.timeout, run).await,
                Ok(Ok(answer)) if self.source.refuses(&answer).is_none()
            );
            if ok {
                return;
            }
            if self.rules.max_retries >= 0 && retries >= self.rules.max_retries {
                tracing::error!(
                    shard,
                    "the window's final invocation kept failing; going on"
                );
                return;
            }
            retries += 1;
            self.count(Counter::Retries, 1);
            tokio::time::sleep(self.rules.poll).await;
        }
    }

    /// `records` are handed over for good: Lambda's checkpoint moves past
    /// them.
    fn mark_done(&self, shard: &str, records: &[S::Record]) {
        if let Some(c) = self.stats.counter(Counter::Outstanding) {
            c.fetch_sub(records.len() as u64, atomic::Ordering::SeqCst);
        }
        if let Some(seq) = records.last().and_then(StreamRecord::sequence) {
            self.stats.checkpoint(shard, seq);
        }
    }

    /// `records` without those older than `MaximumRecordAgeInSeconds` (by
    /// their arrival in the stream), which Lambda sends to the `OnFailure`
    /// destination instead of to the function (reconciliation relies on
    /// that bound: see `likes::reconcile`).
    fn drop_aged(&self, shard: &str, records: Vec<S::Record>) -> Vec<S::Record> {
        let Some(age) = self.rules.max_record_age else {
            return records;
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let oldest = now.saturating_sub(age);
        let (aged, young): (Vec<S::Record>, Vec<S::Record>) =
            records.into_iter().partition(|r| r.older_than(oldest));
        if !aged.is_empty() {
            self.discard(shard, &aged, RECORD_AGE_EXCEEDED);
        }
        young
    }

    /// `records` go to the `OnFailure` destination (here: the log, the
    /// `discarded` counter and, where the source writes one, the
    /// invocation record), and the shard moves on past them; `why` is the
    /// record's `condition`.
    fn discard(&self, shard: &str, records: &[S::Record], why: &str) {
        self.count(Counter::Discarded, records.len() as u64);
        if let Some(record) = self.source.invocation_record(shard, records, why) {
            self.stats.on_failure(record);
        }
        let function = S::FUNCTION;
        tracing::error!(
            shard,
            records = records.len(),
            first = records.first().and_then(StreamRecord::sequence),
            last = records.last().and_then(StreamRecord::sequence),
            why,
            "{function} records sent to the OnFailure destination"
        );
        self.mark_done(shard, records);
    }
}

/// The answer's `batchItemFailures`, as Lambda reads them: the lowest
/// failed sequence number is where the batch goes on from; no failures:
/// done. Any entry that does not name a record of the batch (a null,
/// empty or missing `itemIdentifier`, a wrong key name, a sequence number
/// the batch does not hold, compared as the text it was handed over as)
/// fails the batch whole, whatever the other entries say ("Lambda treats a
/// batch as a complete failure if your function returns ... a null
/// itemIdentifier ... an itemIdentifier value with a sequence number that
/// doesn't exist").
fn failures<R: StreamRecord>(answer: &Value, handed: &[R]) -> Invocation {
    let mut lowest: Option<&str> = None;
    for entry in answer["batchItemFailures"].as_array().into_iter().flatten() {
        let named = entry["itemIdentifier"]
            .as_str()
            .filter(|id| handed.iter().any(|r| r.sequence() == Some(*id)));
        let Some(id) = named else {
            return Invocation::Error;
        };
        if lowest.is_none_or(|l| R::compare(id, l) == Some(Ordering::Less)) {
            lowest = Some(id);
        }
    }
    lowest.map_or(Invocation::Done, |id| Invocation::FailedFrom(id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A record that is only its sequence number (compared as an integer).
    #[derive(Clone)]
    struct Seq(&'static str);

    impl StreamRecord for Seq {
        fn sequence(&self) -> Option<&str> {
            Some(self.0)
        }
        fn compare(a: &str, b: &str) -> Option<Ordering> {
            Some(a.parse::<u64>().ok()?.cmp(&b.parse::<u64>().ok()?))
        }
        fn older_than(&self, _: Duration) -> bool {
            false
        }
    }

    fn read(answer: Value) -> Option<String> {
        let batch = [Seq("9"), Seq("10"), Seq("11")];
        match failures(&answer, &batch) {
            Invocation::Done => Some("done".into()),
            Invocation::FailedFrom(seq) => Some(seq),
            Invocation::Error => None,
        }
    }

    #[test]
    fn batch_item_failures_read_as_lambda_reads_them() {
        let fail = |ids: Value| json!({ "batchItemFailures": ids });
        assert_eq!(read(json!({})).as_deref(), Some("done"));
        assert_eq!(read(fail(json!([]))).as_deref(), Some("done"));
        // The lowest by number, not by text.
        let two = fail(json!([{ "itemIdentifier": "11" }, { "itemIdentifier": "9" }]));
        assert_eq!(read(two).as_deref(), Some("9"));
        // No record of the batch, or no sequence number at all: whole.
        assert_eq!(read(fail(json!([{ "itemIdentifier": "12" }]))), None);
        assert_eq!(read(fail(json!([{ "itemIdentifier": null }]))), None);
        assert_eq!(read(fail(json!([{ "id": "9" }]))), None);
        // One bad entry fails the batch whole, whatever the others say.
        // Before: dropped, and the batch went on from "10".
        let mixed = |bad: Value| fail(json!([{ "itemIdentifier": "10" }, bad]));
        assert_eq!(read(mixed(json!({ "itemIdentifier": null }))), None);
        assert_eq!(read(mixed(json!({ "itemIdentifier": "" }))), None);
        assert_eq!(read(mixed(json!({ "itemIdentifier": "12" }))), None);
        assert_eq!(read(mixed(json!({ "id": "9" }))), None);
        // A sequence number is the text handed over, not a number like it.
        assert_eq!(read(fail(json!([{ "itemIdentifier": "010" }]))), None);
    }
}
