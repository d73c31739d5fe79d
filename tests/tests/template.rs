//! `template.yaml` is the one source of truth, and what the local stack
//! serves is what it says: every route answers through the local gateway,
//! every sample event names a route of the template, the tables the stack
//! created have the template's keys, TTL and indexes (the only index is the
//! sparse `ResizeIndex` the code queries), no function is put in dev auth,
//! and issue 22's guardrails (throttles, the JWT scope, reserved
//! concurrency, table caps, log retention) are all there; every alarm has
//! its runbook row and is on the dashboard's alarm widget. Every
//! counters-table statement of every function is scoped by
//! `dynamodb:LeadingKeys` to key formats of `keys.rs`, each function may
//! touch exactly the key kinds listed for it, every action a function is
//! granted is one its code performs (read from the code), the readiness
//! probe's keys are readable by the read function, and like rows are
//! written only inside transactions. Views: the view function may only put
//! records onto the views stream, the views aggregator reads that stream as
//! the likes aggregator reads its own (whole batches, never bisected, given
//! up into a queue of its own), the stream is encrypted and on demand by
//! default, and the views table is what the local stack can make. Issues
//! 35 and 36: every stream event source takes one batch per shard from one
//! parameter the functions also get (and refuse unless 1); a views record
//! age leaves time to repair a given-up range; the views stream and its
//! failure queue outlive the stack; `/healthz` has a small throttle of its
//! own.

mod common;

use common::{TestStack, repo_root};
use likes_local::template::Template;
use std::collections::{BTreeMap, BTreeSet};

fn template() -> Template {
    Template::load(&repo_root().join("template.yaml")).expect("template parses")
}

#[test]
fn the_template_never_enables_dev_auth() {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let mut blocks = vec![doc["Globals"]["Function"]["Environment"]["Variables"].clone()];
    for (_, res) in doc["Resources"].as_mapping().unwrap() {
        blocks.push(res["Properties"]["Environment"]["Variables"].clone());
    }
    for vars in blocks {
        assert!(
            vars.get("AUTH_MODE").is_none(),
            "AUTH_MODE set in the template"
        );
    }
}

/// The aggregator applies a batch sorted by sequence number above its
/// shard's checkpoint: exact when a batch handed over again holds every
/// record not yet applied, in whatever order. A bisected batch breaks that:
/// after a function error Lambda may hand the halves over in either order
/// ("If records are processed more than once, they might be processed out
/// of order"), and a later half applied first moves the checkpoint past
/// the earlier half, which is then skipped, silently. So the stream source
/// retries whole batches (and reports partial failures from a record on).
#[test]
fn the_stream_source_never_bisects_a_batch() {
    let t = template();
    assert!(!t.stream_sources.is_empty());
    for s in &t.stream_sources {
        assert!(
            !s.bisect,
            "{}: BisectBatchOnFunctionError would hand records over in halves, out of order",
            s.function
        );
        assert!(s.report_failures, "{}: ReportBatchItemFailures", s.function);
    }
}

#[test]
fn every_sample_event_is_a_route_of_the_template() {
    let t = template();
    let mut seen = 0;
    for entry in std::fs::read_dir(repo_root().join("events")).unwrap() {
        let path = entry.unwrap().path();
        let ev: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        if ev["Records"][0]["eventSource"] == "aws:kinesis" {
            // A batch of views: the views aggregator's, from the stream its
            // Kinesis event reads (the shard is in each record's eventID).
            assert!(
                kinesis_event("ViewAggregateFunction").is_some(),
                "{}: no Kinesis event in the template",
                path.display()
            );
            continue;
        }
        if ev.get("Records").is_some() {
            // A stream batch: the aggregate function's, from the table
            // whose stream its DynamoDB event reads.
            let stream = ev["eventSourceARN"].as_str().unwrap_or_default();
            assert!(
                ev["shardId"].is_string() && stream.contains("/stream/"),
                "{}: a stream batch names its shard and stream (tumbling window)",
                path.display()
            );
            assert!(
                t.stream_sources.iter().any(|s| s.tumbling_window_secs > 0),
                "{}: no stream event source with a tumbling window in the template",
                path.display()
            );
            continue;
        }
        if ev.get("requestContext").is_none() {
            // Not an HTTP event: a scheduled invocation (EventBridge's own
            // event, or a schedule's Input, for the reconcile function), or
            // the warm function's own (`rounds`: a bounded run of it).
            let warm = ev.get("rounds").is_some()
                && t.schedules.iter().any(|s| s.code_uri.ends_with("/warm"));
            let scheduled = warm
                || ev["detail-type"] == "Scheduled Event"
                || t.schedules.iter().any(|s| {
                    s.input.as_deref().is_some_and(|i| {
                        let input: serde_json::Value = serde_json::from_str(i).unwrap();
                        input["mode"] == ev["mode"]
                    })
                });
            assert!(
                scheduled,
                "{}: neither HTTP nor a schedule's event",
                path.display()
            );
            continue;
        }
        let key = ev["routeKey"].as_str().unwrap();
        let known = t.routes.iter().any(|r| {
            if r.path == "$default" {
                key == "$default"
            } else {
                key == format!("{} {}", r.method, r.path)
            }
        });
        assert!(
            known,
            "{}: routeKey {key:?} is not in template.yaml",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_template_route_is_served_by_the_local_stack() {
    let tpl = template();
    assert!(tpl.routes.len() >= 5);
    let t = TestStack::uncached().await;
    for r in &tpl.routes {
        if r.path == "$default" {
            let reply = t.send("GET", "/no/such/route", None, &[], None).await;
            assert_eq!(reply.status, 404);
            continue;
        }
        let path = r.path.replace("{reel_id}", "r1");
        let path = if path == "/likes" {
            "/likes?reel_ids=r1".to_owned()
        } else {
            path
        };
        let path = path.replace("{user_id}", "u1");
        let method = if path.ends_with("/like") {
            "PUT"
        } else if path.starts_with("/admin/users/") {
            "DELETE"
        } else if path == "/views" {
            "POST"
        } else {
            "GET"
        };
        let reply = t.send(method, &path, Some("u1"), &[], None).await;
        if ["/views", "/counts", "/trending"].contains(&r.path.as_str()) {
            // Bodies and queries are the views code's to check (its own
            // tests send valid ones): here, that the function answers the
            // method its route serves, not `$default`'s 404 or a 405.
            assert!(
                ![404, 405].contains(&reply.status) && reply.status < 500,
                "{method} {path} ({}): {} {}",
                r.function,
                reply.status,
                reply.body
            );
            continue;
        }
        assert_eq!(
            reply.status, 200,
            "{method} {path} ({}): {}",
            r.function, reply.body
        );
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_creates_the_tables_the_template_defines() {
    let tpl = template();
    let t = TestStack::uncached().await;
    for (var, name) in [
        ("COUNTERS_TABLE", &t.stack.config.counters_table),
        ("LIKES_TABLE", &t.stack.config.likes_table),
    ] {
        let def = tpl
            .table_for_env(var)
            .expect("template wires the variable to a table");
        let desc = t
            .stack
            .client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .unwrap();
        let table = desc.table().unwrap();
        let keys: Vec<(String, String)> = table
            .key_schema()
            .iter()
            .map(|k| {
                (
                    k.attribute_name().to_owned(),
                    k.key_type().as_str().to_owned(),
                )
            })
            .collect();
        assert_eq!(keys, def.key_schema, "{var}");
        let mut indexes: Vec<String> = table
            .global_secondary_indexes()
            .iter()
            .filter_map(|i| i.index_name().map(str::to_owned))
            .collect();
        indexes.sort();
        let wanted: Vec<String> = def.indexes.iter().map(|i| i.name.clone()).collect();
        assert_eq!(indexes, wanted, "{var}: indexes as the template says");
        let ttl = t
            .stack
            .client
            .describe_time_to_live()
            .table_name(name)
            .send()
            .await
            .unwrap();
        let ttl_attr = ttl
            .time_to_live_description()
            .filter(|d| {
                d.time_to_live_status()
                    .is_some_and(|s| s.as_str() == "ENABLED")
            })
            .and_then(|d| d.attribute_name())
            .map(str::to_owned);
        assert_eq!(
            ttl_attr, def.ttl_attribute,
            "{var}: TTL as the template says"
        );
    }
    assert_eq!(
        tpl.table_for_env("COUNTERS_TABLE")
            .unwrap()
            .ttl_attribute
            .as_deref(),
        Some("expires_at")
    );
    t.stop().await;
}

/// The likes table is keyed by user; an index keyed by reel would be a hot
/// partition on every like of a viral reel, so it has none. The counters
/// table's one index is the sparse resize index the code queries, keyed by
/// an attribute only resized reels' settings items carry.
#[test]
fn the_only_index_is_the_sparse_resize_index() {
    let t = template();
    let likes = t.table_for_env("LIKES_TABLE").unwrap();
    assert!(likes.indexes.is_empty(), "{:?}", likes.indexes);
    let counters = t.table_for_env("COUNTERS_TABLE").unwrap();
    assert_eq!(counters.indexes.len(), 1);
    let idx = &counters.indexes[0];
    assert_eq!(idx.name, likes::keys::RESIZE_INDEX);
    assert_eq!(
        idx.key_schema,
        [
            (likes::keys::RESIZE_INDEX_ATTR.to_owned(), "HASH".to_owned()),
            ("pk".to_owned(), "RANGE".to_owned())
        ]
    );
    assert_eq!(idx.projection, "KEYS_ONLY");
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    for (id, res) in doc["Resources"].as_mapping().unwrap() {
        if res["Type"] == "AWS::DynamoDB::Table" {
            assert!(
                res["Properties"].get("LocalSecondaryIndexes").is_none(),
                "{id:?}"
            );
        }
    }
}

/// The admin routes are IAM-authorized (never the user JWT), and a schedule
/// drives the reshard function, every minute by default.
#[test]
fn admin_routes_use_iam_and_a_schedule_drives_resizes() {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let res = &doc["Resources"];
    assert_eq!(
        res["LikesApi"]["Properties"]["Auth"]["EnableIamAuthorizer"],
        true
    );
    let t = template();
    let admin: Vec<_> = t
        .routes
        .iter()
        .filter(|r| r.path.starts_with("/admin/"))
        .collect();
    assert!(!admin.is_empty());
    for r in admin {
        // Resizes are the reshard function's; erasure, the like function's
        // (it is the unlike transactions, with their grants).
        if r.path.starts_with("/admin/users/") {
            assert!(r.code_uri.ends_with("/like"), "{r:?}");
        } else {
            assert!(r.code_uri.ends_with("/reshard"), "{r:?}");
        }
        let events = res[r.function.as_str()]["Properties"]["Events"]
            .as_mapping()
            .unwrap();
        let ev = events
            .values()
            .find(|e| e["Properties"]["Path"].as_str() == Some(r.path.as_str()))
            .unwrap();
        assert_eq!(ev["Properties"]["Auth"]["Authorizer"], "AWS_IAM", "{r:?}");
    }
    // Every non-admin route is served by like/read, never by reshard.
    for r in t.routes.iter().filter(|r| !r.path.starts_with("/admin/")) {
        assert!(!r.code_uri.ends_with("/reshard"), "{r:?}");
    }
    let schedule = t
        .schedules
        .iter()
        .find(|s| s.code_uri.ends_with("/reshard"))
        .expect("a schedule for the reshard function");
    assert_eq!(schedule.expression, "!Ref ReshardSchedule");
    assert_eq!(
        doc["Parameters"]["ReshardSchedule"]["Default"],
        "rate(1 minute)"
    );
}

/// X-Ray is on for every function, and the alarms and dashboard the
/// runbook names exist.
#[test]
fn tracing_alarms_and_dashboard_are_in_the_template() {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    assert_eq!(doc["Globals"]["Function"]["Tracing"], "Active");
    let res = &doc["Resources"];
    for alarm in [
        "LikesGivenUpThrottledAlarm",
        "LikesGivenUpContendedAlarm",
        "Api5xxAlarm",
        "ReconcileDriftAlarm",
        "ResizeStuckAlarm",
        "CountersTableThrottleAlarm",
        "LikesTableThrottleAlarm",
        "AggregateFunctionThrottlesAlarm",
        "ReconcileRunAgeAlarm",
        "StreamLagAlarm",
        "AggregateFailuresAlarm",
        "ViewsIteratorAgeAlarm",
        "ViewsOnFailureAlarm",
        "ViewsRepairDeadLetterAlarm",
        "ViewsOverViewerBoundAlarm",
        "ViewsPutThrottledAlarm",
        "ViewsTableThrottleAlarm",
        "ViewFunctionThrottlesAlarm",
        "ViewAggregateFunctionThrottlesAlarm",
    ] {
        assert_eq!(res[alarm]["Type"], "AWS::CloudWatch::Alarm", "{alarm}");
    }
    // The functions that fail with no caller to see it (a schedule, the
    // stream) are alarmed on Lambda's Errors.
    for (alarm, function) in [
        ("ReconcileFunctionErrorsAlarm", "ReconcileFunction"),
        ("ReshardFunctionErrorsAlarm", "ReshardFunction"),
        ("WarmFunctionErrorsAlarm", "WarmFunction"),
        ("AggregateFunctionErrorsAlarm", "AggregateFunction"),
        ("ViewAggregateFunctionErrorsAlarm", "ViewAggregateFunction"),
        // Called by clients, but a crash or timeout loses their views.
        ("ViewFunctionErrorsAlarm", "ViewFunction"),
    ] {
        let p = &res[alarm]["Properties"];
        assert_eq!(res[alarm]["Type"], "AWS::CloudWatch::Alarm", "{alarm}");
        assert_eq!(p["Namespace"], "AWS/Lambda", "{alarm}");
        assert_eq!(p["MetricName"], "Errors", "{alarm}");
        let dims = p["Dimensions"].as_sequence().expect("dimensions");
        assert!(
            matches!(&dims[..], [d] if d["Name"] == "FunctionName"
                && matches!(&d["Value"], yaml_serde::Value::Tagged(t)
                    if t.tag == "!Ref" && t.value == function)),
            "{alarm}: the errors of {function}: {dims:?}"
        );
        assert_eq!(p["TreatMissingData"], "notBreaching", "{alarm}");
        assert_eq!(
            res[alarm]["Condition"], res[function]["Condition"],
            "{alarm}"
        );
    }
    // Every alarm notifies the alarm topic (when one is given).
    let actions: yaml_serde::Value =
        yaml_serde::from_str("!If [HasAlarmTopic, [!Ref AlarmTopicArn], !Ref AWS::NoValue]")
            .unwrap();
    for (id, r) in res.as_mapping().unwrap() {
        if r["Type"] == "AWS::CloudWatch::Alarm" {
            assert_eq!(
                r["Properties"]["AlarmActions"], actions,
                "{id:?}: AlarmActions"
            );
        }
    }
    // Every alarm the template declares has its row in the runbook: named
    // in the first cell of a row of the Runbook section's table, whose
    // other cells say what it means and what to do.
    let ops = std::fs::read_to_string(repo_root().join("docs").join("operations.md")).unwrap();
    let runbook = ops
        .split_once("\n## Runbook\n")
        .expect("a Runbook section")
        .1;
    let runbook = runbook
        .split_once("\n## ")
        .map_or(runbook, |(section, _)| section);
    let rows: Vec<Vec<&str>> = runbook
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("| ---"))
        .skip(1) // the header
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    for (id, r) in res.as_mapping().unwrap() {
        if r["Type"] == "AWS::CloudWatch::Alarm" {
            let alarm = id.as_str().unwrap();
            let row = rows
                .iter()
                .find(|row| row[0].contains(&format!("`{alarm}`")));
            let row = row.unwrap_or_else(|| panic!("{alarm} has no row in the runbook"));
            assert!(
                row.len() == 3 && row[1..].iter().all(|cell| !cell.is_empty()),
                "{alarm}: its runbook row says what it means and what to do: {row:?}"
            );
        }
    }
    // The aggregate functions' roles are their own, scoped to their
    // streams: SAM's managed policies for DynamoDB and Kinesis event
    // sources read every stream ("*").
    for function in ["AggregateFunction", "ViewAggregateFunction"] {
        assert!(
            matches!(
                &res[function]["Properties"]["Role"],
                yaml_serde::Value::Tagged(t) if t.value == format!("{function}Role.Arn")
            ),
            "{function} keeps its own role"
        );
    }
    assert_eq!(
        res["OperationsDashboard"]["Type"],
        "AWS::CloudWatch::Dashboard"
    );
}

/// Every alarm the template declares is on the dashboard's alarm widget,
/// in the mode it exists in (stream mode's alarms only in stream mode, where
/// CloudFormation can resolve them), and the widget shows nothing else.
#[test]
fn every_alarm_is_on_the_dashboards_alarm_widget() {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let bodies = common::dashboard_bodies();
    assert_eq!(bodies.len(), 2, "classic and stream mode");
    for (stream, body) in bodies {
        let declared: BTreeSet<String> = doc["Resources"]
            .as_mapping()
            .unwrap()
            .iter()
            .filter(|(_, r)| r["Type"] == "AWS::CloudWatch::Alarm")
            .filter(|(id, r)| match r["Condition"].as_str() {
                None => true,
                Some("StreamCounting") => stream,
                Some(other) => panic!("{id:?}: condition {other}"),
            })
            .map(|(id, _)| id.as_str().unwrap().to_owned())
            .collect();
        let widgets: Vec<_> = body["widgets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["type"] == "alarm")
            .collect();
        let [widget] = widgets[..] else {
            panic!(
                "stream mode {stream}: {} alarm widgets, not one",
                widgets.len()
            );
        };
        let shown: BTreeSet<String> = widget["properties"]["alarms"]
            .as_array()
            .expect("the widget's alarms")
            .iter()
            .map(|a| {
                let a = a.as_str().unwrap();
                a.strip_prefix("${")
                    .and_then(|a| a.strip_suffix(".Arn}"))
                    .unwrap_or_else(|| panic!("{a}: not an alarm's ${{<Id>.Arn}}"))
                    .to_owned()
            })
            .collect();
        let missing: Vec<_> = declared.difference(&shown).collect();
        let unknown: Vec<_> = shown.difference(&declared).collect();
        assert!(
            missing.is_empty(),
            "stream mode {stream}: not on the dashboard's alarm widget: {missing:?}"
        );
        assert!(
            unknown.is_empty(),
            "stream mode {stream}: on the alarm widget, but no alarm of this mode: {unknown:?}"
        );
    }
}

/// Issue 22's guardrails, which API Gateway, Lambda and DynamoDB enforce
/// (so no local test shows them biting), stay in the template, each a
/// parameter: a throttle on every route, the stage default (the
/// unauthenticated `/healthz` and `$default`) among them; the JWT scope on
/// the user routes, and on no other; an access log naming the caller;
/// reserved concurrency on every function; both tables capped and
/// deletion-protected; and every function's log group declared with a
/// retention.
#[test]
fn the_guardrails_are_in_the_template() {
    use yaml_serde::Value;
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: Value = yaml_serde::from_str(&text).unwrap();
    let res = &doc["Resources"];
    fn is_ref(v: &Value, name: &str) -> bool {
        match v {
            Value::Tagged(t) => t.tag == "!Ref" && t.value.as_str() == Some(name),
            _ => false,
        }
    }
    /// `!If [<cond>, <then>, !Ref AWS::NoValue]` → (cond, then).
    fn if_else_nothing(v: &Value) -> Option<(String, Value)> {
        let Value::Tagged(t) = v else { return None };
        let s = t.value.as_sequence().filter(|_| t.tag == "!If")?;
        (s.len() == 3 && is_ref(&s[2], "AWS::NoValue"))
            .then(|| (s[0].as_str().unwrap_or_default().to_owned(), s[1].clone()))
    }
    fn throttled_by(settings: &Value, rate: &str, burst: &str) -> bool {
        is_ref(&settings["ThrottlingRateLimit"], rate)
            && is_ref(&settings["ThrottlingBurstLimit"], burst)
    }
    let api = &res["LikesApi"]["Properties"];
    let stage = &api["DefaultRouteSettings"];
    let hard = |route: &Value| throttled_by(route, "DefaultThrottleRate", "DefaultThrottleBurst");
    assert!(hard(stage));
    let default_rate = doc["Parameters"]["DefaultThrottleRate"]["Default"].as_u64();
    assert!(default_rate.is_some_and(|r| r <= 100), "{default_rate:?}");
    // The JWT authorizer is the default one, so a route without `Auth` is a
    // user route and gets its scope (none when the parameter is empty).
    assert_eq!(api["Auth"]["DefaultAuthorizer"], "JwtAuthorizer");
    let scopes = api["Auth"]["Authorizers"]["JwtAuthorizer"]["AuthorizationScopes"]
        .as_sequence()
        .expect("a literal list: SAM takes nothing else");
    let [Some((cond, scope))] = &scopes.iter().map(if_else_nothing).collect::<Vec<_>>()[..] else {
        panic!("one scope, under a condition: {scopes:?}");
    };
    assert_eq!(cond, "HasJwtScope");
    assert!(is_ref(scope, "JwtAuthorizationScope"), "{scope:?}");
    let mut user_routes = BTreeSet::new();
    let functions: Vec<&str> = res
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::Serverless::Function")
        .map(|(id, _)| id.as_str().unwrap())
        .collect();
    for f in &functions {
        let props = &res[*f]["Properties"];
        for (_, ev) in props["Events"].as_mapping().into_iter().flatten() {
            if ev["Type"] != "HttpApi" {
                continue;
            }
            let p = &ev["Properties"];
            let path = p["Path"].as_str().unwrap();
            let route = &p["RouteSettings"];
            match p["Auth"]["Authorizer"].as_str() {
                // Unauthenticated: /healthz its own small throttle, the
                // rest the stage default's hard one.
                Some("NONE") if path == "/healthz" => {
                    assert!(
                        throttled_by(route, "HealthThrottleRate", "HealthThrottleBurst"),
                        "{path}: its own throttle"
                    );
                }
                Some("NONE") => {
                    assert_eq!(path, "$default", "{path}: no auth");
                    assert!(route.is_null() || hard(route), "{path}: throttled hard");
                }
                Some("AWS_IAM") => {
                    assert!(path.starts_with("/admin/"), "{path}");
                    assert!(
                        throttled_by(route, "AdminThrottleRate", "AdminThrottleBurst"),
                        "{path}"
                    );
                }
                None => {
                    let writes = throttled_by(route, "WriteThrottleRate", "WriteThrottleBurst");
                    let reads = throttled_by(route, "ReadThrottleRate", "ReadThrottleBurst");
                    let views = path == "/views"
                        && throttled_by(route, "ViewThrottleRate", "ViewThrottleBurst");
                    assert!(
                        writes || reads || views,
                        "{path}: a user route without its throttle"
                    );
                    user_routes.insert(path);
                }
                Some(other) => panic!("{path}: authorizer {other}"),
            }
        }
        // Reserved concurrency: `<Name>ReservedConcurrency`, -1 leaving it out.
        let param = format!("{}ReservedConcurrency", f.trim_end_matches("Function"));
        let reserved = if_else_nothing(&props["ReservedConcurrentExecutions"]);
        assert!(
            reserved.is_some_and(|(_, v)| is_ref(&v, &param)),
            "{f}: ReservedConcurrentExecutions from {param}"
        );
        // Its log group, named as Lambda names it, with a retention.
        let logs = res.as_mapping().unwrap().values().find(|r| {
            r["Type"] == "AWS::Logs::LogGroup"
                && matches!(&r["Properties"]["LogGroupName"],
                    Value::Tagged(t) if t.tag == "!Sub"
                        && t.value.as_str() == Some(&format!("/aws/lambda/${{{f}}}")))
        });
        let logs = logs.unwrap_or_else(|| panic!("{f}: no log group declared"));
        let retention = &logs["Properties"]["RetentionInDays"];
        assert!(is_ref(retention, "LogRetentionDays"), "{f}: {retention:?}");
    }
    assert_eq!(
        user_routes,
        BTreeSet::from([
            "/counts",
            "/likes",
            "/reels/{reel_id}/like",
            "/reels/{reel_id}/likes",
            "/reels/{reel_id}/stats",
            "/reels/{reel_id}/views",
            "/trending",
            "/views",
        ])
    );
    // Who asked, on every line of the access log.
    let log = api["AccessLogSettings"]["Format"].as_str().unwrap();
    for who in ["authorizer.claims.sub", "identity.userArn"] {
        assert!(
            log.contains(&format!("$context.{who}")),
            "access log without {who}"
        );
    }
    // Every table: an on-demand cap (unless set to -1) and deletion protection.
    for (id, r) in res.as_mapping().unwrap() {
        if r["Type"] != "AWS::DynamoDB::Table" {
            continue;
        }
        let id = id.as_str().unwrap();
        let name = id.trim_end_matches("Table");
        assert_eq!(r["Properties"]["DeletionProtectionEnabled"], true, "{id}");
        let (_, caps) = if_else_nothing(&r["Properties"]["OnDemandThroughput"])
            .unwrap_or_else(|| panic!("{id}: OnDemandThroughput"));
        for (prop, param) in [
            ("MaxReadRequestUnits", format!("{name}MaxReadUnits")),
            ("MaxWriteRequestUnits", format!("{name}MaxWriteUnits")),
        ] {
            let cap = if_else_nothing(&caps[prop]);
            assert!(cap.is_some_and(|(_, v)| is_ref(&v, &param)), "{id}.{prop}");
        }
    }
}

/// Reconciliation starts daily (a parameter) and an unfinished run is
/// resumed by a second schedule that never starts one.
#[test]
fn reconciliation_runs_daily_and_resumes() {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let t = template();
    let ours: Vec<_> = t
        .schedules
        .iter()
        .filter(|s| s.code_uri.ends_with("/reconcile"))
        .collect();
    let input = |s: &likes_local::template::ScheduleDef| -> serde_json::Value {
        serde_json::from_str(s.input.as_deref().expect("an Input")).unwrap()
    };
    let start = ours
        .iter()
        .find(|s| input(s)["mode"] == "start")
        .expect("a start schedule");
    assert_eq!(start.expression, "!Ref ReconcileSchedule");
    assert_eq!(
        doc["Parameters"]["ReconcileSchedule"]["Default"],
        "rate(1 day)"
    );
    let resume = ours
        .iter()
        .find(|s| input(s)["mode"] == "resume")
        .expect("a resume schedule");
    assert_eq!(resume.expression, "!Ref ReconcileResumeSchedule");
    // The function's timeout covers a checkpointed invocation.
    assert_eq!(
        doc["Resources"][start.function.as_str()]["Properties"]["Timeout"],
        900
    );
}

/// `make serve` with `AWS_ENDPOINT_URL_DYNAMODB` set: no emulator of its own,
/// the tables created on that endpoint if missing, the same routes served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_endpoint_is_used_and_given_its_tables() {
    let host = TestStack::uncached().await;
    let mut opts = likes_local::StackOptions::isolated(repo_root().join("template.yaml"));
    opts.dynamo = likes_local::Dynamo::Endpoint(host.stack.dynamo_endpoint.clone());
    for (k, v) in [
        ("COUNTERS_TABLE", "ext-counters"),
        ("LIKES_TABLE", "ext-likes"),
        ("CACHE_TTL_MS", "0"),
    ] {
        opts.env.insert(k.into(), v.into());
    }
    let guest = likes_local::Stack::start(opts)
        .await
        .expect("stack on an existing endpoint");
    assert_eq!(guest.dynamo_endpoint, host.stack.dynamo_endpoint);
    let r = reqwest::Client::new()
        .put(format!("{}/reels/ext/like", guest.base_url))
        .header("x-user-id", "u1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The write landed in the host emulator's newly created tables.
    let rows = host.scan("ext-likes").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(host.scan("ext-counters").await.len(), 1);
    guest.shutdown().await;
    host.stop().await;
}

// ---- IAM: every statement scoped to the keys its function uses ----------

/// A key of every format `likes::keys` defines, by kind (shard 0 apart: the
/// correction writes it alone).
fn key_kinds() -> Vec<(&'static str, Vec<String>)> {
    use likes::keys::*;
    let r = ReelId::parse("r-1_A").unwrap();
    vec![
        ("shard0", vec![shard_key(&r, 0)]),
        ("shard", vec![shard_key(&r, 7), shard_key(&r, 999)]),
        ("base", vec![base_key(&r)]),
        ("settings", vec![settings_key(&r)]),
        ("ledger", vec![reconcile_key(&r)]),
        ("idem", vec![idempotency_record_key("tok123")]),
        ("caller", vec![caller_reads_key("u:someone", 29_000_000)]),
        ("run", vec![RECONCILE_RUN_KEY.to_owned()]),
        ("chunk", vec![reconcile_chunk_key("17-ab", "seg3", 4)]),
        ("count", vec![reconcile_count_key("17-ab", &r)]),
        ("warm", vec![top::warm_key(&r)]),
        ("list", vec![top::trending_list_key("views", "1h")]),
        ("warmset", vec![top::WARM_SET_KEY.to_owned()]),
        (
            "checkpoint",
            vec![aggregate_checkpoint_key(
                "arn:aws:dynamodb:us-east-1:1:table/t/stream/2026",
                "shardId-0001",
            )],
        ),
    ]
}

/// The counters-table key kinds ([`key_kinds`]) `function` may `action`
/// (`dynamodb:GetItem`…), inside `TransactWriteItems` or not, under
/// `statements`, sorted.
fn granted_kinds(
    kinds: &[(&'static str, Vec<String>)],
    statements: &[Statement],
    function: &str,
    action: &str,
    in_tx: bool,
) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = kinds
        .iter()
        .filter(|(_, keys)| {
            keys.iter().all(|key| {
                statements.iter().any(|st| {
                    st.function == function
                        && st.actions.iter().any(|a| a == action)
                        && st.resources.iter().any(|r| r == "CountersTable")
                        && st.enclosing.as_ref().is_none_or(|ops| {
                            in_tx && ops.iter().any(|o| o == "TransactWriteItems")
                        })
                        // No key condition: every key.
                        && st
                            .leading_keys
                            .as_ref()
                            .is_none_or(|ps| ps.iter().any(|p| string_like(p, key)))
                })
            })
        })
        .map(|(kind, _)| *kind)
        .collect();
    out.sort();
    out
}

/// IAM's `StringLike`: `*` is any run of characters, `?` one character.
fn string_like(pattern: &str, value: &str) -> bool {
    fn go(p: &[char], v: &[char]) -> bool {
        match p.split_first() {
            None => v.is_empty(),
            Some(('*', rest)) => (0..=v.len()).any(|i| go(rest, &v[i..])),
            Some(('?', rest)) => !v.is_empty() && go(rest, &v[1..]),
            Some((c, rest)) => v.first() == Some(c) && go(rest, &v[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let v: Vec<char> = value.chars().collect();
    go(&p, &v)
}

fn strings(v: &yaml_serde::Value) -> Vec<String> {
    match v {
        yaml_serde::Value::Sequence(s) => s.iter().flat_map(strings).collect(),
        yaml_serde::Value::String(s) => vec![s.clone()],
        yaml_serde::Value::Tagged(t) => strings(&t.value),
        _ => vec![],
    }
}

/// One DynamoDB statement of a function's policy, as the checks need it.
#[derive(Debug)]
struct Statement {
    function: String,
    sid: String,
    actions: Vec<String>,
    /// `!GetAtt X.Arn` → `X`; a `!Sub` of an index stays as written.
    resources: Vec<String>,
    /// `ForAllValues:StringLike` `dynamodb:LeadingKeys` patterns.
    leading_keys: Option<Vec<String>>,
    /// `ForAnyValue:StringEquals` `dynamodb:EnclosingOperation` values.
    enclosing: Option<Vec<String>>,
    /// Every other condition (operator/key), which the checks refuse.
    other_conditions: Vec<String>,
    /// The template condition the statement is under (`!If [Cond, st,
    /// AWS::NoValue]`), if any.
    when: Option<String>,
}

fn dynamodb_statements() -> Vec<Statement> {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let mut out = Vec::new();
    for (id, res) in doc["Resources"].as_mapping().unwrap() {
        if res["Type"] != "AWS::Serverless::Function" {
            continue;
        }
        let function = id.as_str().unwrap().to_owned();
        // A function with a role of its own (`Role: !GetAtt <Role>.Arn`, so
        // that SAM attaches no managed policy): that role's inline policies.
        let policies: Vec<yaml_serde::Value> = match &res["Properties"]["Role"] {
            yaml_serde::Value::Tagged(t) if t.tag == "!GetAtt" => {
                let role = t
                    .value
                    .as_str()
                    .and_then(|r| r.strip_suffix(".Arn"))
                    .unwrap_or_else(|| panic!("{function}: Role is !GetAtt <Role>.Arn"));
                doc["Resources"][role]["Properties"]["Policies"]
                    .as_sequence()
                    .unwrap_or_else(|| panic!("{role} has inline policies"))
                    .iter()
                    .map(|p| p["PolicyDocument"].clone())
                    .collect()
            }
            _ => res["Properties"]["Policies"]
                .as_sequence()
                .unwrap_or_else(|| panic!("{function} has inline policies"))
                .clone(),
        };
        for policy in &policies {
            for st in policy["Statement"].as_sequence().expect("statements") {
                // `!If [Condition, statement, !Ref AWS::NoValue]`: the
                // statement, under that condition.
                let (st, when) = match st {
                    yaml_serde::Value::Tagged(t) if t.tag == "!If" => {
                        let parts = t.value.as_sequence().expect("!If [cond, then, else]");
                        assert_eq!(
                            strings(&parts[2]),
                            ["AWS::NoValue"],
                            "{function}: an !If statement's else is no statement"
                        );
                        (&parts[1], parts[0].as_str().map(str::to_owned))
                    }
                    other => (other, None),
                };
                let actions = strings(&st["Action"]);
                if !actions.iter().any(|a| a.starts_with("dynamodb:")) {
                    continue;
                }
                assert_eq!(st["Effect"], "Allow", "{function}: {st:?}");
                let resources = strings(&st["Resource"])
                    .into_iter()
                    .map(|r| r.strip_suffix(".Arn").map(str::to_owned).unwrap_or(r))
                    .collect();
                let (mut leading_keys, mut enclosing, mut other_conditions) =
                    (None, None, Vec::new());
                if let Some(cond) = st["Condition"].as_mapping() {
                    for (op, keys) in cond {
                        let op = op.as_str().unwrap();
                        for (key, values) in keys.as_mapping().unwrap() {
                            let key = key.as_str().unwrap();
                            match (op, key) {
                                ("ForAllValues:StringLike", "dynamodb:LeadingKeys") => {
                                    leading_keys = Some(strings(values))
                                }
                                ("ForAnyValue:StringEquals", "dynamodb:EnclosingOperation") => {
                                    enclosing = Some(strings(values))
                                }
                                _ => other_conditions.push(format!("{op} {key}")),
                            }
                        }
                    }
                }
                out.push(Statement {
                    function: function.clone(),
                    sid: st["Sid"].as_str().unwrap_or("?").to_owned(),
                    actions,
                    resources,
                    leading_keys,
                    enclosing,
                    other_conditions,
                    when,
                });
            }
        }
    }
    out
}

/// Actions that name no item key: no key condition can narrow them (a Scan
/// reads every item; DescribeTable is about the table). They must stand in
/// statements of their own.
const KEYLESS: [&str; 2] = ["dynamodb:Scan", "dynamodb:DescribeTable"];

/// Every DynamoDB statement that can touch counters-table items has a
/// `ForAllValues:StringLike` `dynamodb:LeadingKeys` condition, every
/// pattern in it is one of the key formats of `likes::keys`, and keyless
/// actions (which such a condition would let through: `ForAllValues` is
/// true when the key is absent) are never mixed into it.
#[test]
fn every_counters_statement_is_scoped_to_key_formats_of_keys_rs() {
    let kinds = key_kinds();
    let statements = dynamodb_statements();
    assert!(statements.len() >= 12, "{statements:#?}");
    for st in &statements {
        let what = format!("{} {}", st.function, st.sid);
        // Conditions beside the key's narrow a statement further; the one
        // that has them (a spread reel's parts, on the views table) names
        // the attributes it may write and that nothing is returned.
        if st.sid == "WriterSpreadParts" {
            assert_eq!(
                st.other_conditions,
                [
                    "ForAllValues:StringEquals dynamodb:Attributes",
                    "StringEqualsIfExists dynamodb:ReturnValues"
                ],
                "{what}"
            );
        } else {
            assert!(
                st.other_conditions.is_empty(),
                "{what}: {:?}",
                st.other_conditions
            );
        }
        let keyless = st
            .actions
            .iter()
            .filter(|a| KEYLESS.contains(&a.as_str()))
            .count();
        assert!(
            keyless == 0 || keyless == st.actions.len(),
            "{what}: keyless actions mixed with item actions: {:?}",
            st.actions
        );
        if !st.resources.iter().any(|r| r == "CountersTable") {
            continue;
        }
        if keyless > 0 {
            assert!(
                st.leading_keys.is_none(),
                "{what}: a key condition on {:?}",
                st.actions
            );
            continue;
        }
        assert_eq!(
            st.resources,
            ["CountersTable"],
            "{what}: a key-scoped statement names the counters table alone"
        );
        let patterns = st
            .leading_keys
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: no dynamodb:LeadingKeys condition"));
        assert!(!patterns.is_empty(), "{what}");
        for p in patterns {
            let matched: Vec<&str> = kinds
                .iter()
                .filter(|(_, keys)| keys.iter().all(|k| string_like(p, k)))
                .map(|(kind, _)| *kind)
                .collect();
            assert!(
                !matched.is_empty(),
                "{what}: {p:?} is no key format of keys.rs"
            );
        }
    }
}

/// Per function and action, the counters-table key kinds the policy allows,
/// outside and inside a `TransactWriteItems`, are exactly those listed
/// below: a hand-written list of the keys each function's code writes and
/// reads, kept by reading the store's calls in shared/src/store/dynamodb/
/// and their callers in shared/src/service/ and shared/src/http/ (like and
/// read), shared/src/reshard/, shared/src/reconcile/ and
/// shared/src/aggregate/. The code is not read here (which actions it
/// performs at all is `every_action_granted_is_one_its_function_performs`'s
/// to check). `???` cannot tell shard 0 from the others, so both shard
/// kinds go together except where a pattern names `000` alone.
#[test]
fn each_function_may_touch_exactly_the_counters_keys_listed() {
    let kinds = key_kinds();
    let statements = dynamodb_statements();
    let allowed = |function: &str, action: &str, in_tx: bool| {
        granted_kinds(&kinds, &statements, function, action, in_tx)
    };
    let reads_like = [
        "base", "idem", "list", "settings", "shard", "shard0", "warm", "warmset",
    ];
    let reads_sum = ["base", "settings", "shard", "shard0"];
    let reads_recon = [
        "base", "chunk", "count", "ledger", "run", "settings", "shard", "shard0",
    ];
    let none: [&str; 0] = [];
    #[rustfmt::skip]
    let expected: Vec<(&str, &str, bool, Vec<&str>)> = vec![
        // Like: shard updates and key records inside the like's transaction;
        // settings (automatic grow) anywhere.
        ("LikeFunction", "PutItem", false, vec!["settings"]),
        ("LikeFunction", "PutItem", true, vec!["idem", "settings"]),
        ("LikeFunction", "UpdateItem", false, none.to_vec()),
        ("LikeFunction", "UpdateItem", true, vec!["shard", "shard0"]),
        ("LikeFunction", "DeleteItem", true, none.to_vec()),
        ("LikeFunction", "ConditionCheckItem", true, none.to_vec()),
        ("LikeFunction", "GetItem", false, reads_like.to_vec()),
        ("LikeFunction", "BatchGetItem", false, reads_like.to_vec()),
        // Read: sums, and settings for the automatic grow.
        ("ReadFunction", "PutItem", true, vec!["settings"]),
        ("ReadFunction", "UpdateItem", false, vec!["caller"]),
        ("ReadFunction", "UpdateItem", true, vec!["caller"]),
        ("ReadFunction", "DeleteItem", true, none.to_vec()),
        ("ReadFunction", "ConditionCheckItem", true, none.to_vec()),
        // GetItem and BatchGetItem: the cache warmer's items too.
        ("ReadFunction", "GetItem", false, vec!["base", "list", "settings", "shard", "shard0", "warm", "warmset"]),
        ("ReadFunction", "BatchGetItem", false, vec!["base", "list", "settings", "shard", "shard0", "warm", "warmset"]),
        // Warm: sums as the read function's, and its own items put.
        ("WarmFunction", "PutItem", false, vec!["list", "settings", "warm", "warmset"]),
        ("WarmFunction", "UpdateItem", false, none.to_vec()),
        ("WarmFunction", "UpdateItem", true, none.to_vec()),
        ("WarmFunction", "DeleteItem", true, none.to_vec()),
        ("WarmFunction", "GetItem", false, vec!["base", "list", "settings", "shard", "shard0", "warm", "warmset"]),
        ("WarmFunction", "BatchGetItem", false, vec!["base", "list", "settings", "shard", "shard0", "warm", "warmset"]),
        // Reshard: settings puts; folds, reopenings and stray emptying
        // (base and shard updates checked against the settings) inside
        // transactions; it deletes nothing.
        ("ReshardFunction", "PutItem", true, vec!["settings"]),
        ("ReshardFunction", "DeleteItem", false, none.to_vec()),
        ("ReshardFunction", "DeleteItem", true, none.to_vec()),
        ("ReshardFunction", "UpdateItem", false, none.to_vec()),
        ("ReshardFunction", "UpdateItem", true, vec!["base", "shard", "shard0"]),
        ("ReshardFunction", "ConditionCheckItem", false, none.to_vec()),
        ("ReshardFunction", "ConditionCheckItem", true, vec!["settings"]),
        ("ReshardFunction", "GetItem", false, reads_sum.to_vec()),
        ("ReshardFunction", "BatchGetItem", false, reads_sum.to_vec()),
        // Reconcile: its run's items; corrections (shard 0 and the ledger)
        // and stray-item emptying (checked against the settings) inside
        // transactions.
        ("ReconcileFunction", "PutItem", true, vec!["chunk", "count", "run"]),
        ("ReconcileFunction", "UpdateItem", false, vec!["count"]),
        ("ReconcileFunction", "UpdateItem", true, vec!["base", "count", "ledger", "shard", "shard0"]),
        ("ReconcileFunction", "DeleteItem", false, none.to_vec()),
        ("ReconcileFunction", "DeleteItem", true, none.to_vec()),
        ("ReconcileFunction", "ConditionCheckItem", false, none.to_vec()),
        ("ReconcileFunction", "ConditionCheckItem", true, vec!["settings"]),
        ("ReconcileFunction", "GetItem", false, reads_recon.to_vec()),
        ("ReconcileFunction", "BatchGetItem", false, reads_recon.to_vec()),
        // Aggregate (stream mode): its checkpoints, inside one transaction
        // per chunk with its writer items (the views table's, not here).
        ("AggregateFunction", "PutItem", false, none.to_vec()),
        ("AggregateFunction", "PutItem", true, none.to_vec()),
        ("AggregateFunction", "UpdateItem", false, none.to_vec()),
        ("AggregateFunction", "UpdateItem", true, vec!["checkpoint"]),
        ("AggregateFunction", "DeleteItem", true, none.to_vec()),
        ("AggregateFunction", "ConditionCheckItem", true, none.to_vec()),
        ("AggregateFunction", "GetItem", false, vec!["checkpoint"]),
        ("AggregateFunction", "BatchGetItem", false, none.to_vec()),
        // Views aggregator: its own table only, never the counters.
        ("ViewAggregateFunction", "GetItem", false, none.to_vec()),
        ("ViewAggregateFunction", "BatchGetItem", false, none.to_vec()),
        ("ViewAggregateFunction", "PutItem", true, none.to_vec()),
        ("ViewAggregateFunction", "UpdateItem", true, none.to_vec()),
        ("ViewAggregateFunction", "DeleteItem", true, none.to_vec()),
    ];
    let mut wrong = Vec::new();
    for (function, action, in_tx, want) in &expected {
        let got = allowed(function, &format!("dynamodb:{action}"), *in_tx);
        if &got != want {
            wrong.push(format!(
                "{function} {action} (in a transaction: {in_tx}): allows {got:?}, expected {want:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
    // Every function is covered, and no function may BatchWriteItem.
    for st in &statements {
        assert!(
            expected.iter().any(|(f, ..)| *f == st.function),
            "{}: no expectations",
            st.function
        );
        assert!(
            !st.actions.iter().any(|a| a == "dynamodb:BatchWriteItem"),
            "{st:?}"
        );
    }
}

/// `/healthz` reads a never-written key of each table (`ping` in
/// shared/src/store/dynamodb/counter.rs): the read function may `GetItem`
/// both, outside any transaction and whatever the template's conditions.
#[test]
fn the_read_function_may_read_the_readiness_probe_keys() {
    use likes::keys::{PROBE_USER, probe_reel, settings_key};
    let statements = dynamodb_statements();
    let may_get = |table: &str, key: &str| {
        statements.iter().any(|st| {
            st.function == "ReadFunction"
                && st.when.is_none()
                && st.enclosing.is_none()
                && st.actions.iter().any(|a| a == "dynamodb:GetItem")
                && st.resources == [table]
                && st
                    .leading_keys
                    .as_ref()
                    .is_none_or(|ps| ps.iter().any(|p| string_like(p, key)))
        })
    };
    let probe = settings_key(&probe_reel());
    assert!(may_get("CountersTable", &probe), "{probe}");
    assert!(may_get("LikesTable", PROBE_USER), "{PROBE_USER}");
}

/// The likes table (partition key: the user id, so no key condition can
/// narrow it) is written only by the like function, and only inside
/// `TransactWriteItems`, but for stream mode's unkeyed like (a `PutItem`
/// under the `StreamCounting` condition alone).
#[test]
fn like_rows_are_written_only_inside_transactions() {
    for st in dynamodb_statements() {
        if !st.resources.iter().any(|r| r == "LikesTable") {
            continue;
        }
        let writes: Vec<&String> = st
            .actions
            .iter()
            .filter(|a| {
                !matches!(
                    a.as_str(),
                    "dynamodb:GetItem"
                        | "dynamodb:Scan"
                        | "dynamodb:Query"
                        | "dynamodb:DescribeTable"
                )
            })
            .collect();
        if writes.is_empty() {
            continue;
        }
        assert_eq!(st.function, "LikeFunction", "{st:?}");
        assert_eq!(st.resources, ["LikesTable"], "{st:?}");
        if st.when.as_deref() == Some("StreamCounting") {
            // Stream mode's unkeyed like: one PutItem of its row, which no
            // transaction needs (no shard is written with it).
            let puts: Vec<&str> = writes.iter().map(|a| a.as_str()).collect();
            assert_eq!(puts, ["dynamodb:PutItem"], "{st:?}");
            continue;
        }
        assert_eq!(
            st.enclosing.as_deref(),
            Some(&["TransactWriteItems".to_owned()][..]),
            "{st:?}"
        );
    }
}

/// Every number a function reads from a template parameter is one its
/// configuration accepts, wherever the parameter lets it be: at its
/// MinValue and the value above, its default, the value below its
/// MaxValue and its MaxValue (or 10^12 where it has none), leaving out the
/// values a `Rules` assertion refuses (`!Not [!Contains [[...], !Ref P]]`).
/// A parameter the code would refuse stops every function at start: the
/// variables are in Globals, so one bad value takes the whole API down.
/// (HotLikesPerSec and CoolLikesPerSec are tried with the other at a value
/// that keeps cool below hot, which the code checks and CloudFormation
/// cannot: their descriptions say so.)
#[test]
fn every_number_a_function_reads_from_a_parameter_is_one_the_code_accepts() {
    use yaml_serde::Value;
    let doc = template_doc();
    let params = &doc["Parameters"];
    // Variable → the Number parameter it is `!Ref`.
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut add = |env: &Value| {
        for (k, v) in env.as_mapping().into_iter().flatten() {
            if let Value::Tagged(t) = v
                && t.tag == "!Ref"
                && let Some(p) = t.value.as_str()
                && params[p]["Type"].as_str() == Some("Number")
            {
                vars.insert(k.as_str().unwrap().to_owned(), p.to_owned());
            }
        }
    };
    add(&doc["Globals"]["Function"]["Environment"]["Variables"]);
    for (_, res) in doc["Resources"].as_mapping().unwrap() {
        add(&res["Properties"]["Environment"]["Variables"]);
    }
    assert!(vars.len() >= 8, "{vars:?}");
    // Values the rules refuse, per parameter.
    let mut refused: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for (_, rule) in doc["Rules"].as_mapping().into_iter().flatten() {
        for a in rule["Assertions"].as_sequence().into_iter().flatten() {
            if let Value::Tagged(not) = &a["Assert"]
                && not.tag == "!Not"
                && let Value::Tagged(contains) = &not.value[0]
                && contains.tag == "!Contains"
                && let Value::Tagged(r) = &contains.value[1]
                && r.tag == "!Ref"
            {
                let values = contains.value[0].as_sequence().unwrap();
                refused
                    .entry(r.value.as_str().unwrap().to_owned())
                    .or_default()
                    .extend(
                        values
                            .iter()
                            .map(|v| v.as_str().unwrap().parse::<i64>().unwrap()),
                    );
            }
        }
    }
    let mut wrong = Vec::new();
    for (var, param) in &vars {
        let p = &params[param.as_str()];
        let int = |k: &str| p[k].as_i64();
        let min = int("MinValue").unwrap_or_else(|| panic!("{param}: no MinValue"));
        let max = int("MaxValue");
        let mut tried = vec![min, min + 1, int("Default").unwrap()];
        tried.extend(match max {
            Some(m) => vec![m - 1, m],
            None => vec![1_000_000_000_000],
        });
        // CloudFormation refuses what is outside the bounds (a parameter
        // bounded to one value, BatchesPerStreamShard, has no min + 1).
        tried.retain(|v| *v >= min && max.is_none_or(|m| *v <= m));
        for v in tried {
            if refused.get(param).is_some_and(|r| r.contains(&v)) {
                continue;
            }
            // The tables are named by the template (`!Ref`s of its own).
            let mut env = BTreeMap::from([
                ("COUNTERS_TABLE".to_owned(), "counters".to_owned()),
                ("LIKES_TABLE".to_owned(), "likes".to_owned()),
                (var.clone(), v.to_string()),
            ]);
            match var.as_str() {
                "HOT_LIKES_PER_SEC" => {
                    env.insert("COOL_LIKES_PER_SEC".into(), (v - 1).max(1).to_string())
                }
                "COOL_LIKES_PER_SEC" => env.insert("HOT_LIKES_PER_SEC".into(), (v + 1).to_string()),
                _ => None,
            };
            if let Err(e) = likes::config::Config::from_lookup(|k| env.get(k).cloned()) {
                wrong.push(format!("{param} = {v} ({var}): {e}"));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

/// `make lambda-build` (docs/deploying.md) builds every function the
/// template deploys, by its package name (the `CodeUri` folder's). Before:
/// `view` and `aggregate-views` were left out, so a deploy from that
/// build had no bootstrap for them.
#[test]
fn make_lambda_build_builds_every_function_of_the_template() {
    let make = std::fs::read_to_string(repo_root().join("Makefile")).unwrap();
    let recipe = make
        .split("\nlambda-build:")
        .nth(1)
        .expect("a lambda-build target")
        .lines()
        .nth(1)
        .unwrap();
    let built: BTreeSet<&str> = recipe
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "-p")
        .map(|w| w[1])
        .collect();
    let doc = template_doc();
    let mut deployed = BTreeSet::new();
    for (_, res) in doc["Resources"].as_mapping().unwrap() {
        if res["Type"] == "AWS::Serverless::Function" {
            let uri = res["Properties"]["CodeUri"].as_str().unwrap();
            let toml = std::fs::read_to_string(repo_root().join(uri).join("Cargo.toml")).unwrap();
            let name = toml
                .lines()
                .find_map(|l| l.strip_prefix("name = "))
                .unwrap()
                .trim_matches('"')
                .to_owned();
            deployed.insert(name);
        }
    }
    let built: BTreeSet<String> = built.into_iter().map(str::to_owned).collect();
    assert_eq!(built, deployed);
}

// ---- Views: the stream, its producer and its aggregator -------------------

fn template_doc() -> yaml_serde::Value {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    yaml_serde::from_str(&text).unwrap()
}

/// `!<tag> <value>` (`!Ref X`, `!GetAtt X.Arn`).
fn is_tagged(v: &yaml_serde::Value, tag: &str, value: &str) -> bool {
    matches!(v, yaml_serde::Value::Tagged(t)
        if t.tag == tag && t.value.as_str() == Some(value))
}

/// The `Type: Kinesis` event of `function`, if it has one.
fn kinesis_event(function: &str) -> Option<yaml_serde::Value> {
    template_doc()["Resources"][function]["Properties"]["Events"]
        .as_mapping()?
        .values()
        .find(|e| e["Type"] == "Kinesis")
        .cloned()
}

/// Every policy statement of `function`: its own role's inline policies
/// (`Role: !GetAtt <Role>.Arn`) or the `Policies` SAM puts in the role it
/// makes, each `!If [cond, statement, !Ref AWS::NoValue]` as its statement.
fn all_statements(doc: &yaml_serde::Value, function: &str) -> Vec<yaml_serde::Value> {
    let props = &doc["Resources"][function]["Properties"];
    let documents: Vec<yaml_serde::Value> = match &props["Role"] {
        yaml_serde::Value::Tagged(t) => {
            let role = t.value.as_str().unwrap().trim_end_matches(".Arn");
            doc["Resources"][role]["Properties"]["Policies"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|p| p["PolicyDocument"].clone())
                .collect()
        }
        _ => props["Policies"].as_sequence().cloned().unwrap_or_default(),
    };
    documents
        .iter()
        .flat_map(|d| d["Statement"].as_sequence().cloned().unwrap_or_default())
        .map(|st| match st {
            yaml_serde::Value::Tagged(t) if t.tag == "!If" => t.value[1].clone(),
            other => other,
        })
        .collect()
}

fn functions(doc: &yaml_serde::Value) -> Vec<String> {
    doc["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::Serverless::Function")
        .map(|(id, _)| id.as_str().unwrap().to_owned())
        .collect()
}

/// The view function puts views onto the stream and may do nothing else:
/// one statement, `kinesis:PutRecords` on the stream's ARN. No other
/// function may put records there, and no function holds a KMS grant: the
/// stream's key is the AWS managed `alias/aws/kinesis`, whose key policy
/// lets the account use it through Kinesis (a grant would only widen).
#[test]
fn the_view_function_may_only_put_records_on_the_views_stream() {
    let doc = template_doc();
    let props = &doc["Resources"]["ViewFunction"]["Properties"];
    assert_eq!(props["CodeUri"], "functions/view");
    assert!(
        props["Role"].is_null(),
        "SAM's role: basic execution and X-Ray, and the statement below"
    );
    assert!(is_tagged(
        &props["Environment"]["Variables"]["VIEWS_STREAM"],
        "!Ref",
        "ViewsStream"
    ));
    let statements = all_statements(&doc, "ViewFunction");
    let [st] = &statements[..] else {
        panic!("ViewFunction: one statement, not {statements:?}");
    };
    assert_eq!(st["Effect"], "Allow");
    assert_eq!(strings(&st["Action"]), ["kinesis:PutRecords"]);
    assert!(
        is_tagged(&st["Resource"], "!GetAtt", "ViewsStream.Arn"),
        "{st:?}"
    );
    assert!(st["Condition"].is_null(), "{st:?}");
    for function in functions(&doc) {
        for st in all_statements(&doc, &function) {
            let actions = strings(&st["Action"]);
            assert!(
                !actions.iter().any(|a| a.starts_with("kms:")),
                "{function}: {actions:?}"
            );
            if function != "ViewFunction" {
                assert!(
                    !actions.iter().any(|a| a.starts_with("kinesis:Put")),
                    "{function}: {actions:?}"
                );
            }
        }
    }
    // POST /views: a user route, authorised as the like route is.
    let event = |function: &str, path: &str| {
        doc["Resources"][function]["Properties"]["Events"]
            .as_mapping()
            .unwrap()
            .values()
            .find(|e| e["Properties"]["Path"] == path)
            .unwrap_or_else(|| panic!("{function}: no route {path}"))
            .clone()
    };
    let view = event("ViewFunction", "/views");
    let like = event("LikeFunction", "/reels/{reel_id}/like");
    assert_eq!(view["Type"], "HttpApi");
    assert_eq!(view["Properties"]["Auth"], like["Properties"]["Auth"]);
}

/// The views aggregator applies Kinesis records with the likes
/// aggregator's exactly-once core (a checkpoint per stream shard, a
/// high-water mark moved in the chunk's transaction), so its event source
/// is set as the likes aggregator's is: from the start of the stream, one
/// batch per shard at a time, whole batches retried and never bisected
/// (halves may come newer half first, which the checkpoint would skip),
/// partial failures reported, a batch given up into a queue of its own
/// (metadata enough to replay it from the stream, within the record age
/// that the stream's 24 hours leave room for). Its role reads that stream
/// only, and lists its shards (the code reads a child shard's parents).
#[test]
fn the_views_aggregator_reads_the_views_stream_as_the_likes_aggregator_reads_its_own() {
    let doc = template_doc();
    let res = &doc["Resources"];
    let props = &res["ViewAggregateFunction"]["Properties"];
    assert_eq!(props["CodeUri"], "functions/aggregate-views");
    let vars = &props["Environment"]["Variables"];
    assert!(is_tagged(&vars["VIEWS_TABLE"], "!Ref", "ViewsTable"));
    assert!(is_tagged(&vars["VIEWS_STREAM"], "!Ref", "ViewsStream"));
    let ev = kinesis_event("ViewAggregateFunction").expect("a Kinesis event");
    let p = &ev["Properties"];
    assert!(
        is_tagged(&p["Stream"], "!GetAtt", "ViewsStream.Arn"),
        "{p:?}"
    );
    assert_eq!(p["StartingPosition"], "TRIM_HORIZON");
    assert_eq!(p["BatchSize"], 1000);
    assert_eq!(p["MaximumBatchingWindowInSeconds"], 1);
    assert!(is_tagged(
        &p["ParallelizationFactor"],
        "!Ref",
        "BatchesPerStreamShard"
    ));
    assert_eq!(
        strings(&p["FunctionResponseTypes"]),
        ["ReportBatchItemFailures"]
    );
    assert_eq!(p["MaximumRetryAttempts"], 10);
    assert_eq!(p["BisectBatchOnFunctionError"], false);
    // The same settings as the likes aggregator's DynamoDB event.
    let likes = res["AggregateFunction"]["Properties"]["Events"]
        .as_mapping()
        .unwrap()
        .values()
        .find(|e| e["Type"] == "DynamoDB")
        .expect("the likes aggregator's stream event");
    for key in [
        "StartingPosition",
        "BatchSize",
        "MaximumBatchingWindowInSeconds",
        "ParallelizationFactor",
        "FunctionResponseTypes",
        "MaximumRetryAttempts",
        "BisectBatchOnFunctionError",
    ] {
        assert_eq!(p[key], likes["Properties"][key], "{key}");
    }
    // A record given up is still in the stream (24 hours) to replay.
    assert!(is_tagged(
        &p["MaximumRecordAgeInSeconds"],
        "!Ref",
        "ViewsMaxRecordAgeSecs"
    ));
    let age = &doc["Parameters"]["ViewsMaxRecordAgeSecs"];
    let retention = res["ViewsStream"]["Properties"]["RetentionPeriodHours"]
        .as_i64()
        .unwrap()
        * 3600;
    assert!(age["MinValue"].as_i64() >= Some(60), "{age:?}");
    assert!(age["MaxValue"].as_i64() <= Some(retention), "{age:?}");
    assert!(age["Default"].as_i64() < Some(retention), "{age:?}");
    // ... and long enough after the give-up for a repair: see
    // `a_views_range_given_up_at_the_largest_age_can_still_be_repaired`.
    let on_failure = &p["DestinationConfig"]["OnFailure"];
    assert_eq!(on_failure["Type"], "SQS");
    assert!(is_tagged(
        &on_failure["Destination"],
        "!GetAtt",
        "ViewsOnFailureQueue.Arn"
    ));
    let queue = &res["ViewsOnFailureQueue"];
    assert_eq!(queue["Type"], "AWS::SQS::Queue");
    assert_eq!(
        queue["Properties"]["SqsManagedSseEnabled"],
        res["AggregateFailures"]["Properties"]["SqsManagedSseEnabled"]
    );
    assert_eq!(queue["Properties"]["SqsManagedSseEnabled"], true);
    // Its role: the stream's reads and shard listing on that stream only,
    // the queue's SendMessage on that queue only.
    let mut kinesis = BTreeSet::new();
    for st in all_statements(&doc, "ViewAggregateFunction") {
        let actions = strings(&st["Action"]);
        let resource = &st["Resource"];
        for a in &actions {
            if a.starts_with("kinesis:") {
                assert!(is_tagged(resource, "!GetAtt", "ViewsStream.Arn"), "{st:?}");
                kinesis.insert(a.clone());
            } else if a.starts_with("sqs:") {
                // The OnFailure destination's send, and the Repairs event
                // source's poll of the same queue.
                assert!(
                    [
                        "sqs:SendMessage",
                        "sqs:ReceiveMessage",
                        "sqs:DeleteMessage",
                        "sqs:GetQueueAttributes"
                    ]
                    .contains(&a.as_str()),
                    "{a}"
                );
                assert!(
                    is_tagged(resource, "!GetAtt", "ViewsOnFailureQueue.Arn"),
                    "{st:?}"
                );
            } else if a.starts_with("dynamodb:") {
                assert!(is_tagged(resource, "!GetAtt", "ViewsTable.Arn"), "{st:?}");
            } else {
                assert!(a.starts_with("xray:"), "{a}: {st:?}");
            }
        }
    }
    assert_eq!(
        kinesis,
        BTreeSet::from(
            [
                "kinesis:DescribeStream",
                "kinesis:DescribeStreamSummary",
                "kinesis:GetRecords",
                "kinesis:GetShardIterator",
                "kinesis:ListShards",
            ]
            .map(str::to_owned)
        )
    );
    // Its alarms: lag, given-up batches, the stream refusing views.
    let alarm = |id: &str| res[id]["Properties"].clone();
    let lag = alarm("ViewsIteratorAgeAlarm");
    assert_eq!(lag["Namespace"], "AWS/Lambda");
    assert_eq!(lag["MetricName"], "IteratorAge");
    assert!(is_tagged(
        &lag["Dimensions"][0]["Value"],
        "!Ref",
        "ViewAggregateFunction"
    ));
    assert_eq!(lag["Statistic"], "Maximum");
    assert_eq!(lag["Threshold"], 60000);
    assert_eq!(lag["ComparisonOperator"], "GreaterThanThreshold");
    assert_eq!(
        lag["Period"].as_i64().unwrap() * lag["DatapointsToAlarm"].as_i64().unwrap(),
        300
    );
    // Sent, not visible: the Repairs event source takes each message as
    // it comes, so the queue looks empty while its repairs wait.
    let failed = alarm("ViewsOnFailureAlarm");
    assert_eq!(failed["Namespace"], "AWS/SQS");
    assert_eq!(failed["MetricName"], "NumberOfMessagesSent");
    assert!(is_tagged(
        &failed["Dimensions"][0]["Value"],
        "!GetAtt",
        "ViewsOnFailureQueue.QueueName"
    ));
    let put = alarm("ViewsPutThrottledAlarm");
    assert_eq!(put["Namespace"], "AWS/Kinesis");
    assert_eq!(put["MetricName"], "WriteProvisionedThroughputExceeded");
    assert_eq!(put["Dimensions"][0]["Name"], "StreamName");
    assert!(is_tagged(
        &put["Dimensions"][0]["Value"],
        "!Ref",
        "ViewsStream"
    ));
    assert_eq!(put["Threshold"], 0);
    assert_eq!(put["ComparisonOperator"], "GreaterThanThreshold");
}

/// The views stream is encrypted at rest with the AWS managed key, keeps
/// records 24 hours, and is on demand unless `ViewsStreamMode` says
/// PROVISIONED, when (and only when) `ViewsStreamShards` sets its shards.
#[test]
fn the_views_stream_is_encrypted_and_on_demand_by_default() {
    let doc = template_doc();
    let stream = &doc["Resources"]["ViewsStream"];
    assert_eq!(stream["Type"], "AWS::Kinesis::Stream");
    assert!(stream["Condition"].is_null(), "views exist in both modes");
    let p = &stream["Properties"];
    assert_eq!(p["StreamEncryption"]["EncryptionType"], "KMS");
    assert_eq!(p["StreamEncryption"]["KeyId"], "alias/aws/kinesis");
    assert_eq!(p["RetentionPeriodHours"], 24);
    assert!(is_tagged(
        &p["StreamModeDetails"]["StreamMode"],
        "!Ref",
        "ViewsStreamMode"
    ));
    let mode = &doc["Parameters"]["ViewsStreamMode"];
    assert_eq!(mode["Default"], "ON_DEMAND");
    assert_eq!(
        strings(&mode["AllowedValues"]),
        ["ON_DEMAND", "PROVISIONED"]
    );
    let when: yaml_serde::Value = yaml_serde::from_str(
        "!If [ViewsStreamProvisioned, !Ref ViewsStreamShards, !Ref AWS::NoValue]",
    )
    .unwrap();
    assert_eq!(p["ShardCount"], when);
    let provisioned: yaml_serde::Value =
        yaml_serde::from_str("!Equals [!Ref ViewsStreamMode, PROVISIONED]").unwrap();
    assert_eq!(doc["Conditions"]["ViewsStreamProvisioned"], provisioned);
    let outputs = &doc["Outputs"];
    assert!(is_tagged(
        &outputs["ViewsStreamName"]["Value"],
        "!Ref",
        "ViewsStream"
    ));
    assert!(is_tagged(
        &outputs["ViewsTableName"]["Value"],
        "!Ref",
        "ViewsTable"
    ));
}

/// The views table is one the local stack makes from the template (a
/// `pk`/`sk` key, TTL on `expires_at`, no index, no stream), kept as the
/// likes table is, read by the read function and written by the views
/// aggregator alone, inside transactions only.
#[test]
fn the_views_table_is_made_kept_and_written_as_it_should() {
    let t = template();
    let views = t.table_for_env("VIEWS_TABLE").expect("VIEWS_TABLE");
    assert_eq!(views.logical_id, "ViewsTable");
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(views.key_schema, pairs(&[("pk", "HASH"), ("sk", "RANGE")]));
    assert_eq!(views.attributes, pairs(&[("pk", "S"), ("sk", "S")]));
    assert_eq!(views.ttl_attribute.as_deref(), Some("expires_at"));
    assert!(views.indexes.is_empty());
    assert_eq!(views.stream_view_type, None);
    let doc = template_doc();
    let (table, likes) = (
        &doc["Resources"]["ViewsTable"],
        &doc["Resources"]["LikesTable"],
    );
    for key in ["DeletionPolicy", "UpdateReplacePolicy"] {
        assert_eq!(table[key], likes[key], "{key}");
    }
    for key in [
        "BillingMode",
        "DeletionProtectionEnabled",
        "PointInTimeRecoverySpecification",
        "SSESpecification",
    ] {
        assert_eq!(table["Properties"][key], likes["Properties"][key], "{key}");
    }
    let mut readers = BTreeSet::new();
    for st in dynamodb_statements() {
        if !st.resources.iter().any(|r| r == "ViewsTable") {
            continue;
        }
        assert_eq!(st.resources, ["ViewsTable"], "{st:?}");
        let writes: Vec<&String> = st
            .actions
            .iter()
            .filter(|a| {
                !matches!(
                    a.as_str(),
                    "dynamodb:GetItem"
                        | "dynamodb:BatchGetItem"
                        | "dynamodb:Query"
                        | "dynamodb:Scan"
                )
            })
            .collect();
        if writes.is_empty() {
            readers.insert(st.function.clone());
            continue;
        }
        // Stream mode's writer items ("l#…", WRITERS_TABLE points here):
        // the aggregator's chunk updates and the readers' folds, each in a
        // transaction and on those partitions alone.
        // A reader's spread of a hot reel: the registry's one partition,
        // and the parts attribute of part 0's base (outside a transaction,
        // that attribute alone: see above).
        if st.leading_keys.as_deref() == Some(&[likes::keys::LIKES_SPREAD_KEY.to_owned()][..]) {
            assert!(
                st.actions
                    .iter()
                    .all(|a| a == "dynamodb:Query" || a == "dynamodb:PutItem"),
                "{st:?}"
            );
            continue;
        }
        if st.sid == "WriterSpreadParts" {
            assert_eq!(st.actions, ["dynamodb:UpdateItem"], "{st:?}");
            assert_eq!(
                st.leading_keys.as_deref(),
                Some(&["l#*".to_owned()][..]),
                "{st:?}"
            );
            continue;
        }
        if st.leading_keys.as_deref() == Some(&["l#*".to_owned()][..]) {
            assert_eq!(
                st.enclosing.as_deref(),
                Some(&["TransactWriteItems".to_owned()][..]),
                "{st:?}"
            );
            continue;
        }
        // The likes' trending sketches ("top#likes#…"): in transactional
        // mode, a like function instance's own puts (no transaction: nothing
        // is written with them)...
        if st.sid == "TrendingSketchPut" {
            assert_eq!(st.function, "LikeFunction", "{st:?}");
            assert_eq!(st.actions, ["dynamodb:PutItem"], "{st:?}");
            assert_eq!(st.when.as_deref(), Some("TransactionalCounting"), "{st:?}");
            assert_eq!(
                st.leading_keys.as_deref(),
                Some(&["top#likes#*".to_owned()][..]),
                "{st:?}"
            );
            continue;
        }
        // ... and in stream mode the likes' aggregator's, in its chunk's
        // transaction only.
        if st.leading_keys.as_deref() == Some(&["top#likes#*".to_owned()][..]) {
            assert_eq!(st.function, "AggregateFunction", "{st:?}");
            assert_eq!(st.actions, ["dynamodb:PutItem"], "{st:?}");
            assert_eq!(
                st.enclosing.as_deref(),
                Some(&["TransactWriteItems".to_owned()][..]),
                "{st:?}"
            );
            continue;
        }
        // The known reels (shared/src/known): registrations, put by the
        // writers that count a reel first (likes, views), and the set's
        // segments and meta item, put by the warm function's fold alone.
        if st.sid == "KnownReelsRegister" || st.sid == "KnownReelsFold" {
            let (functions, keys): (&[&str], &str) = if st.sid == "KnownReelsRegister" {
                (
                    &["LikeFunction", "AggregateFunction", "ViewAggregateFunction"],
                    "x~new#*",
                )
            } else {
                (&["WarmFunction"], likes::keys::known::SET_KEY)
            };
            assert!(functions.contains(&st.function.as_str()), "{st:?}");
            assert_eq!(st.actions, ["dynamodb:PutItem"], "{st:?}");
            assert_eq!(
                st.leading_keys.as_deref(),
                Some(&[keys.to_owned()][..]),
                "{st:?}"
            );
            continue;
        }
        assert_eq!(st.function, "ViewAggregateFunction", "{st:?}");
        // Its writes are transactions, but for a repair's lease (one
        // UpdateItem on the lease items alone) and the writers' seals (one
        // PutItem on the seal items alone).
        if st.enclosing.is_none() {
            let (action, keys) = if st.actions == ["dynamodb:PutItem"] {
                ("dynamodb:PutItem", "seal#*")
            } else {
                ("dynamodb:UpdateItem", "lease#*")
            };
            assert_eq!(st.actions, [action], "{st:?}");
            assert_eq!(
                st.leading_keys.as_deref(),
                Some(&[keys.to_owned()][..]),
                "{st:?}"
            );
            continue;
        }
        assert_eq!(
            st.enclosing.as_deref(),
            Some(&["TransactWriteItems".to_owned()][..]),
            "{st:?}"
        );
    }
    // Views are read by these two; every function that sums a reel's
    // likes reads the writer partitions too (stream mode), and the likes'
    // aggregator the spread registry.
    assert_eq!(
        readers,
        BTreeSet::from(
            [
                "AggregateFunction",
                "LikeFunction",
                "ReadFunction",
                "ReconcileFunction",
                "ReshardFunction",
                "ViewAggregateFunction",
                "WarmFunction",
            ]
            .map(str::to_owned)
        )
    );
}

/// The effective environment variable `var` of `function`: its own, else
/// the `Globals` one.
fn function_env(doc: &yaml_serde::Value, function: &str, var: &str) -> yaml_serde::Value {
    let own = &doc["Resources"][function]["Properties"]["Environment"]["Variables"][var];
    if own.is_null() {
        doc["Globals"]["Function"]["Environment"]["Variables"][var].clone()
    } else {
        own.clone()
    }
}

/// Issue 35: with a `ParallelizationFactor` above 1, Lambda hands an
/// aggregator two batches of one stream shard at once, and its checkpoint
/// (a high-water mark) makes the one applied second skip its records below
/// the other's last (batch A = …10, …30, …50 and batch B = …20, …40, …60,
/// six likes of one reel, counted 4: `tests/tests/stream_parallel.rs`).
/// So the factor of every stream event source (the likes aggregator's
/// DynamoDB one, the views aggregator's Kinesis one) comes from one
/// parameter, bounded to 1 and refused otherwise by a rule, and the same
/// parameter reaches the function as `BATCHES_PER_STREAM_SHARD`, which the
/// functions refuse at start-up unless 1 (a mapping edited by hand along
/// with the variable does not start), and the local event sources refuse
/// too. Before: a literal 1 on each event, which nothing else saw.
#[test]
fn every_stream_event_source_takes_one_batch_per_shard_from_one_parameter() {
    use yaml_serde::Value;
    let doc = template_doc();
    let param = "BatchesPerStreamShard";
    let mut sources = BTreeSet::new();
    for f in functions(&doc) {
        let events = &doc["Resources"][f.as_str()]["Properties"]["Events"];
        for (name, ev) in events.as_mapping().into_iter().flatten() {
            let ty = ev["Type"].as_str().unwrap_or_default();
            // Streams only: a queue (the views' Repairs event, SQS) has
            // no shards, and no ParallelizationFactor.
            if !["DynamoDB", "Kinesis", "MSK", "MQ", "SelfManagedKafka"].contains(&ty) {
                continue;
            }
            let p = &ev["Properties"];
            assert!(
                is_tagged(&p["ParallelizationFactor"], "!Ref", param),
                "{f}.{name:?}: ParallelizationFactor {:?}, not !Ref {param}",
                p["ParallelizationFactor"]
            );
            assert!(
                is_tagged(
                    &function_env(&doc, &f, "BATCHES_PER_STREAM_SHARD"),
                    "!Ref",
                    param
                ),
                "{f}: BATCHES_PER_STREAM_SHARD is not what its event source takes"
            );
            sources.insert(format!("{f}:{ty}"));
        }
    }
    assert_eq!(
        sources,
        BTreeSet::from(
            [
                "AggregateFunction:DynamoDB",
                "ViewAggregateFunction:Kinesis"
            ]
            .map(str::to_owned)
        )
    );
    // The parameter: 1, and nothing else.
    let p = &doc["Parameters"][param];
    assert_eq!(p["Type"], "Number");
    for key in ["Default", "MinValue", "MaxValue"] {
        assert_eq!(p[key], 1, "{param}.{key}");
    }
    // A rule says so in words: `!Equals [!Ref BatchesPerStreamShard, "1"]`.
    let wanted: Value = yaml_serde::from_str(&format!("!Equals [!Ref {param}, \"1\"]")).unwrap();
    let rules: Vec<&Value> = doc["Rules"]
        .as_mapping()
        .into_iter()
        .flatten()
        .flat_map(|(_, r)| r["Assertions"].as_sequence().into_iter().flatten())
        .filter(|a| a["Assert"] == wanted)
        .collect();
    assert_eq!(rules.len(), 1, "no rule refusing {param} other than 1");
    let why = rules[0]["AssertDescription"].as_str().unwrap();
    assert!(why.contains("high-water mark"), "{why}");
    // What the functions get is what they accept: 1 only.
    let env = |v: &str| {
        let env = BTreeMap::from([
            ("COUNTERS_TABLE", "counters"),
            ("LIKES_TABLE", "likes"),
            ("BATCHES_PER_STREAM_SHARD", v),
        ]);
        likes::config::Config::from_lookup(|k| env.get(k).map(|v| v.to_string()))
    };
    assert!(env(&p["Default"].as_i64().unwrap().to_string()).is_ok());
    let refused = env("2").unwrap_err().to_string();
    assert!(refused.contains("high-water mark"), "{refused}");
    assert_eq!(likes::config::MAX_BATCHES_PER_STREAM_SHARD, 1);
    // And the local stack's sources, which read the template, take it.
    assert!(!template().stream_sources.is_empty());
    assert!(
        likes_local::kinesis::KinesisSourceDef::load(&repo_root().join("template.yaml")).is_ok()
    );
}

/// Issue 35: a views range given up at `ViewsMaxRecordAgeSecs` is repaired
/// from the stream, whose records are gone 24 hours after they arrived; a
/// repair may start `VIEWS_REPAIR_AFTER_SECS` (900 s) after the give-up,
/// or, when copies of its records arriving up to `VIEWS_DEDUP_SECS`
/// (300 s, and 10 s of skew) later were given up too, once those are that
/// age and 900 s old. The largest age the template takes (and the
/// functions, `VIEWS_MAX_RECORD_AGE_MAX_SECS`) leaves hours for that
/// repair. Before: 86400, which left none.
#[test]
fn a_views_range_given_up_at_the_largest_age_can_still_be_repaired() {
    let doc = template_doc();
    let age = &doc["Parameters"]["ViewsMaxRecordAgeSecs"];
    let max = age["MaxValue"].as_u64().unwrap();
    assert_eq!(max, likes::config::VIEWS_MAX_RECORD_AGE_MAX_SECS);
    let retention = doc["Resources"]["ViewsStream"]["Properties"]["RetentionPeriodHours"]
        .as_u64()
        .unwrap()
        * 3600;
    let views = likes::views::ViewsConfig::from_lookup(|_| None).unwrap();
    let (repair_after, dedup) = (
        views.repair_after.as_secs(),
        views.dedup_window.as_secs() + 10,
    );
    // The latest a repair may have to wait for, after the range's first
    // record arrived (an invocation of the batch may run 60 s past the age).
    let earliest_repair = (max + 60 + repair_after).max(dedup + max + repair_after);
    let left = retention - earliest_repair;
    assert!(
        left >= 6 * 3600,
        "ViewsMaxRecordAgeSecs up to {max} leaves {left} s to repair a given-up range"
    );
    // The functions refuse what the template refuses.
    let env = |v: u64| {
        let env = BTreeMap::from([
            ("COUNTERS_TABLE", "counters".to_owned()),
            ("LIKES_TABLE", "likes".to_owned()),
            ("VIEWS_MAX_RECORD_AGE_SECS", v.to_string()),
        ]);
        likes::config::Config::from_lookup(|k| env.get(k).cloned())
    };
    assert!(env(max).is_ok());
    assert!(env(max + 1).is_err());
    assert!(env(retention).is_err());
}

/// Issue 36: views have no truth table, so the stream (the records not yet
/// counted, or given up and not yet repaired) and the OnFailure queue (which
/// ranges were given up) are kept when the stack is deleted or the
/// resource replaced, as the tables are. Before: deleted with the stack.
#[test]
fn the_views_stream_and_its_failure_queue_outlive_the_stack() {
    let doc = template_doc();
    for id in [
        "ViewsStream",
        "ViewsOnFailureQueue",
        "ViewsRepairDeadLetterQueue",
        "ViewsTable",
    ] {
        let r = &doc["Resources"][id];
        assert_eq!(r["DeletionPolicy"], "Retain", "{id}");
        assert_eq!(r["UpdateReplacePolicy"], "Retain", "{id}");
    }
}

/// Issue 36: `/healthz` answers monitors during a flood. It has a throttle
/// of its own (`HealthThrottleRate`, `HealthThrottleBurst`): its route key
/// (`ANY /healthz`) gets a token bucket no other route draws from, so a
/// flood of unmatched paths ($default, the stage default's 10 a second) or
/// of any other route cannot take its requests, and a flood of `/healthz`
/// cannot take the read routes'. The throttle is small (below the read
/// routes', each request a read function invocation), yet above a flood of
/// about 30 a second, which then leaves the monitors room. Before: it shared
/// the stage default with $default (10 a second), so 30 unmatched requests
/// a second could starve it (if that default is one bucket for the
/// routes without their own) and 30 of its own always did.
#[test]
fn healthz_has_a_small_throttle_of_its_own() {
    let doc = template_doc();
    let res = &doc["Resources"];
    let mut health = Vec::new();
    for f in functions(&doc) {
        let events = &res[f.as_str()]["Properties"]["Events"];
        for (_, ev) in events.as_mapping().into_iter().flatten() {
            if ev["Type"] != "HttpApi" {
                continue;
            }
            let p = &ev["Properties"];
            let route = &p["RouteSettings"];
            let uses_health = ["ThrottlingRateLimit", "ThrottlingBurstLimit"]
                .iter()
                .any(|k| matches!(&route[*k], yaml_serde::Value::Tagged(t) if t.value.as_str().is_some_and(|v| v.starts_with("HealthThrottle"))));
            if p["Path"] == "/healthz" {
                assert_eq!(f, "ReadFunction");
                assert_eq!(p["Auth"]["Authorizer"], "NONE");
                assert!(is_tagged(
                    &route["ThrottlingRateLimit"],
                    "!Ref",
                    "HealthThrottleRate"
                ));
                assert!(is_tagged(
                    &route["ThrottlingBurstLimit"],
                    "!Ref",
                    "HealthThrottleBurst"
                ));
                health.push(p["Path"].clone());
            } else {
                // No other route shares its bucket's settings, and every
                // route has its own but $default (the stage default).
                assert!(!uses_health, "{:?} uses /healthz's throttle", p["Path"]);
                assert!(
                    p["Path"] == "$default" || route.is_mapping(),
                    "{:?}: no throttle of its own",
                    p["Path"]
                );
            }
        }
    }
    assert_eq!(health.len(), 1, "one /healthz route");
    let stage = &res["LikesApi"]["Properties"]["DefaultRouteSettings"];
    assert!(is_tagged(
        &stage["ThrottlingRateLimit"],
        "!Ref",
        "DefaultThrottleRate"
    ));
    let params = &doc["Parameters"];
    let default = |p: &str| params[p]["Default"].as_u64().unwrap();
    let (rate, burst) = (
        default("HealthThrottleRate"),
        default("HealthThrottleBurst"),
    );
    assert!((30..=100).contains(&rate), "HealthThrottleRate {rate}");
    assert!(burst >= rate, "HealthThrottleBurst {burst}");
    assert!(rate < default("ReadThrottleRate"));
    assert!(rate > default("DefaultThrottleRate"));
}

// Every action granted is one its function's code performs: a test that
// reads the code, in a room of its own (template/code.rs).
#[path = "template/code.rs"]
mod code;

/// Issue 36, "Admin and erasure": IAM authorization admits any principal
/// of the account, so the functions admit only allowlisted ones, from two
/// parameters that default to nobody; erasure has its own list. And the
/// user routes' JWT scope is required by default (an ID token or another
/// client's token no longer passes), on every route of the JWT authorizer
/// and again in the functions that serve them (`JWT_SCOPE`). Before: no
/// allowlist parameters, and `JwtAuthorizationScope` defaulted to empty.
#[test]
fn admin_and_erasure_are_allowlisted_and_the_jwt_scope_is_required_by_default() {
    use yaml_serde::Value;
    let doc = template_doc();
    let params = &doc["Parameters"];
    for (param, var, function) in [
        ("AdminPrincipals", "ADMIN_PRINCIPALS", "ReshardFunction"),
        ("ErasurePrincipals", "ERASURE_PRINCIPALS", "LikeFunction"),
    ] {
        let p = &params[param];
        assert_eq!(p["Type"], "String", "{param}");
        assert_eq!(p["Default"], "", "{param}: empty, nobody, by default");
        assert!(is_tagged(&function_env(&doc, function, var), "!Ref", param));
        // Only the function that serves the routes gets the list.
        for f in functions(&doc).iter().filter(|f| *f != function) {
            assert!(function_env(&doc, f, var).is_null(), "{f} gets {var}");
        }
    }
    // Erasure is the like function's, resizes the reshard function's.
    let erasure = &doc["Resources"]["LikeFunction"]["Properties"]["Events"]["EraseUserLikes"];
    assert_eq!(
        erasure["Properties"]["Path"],
        "/admin/users/{user_id}/likes"
    );

    let scope = params["JwtAuthorizationScope"]["Default"]
        .as_str()
        .expect("a default scope");
    assert!(
        !scope.is_empty() && !scope.contains(char::is_whitespace) && scope.contains('/'),
        "a resource server's scope, identifier/name: {scope:?}"
    );
    assert_eq!(scope, likes::config::access::DEFAULT_JWT_SCOPE);
    let res = &doc["Resources"];
    let api = &res["LikesApi"]["Properties"]["Auth"];
    assert_eq!(api["DefaultAuthorizer"], "JwtAuthorizer");
    let [Value::Tagged(t)] = api["Authorizers"]["JwtAuthorizer"]["AuthorizationScopes"]
        .as_sequence()
        .expect("a list")
        .as_slice()
    else {
        panic!("one scope");
    };
    assert_eq!(t.tag, "!If");
    assert!(is_tagged(&t.value[1], "!Ref", "JwtAuthorizationScope"));
    let mut jwt_routes = 0;
    for f in functions(&doc) {
        let mut serves_jwt = false;
        for (_, ev) in res[f.as_str()]["Properties"]["Events"]
            .as_mapping()
            .into_iter()
            .flatten()
        {
            if ev["Type"] != "HttpApi" {
                continue;
            }
            let auth = &ev["Properties"]["Auth"];
            let jwt = match auth["Authorizer"].as_str() {
                None | Some("JwtAuthorizer") => true,
                Some("NONE" | "AWS_IAM") => false,
                Some(other) => panic!("{f}: authorizer {other}"),
            };
            if !jwt {
                continue;
            }
            jwt_routes += 1;
            serves_jwt = true;
            // A route's own AuthorizationScopes would replace the
            // authorizer's: none may drop the scope.
            assert!(
                auth["AuthorizationScopes"].is_null(),
                "{f} {:?}: scopes of its own",
                ev["Properties"]["Path"]
            );
        }
        if serves_jwt {
            assert!(
                is_tagged(
                    &function_env(&doc, &f, "JWT_SCOPE"),
                    "!Ref",
                    "JwtAuthorizationScope"
                ),
                "{f} serves JWT routes without JWT_SCOPE"
            );
        }
    }
    assert!(jwt_routes >= 6, "{jwt_routes} JWT routes");

    // The defaults, as a function inside Lambda reads them: the scope
    // required, nobody allowed.
    let env = BTreeMap::from([
        ("COUNTERS_TABLE", "c".to_owned()),
        ("LIKES_TABLE", "l".to_owned()),
        ("AWS_LAMBDA_FUNCTION_NAME", "likes-like".to_owned()),
        ("SHARD_KEY", "k".repeat(32)),
        ("JWT_SCOPE", scope.to_owned()),
        ("ADMIN_PRINCIPALS", String::new()),
        ("ERASURE_PRINCIPALS", String::new()),
    ]);
    let config = likes::Config::from_lookup(|k| env.get(k).cloned()).unwrap();
    assert_eq!(config.access.jwt_scope.as_deref(), Some(scope));
    assert!(config.access.admin.is_empty() && config.access.erasure.is_empty());
}

/// Issue 35: repairs are automatic. The OnFailure queue is an SQS event
/// source of the views aggregator (one message per invocation, partial
/// batch answers, SQS's minimum concurrency); its visibility timeout, the
/// delay of a repair's next attempt, is at least the function's timeout
/// (Lambda refuses the mapping otherwise) and 6 times it (Lambda's
/// advice); a message still failing after a day of deliveries goes to an
/// encrypted, retained, alarmed dead-letter queue, on the dashboard.
/// Before: no event source; an operator invoked the function with each
/// message by hand.
#[test]
fn the_views_on_failure_queue_feeds_the_repairs() {
    let doc = template_doc();
    let res = &doc["Resources"];
    let f = &res["ViewAggregateFunction"]["Properties"];
    let sqs: Vec<&yaml_serde::Value> = f["Events"]
        .as_mapping()
        .unwrap()
        .values()
        .filter(|e| e["Type"] == "SQS")
        .collect();
    assert_eq!(sqs.len(), 1, "one SQS event");
    let p = &sqs[0]["Properties"];
    assert!(is_tagged(&p["Queue"], "!GetAtt", "ViewsOnFailureQueue.Arn"));
    assert_eq!(p["BatchSize"], 1);
    assert_eq!(
        strings(&p["FunctionResponseTypes"]),
        vec!["ReportBatchItemFailures".to_owned()]
    );
    assert_eq!(p["ScalingConfig"]["MaximumConcurrency"], 2);
    let q = &res["ViewsOnFailureQueue"]["Properties"];
    let timeout = f["Timeout"].as_i64().unwrap();
    let visibility = q["VisibilityTimeout"].as_i64().unwrap();
    assert!(visibility >= 6 * timeout, "{visibility} < 6 × {timeout}");
    let redrive = &q["RedrivePolicy"];
    assert!(is_tagged(
        &redrive["deadLetterTargetArn"],
        "!GetAtt",
        "ViewsRepairDeadLetterQueue.Arn"
    ));
    // Deliveries for a day at least: the longest a repair may wait is
    // about ViewsMaxRecordAgeSecs' largest value (12 h) past the give-up.
    let receives = redrive["maxReceiveCount"].as_i64().unwrap();
    let retention = res["ViewsStream"]["Properties"]["RetentionPeriodHours"]
        .as_i64()
        .unwrap()
        * 3600;
    assert!(
        receives * visibility >= retention,
        "{receives} × {visibility}"
    );
    let max_age = doc["Parameters"]["ViewsMaxRecordAgeSecs"]["MaxValue"]
        .as_i64()
        .unwrap();
    assert!(receives * visibility > max_age + 900 + 300);
    // Messages are kept past the time they may wait.
    assert!(q["MessageRetentionPeriod"].as_i64().unwrap() >= 2 * retention);
    let dlq = &res["ViewsRepairDeadLetterQueue"];
    assert_eq!(dlq["Type"], "AWS::SQS::Queue");
    assert_eq!(dlq["Properties"]["SqsManagedSseEnabled"], true);
    assert_eq!(
        dlq["Properties"]["MessageRetentionPeriod"],
        q["MessageRetentionPeriod"]
    );
    let alarm = &res["ViewsRepairDeadLetterAlarm"]["Properties"];
    assert_eq!(alarm["Namespace"], "AWS/SQS");
    assert_eq!(alarm["MetricName"], "ApproximateNumberOfMessagesVisible");
    assert!(is_tagged(
        &alarm["Dimensions"][0]["Value"],
        "!GetAtt",
        "ViewsRepairDeadLetterQueue.QueueName"
    ));
    assert_eq!(alarm["Threshold"], 0);
    assert_eq!(alarm["ComparisonOperator"], "GreaterThanThreshold");
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let body = text.split_once("DashboardBody:").unwrap().1;
    for needle in [
        "${ViewsRepairDeadLetterAlarm.Arn}",
        "${ViewsRepairDeadLetterQueue.QueueName}",
    ] {
        assert!(body.contains(needle), "the dashboard shows {needle}");
    }
}
