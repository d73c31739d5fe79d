//! CloudWatch metrics in the Embedded Metric Format (EMF), written by the
//! functions themselves: one JSON line on standard output per request or run,
//! which CloudWatch Logs turns into metrics. No agent, no API call, no extra
//! permission, nothing on the request's critical path but one buffered write.
//!
//! Dimensions are bounded by construction: the function name and, for some
//! metrics, a small fixed set of values (an outcome, a phase). Never a reel
//! or user id: those go to the logs.

use serde_json::{Map, Value, json};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// CloudWatch units used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A number of events (requests, retries, reels).
    Count,
    /// A duration in milliseconds (latencies).
    Milliseconds,
    /// A duration in seconds (ages, run lengths).
    Seconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Milliseconds => "Milliseconds",
            Unit::Seconds => "Seconds",
        }
    }
}

/// Where records go.
#[derive(Clone, Debug)]
pub enum Sink {
    /// Standard output (Lambda ships it to CloudWatch Logs).
    Stdout,
    /// Kept in memory (tests).
    Memory(Arc<Mutex<Vec<String>>>),
    /// Dropped (`METRICS=off`, the local stack's default).
    Off,
}

/// Where and under which namespace records are written.
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
            Some("memory") => Sink::Memory(Arc::default()),
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

    /// The same namespace, writing to `sink` instead (tests use
    /// [`Sink::Memory`]).
    pub fn with_sink(mut self, sink: Sink) -> Self {
        self.sink = sink;
        self
    }

    /// The records written so far, with a memory sink.
    pub fn lines(&self) -> Vec<String> {
        match &self.sink {
            Sink::Memory(l) => l.lock().map(|l| l.clone()).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// A record of `function`'s unit of work (a request, a run), written
    /// when [`Record::emit`] is called, and only if it holds a value.
    pub fn record(&self, function: &'static str) -> Record<'_> {
        Record {
            metrics: self,
            dimensions: vec![("Function".to_owned(), function.to_owned())],
            values: Vec::new(),
            properties: Map::new(),
        }
    }
}

/// One EMF record under construction.
pub struct Record<'a> {
    metrics: &'a Metrics,
    dimensions: Vec<(String, String)>,
    values: Vec<(&'static str, f64, Unit)>,
    properties: Map<String, Value>,
}

impl Record<'_> {
    /// Adds a dimension from a fixed set of values.
    pub fn dimension(mut self, name: &str, value: &'static str) -> Self {
        self.dimensions.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Adds a metric counted in [`Unit::Count`].
    pub fn count(&mut self, name: &'static str, value: u64) -> &mut Self {
        self.values.push((name, value as f64, Unit::Count));
        self
    }

    /// Adds a metric in the given unit.
    pub fn value(&mut self, name: &'static str, value: f64, unit: Unit) -> &mut Self {
        self.values.push((name, value, unit));
        self
    }

    /// A searchable property that is not a metric (e.g. the request id).
    pub fn property(&mut self, name: &str, value: impl Into<Value>) -> &mut Self {
        self.properties.insert(name.to_owned(), value.into());
        self
    }

    /// The EMF document.
    pub fn to_json(&self) -> Value {
        let mut doc = self.properties.clone();
        for (k, v) in &self.dimensions {
            doc.insert(k.clone(), Value::String(v.clone()));
        }
        let mut defs = Vec::new();
        for (name, value, unit) in &self.values {
            doc.insert((*name).to_owned(), json!(value));
            defs.push(json!({ "Name": name, "Unit": unit.as_str() }));
        }
        let dims: Vec<&str> = self.dimensions.iter().map(|(k, _)| k.as_str()).collect();
        doc.insert(
            "_aws".into(),
            json!({
                "Timestamp": crate::clock::now_ms(),
                "CloudWatchMetrics": [{
                    "Namespace": self.metrics.namespace,
                    "Dimensions": [dims],
                    "Metrics": defs,
                }],
            }),
        );
        Value::Object(doc)
    }

    /// Writes the record (one line). Errors writing are ignored: metrics
    /// never fail a request.
    pub fn emit(&self) {
        if self.values.is_empty() {
            return;
        }
        match &self.metrics.sink {
            Sink::Off => {}
            Sink::Stdout => {
                let mut line = self.to_json().to_string();
                line.push('\n');
                let _ = std::io::stdout().lock().write_all(line.as_bytes());
            }
            Sink::Memory(lines) => {
                if let Ok(mut l) = lines.lock() {
                    l.push(self.to_json().to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_follow_the_emf_specification() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let m = Metrics::from_lookup(|_| None).with_sink(Sink::Memory(lines.clone()));
        let mut r = m.record("like").dimension("Outcome", "applied");
        r.count("LikesApplied", 1)
            .value("Latency", 12.5, Unit::Milliseconds)
            .property("request_id", "abc");
        r.emit();
        m.record("like").emit(); // empty: nothing written
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 1);
        let doc: Value = serde_json::from_str(&lines[0]).unwrap();
        let cw = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(cw["Namespace"], "Likes");
        assert_eq!(cw["Dimensions"], json!([["Function", "Outcome"]]));
        assert_eq!(
            cw["Metrics"][1],
            json!({"Name": "Latency", "Unit": "Milliseconds"})
        );
        assert!(doc["_aws"]["Timestamp"].as_i64().unwrap() > 0);
        assert_eq!(
            (doc["Function"].as_str(), doc["Outcome"].as_str()),
            (Some("like"), Some("applied"))
        );
        assert_eq!(
            (doc["LikesApplied"].as_f64(), doc["request_id"].as_str()),
            (Some(1.0), Some("abc"))
        );
    }

    #[test]
    fn on_by_default_only_on_lambda() {
        let off = Metrics::from_lookup(|_| None);
        assert!(matches!(off.sink, Sink::Off));
        let on = Metrics::from_lookup(|k| (k == "AWS_LAMBDA_FUNCTION_NAME").then(|| "f".into()));
        assert!(matches!(on.sink, Sink::Stdout));
        let forced = Metrics::from_lookup(|k| (k == "METRICS").then(|| "emf".into()));
        assert!(matches!(forced.sink, Sink::Stdout));
    }
}
