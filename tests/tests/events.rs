//! The handlers on the sample events in `events/` (the same files users pass
//! to `sam local invoke`), exactly as Lambda hands them over: payload format
//! 2.0, identity from the JWT authorizer's claims (access tokens with the
//! template's default scope, `likes/api`), `AUTH_MODE` unset. Also:
//! a forged `x-user-id` is ignored outside dev mode, admin routes need IAM
//! authorization by an allowlisted principal outside dev mode, a token
//! without the scope is refused, the reshard function's entry point tells
//! HTTP events from the schedule (never sleeping past its deadline), the
//! reconcile events (start, resume, dry run) run the job and a bad mode is
//! refused, an unreachable DynamoDB answers 503 quickly, and the views
//! samples: the Kinesis batch applied once, read back by the views routes.

mod common;

use common::{TestStack, repo_root};
use lambda_http::Body;
use likes::App;
use likes::http::{Function, handle};
use likes::store::dynamodb::DynamoStore;
use likes::store::dynamodb::DynamoViews;
use likes::store::{LogPut, LogPutResult, LogStore};
use likes::triggers::{handle_reconcile_event, handle_reshard_event};
use likes::views::ViewsConfig;
use likes::views::aggregate::ViewAggregator;
use likes::views::record::KinesisEvent;
use likes::{AuthMode, Config};
use serde_json::Value;
use std::sync::Arc;

fn event(name: &str) -> lambda_http::Request {
    let path = repo_root().join("events").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    lambda_http::request::from_str(&text)
        .unwrap_or_else(|e| panic!("{name} is not an API Gateway v2 event: {e}"))
}

async fn call(app: &App, f: Function, req: lambda_http::Request) -> (u16, Value) {
    let resp = handle(app, f, req).await;
    let status = resp.status().as_u16();
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let body = match resp.body() {
        Body::Text(t) => serde_json::from_str(t).expect("JSON body"),
        other => panic!("unexpected body {other:?}"),
    };
    (status, body)
}

/// The role whose session signs the admin sample events
/// (`arn:aws:sts::123456789012:assumed-role/likes-operators/ops-admin`).
const OPERATORS_ROLE: &str = "arn:aws:iam::123456789012:role/likes-operators";

/// The production configuration (JWT only, the template's default scope)
/// on the test stack's tables, with the sample events' operator role on
/// the admin allowlist (as `make sam-local` passes `ADMIN_PRINCIPALS`).
fn jwt_app(t: &TestStack) -> App {
    let mut config = t.stack.config.clone();
    config.auth_mode = AuthMode::Jwt;
    config.access = likes::http::Access::from_lookup(
        |k| (k == "ADMIN_PRINCIPALS").then(|| OPERATORS_ROLE.to_owned()),
        true,
    )
    .unwrap();
    App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_events_drive_the_handlers() {
    let t = TestStack::uncached().await;
    let app = jwt_app(&t);

    let (s, b) = call(&app, Function::Like, event("like.json")).await;
    assert_eq!(
        (s, &b),
        (
            200,
            &serde_json::json!({"reel_id": "reel-8841", "liked": true, "changed": true, "count": 1})
        )
    );
    // Lambda (or a client) delivering the same event again: counted once.
    let (s, b) = call(&app, Function::Like, event("like.json")).await;
    assert_eq!(
        (s, b["changed"].as_bool(), b["count"].as_i64()),
        (200, Some(true), Some(1))
    );
    assert_eq!(t.shard_sum("reel-8841").await, 1);

    let (s, b) = call(&app, Function::Read, event("read.json")).await;
    assert_eq!(
        (s, b["count"].as_i64(), b["liked_by_me"].as_bool()),
        (200, Some(1), Some(true))
    );

    let (s, b) = call(&app, Function::Read, event("batch-read.json")).await;
    assert_eq!(
        (s, &b["counts"]),
        (
            200,
            &serde_json::json!({"reel-8841": 1, "reel-17": 0, "reel-99": 0})
        )
    );

    let (s, b) = call(&app, Function::Like, event("unlike.json")).await;
    assert_eq!(
        (
            s,
            b["liked"].as_bool(),
            b["changed"].as_bool(),
            b["count"].as_i64()
        ),
        (200, Some(false), Some(true), Some(0))
    );
    assert_eq!(t.shard_sum("reel-8841").await, 0);

    let (s, b) = call(&app, Function::Read, event("healthz.json")).await;
    assert_eq!((s, b["status"].as_str()), (200, Some("ok")));

    let (s, b) = call(&app, Function::Read, event("not-found.json")).await;
    assert_eq!((s, b["error"]["code"].as_str()), (404, Some("not_found")));

    let (s, b) = call(&app, Function::Like, event("like-no-identity.json")).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );

    let (s, b) = call(&app, Function::Like, event("like-bad-reel.json")).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (400, Some("invalid_reel_id"))
    );

    let (s, b) = call(&app, Function::Like, event("method-not-allowed.json")).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (405, Some("method_not_allowed"))
    );

    // A function only serves its own routes.
    let (s, _) = call(&app, Function::Read, event("like.json")).await;
    assert_eq!(s, 404);
    let (s, _) = call(&app, Function::Like, event("read.json")).await;
    assert_eq!(s, 404);

    assert_eq!(t.like_rows("reel-8841").await, 0);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_events_need_iam_authorization_and_the_schedule_runs() {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0")]).await;
    let app = jwt_app(&t);
    // Signed with IAM, as API Gateway passes it on.
    let (s, b) = call(&app, Function::Reshard, event("admin-shards-post.json")).await;
    assert_eq!(
        (s, b["target"].as_u64(), b["phase"].as_str()),
        (202, Some(8), Some("growing"))
    );
    assert_eq!(b["outcome"], "started");
    let (s, b) = call(&app, Function::Reshard, event("admin-shards-get.json")).await;
    assert_eq!(
        (s, b["read_shards"].as_u64(), b["write_shards"].as_u64()),
        (200, Some(8), Some(1))
    );
    // A user's JWT (or no authorizer at all) is not enough.
    for name in ["admin-shards-get.json", "admin-shards-post.json"] {
        let mut req = event(name);
        req.extensions_mut().clear();
        let (s, b) = call(&app, Function::Reshard, req).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{name}"
        );
    }
    // Signed, but by a principal off the allowlist (or with none): 403,
    // nothing read or written; and erasure wants ERASURE_PRINCIPALS, which
    // the admin role is not on.
    let mut config = app.config.clone();
    config.access.admin = likes::config::access::Principals::from_list(
        "ADMIN_PRINCIPALS",
        "arn:aws:iam::123456789012:role/likes-other",
    )
    .unwrap();
    let strict = App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    );
    let none = {
        let mut c = config.clone();
        c.access.admin = Default::default();
        App::new(c.clone(), DynamoStore::new(t.stack.client.clone(), &c))
    };
    for app in [&strict, &none] {
        for name in ["admin-shards-get.json", "admin-shards-post.json"] {
            let (s, b) = call(app, Function::Reshard, event(name)).await;
            assert_eq!(
                (s, b["error"]["code"].as_str()),
                (403, Some("forbidden")),
                "{name}"
            );
        }
    }
    let text = std::fs::read_to_string(repo_root().join("events/admin-shards-get.json")).unwrap();
    let mut erase: Value = serde_json::from_str(&text).unwrap();
    erase["rawPath"] = "/admin/users/user-42/likes".into();
    erase["routeKey"] = "ANY /admin/users/{user_id}/likes".into();
    erase["requestContext"]["http"]["method"] = "DELETE".into();
    erase["requestContext"]["http"]["path"] = "/admin/users/user-42/likes".into();
    let erase = lambda_http::request::from_str(&erase.to_string()).unwrap();
    let (s, b) = call(&app, Function::Like, erase).await;
    assert_eq!((s, b["error"]["code"].as_str()), (403, Some("forbidden")));
    let (s, b) = call(&app, Function::Reshard, event("admin-shards-get.json")).await;
    assert_eq!((s, b["target"].as_u64()), (200, Some(8)), "{b}");

    let text = std::fs::read_to_string(repo_root().join("events/read.json")).unwrap();
    let mut jwt_event: Value = serde_json::from_str(&text).unwrap();
    jwt_event["rawPath"] = "/admin/reels/reel-8841/shards".into();
    let out = handle_reshard_event(&app, jwt_event, None).await.unwrap();
    assert_eq!(out["statusCode"], 403, "{out}");
    // Other functions do not serve the admin route.
    let (s, _) = call(&app, Function::Read, event("admin-shards-get.json")).await;
    assert_eq!(s, 404);

    // The raw Lambda payloads: an HTTP event answers in payload-2.0 form...
    let text = std::fs::read_to_string(repo_root().join("events/admin-shards-get.json")).unwrap();
    let out = handle_reshard_event(&app, serde_json::from_str(&text).unwrap(), None)
        .await
        .unwrap();
    assert_eq!(out["statusCode"], 200, "{out}");
    let body: Value = serde_json::from_str(out["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["target"], 8);
    // ...and the EventBridge event runs the schedule, answering its summary.
    // Its step is due only after the full production wait (19 s); the run
    // must not sleep past its deadline, so it leaves the step for later.
    let text = std::fs::read_to_string(repo_root().join("events/reshard-schedule.json")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    let out = handle_reshard_event(&app, serde_json::from_str(&text).unwrap(), Some(deadline))
        .await
        .unwrap();
    assert!(std::time::Instant::now() < deadline);
    assert_eq!(
        (out["reels"].as_u64(), out["waiting"].as_u64()),
        (Some(1), Some(1)),
        "{out}"
    );
    assert!(out["duration_ms"].is_u64());
    t.stop().await;
}

/// The warm function's sample event (`events/warm.json`, as `make
/// sam-local` invokes it): one round, then its summary. In transactional
/// mode with nothing liked or viewed, the round ranks and writes the four
/// (empty) lists, likes and views over an hour and a day, and the (empty)
/// warm set. A malformed `rounds` is refused
/// before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warm_sample_event_runs_one_round() {
    let t = TestStack::start(&[("COUNTING", "transactional")]).await;
    let text = std::fs::read_to_string(repo_root().join("events/warm.json")).unwrap();
    let out = likes::triggers::handle_warm_event(
        &t.stack.app,
        &serde_json::from_str(&text).unwrap(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        (&out["rounds"], &out["lists"], &out["errors"]),
        (&1.into(), &4.into(), &0.into()),
        "{out}"
    );
    assert_eq!(t.scan_prefix("trending#").await.len(), 5);
    for bad in [
        serde_json::json!({"rounds": 0}),
        serde_json::json!({"rounds": "1"}),
    ] {
        let e = likes::triggers::handle_warm_event(&t.stack.app, &bad, None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "invalid_rounds", "{bad}");
    }
    t.stop().await;
}

/// Lambda's deadline is Unix ms; `cargo lambda watch` passes a duration
/// (600000) there, which must not read as "out of time".
#[test]
fn the_lambda_deadline_is_read_as_unix_ms_or_ignored() {
    use likes::http::lambda_deadline;
    assert!(lambda_deadline(600_000).is_none());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let d = lambda_deadline(now_ms + 60_000).expect("a future deadline");
    let left = d.saturating_duration_since(std::time::Instant::now());
    assert!(
        left > std::time::Duration::from_secs(55) && left <= std::time::Duration::from_secs(60)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_events_run_the_job() {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0")]).await;
    let app = jwt_app(&t);
    let read = |name: &str| -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(repo_root().join("events").join(name)).unwrap(),
        )
        .unwrap()
    };
    let out = handle_reconcile_event(&app, &read("reconcile-dry-run.json"), None)
        .await
        .unwrap();
    assert_eq!(
        (out["dry_run"].as_bool(), out["complete"].as_bool()),
        (Some(true), Some(true)),
        "{out}"
    );
    let out = handle_reconcile_event(&app, &read("reconcile.json"), None)
        .await
        .unwrap();
    assert_eq!(
        (out["invocation"].as_str(), out["complete"].as_bool()),
        (Some("started"), Some(true)),
        "{out}"
    );
    // The continuation schedule's input: nothing in progress, nothing done.
    let out = handle_reconcile_event(&app, &serde_json::json!({"mode": "resume"}), None)
        .await
        .unwrap();
    assert_eq!(out["invocation"], "idle");
    let err = handle_reconcile_event(&app, &serde_json::json!({"mode": "now"}), None)
        .await
        .unwrap_err();
    assert_eq!(err.status(), 400);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_user_header_is_ignored_outside_dev_mode() {
    let t = TestStack::uncached().await;
    let app = jwt_app(&t);
    let mut req = event("like-no-identity.json");
    req.headers_mut()
        .insert("x-user-id", "victim".parse().unwrap());
    let (s, _) = call(&app, Function::Like, req).await;
    assert_eq!(s, 401);
    // With a JWT, the claim wins over the header.
    let mut req = event("like.json");
    req.headers_mut()
        .insert("x-user-id", "victim".parse().unwrap());
    let (s, _) = call(&app, Function::Like, req).await;
    assert_eq!(s, 200);
    let rows = t.scan(&t.stack.config.likes_table).await;
    let users: Vec<_> = rows
        .iter()
        .filter_map(|r| r.get("user_id").and_then(|v| v.as_s().ok()).cloned())
        .collect();
    assert_eq!(users, ["user-42"]);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_answers_503_within_the_budget() {
    // Nothing listens on the discard port of loopback.
    let config = Config::from_lookup(|k| match k {
        "COUNTERS_TABLE" => Some("c".into()),
        "LIKES_TABLE" => Some("l".into()),
        "DDB_CONNECT_TIMEOUT_MS" => Some("200".into()),
        "DDB_OPERATION_TIMEOUT_MS" => Some("1000".into()),
        "DDB_MAX_ATTEMPTS" => Some("2".into()),
        _ => None,
    })
    .unwrap();
    let mut opts = likes_local::StackOptions::isolated(repo_root().join("template.yaml"));
    opts.inherit_env = false;
    let client = likes_local::stack::client_for(&config, "http://127.0.0.1:9", &opts).await;
    let app = App::new(config.clone(), DynamoStore::new(client, &config));
    let started = std::time::Instant::now();
    for (f, e) in [
        (Function::Like, "like.json"),
        (Function::Read, "read.json"),
        (Function::Read, "healthz.json"),
    ] {
        let (s, b) = call(&app, f, event(e)).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (503, Some("unavailable")),
            "{e}"
        );
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// The aggregate function's sample batch (`events/aggregate.json`, Lambda's
/// DynamoDB stream event with the tumbling-window fields): applied once,
/// answered with an empty `batchItemFailures` and an empty `state`;
/// delivered again, it changes nothing. A batch without `shardId` (no
/// tumbling window on the mapping) is refused as an error, so Lambda keeps
/// it instead of losing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_batch_event_is_applied_once() {
    let t = TestStack::start(&[("COUNTING", "stream"), ("LOCAL_SCHEDULE_SECS", "0")]).await;
    // The event source of the stack is held back: only the sample batch
    // reaches the aggregator here.
    t.stack.streams[0].pause(true);
    let text = std::fs::read_to_string(repo_root().join("events/aggregate.json")).unwrap();
    let batch: Value = serde_json::from_str(&text).unwrap();
    // fan-1's like (written in stream mode) and fan-2's unlike of r1.
    t.put_shard("r1", 0, 10).await;
    let out = likes::triggers::handle_aggregate_event(&t.stack.app, batch.clone(), None)
        .await
        .unwrap();
    assert_eq!(
        out,
        serde_json::json!({"state": {}, "batchItemFailures": []})
    );
    assert_eq!(t.shard_sum("r1").await, 10, "+1 and -1");
    let checkpoints = t.scan_prefix("agg#").await;
    assert_eq!(checkpoints.len(), 1);
    assert_eq!(
        checkpoints[0]["seq"].as_s().unwrap(),
        &format!("{:0>40}", "111100000000004242424202")
    );
    // The same batch again: every record is at or below the checkpoint.
    let mut only_like = batch.clone();
    only_like["Records"].as_array_mut().unwrap().truncate(1);
    likes::triggers::handle_aggregate_event(&t.stack.app, only_like, None)
        .await
        .unwrap();
    likes::triggers::handle_aggregate_event(&t.stack.app, batch.clone(), None)
        .await
        .unwrap();
    assert_eq!(t.shard_sum("r1").await, 10);
    assert_eq!(
        t.scan_prefix("agg#").await[0]["records"].as_n().unwrap(),
        "2"
    );
    let mut no_shard = batch;
    no_shard.as_object_mut().unwrap().remove("shardId");
    assert!(
        likes::triggers::handle_aggregate_event(&t.stack.app, no_shard, None)
            .await
            .is_err()
    );
    t.stop().await;
}

/// A views log with no shard parents (the sample batch's shard has none),
/// where nothing is put.
struct NoParents;

impl LogStore for NoParents {
    async fn put(&self, _: &[LogPut]) -> Result<Vec<LogPutResult>, likes::Error> {
        Err(likes::Error::Internal)
    }
    async fn parents(&self, _: &str, _: &str) -> Result<Vec<String>, likes::Error> {
        Ok(Vec::new())
    }
    async fn children(&self, _: &str, _: &str) -> Result<Vec<String>, likes::Error> {
        Ok(Vec::new())
    }
    async fn read_range(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
    ) -> Result<Vec<likes::store::LogRead>, likes::Error> {
        Ok(Vec::new())
    }
    async fn next_records(
        &self,
        _: &str,
        _: &str,
        _: likes::store::ReadFrom<'_>,
        _: usize,
        _: i64,
    ) -> Result<likes::store::NextRecords, likes::Error> {
        Ok(likes::store::NextRecords::default())
    }
}

/// The views samples: `aggregate-views.json` (Lambda's Kinesis event, three
/// records of one shard: fan-1 twice, fan-2 once) applied once however
/// often it is delivered, then read back through the read function's
/// handler with `reel-views.json`, `reel-stats.json` and `counts.json`, on
/// the clock of the
/// batch's day; `views.json` carries the documented `POST /views` body.
/// (`make sam-local` runs them in the Lambda container, with Kinesis.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_views_samples_are_applied_once_and_read_back() {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0")]).await;
    let mut views = ViewsConfig::from_lookup(|_| None).unwrap();
    views.table = Some("ViewsTable".into());
    // 2026-12-01T12:00:00Z: the batch's records are of that morning.
    views.clock = Arc::new(|| 1_796_155_200_000);
    let aggregator = ViewAggregator::new(
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        Arc::new(NoParents),
        &t.stack.config,
        views.clone(),
    );
    let text = std::fs::read_to_string(repo_root().join("events/aggregate-views.json")).unwrap();
    let batch: KinesisEvent = serde_json::from_str(&text).unwrap();
    let out = aggregator.handle(&batch, None).await.unwrap();
    assert_eq!(
        (out.applied, out.failed_from.as_deref()),
        (3, None),
        "{out:?}"
    );
    // Delivered again: every record is at or below the checkpoint.
    let out = aggregator.handle(&batch, None).await.unwrap();
    assert_eq!(
        (out.applied, out.failed_from.as_deref()),
        (0, None),
        "{out:?}"
    );

    let app = jwt_app(&t).with_views(views, None);
    let (s, b) = call(&app, Function::Read, event("reel-views.json")).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        [
            &b["reel_id"],
            &b["views"],
            &b["unique_viewers"],
            &b["views_7d"],
            &b["unique_viewers_7d"]
        ],
        [
            &Value::from("r1"),
            &6.into(),
            &2.into(),
            &6.into(),
            &2.into()
        ],
        "{b}"
    );
    // The same views by window, read on that clock: in the 7 days (their
    // day item). The aggregator applied them on the real clock, days after
    // they were made, so they took no hourly or 5-minute bucket (a bucket
    // is written only while it is in its window).
    let (s, b) = call(&app, Function::Read, event("reel-stats.json")).await;
    assert_eq!(s, 200, "{b}");
    let w = &b["windows"];
    assert_eq!(
        [&w["1h"]["views"], &w["24h"]["views"], &w["7d"]["views"]],
        [&Value::from(0), &0.into(), &6.into()],
        "{b}"
    );
    assert_eq!(b["reel_id"], "r1", "{b}");
    let (s, b) = call(&app, Function::Read, event("counts.json")).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["counts"],
        serde_json::json!({
            "r1": {"likes": 0, "views": 6, "unique_viewers": 2, "views_7d": 6, "unique_viewers_7d": 2},
            "r2": {"likes": 0, "views": 1, "unique_viewers": 1, "views_7d": 1, "unique_viewers_7d": 1},
        })
    );

    let req = event("views.json");
    let body = match req.body() {
        Body::Text(t) => t.as_bytes().to_vec(),
        other => panic!("views.json: unexpected body {other:?}"),
    };
    let parsed = likes::views::accept::parse_batch(&body).unwrap();
    assert_eq!(
        parsed
            .iter()
            .map(|(r, n)| (r.as_str(), *n))
            .collect::<Vec<_>>(),
        [("r1", 2)]
    );
    t.stop().await;
}

/// The sample events carry an access token with the scope; the same
/// event with a Cognito ID token (no `scope`), or with another scope, is
/// refused with 403 `insufficient_scope` and writes nothing. Before: the
/// functions never looked at the scope, and the template required none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_the_scope_is_refused() {
    let t = TestStack::uncached().await;
    let app = jwt_app(&t);
    assert_eq!(app.config.access.jwt_scope.as_deref(), Some("likes/api"));
    let with_claims = |name: &str, edit: &dyn Fn(&mut Value)| {
        let text = std::fs::read_to_string(repo_root().join("events").join(name)).unwrap();
        let mut v: Value = serde_json::from_str(&text).unwrap();
        edit(&mut v["requestContext"]["authorizer"]["jwt"]["claims"]);
        lambda_http::request::from_str(&v.to_string()).unwrap()
    };
    let id_token = |c: &mut Value| {
        let c = c.as_object_mut().unwrap();
        c.remove("scope");
        c.insert("token_use".into(), "id".into());
    };
    let other_scope = |c: &mut Value| c["scope"] = "likes/apix openid".into();
    for edit in [&id_token as &dyn Fn(&mut Value), &other_scope] {
        for (f, name) in [
            (Function::Like, "like.json"),
            (Function::Read, "read.json"),
            (Function::Read, "batch-read.json"),
            (Function::Read, "reel-views.json"),
            (Function::Read, "reel-stats.json"),
            (Function::Read, "counts.json"),
        ] {
            let (s, b) = call(&app, f, with_claims(name, edit)).await;
            assert_eq!(
                (s, b["error"]["code"].as_str()),
                (403, Some("insufficient_scope")),
                "{name}"
            );
        }
    }
    assert_eq!(t.like_rows("reel-8841").await, 0);
    let (s, _) = call(&app, Function::Like, event("like.json")).await;
    assert_eq!(s, 200);
    t.stop().await;
}
