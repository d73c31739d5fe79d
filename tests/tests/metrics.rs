//! The functions' CloudWatch Embedded Metric Format records, as the
//! `metrics` facade's EMF recorder writes them: every record a request, a
//! resize run or a reconciliation run flushes is valid EMF (one namespace,
//! dimension sets naming present keys, metric values that are numbers or
//! arrays of numbers with CloudWatch units), carries only bounded dimensions
//! (never a reel or user id), and has the names the template's alarms and
//! dashboard use, with the values the requests caused.

mod common;

use common::TestStack;
use serde_json::Value;
use std::collections::HashMap;

const UNITS: &[&str] = &["Count", "Milliseconds", "Seconds"];
const FUNCTIONS: &[&str] = &["like", "read", "reshard", "reconcile"];
const PATHS: &[&str] = &[
    "applied",
    "replayed",
    "committed",
    "already_in_state",
    "resolved_by_record",
    "resolved_by_row",
];

/// The `Writes` records by write path among `lines`.
fn by_path(lines: &[String]) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for l in lines {
        let doc: Value = serde_json::from_str(l).unwrap();
        if let Some(p) = doc["WritePath"].as_str() {
            *out.entry(p.to_owned()).or_default() += doc["Writes"].as_f64().unwrap();
        }
    }
    out
}

/// A metric's value in a record; a counter left out of it is zero.
fn get(values: &HashMap<String, f64>, name: &str) -> f64 {
    values.get(name).copied().unwrap_or(0.0)
}

/// Parses and checks one record; returns its function and metric values by
/// name (a histogram's samples summed), without the records of the
/// `Writes` counter by write path, which [`by_path`] reads.
fn check(line: &str) -> (String, HashMap<String, f64>) {
    let doc: Value = serde_json::from_str(line).expect("a record is one JSON object");
    let aws = &doc["_aws"];
    assert!(
        aws["Timestamp"]
            .as_i64()
            .is_some_and(|t| t > 1_600_000_000_000),
        "{line}"
    );
    let directives = aws["CloudWatchMetrics"]
        .as_array()
        .expect("CloudWatchMetrics");
    assert_eq!(directives.len(), 1, "{line}");
    let d = &directives[0];
    assert_eq!(d["Namespace"], "Likes");
    // Bounded dimensions: the function, and for the write-path counter the
    // path, from a fixed set.
    if doc.get("WritePath").is_some() {
        assert_eq!(
            d["Dimensions"],
            serde_json::json!([["Function", "WritePath"]]),
            "{line}"
        );
        assert!(
            PATHS.contains(&doc["WritePath"].as_str().unwrap()),
            "{line}"
        );
    } else {
        assert_eq!(d["Dimensions"], serde_json::json!([["Function"]]), "{line}");
    }
    let function = doc["Function"]
        .as_str()
        .expect("Function dimension")
        .to_owned();
    assert!(FUNCTIONS.contains(&function.as_str()), "{line}");
    let mut values = HashMap::new();
    for m in d["Metrics"].as_array().expect("Metrics") {
        let name = m["Name"].as_str().expect("Name");
        let unit = m["Unit"].as_str().expect("Unit");
        assert!(UNITS.contains(&unit), "{line}");
        let want = match name {
            "Latency" | "AggregationLag" | "ViewAggregationLag" => "Milliseconds",
            n if n.ends_with("Age") || n.ends_with("Duration") => "Seconds",
            _ => "Count",
        };
        assert_eq!(unit, want, "{name}");
        assert!(
            likes::metrics::NAMES.iter().any(|(n, _)| *n == name),
            "{name} is not in metrics::NAMES"
        );
        let v = match &doc[name] {
            Value::Array(samples) => samples.iter().map(|s| s.as_f64().unwrap()).sum(),
            other => other
                .as_f64()
                .unwrap_or_else(|| panic!("{name} has no numeric value: {line}")),
        };
        assert!(v >= 0.0, "{line}");
        values.insert(name.to_owned(), v);
    }
    assert!(!values.is_empty());
    (function, values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_is_valid_emf_with_the_names_the_alarms_use() {
    let t = TestStack::start(&[
        ("METRICS", "memory"),
        ("CACHE_TTL_MS", "60000"),
        ("LOCAL_SCHEDULE_SECS", "0"),
    ])
    .await;
    let metrics = t.stack.app.config.metrics.clone();
    // Records of the requests since line `from`, the write-path ones apart.
    let take = |from: usize| -> Vec<(String, HashMap<String, f64>)> {
        metrics.lines()[from..]
            .iter()
            .filter(|l| !l.contains("\"WritePath\""))
            .map(|l| check(l))
            .collect()
    };

    let r = t.like("fan-1", "hot").await;
    assert_eq!(r.status, 200);
    let r = t.like("fan-1", "hot").await; // a double tap
    assert_eq!(r.body["changed"], false);
    let recs = take(0);
    assert_eq!(recs.len(), 2, "one record per request");
    assert_eq!(recs[0].0, "like");
    assert_eq!(get(&recs[0].1, "LikesApplied"), 1.0);
    assert_eq!(get(&recs[0].1, "DuplicatesAbsorbed"), 0.0);
    assert_eq!(get(&recs[1].1, "LikesApplied"), 0.0);
    assert_eq!(get(&recs[1].1, "DuplicatesAbsorbed"), 1.0);
    for (name, want) in [
        ("Requests", 1.0),
        ("ServerErrors", 0.0),
        ("ClientErrors", 0.0),
    ] {
        assert_eq!(get(&recs[0].1, name), want, "{name}");
    }
    assert!(recs[0].1.contains_key("Latency"));
    // Nothing was retried: the retry counters are left out, not written 0.
    assert!(!recs[0].1.contains_key("ConflictsRetried"));
    // `Writes` by path, `applied` left out (it is `LikesApplied` +
    // `UnlikesApplied` less `replayed` and `committed`): an ordinary like
    // writes one EMF document, not two.
    let paths = by_path(&metrics.lines());
    assert_eq!(
        (paths.get("applied"), paths.get("already_in_state")),
        (None, Some(&1.0)),
        "{paths:?}"
    );

    // Reads: the first misses the cache (it was filled by the like's count,
    // so this one hits), a batch read of a new reel misses.
    let n = metrics.lines().len();
    t.http_count("hot").await;
    t.send("GET", "/likes?reel_ids=hot,cold", None, &[], None)
        .await;
    let recs = take(n);
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|(f, _)| f == "read"));
    assert_eq!(
        (get(&recs[0].1, "CacheHits"), get(&recs[0].1, "CacheMisses")),
        (1.0, 0.0)
    );
    assert_eq!(
        (get(&recs[1].1, "CacheHits"), get(&recs[1].1, "CacheMisses")),
        (1.0, 1.0)
    );
    assert_eq!(
        get(&recs[1].1, "ShardsRead"),
        1.0,
        "one shard of the missed reel"
    );

    // Errors are counted as such.
    let n = metrics.lines().len();
    t.send("GET", "/reels/bad%23id/likes", None, &[], None)
        .await;
    let recs = take(n);
    assert_eq!(
        (
            get(&recs[0].1, "ClientErrors"),
            get(&recs[0].1, "ServerErrors")
        ),
        (1.0, 0.0)
    );

    // A resize run and a reconciliation run each write one record.
    let n = metrics.lines().len();
    let event = serde_json::json!({"source": "aws.events", "detail-type": "Scheduled Event"});
    likes::triggers::handle_reshard_event(&t.stack.app, event, None)
        .await
        .unwrap();
    likes::triggers::handle_reconcile_event(
        &t.stack.app,
        &serde_json::json!({"mode": "start"}),
        None,
    )
    .await
    .unwrap();
    let recs = take(n);
    let reshard = recs
        .iter()
        .find(|(f, _)| f == "reshard")
        .expect("reshard record");
    assert_eq!(get(&reshard.1, "ReshardRuns"), 1.0);
    assert!(reshard.1.contains_key("OldestResizePhaseAge"));
    let reconcile = recs
        .iter()
        .find(|(f, _)| f == "reconcile")
        .expect("reconcile record");
    assert_eq!(get(&reconcile.1, "ReconcileRuns"), 1.0);
    assert_eq!(get(&reconcile.1, "ReconcileRowsScanned"), 1.0);
    assert_eq!(get(&reconcile.1, "ReconcileReelsCorrected"), 0.0);
    assert!(reconcile.1.contains_key("ReconcileRunDuration"));
    // The run finished: none in progress, age 0 (the alarm's metric, on
    // every invocation).
    assert_eq!(get(&reconcile.1, "ReconcileRunAge"), 0.0);

    // Every metric an alarm or the dashboard names is one the code writes:
    // one of metrics::NAMES (every record above was checked against it),
    // each of which is written by a literal in the handlers, the events or
    // the views (every file of shared/src/views/: the aggregator, its
    // throttled reads and repairs write their own).
    let views = common::repo_root().join("shared/src/views");
    let mut files: Vec<std::path::PathBuf> =
        ["shared/src/http/handlers.rs", "shared/src/triggers.rs"]
            .iter()
            .map(|p| common::repo_root().join(p))
            .collect();
    let mut view_files: Vec<std::path::PathBuf> = std::fs::read_dir(&views)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    view_files.sort();
    assert!(view_files.len() > 1, "{}", views.display());
    files.extend(view_files);
    let sources: String = files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let written: Vec<String> = likes::metrics::NAMES
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    for name in &written {
        assert!(
            sources.contains(&format!("\"{name}\"")),
            "{name} is in metrics::NAMES but never written"
        );
    }
    // ... and every name those files write is one of NAMES, so that the
    // recorder describes its unit. Before: the views metrics were written
    // without being listed (ViewAggregationLag, milliseconds, went out
    // with no unit).
    let mut recorded = Vec::new();
    for call in [".count(", ".sample("] {
        for (at, _) in sources.match_indices(call) {
            let rest = sources[at + call.len()..].trim_start();
            if let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                recorded.push(name.to_owned());
            }
        }
    }
    assert!(recorded.len() > 20, "{recorded:?}");
    for name in &recorded {
        assert!(
            written.contains(name),
            "{name} is written but not in metrics::NAMES"
        );
    }
    let template = std::fs::read_to_string(common::repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&template).unwrap();
    for (id, res) in doc["Resources"].as_mapping().unwrap() {
        if res["Type"] == "AWS::CloudWatch::Alarm" && res["Properties"]["Namespace"] == "Likes" {
            let name = res["Properties"]["MetricName"].as_str().unwrap();
            assert!(
                written.iter().any(|w| w == name),
                "{id:?} alarms on {name}, never written"
            );
        }
    }
    // The dashboard body is JSON once CloudFormation substitutes its
    // variables (in either mode); its graphs name metrics the code writes;
    // one alarm per annotation.
    for (stream, dash) in common::dashboard_bodies() {
        let mut graphed = 0;
        for w in dash["widgets"].as_array().unwrap() {
            let props = &w["properties"];
            if let Some(alarms) = props["annotations"]["alarms"].as_array() {
                assert!(alarms.len() <= 1, "one alarm per annotation");
            }
            let (mut ns, mut name) = (String::new(), String::new());
            for m in props["metrics"].as_array().into_iter().flatten() {
                let parts = m.as_array().unwrap();
                let Some(first) = parts[0].as_str() else {
                    continue;
                };
                if first == "..." {
                    continue;
                }
                if first != "." {
                    ns = first.to_owned();
                }
                if parts[1].as_str() != Some(".") {
                    name = parts[1].as_str().unwrap().to_owned();
                }
                if ns == "Likes" {
                    assert!(
                        written.contains(&name),
                        "the dashboard graphs {name}, never written"
                    );
                    graphed += 1;
                }
            }
        }
        assert!(graphed >= 20, "stream mode {stream}: {graphed}");
    }
    t.stop().await;
}
