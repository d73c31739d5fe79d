//! CloudWatch metrics through the ecosystem's facade: the code counts with
//! the [`metrics`] crate's macros, and `metrics_cloudwatch_embedded` (the
//! recorder installed once per process) writes them out in the Embedded
//! Metric Format (EMF): JSON lines on standard output, which CloudWatch Logs
//! turns into metrics. No agent, no API call, no extra permission, nothing
//! on the request's critical path but an atomic add.
//!
//! # One flush per unit of work
//!
//! The recorder sums what it is given until it is flushed, and each unit of
//! work flushes at its end: a request ([`crate::http::handle`]), a resize
//! run, a reconciliation invocation. On Lambda an instance serves one
//! invocation at a time, so each flush is that invocation's record, as the
//! exporter's own Lambda layer would write it; flushing here instead of in
//! that layer runs the same code in the local stack and the tests, where
//! one process serves every route and a flush may hold several requests.
//!
//! # Bounded dimensions
//!
//! Every metric carries one label, `Function` (`like`, `read`, `reshard`,
//! `reconcile`, `aggregate`, `view`, `aggregate-views`), and the write-path counter a second from a fixed set
//! ([`crate::service::WritePath`]); each distinct label set is its own EMF
//! document. Never a reel or user id: those go to the logs. The names, with
//! their units, are [`NAMES`]: the ones the template's alarms and dashboard
//! read.

use metrics_cloudwatch_embedded::Collector;
use std::sync::{Mutex, OnceLock};

pub use metrics::Unit;

/// Every metric the code writes, with its CloudWatch unit: described to the
/// recorder once when it is installed, so each EMF document names the unit.
pub const NAMES: &[(&str, Unit)] = &[
    // Every request.
    ("Requests", Unit::Count),
    ("Latency", Unit::Milliseconds),
    ("ServerErrors", Unit::Count),
    ("ClientErrors", Unit::Count),
    // Likes and unlikes.
    ("LikesApplied", Unit::Count),
    ("UnlikesApplied", Unit::Count),
    ("DuplicatesAbsorbed", Unit::Count),
    ("ConflictsRetried", Unit::Count),
    ("ThrottlesRetried", Unit::Count),
    ("ConflictsGivenUp", Unit::Count),
    ("ThrottlesGivenUp", Unit::Count),
    // Writes by path, labelled `WritePath` (see `WritePath::as_str`).
    ("Writes", Unit::Count),
    // Count reads.
    ("CacheHits", Unit::Count),
    ("CacheMisses", Unit::Count),
    ("ShardsRead", Unit::Count),
    ("WarmHits", Unit::Count),
    ("NeverCounted", Unit::Count),
    // The cache warmer's run.
    ("WarmRounds", Unit::Count),
    ("WarmLists", Unit::Count),
    ("WarmFigures", Unit::Count),
    ("WarmErrors", Unit::Count),
    ("WarmReels", Unit::Count),
    // The known reels' fold, in the warm run.
    ("KnownFolded", Unit::Count),
    ("KnownIncomplete", Unit::Count),
    ("KnownFoldErrors", Unit::Count),
    // The scheduled resize run.
    ("ReshardRuns", Unit::Count),
    ("ShardedReels", Unit::Count),
    ("ResizeSteps", Unit::Count),
    ("ResizesCompleted", Unit::Count),
    ("GrowsStarted", Unit::Count),
    ("ShrinksStarted", Unit::Count),
    ("Folds", Unit::Count),
    ("ResizeErrors", Unit::Count),
    ("OldestResizePhaseAge", Unit::Seconds),
    // A completed reconciliation run.
    ("ReconcileRuns", Unit::Count),
    ("ReconcileRowsScanned", Unit::Count),
    ("ReconcileReelsChecked", Unit::Count),
    ("ReconcileReelsCorrected", Unit::Count),
    ("ReconcileReelsDeferred", Unit::Count),
    ("ReconcileAbsDrift", Unit::Count),
    ("ReconcileRunDuration", Unit::Seconds),
    ("ReconcileRunAge", Unit::Seconds),
    // The stream aggregator (stream mode), per batch.
    ("AggregateBatches", Unit::Count),
    ("AggregatedRecords", Unit::Count),
    ("AggregateSkippedRecords", Unit::Count),
    ("AggregateChunks", Unit::Count),
    ("AggregateRetries", Unit::Count),
    ("AggregateBatchesHandedBack", Unit::Count),
    ("AggregateBatchesOutOfOrder", Unit::Count),
    ("AggregateErrors", Unit::Count),
    ("AggregationLag", Unit::Milliseconds),
    // The view function, per `POST /views`.
    ("ViewsAccepted", Unit::Count),
    ("ViewPutRetries", Unit::Count),
    // The views aggregator, per batch.
    ("ViewBatches", Unit::Count),
    ("ViewsApplied", Unit::Count),
    ("ViewRecordsApplied", Unit::Count),
    ("ViewRecordsSkipped", Unit::Count),
    ("ViewRecordsMalformed", Unit::Count),
    ("ViewsOverViewerBound", Unit::Count),
    ("ViewRecordsNewerFormat", Unit::Count),
    ("ViewReadThrottlesRetried", Unit::Count),
    ("ViewReadThrottlesGivenUp", Unit::Count),
    ("ViewChunks", Unit::Count),
    ("ViewRetries", Unit::Count),
    ("ViewBatchesHandedBack", Unit::Count),
    ("ViewBatchesOutOfOrder", Unit::Count),
    ("ViewRepairParts", Unit::Count),
    ("ViewRepairsIncomplete", Unit::Count),
    ("ViewRepairsCompleted", Unit::Count),
    ("ViewRepairsTooEarly", Unit::Count),
    ("ViewRepairMessagesDropped", Unit::Count),
    ("ViewErrors", Unit::Count),
    ("ViewAggregationLag", Unit::Milliseconds),
    // The views aggregator's compaction of sealed writers' items.
    ("ViewFolds", Unit::Count),
    ("ViewItemsFolded", Unit::Count),
    ("ViewFoldsSkipped", Unit::Count),
];

/// Where flushed records go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    /// Standard output (Lambda ships it to CloudWatch Logs).
    Stdout,
    /// Kept in memory, for [`Metrics::lines`] (tests).
    Memory,
    /// Nothing is recorded (`METRICS=off`, the local stack's default): no
    /// recorder is installed, so every metric macro is a no-op.
    Off,
}

/// The process's recorder, installed by the first [`Metrics::install`]
/// that asks for one.
static COLLECTOR: OnceLock<Option<&'static Collector>> = OnceLock::new();
/// The records flushed to [`Sink::Memory`].
static MEMORY: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The metrics configuration: a namespace and a sink.
#[derive(Clone, Debug)]
pub struct Metrics {
    namespace: String,
    sink: Sink,
}

impl Metrics {
    /// `METRICS_NAMESPACE` (default `Likes`); `METRICS` = `emf` (the default
    /// on Lambda, where `AWS_LAMBDA_FUNCTION_NAME` is set), `off` (the
    /// default elsewhere) or `memory` (kept for [`Metrics::lines`]: tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let on_lambda = get("AWS_LAMBDA_FUNCTION_NAME").is_some();
        let sink = match get("METRICS").as_deref().map(str::trim) {
            Some("emf") => Sink::Stdout,
            Some("off") => Sink::Off,
            Some("memory") => Sink::Memory,
            _ if on_lambda => Sink::Stdout,
            _ => Sink::Off,
        };
        Metrics {
            namespace: get("METRICS_NAMESPACE")
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| "Likes".into()),
            sink,
        }
    }

    /// Where this configuration's records go.
    pub fn sink(&self) -> Sink {
        self.sink
    }

    /// Installs the process's recorder unless the sink is [`Sink::Off`]
    /// (once per process: the first namespace installed stays), and
    /// describes every metric of [`NAMES`] to it. Called once per cold
    /// start, by [`crate::App::new`].
    pub fn install(&self) {
        if self.sink == Sink::Off {
            return;
        }
        let collector = COLLECTOR.get_or_init(|| {
            match metrics_cloudwatch_embedded::Builder::new()
                .cloudwatch_namespace(self.namespace.clone())
                .init()
            {
                Ok(c) => Some(c),
                Err(e) => {
                    // Another recorder was set first (an embedding
                    // application's own): metrics go there instead.
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    None
                }
            }
        });
        if collector.is_some() {
            for (name, unit) in NAMES {
                match unit {
                    Unit::Milliseconds | Unit::Seconds => {
                        metrics::describe_histogram!(*name, *unit, "")
                    }
                    _ => metrics::describe_counter!(*name, *unit, ""),
                }
            }
        }
    }

    /// Writes out everything recorded since the last flush, one EMF line
    /// per label set, with `request_id` as a property when given. Errors
    /// writing are ignored: metrics never fail a request.
    pub fn flush(&self, request_id: Option<&str>) {
        let Some(Some(collector)) = COLLECTOR.get() else {
            return;
        };
        match request_id {
            Some(id) => collector.set_property("request_id", id),
            None => collector.remove_property("request_id"),
        };
        match self.sink {
            Sink::Off => {}
            Sink::Stdout => {
                let _ = collector.flush(std::io::stdout().lock());
            }
            Sink::Memory => {
                let mut buf = Vec::new();
                let _ = collector.flush(&mut buf);
                if let Ok(mut lines) = MEMORY.lock() {
                    lines.extend(String::from_utf8_lossy(&buf).lines().map(str::to_owned));
                }
            }
        }
    }

    /// The records flushed to memory so far in this process, oldest first
    /// (empty unless the sink is [`Sink::Memory`]).
    pub fn lines(&self) -> Vec<String> {
        if self.sink != Sink::Memory {
            return Vec::new();
        }
        MEMORY.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The metrics of one unit of work of `function`.
    pub fn record(&self, function: &'static str) -> Record {
        Record { function }
    }
}

/// Metrics of one unit of work, all labelled with its function.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    function: &'static str,
}

impl Record {
    /// The metrics of `function`, for code deep in a unit of work that
    /// counts what only it sees (a read retried, a record skipped): the
    /// unit's entry point flushes them with its own, at its end.
    pub fn of(function: &'static str) -> Record {
        Record { function }
    }

    /// Adds `value` to the counter `name` (one of [`NAMES`]). Zero adds
    /// nothing, and a counter with nothing added since the last flush is
    /// left out of it (CloudWatch reads a missing value as no data).
    pub fn count(&self, name: &'static str, value: u64) -> &Self {
        if value > 0 {
            metrics::counter!(name, "Function" => self.function).increment(value);
        }
        self
    }

    /// Adds `value` to the counter `name` under a second label from a fixed
    /// set (`label` = `value`), e.g. the write path.
    pub fn count_by(
        &self,
        name: &'static str,
        label: &'static str,
        label_value: &'static str,
        value: u64,
    ) -> &Self {
        if value > 0 {
            metrics::counter!(name, "Function" => self.function, label => label_value)
                .increment(value);
        }
        self
    }

    /// Records one sample of `name` (a latency, an age: its unit is the
    /// one [`NAMES`] gives). Every sample since the last flush is written.
    pub fn sample(&self, name: &'static str, value: f64) -> &Self {
        metrics::histogram!(name, "Function" => self.function).record(value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn records_follow_the_emf_specification() {
        let m = Metrics::from_lookup(|k| (k == "METRICS").then(|| "memory".into()));
        m.install();
        let r = m.record("like");
        r.count("LikesApplied", 1)
            .count("ConflictsRetried", 0)
            .sample("Latency", 12.5)
            .count_by("Writes", "WritePath", "applied", 1);
        m.flush(Some("abc"));
        m.flush(None); // nothing new: nothing written
        let lines = m.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        let docs: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let plain = docs.iter().find(|d| d.get("WritePath").is_none()).unwrap();
        let cw = &plain["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(cw["Namespace"], "Likes");
        assert_eq!(cw["Dimensions"], json!([["Function"]]));
        let defs = cw["Metrics"].as_array().unwrap();
        assert!(defs.contains(&json!({"Name": "Latency", "Unit": "Milliseconds"})));
        assert!(defs.contains(&json!({"Name": "LikesApplied", "Unit": "Count"})));
        // A zero is not written.
        assert!(!defs.iter().any(|d| d["Name"] == "ConflictsRetried"));
        assert!(plain["_aws"]["Timestamp"].as_u64().unwrap() > 0);
        assert_eq!(plain["Function"], "like");
        assert_eq!(plain["LikesApplied"], 1);
        assert_eq!(plain["Latency"], json!([12.5]));
        assert_eq!(plain["request_id"], "abc");
        let by_path = docs.iter().find(|d| d.get("WritePath").is_some()).unwrap();
        assert_eq!(
            by_path["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Function", "WritePath"]])
        );
        assert_eq!(
            (by_path["WritePath"].as_str(), by_path["Writes"].as_u64()),
            (Some("applied"), Some(1))
        );
    }

    #[test]
    fn on_by_default_only_on_lambda() {
        let off = Metrics::from_lookup(|_| None);
        assert_eq!(off.sink(), Sink::Off);
        let on = Metrics::from_lookup(|k| (k == "AWS_LAMBDA_FUNCTION_NAME").then(|| "f".into()));
        assert_eq!(on.sink(), Sink::Stdout);
        let forced = Metrics::from_lookup(|k| (k == "METRICS").then(|| "emf".into()));
        assert_eq!(forced.sink(), Sink::Stdout);
    }
}
