//! What `template.yaml` says about the views stream and the function that
//! reads it: the `AWS::Kinesis::Stream` resource `ViewsStream`, and the
//! `Kinesis` event of `ViewAggregateFunction`, with the local defaults for
//! what they leave out. Read here rather than in `crate::template` so that
//! a template without them (today's) still loads everywhere else.

use anyhow::{Context, Result, anyhow};
use std::path::Path;
use std::time::Duration;
use yaml_serde::Value;

/// The stream's logical id, and its local name when the template has none.
pub const STREAM_ID: &str = "ViewsStream";
/// The function whose `Kinesis` event the local event source imitates.
pub const FUNCTION_ID: &str = "ViewAggregateFunction";

/// The views stream and its event source mapping, as the template defines
/// them.
#[derive(Clone, Debug, PartialEq)]
pub struct KinesisSourceDef {
    /// The stream's name: its `Name` when that is a plain string, else its
    /// logical id (CloudFormation would make one up).
    pub stream: String,
    /// `StreamModeDetails.StreamMode` (`ON_DEMAND` or `PROVISIONED`).
    pub mode: String,
    /// `ShardCount` (provisioned streams only).
    pub shard_count: Option<u32>,
    /// `BatchSize`.
    pub batch_size: u32,
    /// `MaximumBatchingWindowInSeconds`.
    pub batching_window: Duration,
    /// `MaximumRetryAttempts` (-1: until the records expire).
    pub max_retries: i64,
    /// `MaximumRecordAgeInSeconds` (none, or -1: until the records
    /// expire): older records go to `OnFailure` instead of the function.
    pub max_record_age: Option<Duration>,
    /// `BisectBatchOnFunctionError`.
    pub bisect: bool,
    /// `FunctionResponseTypes` holds `ReportBatchItemFailures`.
    pub report_failures: bool,
    /// `StartingPosition`: `TRIM_HORIZON` or `LATEST`.
    pub from_oldest: bool,
    /// The function's `Timeout`, per invocation.
    pub timeout: Duration,
    /// The function's `SQS` event on the `OnFailure` destination's queue
    /// (the repairs of given-up ranges), if it has one.
    pub repairs: Option<crate::template::QueueSourceDef>,
}

impl Default for KinesisSourceDef {
    /// What the local stack uses for what the template does not say: the
    /// settings the views design asks for (1,000 records, 1 s), not
    /// Lambda's own defaults (100, 0 s), so that a template still without
    /// them behaves as the finished one will.
    fn default() -> Self {
        KinesisSourceDef {
            stream: STREAM_ID.to_owned(),
            mode: "ON_DEMAND".to_owned(),
            shard_count: None,
            batch_size: 1000,
            batching_window: Duration::from_secs(1),
            max_retries: -1,
            max_record_age: None,
            bisect: false,
            report_failures: true,
            from_oldest: true,
            timeout: Duration::from_secs(60),
            repairs: None,
        }
    }
}

impl KinesisSourceDef {
    /// From the template at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text)
    }

    /// From a template's text; the defaults for whatever it lacks.
    pub fn parse(text: &str) -> Result<Self> {
        let doc: Value = yaml_serde::from_str(text).context("template.yaml is not valid YAML")?;
        let mut def = KinesisSourceDef::default();
        let resources = doc.get("Resources");
        if let Some(stream) = resources.and_then(|r| r.get(STREAM_ID)) {
            let p = stream.get("Properties");
            if let Some(name) = p.and_then(|p| p.get("Name")).and_then(Value::as_str) {
                def.stream = name.to_owned();
            }
            if let Some(mode) = p
                .and_then(|p| p.get("StreamModeDetails"))
                .and_then(|m| m.get("StreamMode"))
                .and_then(Value::as_str)
            {
                def.mode = mode.to_owned();
            }
            def.shard_count = p
                .and_then(|p| p.get("ShardCount"))
                .and_then(Value::as_u64)
                .map(|n| n.clamp(1, 1000) as u32);
        }
        let Some(function) = resources.and_then(|r| r.get(FUNCTION_ID)) else {
            return Ok(def);
        };
        if let Some(t) = function
            .get("Properties")
            .and_then(|p| p.get("Timeout"))
            .and_then(Value::as_u64)
        {
            def.timeout = Duration::from_secs(t.clamp(1, 900));
        }
        let events = function
            .get("Properties")
            .and_then(|p| p.get("Events"))
            .and_then(Value::as_mapping);
        let Some(p) = events
            .into_iter()
            .flatten()
            .find(|(_, e)| e.get("Type").and_then(Value::as_str) == Some("Kinesis"))
            .and_then(|(_, e)| e.get("Properties"))
        else {
            return Ok(def);
        };
        let parameters = doc.get("Parameters");
        // A number, or a `!Ref` to a parameter: its default, as deployed
        // without overrides.
        let int = |name: &str| match p.get(name) {
            Some(Value::Tagged(t)) if t.tag == "!Ref" => t
                .value
                .as_str()
                .and_then(|param| parameters?.get(param)?.get("Default")?.as_i64()),
            other => other.and_then(Value::as_i64),
        };
        if let Some(n) = int("BatchSize") {
            def.batch_size = n.clamp(1, 10_000) as u32;
        }
        if let Some(n) = int("MaximumBatchingWindowInSeconds") {
            def.batching_window = Duration::from_secs(n.clamp(0, 300) as u64);
        }
        if let Some(n) = int("MaximumRetryAttempts") {
            def.max_retries = n;
        }
        if let Some(n) = int("MaximumRecordAgeInSeconds") {
            def.max_record_age = u64::try_from(n).ok().map(Duration::from_secs);
        }
        if let Some(b) = p.get("BisectBatchOnFunctionError").and_then(Value::as_bool) {
            def.bisect = b;
        }
        if let Some(types) = p.get("FunctionResponseTypes") {
            def.report_failures = types
                .as_sequence()
                .ok_or_else(|| anyhow!("{FUNCTION_ID}: FunctionResponseTypes is not a list"))?
                .iter()
                .any(|v| v.as_str() == Some("ReportBatchItemFailures"));
        }
        if let Some(pos) = p.get("StartingPosition").and_then(Value::as_str) {
            def.from_oldest = pos == "TRIM_HORIZON";
        }
        // The OnFailure queue as an event source of the same function:
        // only that queue's, as the given-up records go there.
        let destination = match p
            .get("DestinationConfig")
            .and_then(|d| d.get("OnFailure"))
            .and_then(|o| o.get("Destination"))
        {
            Some(Value::Tagged(t)) if t.tag == "!GetAtt" => t
                .value
                .as_str()
                .and_then(|v| v.strip_suffix(".Arn"))
                .map(str::to_owned),
            _ => None,
        };
        def.repairs = crate::template::queue_source(&doc, FUNCTION_ID)
            .filter(|q| destination.as_deref() == Some(q.queue.as_str()));
        // Refused, not imitated: the local source reads one batch per
        // shard at a time, which would hide the records Lambda's would
        // make the aggregator skip.
        crate::template::one_batch_per_shard(FUNCTION_ID, p, parameters)?;
        Ok(def)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_without_the_stream_gets_the_defaults() {
        let def = KinesisSourceDef::parse("Resources: {}").unwrap();
        assert_eq!(def, KinesisSourceDef::default());
        assert_eq!(def.stream, "ViewsStream");
        // The project's template, whichever state it is in, parses.
        let ours = KinesisSourceDef::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../template.yaml"
        )));
        assert!(ours.is_ok(), "{ours:?}");
        let repairs = ours
            .unwrap()
            .repairs
            .expect("the OnFailure queue's SQS event");
        assert_eq!(repairs.queue, "ViewsOnFailureQueue");
    }

    /// Issue 35: a views event source of more than one batch per shard is
    /// refused (the checkpoint is a high-water mark). Before, it was a
    /// warning, and the template loaded.
    #[test]
    fn more_than_one_batch_per_shard_is_refused() {
        let fixture = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/kinesis/testdata/views-template.yaml"
        ))
        .unwrap();
        let literal = "ParallelizationFactor: 1\n";
        assert!(fixture.contains(literal));
        for (factor, parameter) in [("2", ""), ("!Ref ViewsFactor", "3"), ("!Ref Nowhere", "1")] {
            let text = fixture
                .replace(literal, &format!("ParallelizationFactor: {factor}\n"))
                .replace(
                    "Parameters:\n",
                    &format!("Parameters:\n  ViewsFactor:\n    Type: Number\n    Default: {parameter:0>1}\n"),
                );
            let err = format!("{:#}", KinesisSourceDef::parse(&text).unwrap_err());
            assert!(
                err.contains("ViewAggregateFunction: ParallelizationFactor")
                    && err.contains("high-water mark"),
                "{factor}: {err}"
            );
        }
        // Through a parameter whose default is 1, as the project's template.
        let text = fixture
            .replace(literal, "ParallelizationFactor: !Ref ViewsFactor\n")
            .replace(
                "Parameters:\n",
                "Parameters:\n  ViewsFactor:\n    Type: Number\n    Default: 1\n",
            );
        assert!(KinesisSourceDef::parse(&text).is_ok());
    }

    #[test]
    fn the_stream_and_the_event_are_read() {
        let def = KinesisSourceDef::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/kinesis/testdata/views-template.yaml"
        )))
        .unwrap();
        assert_eq!(
            def,
            KinesisSourceDef {
                stream: "likes-views".into(),
                mode: "ON_DEMAND".into(),
                shard_count: None,
                batch_size: 500,
                batching_window: Duration::from_secs(2),
                max_retries: 3,
                max_record_age: Some(Duration::from_secs(3600)),
                bisect: true,
                report_failures: true,
                from_oldest: true,
                timeout: Duration::from_secs(30),
                repairs: None,
            }
        );
    }
}
