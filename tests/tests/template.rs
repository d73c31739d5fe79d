//! `template.yaml` is the one source of truth, and what the local stack
//! serves is what it says: every route answers through the local gateway,
//! every sample event names a route of the template, the tables the stack
//! created have the template's keys, and no function is put in dev auth.

mod common;

use common::{TestStack, repo_root};
use likes_local::template::Template;

fn template() -> Template {
    Template::load(&repo_root().join("template.yaml")).expect("template parses")
}

#[test]
fn the_template_never_enables_dev_auth() {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
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

#[test]
fn every_sample_event_is_a_route_of_the_template() {
    let t = template();
    let mut seen = 0;
    for entry in std::fs::read_dir(repo_root().join("events")).unwrap() {
        let path = entry.unwrap().path();
        let ev: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        if ev.get("requestContext").is_none() {
            // Not an HTTP event: a scheduled invocation (EventBridge's own
            // event, or a schedule's Input, for the reconcile function).
            let scheduled = ev["detail-type"] == "Scheduled Event"
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
        let method = if path.ends_with("/like") {
            "PUT"
        } else {
            "GET"
        };
        let reply = t.send(method, &path, Some("u1"), &[], None).await;
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
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
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
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
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
        assert!(r.code_uri.ends_with("/reshard"), "{r:?}");
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
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(doc["Globals"]["Function"]["Tracing"], "Active");
    let res = &doc["Resources"];
    for alarm in [
        "LikesGivenUpThrottledAlarm",
        "LikesGivenUpContendedAlarm",
        "Api5xxAlarm",
        "ReconcileDriftAlarm",
        "ResizeStuckAlarm",
    ] {
        assert_eq!(res[alarm]["Type"], "AWS::CloudWatch::Alarm", "{alarm}");
        let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
        assert!(readme.contains(alarm), "{alarm} missing from the runbook");
    }
    assert_eq!(
        res["OperationsDashboard"]["Type"],
        "AWS::CloudWatch::Dashboard"
    );
}

/// Reconciliation starts daily (a parameter) and an unfinished run is
/// resumed by a second schedule that never starts one.
#[test]
fn reconciliation_runs_daily_and_resumes() {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
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
