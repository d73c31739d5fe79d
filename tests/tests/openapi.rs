//! `openapi.yaml` is true. Its paths are exactly the HttpApi routes of
//! `template.yaml` (besides `$default`), with the security the template
//! gives each route; a route the template wires with an explicit method
//! documents just that method, and a route wired with `ANY` documents
//! exactly the methods its function accepts: the running stack answers any
//! other method 405 with an `Allow` header naming the documented ones (an
//! explicit-method route leaves other methods to `$default`'s 404). Real
//! answers of the local stack to requests covering every operation and
//! every error status the functions give (400, 401, 403, 404, 405, 409, 413
//! and 503 for real; 429 and 500 through the error mapping itself) each
//! have a status documented for their operation, the documented content
//! type and headers (`Retry-After`, `Allow`, `Cache-Control`), and a body
//! valid against the documented JSON schema, `$ref`s resolved to the
//! document's components (about 55 requests in all).

mod common;

use common::{TestStack, repo_root};
use lambda_http::Body;
use likes::App;
use likes::http::{Function, handle};
use likes::store::dynamodb::DynamoStore;
use likes::{AuthMode, Error};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// The methods probed on every path: each is either documented for it or
/// answered 405 (404 for explicit-method routes). HEAD is left out only
/// because its answer has no body to validate.
const METHODS: [&str; 6] = ["GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"];

/// The OpenAPI document, as JSON.
struct Doc(Value);

/// One answer, from the HTTP stack or straight from a handler.
struct Answer {
    status: u16,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    fn from_reply(r: common::Reply) -> Answer {
        Answer {
            status: r.status,
            headers: r
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_ascii_lowercase(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: r.body,
        }
    }

    fn from_handler(resp: lambda_http::Response<Body>) -> Answer {
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = match resp.body() {
            Body::Text(t) => serde_json::from_str(t).unwrap_or_else(|_| panic!("not JSON: {t:?}")),
            other => panic!("unexpected body {other:?}"),
        };
        Answer {
            status: resp.status().as_u16(),
            headers,
            body,
        }
    }
}

impl Doc {
    fn load() -> Doc {
        let path = repo_root().join("openapi.yaml");
        let text = std::fs::read_to_string(&path).expect("openapi.yaml at the repo root");
        Doc(yaml_serde::from_str(&text).expect("openapi.yaml is YAML with a JSON data model"))
    }

    /// Follows local `$ref`s to what they name.
    fn deref<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        for _ in 0..16 {
            let Some(r) = v.get("$ref").and_then(Value::as_str) else {
                return v;
            };
            let pointer = r
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("non-local $ref {r}"));
            v = self
                .0
                .pointer(pointer)
                .unwrap_or_else(|| panic!("$ref {r} names nothing"));
        }
        panic!("$ref chain too long")
    }

    /// Path template -> its documented methods (upper case).
    fn paths(&self) -> BTreeMap<String, BTreeSet<String>> {
        let paths = self.0["paths"].as_object().expect("paths");
        paths
            .iter()
            .map(|(path, item)| {
                let methods = item
                    .as_object()
                    .expect("path item")
                    .keys()
                    .filter(|k| {
                        [
                            "get", "put", "post", "delete", "patch", "options", "head", "trace",
                        ]
                        .contains(&k.as_str())
                    })
                    .map(|k| k.to_ascii_uppercase())
                    .collect();
                (path.clone(), methods)
            })
            .collect()
    }

    fn operation(&self, method: &str, path: &str) -> &Value {
        let op = &self.0["paths"][path][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} is not documented");
        op
    }

    /// Every (method, path, operation).
    fn operations(&self) -> Vec<(String, String, &Value)> {
        let mut out = Vec::new();
        for (path, methods) in self.paths() {
            for m in methods {
                let op = self.operation(&m, &path);
                out.push((m, path.clone(), op));
            }
        }
        out
    }

    /// A validator for `schema` (part of this document): it sits beside the
    /// document's components, so its `#/components/...` references resolve.
    fn validator(&self, schema: &Value) -> jsonschema::Validator {
        let root = json!({ "allOf": [schema], "components": self.0["components"] });
        // OpenAPI 3.0 schemas are a JSON Schema draft 4/5 dialect.
        jsonschema::draft4::new(&root)
            .unwrap_or_else(|e| panic!("schema does not compile: {e}\n{schema}"))
    }

    fn schema_errors(&self, schema: &Value, instance: &Value) -> Vec<String> {
        self.validator(schema)
            .iter_errors(instance)
            .map(|e| format!("{e} (at {})", e.instance_path()))
            .collect()
    }

    /// The documented response of an operation for `status`.
    fn response(&self, method: &str, path: &str, status: u16) -> Option<&Value> {
        let responses = &self.operation(method, path)["responses"];
        responses
            .get(status.to_string())
            .or_else(|| responses.get("default"))
            .map(|r| self.deref(r))
    }

    /// Checks a real answer against a documented response: content type,
    /// body schema, headers.
    fn check_response(&self, resp: &Value, a: &Answer, what: &str) {
        let content = resp["content"]
            .as_object()
            .unwrap_or_else(|| panic!("{what}: the response documents no content"));
        let ct = a
            .header("content-type")
            .unwrap_or_else(|| panic!("{what}: no Content-Type"));
        let media = content.get(ct).unwrap_or_else(|| {
            panic!(
                "{what}: Content-Type {ct:?} is not documented ({:?})",
                content.keys().collect::<Vec<_>>()
            )
        });
        let errors = self.schema_errors(&media["schema"], &a.body);
        assert!(
            errors.is_empty(),
            "{what}: {} {} does not match the documented schema:\n  {}",
            a.status,
            a.body,
            errors.join("\n  ")
        );
        let documented = resp
            .get("headers")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (name, h) in &documented {
            let h = self.deref(h);
            match a.header(name) {
                None => assert!(
                    !h["required"].as_bool().unwrap_or(false),
                    "{what}: required header {name} is missing"
                ),
                Some(v) => {
                    let schema = &h["schema"];
                    let value = match self.deref(schema)["type"].as_str() {
                        Some("integer") => v
                            .parse::<i64>()
                            .map(Value::from)
                            .unwrap_or_else(|_| Value::String(v.to_owned())),
                        _ => Value::String(v.to_owned()),
                    };
                    let errors = self.schema_errors(schema, &value);
                    assert!(
                        errors.is_empty(),
                        "{what}: header {name}: {v:?}: {}",
                        errors.join("; ")
                    );
                }
            }
        }
        // The headers with a meaning for clients are never undocumented.
        for name in ["retry-after", "allow"] {
            if a.header(name).is_some() {
                assert!(
                    documented.keys().any(|k| k.eq_ignore_ascii_case(name)),
                    "{what}: {name} is sent but not documented for {}",
                    a.status
                );
            }
        }
    }

    /// Checks a real answer to `method path` (a documented operation).
    fn check(&self, method: &str, path: &str, a: &Answer, what: &str) {
        let resp = self.response(method, path, a.status).unwrap_or_else(|| {
            panic!(
                "{what}: status {} is not documented for {method} {path}: {}",
                a.status, a.body
            )
        });
        self.check_response(resp, a, what);
    }

    fn component_response(&self, name: &str) -> &Value {
        let r = &self.0["components"]["responses"][name];
        assert!(r.is_object(), "components.responses.{name} is missing");
        r
    }
}

/// An HttpApi route of the template.
#[derive(Debug)]
struct TemplateRoute {
    method: String,
    path: String,
    /// `Auth.Authorizer` of the event (`AWS_IAM`, `NONE`), if any.
    authorizer: Option<String>,
}

/// The template's HttpApi routes, and the API's default authorizer's kind.
fn template_routes() -> (Vec<TemplateRoute>, Option<String>) {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).expect("template.yaml");
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).expect("template.yaml is YAML");
    let resources = doc["Resources"].as_mapping().expect("Resources");
    let mut routes = Vec::new();
    let mut default_kind = None;
    for (_, res) in resources {
        match res["Type"].as_str() {
            Some("AWS::Serverless::HttpApi") => {
                let auth = &res["Properties"]["Auth"];
                if let Some(name) = auth["DefaultAuthorizer"].as_str() {
                    let def = &auth["Authorizers"][name];
                    default_kind = Some(
                        if def["JwtConfiguration"].is_mapping() {
                            "JWT"
                        } else {
                            "other"
                        }
                        .to_owned(),
                    );
                }
            }
            Some("AWS::Serverless::Function") => {
                let events = res["Properties"]["Events"].as_mapping();
                for (_, ev) in events.into_iter().flatten() {
                    if ev["Type"].as_str() != Some("HttpApi") {
                        continue;
                    }
                    let p = &ev["Properties"];
                    routes.push(TemplateRoute {
                        method: p["Method"].as_str().unwrap_or("ANY").to_ascii_uppercase(),
                        path: p["Path"].as_str().unwrap_or("$default").to_owned(),
                        authorizer: p["Auth"]["Authorizer"].as_str().map(str::to_owned),
                    });
                }
            }
            _ => {}
        }
    }
    (routes, default_kind)
}

/// Every `$ref` string anywhere in `v`.
fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    out.push(x.as_str().expect("$ref is a string").to_owned());
                } else {
                    refs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

#[test]
fn the_documented_routes_and_their_security_are_the_templates() {
    let doc = Doc::load();
    assert_eq!(doc.0["openapi"].as_str().map(|v| &v[..2]), Some("3."));
    let (routes, default_kind) = template_routes();
    assert_eq!(
        default_kind.as_deref(),
        Some("JWT"),
        "the API's default authorizer is the JWT one"
    );
    assert!(
        routes.iter().any(|r| r.path == "$default"),
        "the template has a $default route (the documented JSON 404)"
    );
    doc.component_response("NotFound");
    doc.component_response("MethodNotAllowed");

    let documented = doc.paths();
    let template_paths: BTreeSet<String> = routes
        .iter()
        .filter(|r| r.path != "$default")
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(
        documented.keys().cloned().collect::<BTreeSet<_>>(),
        template_paths,
        "openapi.yaml documents exactly the template's HttpApi paths"
    );
    for r in routes.iter().filter(|r| r.path != "$default") {
        let methods = &documented[&r.path];
        assert!(!methods.is_empty(), "{} documents no method", r.path);
        if r.method == "ANY" {
            // Which ones: the function's; the live test compares them with
            // its 405 answers.
            assert!(
                methods.iter().all(|m| METHODS.contains(&m.as_str())),
                "{}: {methods:?}",
                r.path
            );
        } else {
            assert_eq!(
                methods,
                &BTreeSet::from([r.method.clone()]),
                "{} is wired for {} only",
                r.path,
                r.method
            );
        }
        for m in methods {
            let security = &doc.operation(m, &r.path)["security"];
            let schemes: BTreeSet<String> = security
                .as_array()
                .unwrap_or_else(|| panic!("{m} {} declares no security", r.path))
                .iter()
                .flat_map(|req| req.as_object().expect("requirement").keys().cloned())
                .collect();
            let expected: BTreeSet<String> = match r.authorizer.as_deref() {
                Some("AWS_IAM") => ["sigv4"].map(String::from).into(),
                Some("NONE") => BTreeSet::new(),
                // The default (JWT) authorizer, and dev mode's header.
                None => ["jwt", "devUser"].map(String::from).into(),
                Some(other) => panic!("unexpected authorizer {other}"),
            };
            assert_eq!(schemes, expected, "security of {m} {}", r.path);
        }
    }

    // Every reference resolves; every schema compiles; operation ids are
    // unique; every response documents JSON.
    let mut all = Vec::new();
    refs(&doc.0, &mut all);
    for r in &all {
        doc.deref(&json!({ "$ref": r }));
    }
    let mut ids = BTreeSet::new();
    for (m, path, op) in doc.operations() {
        let id = op["operationId"].as_str().expect("operationId");
        assert!(ids.insert(id.to_owned()), "duplicate operationId {id}");
        let responses = op["responses"].as_object().expect("responses");
        for (status, r) in responses {
            let r = doc.deref(r);
            let content = r["content"]
                .as_object()
                .unwrap_or_else(|| panic!("{m} {path} {status}: no content"));
            assert_eq!(
                content.keys().collect::<Vec<_>>(),
                ["application/json"],
                "{m} {path} {status}"
            );
            doc.validator(&content["application/json"]["schema"]);
        }
    }
    for r in doc.0["components"]["responses"]
        .as_object()
        .unwrap()
        .values()
    {
        doc.validator(&r["content"]["application/json"]["schema"]);
    }
}

#[test]
fn every_error_the_mapping_can_produce_is_documented() {
    let doc = Doc::load();
    let errors = [
        Error::bad_request("invalid_reel_id", "reel_id must not be empty"),
        Error::bad_request("missing_reel_ids", "x"),
        Error::bad_request("too_many_reel_ids", "x"),
        Error::bad_request("invalid_idempotency_key", "x"),
        Error::bad_request("invalid_user_id", "x"),
        Error::bad_request("invalid_body", "x"),
        Error::bad_request("invalid_shards", "x"),
        Error::Unauthorized,
        Error::Forbidden,
        Error::NotFound,
        Error::Conflict {
            code: "resize_in_progress",
            message: "busy".into(),
        },
        Error::PayloadTooLarge {
            limit: likes::http::MAX_BODY_BYTES,
        },
        Error::Throttled,
        Error::Contended,
        Error::Unavailable,
        Error::Internal,
    ];
    let ops = doc.operations();
    for e in &errors {
        let status = e.status();
        let mut matching = Vec::new();
        for (m, path, _) in &ops {
            let Some(resp) = doc.response(m, path, status) else {
                continue;
            };
            let schema = &resp["content"]["application/json"]["schema"];
            if doc.schema_errors(schema, &e.body()).is_empty() {
                let retry_after = resp
                    .get("headers")
                    .and_then(Value::as_object)
                    .and_then(|h| h.get("Retry-After"))
                    .map(|h| doc.deref(h));
                assert_eq!(
                    retry_after.is_some_and(|h| h["required"] == true),
                    e.retry_after_secs().is_some(),
                    "{m} {path} {status}: Retry-After is documented iff {} sends it",
                    e.code()
                );
                matching.push(format!("{m} {path}"));
            }
        }
        assert!(
            !matching.is_empty(),
            "{status} {} is documented for no operation",
            e.code()
        );
        // Any request can meet DynamoDB throttling, a fault or a timeout.
        if matches!(
            e,
            Error::Throttled | Error::Contended | Error::Unavailable | Error::Internal
        ) {
            assert_eq!(
                matching.len(),
                ops.len(),
                "{} must be documented for every operation: {matching:?}",
                e.code()
            );
        }
    }
    // The 405 every known path gives for its undocumented methods.
    let e = Error::MethodNotAllowed { allow: "GET" };
    let resp = doc.component_response("MethodNotAllowed");
    let schema = &resp["content"]["application/json"]["schema"];
    assert!(doc.schema_errors(schema, &e.body()).is_empty());
    assert!(resp["headers"]["Allow"].is_object());
}

/// One real request and the answer expected.
struct Case {
    /// The documented operation it exercises: (method, path template).
    op: (&'static str, &'static str),
    path: String,
    user: Option<&'static str>,
    headers: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
    status: u16,
    /// The error code, for error answers.
    code: Option<&'static str>,
}

fn case(op: (&'static str, &'static str), path: impl Into<String>, status: u16) -> Case {
    Case {
        op,
        path: path.into(),
        user: Some("u1"),
        headers: Vec::new(),
        body: None,
        status,
        code: None,
    }
}

impl Case {
    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    fn anonymous(mut self) -> Self {
        self.user = None;
        self
    }
    fn user(mut self, user: &'static str) -> Self {
        self.user = Some(user);
        self
    }
    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
    fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }
}

const LIKE: (&str, &str) = ("PUT", "/reels/{reel_id}/like");
const UNLIKE: (&str, &str) = ("DELETE", "/reels/{reel_id}/like");
const COUNT: (&str, &str) = ("GET", "/reels/{reel_id}/likes");
const COUNTS: (&str, &str) = ("GET", "/likes");
const HEALTH: (&str, &str) = ("GET", "/healthz");
const SHARDS: (&str, &str) = ("GET", "/admin/reels/{reel_id}/shards");
const RESIZE: (&str, &str) = ("POST", "/admin/reels/{reel_id}/shards");
const RESIZED: (&str, &str) = ("GET", "/admin/reels");
const ERASE: (&str, &str) = ("DELETE", "/admin/users/{user_id}/likes");
const VIEWS: (&str, &str) = ("POST", "/views");
const REEL_VIEWS: (&str, &str) = ("GET", "/reels/{reel_id}/views");
const FEED: (&str, &str) = ("GET", "/counts");
const STATS: (&str, &str) = ("GET", "/reels/{reel_id}/stats");
const TRENDING: (&str, &str) = ("GET", "/trending");

/// A payload-2.0 event built from a sample in `events/`, edited.
fn event_from(name: &str, edit: impl FnOnce(&mut Value)) -> lambda_http::Request {
    let text = std::fs::read_to_string(repo_root().join("events").join(name)).expect("event");
    let mut v: Value = serde_json::from_str(&text).expect("event JSON");
    edit(&mut v);
    lambda_http::request::from_str(&v.to_string()).expect("an API Gateway v2 event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_match_the_document() {
    let doc = Doc::load();
    let t = TestStack::start(&[
        ("CACHE_TTL_MS", "0"),
        ("SETTINGS_TTL_MS", "0"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        // The views routes need the views stream (kinesis-mock).
        ("LOCAL_VIEWS", "on"),
    ])
    .await;
    let long = "a".repeat(65);
    let batch = |entries: &str| format!(r#"{{"views": [{entries}]}}"#);
    let hundred_and_one = vec![r#"{"reel_id": "r1", "count": 1}"#; 101].join(",");
    let max = "b".repeat(64);
    let distinct: Vec<String> = (0..101).map(|i| format!("r{i}")).collect();
    let same = vec!["dup"; 150].join(",");
    let big = vec![b'x'; 2048];

    let cases = vec![
        // Like and unlike.
        case(LIKE, "/reels/r1/like", 200),
        case(LIKE, "/reels/r1/like", 200), // a double tap: changed false
        case(LIKE, format!("/reels/{max}/like"), 200).header("idempotency-key", "k-1"),
        case(LIKE, format!("/reels/{max}/like"), 200).header("idempotency-key", "k-1"),
        case(LIKE, "/reels/r%23x/like", 400).code("invalid_reel_id"),
        case(LIKE, format!("/reels/{long}/like"), 400).code("invalid_reel_id"),
        case(LIKE, "/reels/r1/like", 400)
            .header("idempotency-key", "has space")
            .code("invalid_idempotency_key"),
        case(LIKE, "/reels/r1/like", 400)
            .header("idempotency-key", "k".repeat(65))
            .code("invalid_idempotency_key"),
        case(LIKE, "/reels/r1/like", 400)
            .anonymous()
            .header("x-user-id", "u".repeat(257))
            .code("invalid_user_id"),
        case(LIKE, "/reels/r1/like", 401)
            .anonymous()
            .code("unauthorized"),
        case(LIKE, "/reels//like", 404).code("not_found"),
        case(LIKE, "/reels/a/b/like", 404).code("not_found"),
        case(LIKE, "/reels/r1/like", 413)
            .body(big.clone())
            .code("payload_too_large"),
        case(UNLIKE, "/reels/r1/like", 200),
        case(UNLIKE, "/reels/r1/like", 200), // nothing to remove: changed false
        case(UNLIKE, "/reels/never/like", 200).header("idempotency-key", "k-2"),
        case(UNLIKE, "/reels/r%2Fx/like", 400).code("invalid_reel_id"),
        case(UNLIKE, "/reels/r1/like", 401)
            .anonymous()
            .code("unauthorized"),
        // The local gateway's own limit answers the same way.
        case(UNLIKE, "/reels/r1/like", 413)
            .body(vec![0xff; 200 * 1024])
            .code("payload_too_large"),
        // Reads.
        case(COUNT, "/reels/r1/likes", 200), // with liked_by_me
        case(COUNT, "/reels/r1/likes", 200).anonymous(), // without
        case(COUNT, format!("/reels/{long}/likes"), 400)
            .anonymous()
            .code("invalid_reel_id"),
        case(COUNT, "/reels//likes", 400).code("invalid_reel_id"),
        case(COUNT, "/reels/r1/likes", 400)
            .anonymous()
            .header("x-user-id", "a\tb")
            .code("invalid_user_id"),
        case(COUNT, "/reels/a/b/likes", 404).code("not_found"),
        case(COUNT, "/reels/r1/likes", 413)
            .body(big.clone())
            .code("payload_too_large"),
        case(COUNTS, "/likes?reel_ids=r1,r2", 200).anonymous(),
        case(COUNTS, "/likes?reel_ids=r1&reel_ids=r3", 200),
        case(COUNTS, format!("/likes?reel_ids={same}"), 200), // merged
        case(COUNTS, "/likes", 400).code("missing_reel_ids"),
        case(COUNTS, "/likes?reel_ids=", 400).code("invalid_reel_id"),
        case(COUNTS, "/likes?reel_ids=a,,b", 400).code("invalid_reel_id"),
        case(
            COUNTS,
            format!("/likes?reel_ids={}", distinct.join(",")),
            400,
        )
        .code("too_many_reel_ids"),
        case(HEALTH, "/healthz", 200).anonymous(),
        case(HEALTH, "/healthz", 413)
            .body(big.clone())
            .code("payload_too_large"),
        // Admin (open in dev mode).
        case(SHARDS, "/admin/reels/fresh/shards", 200),
        case(SHARDS, "/admin/reels/r%23/shards", 400).code("invalid_reel_id"),
        case(SHARDS, "/admin/reels//shards", 404).code("not_found"),
        case(RESIZE, "/admin/reels/steady/shards", 200).body(r#"{"shards": 1}"#),
        case(RESIZE, "/admin/reels/hot/shards", 202).body(r#"{"shards": 3}"#),
        case(RESIZE, "/admin/reels/hot/shards", 202).body(r#"{"shards": 3}"#),
        case(RESIZE, "/admin/reels/hot/shards", 409)
            .body(r#"{"shards": 4}"#)
            .code("resize_in_progress"),
        case(SHARDS, "/admin/reels/hot/shards", 200),
        case(RESIZE, "/admin/reels/x/shards", 400).code("invalid_body"),
        case(RESIZE, "/admin/reels/x/shards", 400)
            .body(r#"{"shards": 2, "why": "hot"}"#)
            .code("invalid_body"),
        case(RESIZE, "/admin/reels/x/shards", 400)
            .body("shards=2")
            .code("invalid_body"),
        case(RESIZE, "/admin/reels/x/shards", 400)
            .body(r#"{"shards": 0}"#)
            .code("invalid_shards"),
        case(RESIZE, "/admin/reels/x/shards", 400)
            .body(r#"{"shards": 101}"#)
            .code("invalid_shards"),
        case(RESIZE, "/admin/reels/x/shards", 400)
            .body(r#"{"shards": 1.5}"#)
            .code("invalid_shards"),
        case(RESIZE, "/admin/reels/x/shards", 400)
            .body(r#"{"shards": "2"}"#)
            .code("invalid_shards"),
        case(RESIZE, "/admin/reels/a%20b/shards", 400)
            .body(r#"{"shards": 2}"#)
            .code("invalid_reel_id"),
        case(RESIZE, "/admin/reels/x/shards", 413)
            .body(big.clone())
            .code("payload_too_large"),
        case(RESIZED, "/admin/reels", 200), // lists "hot"
        case(RESIZED, "/admin/reels", 413)
            .body(big.clone())
            .code("payload_too_large"),
        // Views.
        case(VIEWS, "/views", 202).body(batch(r#"{"reel_id": "r1", "count": 3}"#)),
        case(VIEWS, "/views", 202)
            .header("idempotency-key", "v-1")
            .body(batch(
                r#"{"reel_id": "r1", "count": 1}, {"reel_id": "r2", "count": 1000}"#,
            )),
        case(VIEWS, "/views", 400).code("invalid_body"),
        case(VIEWS, "/views", 400)
            .body(r#"{"views": [{"reel_id": "r1"}]}"#)
            .code("invalid_body"),
        case(VIEWS, "/views", 400)
            .body(batch(""))
            .code("invalid_views"),
        case(VIEWS, "/views", 400)
            .body(batch(&hundred_and_one))
            .code("invalid_views"),
        case(VIEWS, "/views", 400)
            .body(batch(r#"{"reel_id": "r1", "count": 0}"#))
            .code("invalid_count"),
        case(VIEWS, "/views", 400)
            .body(batch(r#"{"reel_id": "r#1", "count": 1}"#))
            .code("invalid_reel_id"),
        // More than a minute's views in one batch: admitted (a full
        // bucket), then the viewer owes.
        case(VIEWS, "/views", 202)
            .user("big-batch")
            .body(batch(&[r#"{"reel_id": "r1", "count": 1000}"#; 7].join(","))),
        case(VIEWS, "/views", 429)
            .user("big-batch")
            .body(batch(r#"{"reel_id": "r1", "count": 1}"#))
            .code("rate_limited"),
        case(VIEWS, "/views", 400)
            .header("idempotency-key", "has space")
            .body(batch(r#"{"reel_id": "r1", "count": 1}"#))
            .code("invalid_idempotency_key"),
        case(VIEWS, "/views", 401)
            .anonymous()
            .body(batch(r#"{"reel_id": "r1", "count": 1}"#))
            .code("unauthorized"),
        case(VIEWS, "/views", 413)
            .body(vec![b' '; 17 * 1024])
            .code("payload_too_large"),
        case(REEL_VIEWS, "/reels/r1/views", 200).anonymous(),
        case(REEL_VIEWS, "/reels/r%23/views", 400).code("invalid_reel_id"),
        case(REEL_VIEWS, "/reels/r1/views", 413)
            .body(big.clone())
            .code("payload_too_large"),
        case(TRENDING, "/trending?metric=views&window=24h&limit=5", 200).anonymous(),
        case(TRENDING, "/trending", 200),
        case(TRENDING, "/trending?window=7d", 400).code("invalid_window"),
        case(TRENDING, "/trending?limit=0", 400).code("invalid_limit"),
        case(STATS, "/reels/r1/stats", 200),
        case(STATS, "/reels/never/stats", 200).anonymous(),
        case(STATS, "/reels/r%23/stats", 400).code("invalid_reel_id"),
        case(FEED, "/counts?reel_ids=r1,r2", 200).anonymous(),
        case(FEED, "/counts", 400).code("missing_reel_ids"),
        case(FEED, "/counts?reel_ids=a,,b", 400).code("invalid_reel_id"),
        case(
            FEED,
            format!("/counts?reel_ids={}", distinct.join(",")),
            400,
        )
        .code("too_many_reel_ids"),
        case(ERASE, "/admin/users/u1/likes", 200),
        case(ERASE, "/admin/users/a%09b/likes", 400).code("invalid_user_id"),
        case(ERASE, "/admin/users/u1/likes", 413)
            .body(big.clone())
            .code("payload_too_large"),
    ];

    let mut seen: BTreeSet<(String, u16)> = BTreeSet::new();
    for c in &cases {
        let (m, path) = c.op;
        let headers: Vec<(&str, &str)> = c.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let reply = t.send(m, &c.path, c.user, &headers, c.body.clone()).await;
        let a = Answer::from_reply(reply);
        let what = format!("{m} {}", c.path);
        assert_eq!(a.status, c.status, "{what}: {}", a.body);
        if let Some(code) = c.code {
            assert_eq!(a.body["error"]["code"], code, "{what}: {}", a.body);
        }
        doc.check(m, path, &a, &what);
        if what.ends_with("/admin/reels") && a.status == 200 {
            assert_eq!(a.body["reels"][0]["reel_id"], "hot", "{}", a.body);
        }
        seen.insert((format!("{m} {path}"), a.status));
    }

    // Undocumented methods: 405 with the documented methods in `Allow` on
    // an `ANY` route; `$default`'s 404 on an explicit-method route.
    let (routes, _) = template_routes();
    for (path, documented) in doc.paths() {
        let route = routes
            .iter()
            .find(|r| r.path == path)
            .expect("template route");
        let url = path.replace("{reel_id}", "probe");
        for m in METHODS.iter().filter(|m| !documented.contains(**m)) {
            let a = Answer::from_reply(t.send(m, &url, Some("u1"), &[], None).await);
            let what = format!("{m} {url}");
            if route.method == "ANY" {
                assert_eq!(a.status, 405, "{what}: {}", a.body);
                doc.check_response(doc.component_response("MethodNotAllowed"), &a, &what);
                let allow: BTreeSet<String> = a
                    .header("allow")
                    .unwrap_or_default()
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .collect();
                assert_eq!(
                    &allow, &documented,
                    "{what}: Allow names exactly the documented methods"
                );
            } else {
                assert_eq!(a.status, 404, "{what}: {}", a.body);
                doc.check_response(doc.deref(doc.component_response("NotFound")), &a, &what);
            }
            seen.insert((format!("{m} {path}"), a.status));
        }
    }

    // Outside dev mode, straight through the handlers (the local stack is
    // always in dev mode): the function's own 401 and 403.
    let mut config = t.stack.config.clone();
    config.auth_mode = AuthMode::Jwt;
    let jwt = App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    );
    let no_iam = |name: &str, raw_path: &'static str| {
        event_from(name, move |v| {
            v["rawPath"] = raw_path.into();
            v["requestContext"]["http"]["path"] = raw_path.into();
            v["requestContext"]
                .as_object_mut()
                .unwrap()
                .remove("authorizer");
        })
    };
    let direct = [
        (
            LIKE,
            Function::Like,
            event_from("like-no-identity.json", |_| {}),
            401,
        ),
        (
            SHARDS,
            Function::Reshard,
            no_iam("admin-shards-get.json", "/admin/reels/reel-8841/shards"),
            403,
        ),
        (
            RESIZE,
            Function::Reshard,
            no_iam("admin-shards-post.json", "/admin/reels/reel-8841/shards"),
            403,
        ),
        (
            RESIZED,
            Function::Reshard,
            no_iam("admin-shards-get.json", "/admin/reels"),
            403,
        ),
    ];
    for ((m, path), f, req, status) in direct {
        let a = Answer::from_handler(handle(&jwt, f, req).await);
        let what = format!("{m} {path} (JWT mode)");
        assert_eq!(a.status, status, "{what}: {}", a.body);
        doc.check(m, path, &a, &what);
        seen.insert((format!("{m} {path}"), a.status));
    }

    // A table missing: 503 with Retry-After.
    let mut config = t.stack.config.clone();
    config.auth_mode = AuthMode::Jwt;
    config.likes_table = "no-such-table".into();
    let broken = App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    );
    let direct = [
        (HEALTH, Function::Read, event_from("healthz.json", |_| {})),
        (LIKE, Function::Like, event_from("like.json", |_| {})),
        (COUNT, Function::Read, event_from("read.json", |_| {})),
    ];
    for ((m, path), f, req) in direct {
        let a = Answer::from_handler(handle(&broken, f, req).await);
        let what = format!("{m} {path} (table missing)");
        assert_eq!(a.status, 503, "{what}: {}", a.body);
        assert!(
            matches!(a.header("retry-after"), Some("1" | "2" | "3")),
            "{what}: {:?}",
            a.header("retry-after")
        );
        doc.check(m, path, &a, &what);
        seen.insert((format!("{m} {path}"), a.status));
    }

    // Every operation answered 2xx at least once, and every error status
    // the functions give here was met.
    for (m, path, _) in doc.operations() {
        assert!(
            seen.iter()
                .any(|(op, s)| *op == format!("{m} {path}") && (200..300).contains(s)),
            "{m} {path} never answered 2xx"
        );
    }
    let statuses: BTreeSet<u16> = seen.iter().map(|(_, s)| *s).collect();
    for s in [200, 202, 400, 401, 403, 404, 405, 409, 413, 503] {
        assert!(statuses.contains(&s), "no answer with status {s}");
    }
    t.stop().await;
}
