//! What the bill takes from `template.yaml` rather than from a constant:
//! each function's `MemorySize` (its own, or `Globals.Function`'s), the
//! application log level the functions log at by default
//! (`LoggingConfig.ApplicationLogLevel`, a parameter's default), whether
//! Lambda traces them (`Tracing: Active`), the HTTP API's access log
//! format, and the views stream's default capacity mode.

use anyhow::{Context, Result, anyhow};
use std::collections::BTreeMap;
use std::path::Path;
use yaml_serde::Value;

/// The template's facts the bill needs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Facts {
    /// MB of memory per function, by the last part of its `CodeUri`
    /// (`like`, `read`, `view`, `aggregate`, `aggregate-views`, ...).
    pub memory_mb: BTreeMap<String, f64>,
    /// The level the functions log at unless told otherwise (`INFO`).
    pub log_level: String,
    /// `Tracing: Active` on the functions (X-Ray).
    pub tracing: bool,
    /// The HTTP API's access log line (`AccessLogSettings.Format`), if
    /// it writes one.
    pub access_log_format: Option<String>,
    /// `ViewsStreamMode`'s default (`ON_DEMAND` or `PROVISIONED`).
    pub views_stream_mode: String,
}

impl Facts {
    pub(crate) fn load(path: &Path) -> Result<Facts> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Facts::parse(&text)
    }

    pub(crate) fn parse(text: &str) -> Result<Facts> {
        let doc: Value = yaml_serde::from_str(text).context("template.yaml is not valid YAML")?;
        let params = doc.get("Parameters");
        // A plain value, or a `!Ref` to a parameter: its default.
        let resolve = |v: &Value| -> Option<Value> {
            match v {
                Value::Tagged(t) if t.tag == "!Ref" => {
                    let name = t.value.as_str()?;
                    params?.get(name)?.get("Default").cloned()
                }
                Value::Tagged(_) => None,
                other => Some(other.clone()),
            }
        };
        let number = |v: &Value| resolve(v).and_then(|v| v.as_f64());
        let string = |v: &Value| {
            resolve(v).and_then(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            })
        };
        let globals = doc.get("Globals").and_then(|g| g.get("Function"));
        let global_memory = globals
            .and_then(|g| g.get("MemorySize"))
            .and_then(number)
            // Lambda's own default.
            .unwrap_or(128.0);
        let resources = doc
            .get("Resources")
            .and_then(Value::as_mapping)
            .ok_or_else(|| anyhow!("template has no Resources"))?;
        let mut memory_mb = BTreeMap::new();
        let mut access_log_format = None;
        for (_, res) in resources {
            let props = res.get("Properties");
            match res.get("Type").and_then(Value::as_str) {
                Some("AWS::Serverless::Function") => {
                    let Some(name) = props
                        .and_then(|p| p.get("CodeUri"))
                        .and_then(Value::as_str)
                        .and_then(|c| c.trim_end_matches('/').rsplit('/').next())
                    else {
                        continue;
                    };
                    let mb = props
                        .and_then(|p| p.get("MemorySize"))
                        .and_then(number)
                        .unwrap_or(global_memory);
                    memory_mb.insert(name.to_owned(), mb);
                }
                Some("AWS::Serverless::HttpApi") => {
                    access_log_format = props
                        .and_then(|p| p.get("AccessLogSettings"))
                        .and_then(|a| a.get("Format"))
                        .and_then(string);
                }
                _ => {}
            }
        }
        let log_level = globals
            .and_then(|g| g.get("LoggingConfig"))
            .and_then(|l| l.get("ApplicationLogLevel"))
            .and_then(string)
            // Lambda's default for JSON logs.
            .unwrap_or_else(|| "INFO".to_owned());
        let tracing = globals
            .and_then(|g| g.get("Tracing"))
            .and_then(string)
            .is_some_and(|t| t == "Active");
        let views_stream_mode = params
            .and_then(|p| p.get("ViewsStreamMode"))
            .and_then(|m| m.get("Default"))
            .and_then(Value::as_str)
            .unwrap_or("ON_DEMAND")
            .to_owned();
        Ok(Facts {
            memory_mb,
            log_level,
            tracing,
            access_log_format,
            views_stream_mode,
        })
    }

    /// GB of memory of `function` (MB ÷ 1,024, as Lambda bills GB-s).
    pub(crate) fn memory_gb(&self, function: &str) -> Result<f64> {
        self.memory_mb
            .get(function)
            .map(|mb| mb / 1024.0)
            .ok_or_else(|| anyhow!("template.yaml has no function with CodeUri .../{function}"))
    }

    /// Bytes of one access log line: the format with each
    /// `$context.…` variable replaced by a value of the length API Gateway
    /// gives it on a like (an estimate: the log is API Gateway's, not the
    /// stack's), and its newline. 0 without an access log.
    pub(crate) fn access_log_bytes(&self) -> u64 {
        let Some(format) = &self.access_log_format else {
            return 0;
        };
        let mut out = String::new();
        let mut rest = format.as_str();
        while let Some(at) = rest.find("$context.") {
            out.push_str(&rest[..at]);
            let var = &rest[at + "$context.".len()..];
            let end = var
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                .unwrap_or(var.len());
            out.push_str(typical(&var[..end]));
            rest = &var[end..];
        }
        out.push_str(rest);
        // YAML's folded `>-` joins the lines with spaces; API Gateway keeps
        // them, and writes the line with its newline.
        out.len() as u64 + 1
    }
}

/// A value of the length API Gateway writes for `var` on a user's like.
fn typical(var: &str) -> &'static str {
    match var {
        "requestId" => "JKJaXmPLvHcESHA=",
        "requestTimeEpoch" => "1700000000000",
        "identity.sourceIp" => "203.0.113.42",
        "httpMethod" => "PUT",
        "routeKey" => "PUT /reels/{reel_id}/like",
        "status" | "integrationStatus" => "200",
        "responseLatency" => "12",
        "authorizer.claims.sub" => "8c3f1e2a-4b5d-4e6f-9a7b-1c2d3e4f5a6b",
        // The admin routes' fields, empty on a user's request.
        _ => "",
    }
}
