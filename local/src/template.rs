//! Reads `template.yaml`: the one source of truth for the tables, the routes
//! and which function serves each route.

use anyhow::{Context, Result, anyhow, bail};
use std::collections::BTreeMap;
use std::path::Path;
use yaml_serde::Value;

/// A DynamoDB table as the template defines it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDef {
    pub logical_id: String,
    /// (attribute name, "HASH" | "RANGE")
    pub key_schema: Vec<(String, String)>,
    /// (attribute name, "S" | "N" | "B")
    pub attributes: Vec<(String, String)>,
    /// The TTL attribute, when `TimeToLiveSpecification` enables one.
    pub ttl_attribute: Option<String>,
    pub indexes: Vec<IndexDef>,
    /// `StreamSpecification.StreamViewType`, when the table has a stream.
    pub stream_view_type: Option<String>,
}

/// A global secondary index of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexDef {
    pub name: String,
    pub key_schema: Vec<(String, String)>,
    /// `KEYS_ONLY`, `INCLUDE` or `ALL`.
    pub projection: String,
}

/// One `Schedule` / `ScheduleV2` event of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleDef {
    pub function: String,
    pub code_uri: String,
    /// The `Schedule` / `ScheduleExpression` value as written (it may be a
    /// `!Ref` to a parameter, shown as `!Ref Name`).
    pub expression: String,
    /// The event's `Input` (the JSON the function receives), if any.
    pub input: Option<String>,
}

/// One `DynamoDB` (stream) event of a function: what Lambda's event source
/// mapping does, which the local stack's event source imitates.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamSourceDef {
    pub function: String,
    pub code_uri: String,
    /// The table whose stream it reads (`Stream: !GetAtt <Table>.StreamArn`).
    pub table: String,
    pub batch_size: u32,
    /// `MaximumBatchingWindowInSeconds`.
    pub batching_window_secs: u32,
    /// `MaximumRetryAttempts` (-1: until the records expire).
    pub max_retries: i64,
    /// `MaximumRecordAgeInSeconds` (-1: until the records expire): older
    /// records go to `OnFailure` instead of to the function.
    pub max_record_age_secs: i64,
    /// `BisectBatchOnFunctionError`.
    pub bisect: bool,
    /// `FunctionResponseTypes` holds `ReportBatchItemFailures`.
    pub report_failures: bool,
    /// `TumblingWindowInSeconds` (0: none; the event then names no shard).
    pub tumbling_window_secs: u32,
    /// `StartingPosition`: `TRIM_HORIZON` or `LATEST`.
    pub starting_position: String,
    /// The function's `Timeout` (seconds), when it sets one.
    pub timeout_secs: Option<u32>,
}

/// One `HttpApi` event of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDef {
    /// `ANY`, `GET`, ... (upper case).
    pub method: String,
    /// `/reels/{reel_id}/like`, or `$default`.
    pub path: String,
    /// The function's logical id.
    pub function: String,
    /// The function's `CodeUri`, e.g. `functions/like`.
    pub code_uri: String,
}

#[derive(Clone, Debug)]
pub struct Template {
    pub tables: Vec<TableDef>,
    pub routes: Vec<RouteDef>,
    pub schedules: Vec<ScheduleDef>,
    pub stream_sources: Vec<StreamSourceDef>,
    /// Environment variable → table logical id, from `!Ref <Table>` values in
    /// `Globals.Function.Environment` and each function's `Environment`.
    pub table_env: BTreeMap<String, String>,
}

impl Template {
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self> {
        let doc: Value = yaml_serde::from_str(text).context("template.yaml is not valid YAML")?;
        let resources = doc
            .get("Resources")
            .and_then(Value::as_mapping)
            .ok_or_else(|| anyhow!("template has no Resources"))?;
        let mut tables = Vec::new();
        let mut routes = Vec::new();
        let mut schedules = Vec::new();
        let mut stream_sources = Vec::new();
        let mut table_env = BTreeMap::new();
        let mut env_blocks: Vec<&Value> = Vec::new();
        if let Some(v) = doc
            .get("Globals")
            .and_then(|g| g.get("Function"))
            .and_then(|f| f.get("Environment"))
        {
            env_blocks.push(v);
        }
        for (id, res) in resources {
            let id = id
                .as_str()
                .ok_or_else(|| anyhow!("non-string resource id"))?
                .to_owned();
            let ty = res.get("Type").and_then(Value::as_str).unwrap_or_default();
            let props = res.get("Properties");
            match ty {
                "AWS::DynamoDB::Table" => {
                    let props = props.ok_or_else(|| anyhow!("{id}: no Properties"))?;
                    tables.push(TableDef {
                        logical_id: id.clone(),
                        key_schema: pairs(props.get("KeySchema"), "AttributeName", "KeyType")
                            .with_context(|| format!("{id}.KeySchema"))?,
                        attributes: pairs(
                            props.get("AttributeDefinitions"),
                            "AttributeName",
                            "AttributeType",
                        )
                        .with_context(|| format!("{id}.AttributeDefinitions"))?,
                        ttl_attribute: props
                            .get("TimeToLiveSpecification")
                            .filter(|t| t.get("Enabled").and_then(Value::as_bool) == Some(true))
                            .and_then(|t| t.get("AttributeName"))
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        indexes: indexes(props.get("GlobalSecondaryIndexes"))
                            .with_context(|| format!("{id}.GlobalSecondaryIndexes"))?,
                        stream_view_type: props
                            .get("StreamSpecification")
                            .and_then(|s| s.get("StreamViewType"))
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    });
                }
                "AWS::Serverless::Function" => {
                    let props = props.ok_or_else(|| anyhow!("{id}: no Properties"))?;
                    let code_uri = props
                        .get("CodeUri")
                        .and_then(Value::as_str)
                        .ok_or_else(|| anyhow!("{id}: CodeUri must be a plain string"))?
                        .trim_end_matches('/')
                        .to_owned();
                    if let Some(env) = props.get("Environment") {
                        env_blocks.push(env);
                    }
                    let events = props.get("Events").and_then(Value::as_mapping);
                    for (_, ev) in events.into_iter().flatten() {
                        let p = ev.get("Properties");
                        match ev.get("Type").and_then(Value::as_str) {
                            Some("HttpApi") => {}
                            Some("DynamoDB") => {
                                let p = p.ok_or_else(|| {
                                    anyhow!("{id}: a DynamoDB event without Properties")
                                })?;
                                let mut s =
                                    stream_source(&id, &code_uri, p, doc.get("Parameters"))?;
                                s.timeout_secs = props
                                    .get("Timeout")
                                    .and_then(Value::as_u64)
                                    .map(|t| t.min(900) as u32);
                                stream_sources.push(s);
                                continue;
                            }
                            Some("Schedule" | "ScheduleV2") => {
                                let expr = p
                                    .and_then(|p| p.get("Schedule").or(p.get("ScheduleExpression")))
                                    .map(describe)
                                    .unwrap_or_default();
                                schedules.push(ScheduleDef {
                                    function: id.clone(),
                                    code_uri: code_uri.clone(),
                                    expression: expr,
                                    input: p
                                        .and_then(|p| p.get("Input"))
                                        .and_then(Value::as_str)
                                        .map(str::to_owned),
                                });
                                continue;
                            }
                            _ => continue,
                        }
                        let path = p
                            .and_then(|p| p.get("Path"))
                            .and_then(Value::as_str)
                            .unwrap_or("$default");
                        let method = p
                            .and_then(|p| p.get("Method"))
                            .and_then(Value::as_str)
                            .unwrap_or("ANY");
                        routes.push(RouteDef {
                            method: method.to_ascii_uppercase(),
                            path: path.to_owned(),
                            function: id.clone(),
                            code_uri: code_uri.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        for env in env_blocks {
            let vars = env.get("Variables").and_then(Value::as_mapping);
            for (k, v) in vars.into_iter().flatten() {
                if let (Some(k), Value::Tagged(t)) = (k.as_str(), v)
                    && t.tag == "!Ref"
                    && let Some(target) = t.value.as_str()
                    && tables.iter().any(|t| t.logical_id == target)
                {
                    table_env.insert(k.to_owned(), target.to_owned());
                }
            }
        }
        if tables.is_empty() {
            bail!("template defines no AWS::DynamoDB::Table");
        }
        Ok(Template {
            tables,
            routes,
            schedules,
            stream_sources,
            table_env,
        })
    }

    /// The table a function reads from environment variable `var`.
    pub fn table_for_env(&self, var: &str) -> Option<&TableDef> {
        let id = self.table_env.get(var)?;
        self.tables.iter().find(|t| &t.logical_id == id)
    }
}

/// A scalar as written, or `!Tag value` for a short-form intrinsic.
fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Tagged(t) => format!("{} {}", t.tag, describe(&t.value)),
        other => yaml_serde::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

fn indexes(v: Option<&Value>) -> Result<Vec<IndexDef>> {
    let Some(list) = v else {
        return Ok(Vec::new());
    };
    let list = list
        .as_sequence()
        .ok_or_else(|| anyhow!("expected a list"))?;
    list.iter()
        .map(|g| {
            Ok(IndexDef {
                name: g
                    .get("IndexName")
                    .and_then(Value::as_str)
                    .ok_or_else(|| anyhow!("an index without a plain IndexName"))?
                    .to_owned(),
                key_schema: pairs(g.get("KeySchema"), "AttributeName", "KeyType")?,
                projection: g
                    .get("Projection")
                    .and_then(|p| p.get("ProjectionType"))
                    .and_then(Value::as_str)
                    .unwrap_or("ALL")
                    .to_owned(),
            })
        })
        .collect()
}

fn pairs(v: Option<&Value>, a: &str, b: &str) -> Result<Vec<(String, String)>> {
    let list = v
        .and_then(Value::as_sequence)
        .ok_or_else(|| anyhow!("expected a list"))?;
    list.iter()
        .map(|e| {
            let x = e
                .get(a)
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("missing {a}"))?;
            let y = e
                .get(b)
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("missing {b}"))?;
            Ok((x.to_owned(), y.to_owned()))
        })
        .collect()
}

/// Does `pattern` (`/reels/{reel_id}/like`) match the raw `path`? Returns the
/// path parameters, percent-decoded as API Gateway passes them.
pub fn match_path(pattern: &str, path: &str) -> Option<Vec<(String, String)>> {
    let pat: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
    let segs: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    if pat.len() != segs.len() {
        return None;
    }
    let mut params = Vec::new();
    for (p, s) in pat.iter().zip(&segs) {
        if let Some(name) = p.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            if s.is_empty() {
                return None;
            }
            let decoded = percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned();
            params.push((name.to_owned(), decoded));
        } else if p != s {
            return None;
        }
    }
    Some(params)
}

/// A function's `DynamoDB` event, with Lambda's defaults for what it leaves
/// out. The stream must be `!GetAtt <Table>.StreamArn`.
fn stream_source(
    function: &str,
    code_uri: &str,
    p: &Value,
    parameters: Option<&Value>,
) -> Result<StreamSourceDef> {
    let table = match p.get("Stream") {
        Some(Value::Tagged(t)) if t.tag == "!GetAtt" => t
            .value
            .as_str()
            .and_then(|s| s.strip_suffix(".StreamArn"))
            .map(str::to_owned),
        _ => None,
    }
    .ok_or_else(|| anyhow!("{function}: Stream must be !GetAtt <Table>.StreamArn"))?;
    // A number, or a `!Ref` to a parameter: its default, as deployed
    // without overrides.
    let int = |name: &str, default: i64| match p.get(name) {
        Some(Value::Tagged(t)) if t.tag == "!Ref" => t
            .value
            .as_str()
            .and_then(|param| parameters?.get(param)?.get("Default")?.as_i64())
            .unwrap_or(default),
        other => other.and_then(Value::as_i64).unwrap_or(default),
    };
    one_batch_per_shard(function, p, parameters)?;
    Ok(StreamSourceDef {
        function: function.to_owned(),
        code_uri: code_uri.to_owned(),
        table,
        batch_size: int("BatchSize", 100).clamp(1, 10_000) as u32,
        batching_window_secs: int("MaximumBatchingWindowInSeconds", 0).clamp(0, 300) as u32,
        max_retries: int("MaximumRetryAttempts", -1),
        max_record_age_secs: int("MaximumRecordAgeInSeconds", -1),
        bisect: p
            .get("BisectBatchOnFunctionError")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        report_failures: p
            .get("FunctionResponseTypes")
            .and_then(Value::as_sequence)
            .is_some_and(|s| {
                s.iter()
                    .any(|v| v.as_str() == Some("ReportBatchItemFailures"))
            }),
        tumbling_window_secs: int("TumblingWindowInSeconds", 0).clamp(0, 900) as u32,
        starting_position: p
            .get("StartingPosition")
            .and_then(Value::as_str)
            .unwrap_or("LATEST")
            .to_owned(),
        timeout_secs: None,
    })
}

/// Refuses an event source whose `ParallelizationFactor` (a number, or a
/// `!Ref` to a parameter, taken at its default) is not 1, or cannot be
/// told; left out, it is Lambda's default, 1. The aggregators' checkpoint of
/// a stream shard is a high-water mark: with two batches of one shard at
/// once, the one applied second would skip its records below the other's
/// last. The local event sources hand over one batch per shard at a time,
/// so they would hide that loss; they refuse such a template instead.
/// Shared by the DynamoDB stream source and the Kinesis one
/// (`crate::kinesis::def`).
pub fn one_batch_per_shard(function: &str, p: &Value, parameters: Option<&Value>) -> Result<()> {
    let factor = match p.get("ParallelizationFactor") {
        None => return Ok(()),
        Some(Value::Tagged(t)) if t.tag == "!Ref" => t
            .value
            .as_str()
            .and_then(|param| parameters?.get(param)?.get("Default"))
            .and_then(|d| d.as_i64().or_else(|| d.as_str()?.trim().parse().ok())),
        Some(other) => other.as_i64(),
    };
    match factor {
        Some(1) => Ok(()),
        other => bail!(
            "{function}: ParallelizationFactor {}: only 1 is supported. The aggregators' \
             checkpoint of a stream shard is a high-water mark (the highest sequence number \
             applied): with two batches of one shard at once, the one applied second would \
             skip its records below the other's last",
            other.map_or_else(|| describe(&p["ParallelizationFactor"]), |n| n.to_string())
        ),
    }
}

/// One `SQS` event of a function, with its queue's settings: what
/// Lambda's SQS event source mapping does, which the local views stack
/// imitates for the OnFailure queue (`crate::kinesis::repairs`).
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSourceDef {
    /// The queue's logical id (`Queue: !GetAtt <Queue>.Arn`).
    pub queue: String,
    /// `BatchSize` (Lambda's default for SQS: 10).
    pub batch_size: u32,
    /// `ScalingConfig.MaximumConcurrency` (left out: 2 here, SQS's
    /// minimum, rather than Lambda's unbounded scaling).
    pub max_concurrency: u32,
    /// `FunctionResponseTypes` holds `ReportBatchItemFailures`.
    pub report_failures: bool,
    /// The queue's `VisibilityTimeout` (SQS's default: 30 s).
    pub visibility: std::time::Duration,
    /// Its `RedrivePolicy.maxReceiveCount`, if it has a dead-letter queue.
    pub max_receives: Option<u32>,
}

/// The `SQS` event of `function` in `doc` (a whole template), if it has
/// one whose queue is a resource of the template.
pub fn queue_source(doc: &Value, function: &str) -> Option<QueueSourceDef> {
    let resources = doc.get("Resources")?;
    let events = resources
        .get(function)?
        .get("Properties")?
        .get("Events")?
        .as_mapping()?;
    let p = events
        .values()
        .find(|e| e.get("Type").and_then(Value::as_str) == Some("SQS"))?
        .get("Properties")?;
    let queue = match p.get("Queue")? {
        Value::Tagged(t) if t.tag == "!GetAtt" => t.value.as_str()?.strip_suffix(".Arn")?,
        _ => return None,
    };
    let q = resources.get(queue)?.get("Properties");
    let num = |v: Option<&Value>| v.and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()));
    Some(QueueSourceDef {
        queue: queue.to_owned(),
        batch_size: num(p.get("BatchSize")).map_or(10, |n| n.clamp(1, 10_000) as u32),
        max_concurrency: num(p
            .get("ScalingConfig")
            .and_then(|c| c.get("MaximumConcurrency")))
        .map_or(2, |n| n.clamp(2, 1000) as u32),
        report_failures: p
            .get("FunctionResponseTypes")
            .and_then(Value::as_sequence)
            .is_some_and(|t| {
                t.iter()
                    .any(|v| v.as_str() == Some("ReportBatchItemFailures"))
            }),
        visibility: std::time::Duration::from_secs(
            num(q.and_then(|q| q.get("VisibilityTimeout"))).map_or(30, |n| n.min(43_200)),
        ),
        max_receives: num(q
            .and_then(|q| q.get("RedrivePolicy"))
            .and_then(|r| r.get("maxReceiveCount")))
        .map(|n| n.clamp(1, 1000) as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template whose one stream event says `factor` (a YAML value), with
    /// a parameter `Factor` defaulting to `param`.
    fn with_factor(factor: &str, param: &str) -> String {
        format!(
            "Parameters:\n  Factor:\n    Type: Number\n    Default: {param}\n\
             Resources:\n  T:\n    Type: AWS::DynamoDB::Table\n    Properties:\n\
             \x20     KeySchema: [{{AttributeName: pk, KeyType: HASH}}]\n\
             \x20     AttributeDefinitions: [{{AttributeName: pk, AttributeType: S}}]\n\
             \x20     StreamSpecification: {{StreamViewType: NEW_IMAGE}}\n\
             \x20 F:\n    Type: AWS::Serverless::Function\n    Properties:\n\
             \x20     CodeUri: functions/f\n      Events:\n        S:\n\
             \x20         Type: DynamoDB\n          Properties:\n\
             \x20           Stream: !GetAtt T.StreamArn\n\
             \x20           ParallelizationFactor: {factor}\n"
        )
    }

    /// Issue 35: the local stream source reads one batch per shard at a
    /// time whatever the template says, so a factor above 1 would have run
    /// here without the loss it causes in Lambda. Before, the factor was
    /// not read at all: `with_factor("2", ..)` loaded.
    #[test]
    fn a_stream_source_of_more_than_one_batch_per_shard_is_refused() {
        for (factor, param) in [("1", "1"), ("!Ref Factor", "1"), ("!Ref Factor", "\"1\"")] {
            let t = Template::parse(&with_factor(factor, param));
            assert!(t.is_ok(), "{factor} ({param}): {t:?}");
        }
        for (factor, param) in [
            ("2", "1"),
            ("10", "1"),
            ("!Ref Factor", "2"),
            ("!Ref Missing", "1"),
            ("!GetAtt X.Y", "1"),
        ] {
            let err = Template::parse(&with_factor(factor, param)).unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains("F: ParallelizationFactor") && err.contains("high-water mark"),
                "{factor} ({param}): {err}"
            );
        }
        // Left out: Lambda's default, 1.
        let t = with_factor("1", "1").replace("            ParallelizationFactor: 1\n", "");
        assert!(Template::parse(&t).is_ok());
        // The project's template says 1 (through its parameter).
        let ours = Template::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../template.yaml"
        )));
        assert!(ours.is_ok_and(|t| !t.stream_sources.is_empty()));
    }

    /// The views aggregator's repairs: its SQS event on the OnFailure
    /// queue, with the queue's settings, as `crate::kinesis` imitates it.
    #[test]
    fn the_repairs_queue_source_is_read() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml"))
                .unwrap();
        let doc: Value = yaml_serde::from_str(&text).unwrap();
        let q = queue_source(&doc, "ViewAggregateFunction").unwrap();
        assert_eq!(q.queue, "ViewsOnFailureQueue");
        assert_eq!((q.batch_size, q.max_concurrency), (1, 2));
        assert!(q.report_failures);
        assert_eq!(q.visibility, std::time::Duration::from_secs(360));
        assert_eq!(q.max_receives, Some(240));
        assert_eq!(queue_source(&doc, "AggregateFunction"), None);
    }

    #[test]
    fn paths_match_like_api_gateway() {
        assert_eq!(
            match_path("/reels/{reel_id}/like", "/reels/a%23b/like"),
            Some(vec![("reel_id".into(), "a#b".into())])
        );
        assert_eq!(match_path("/reels/{reel_id}/like", "/reels//like"), None);
        assert_eq!(match_path("/likes", "/likes"), Some(vec![]));
        assert_eq!(match_path("/likes", "/likes/"), None);
    }
}
