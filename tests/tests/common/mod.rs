//! The test harness: a whole local stack per test (embedded dynoxide on a
//! free port, the tables from template.yaml, the gateway running the real
//! handlers), plus ground-truth views of the tables through the SDK.
#![allow(dead_code)]

use aws_sdk_dynamodb::types::AttributeValue;
use likes_local::{Stack, StackOptions};
use serde_json::Value;
use std::path::PathBuf;

pub mod stream_events;
pub mod views_events;
pub mod views_log;

/// Write bounds too wide to meet: for the tests whose simulated clients
/// retry one user's writes as fast as faults let them (what they test is
/// DynamoDB's behaviour, not a caller's bounds, which `hostile.rs` tests).
pub const UNBOUNDED_CALLERS: [(&str, &str); 5] = [
    ("USER_WRITES_PER_SEC", "100000"),
    ("USER_WRITE_BURST", "10000"),
    ("REEL_TOGGLES_PER_MIN", "10000"),
    ("USER_REELS_PER_HOUR", "100000"),
    ("USER_KEYS_PER_MIN", "100000"),
];

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The operations dashboard's body as CloudFormation hands it to
/// CloudWatch, in classic mode and in stream mode: `(stream mode, body)`.
/// The template's `DashboardBody` is a `!Sub` whose variables are
/// `!If [StreamCounting, ...]` (stream mode's resources exist only there);
/// each is given its branch for the mode. The other `${...}` references are
/// left as they are: they all sit inside JSON strings.
pub fn dashboard_bodies() -> Vec<(bool, Value)> {
    use yaml_serde::Value as Yaml;
    fn text(v: &Yaml) -> String {
        match v {
            Yaml::String(s) => s.clone(),
            Yaml::Tagged(t) if t.tag == "!Sub" => {
                t.value.as_str().expect("a !Sub string").to_owned()
            }
            other => panic!("a dashboard variable that is not a string: {other:?}"),
        }
    }
    let template = std::fs::read_to_string(repo_root().join("template.yaml")).unwrap();
    let doc: Yaml = yaml_serde::from_str(&template).unwrap();
    let (body, vars) = match &doc["Resources"]["OperationsDashboard"]["Properties"]["DashboardBody"]
    {
        Yaml::Tagged(t) if t.tag == "!Sub" => match &t.value {
            Yaml::String(body) => (body.clone(), yaml_serde::Mapping::new()),
            Yaml::Sequence(s) if s.len() == 2 => (
                s[0].as_str().expect("the body").to_owned(),
                s[1].as_mapping().expect("the variables").clone(),
            ),
            other => panic!("DashboardBody: {other:?}"),
        },
        other => panic!("DashboardBody is not a !Sub: {other:?}"),
    };
    [false, true]
        .into_iter()
        .map(|stream| {
            let mut body = body.clone();
            for (name, value) in &vars {
                let value = match value {
                    Yaml::Tagged(t) if t.tag == "!If" => {
                        let s = t.value.as_sequence().expect("!If [cond, then, else]");
                        assert_eq!(s[0], "StreamCounting", "{name:?}: only stream mode varies");
                        text(&s[if stream { 1 } else { 2 }])
                    }
                    other => text(other),
                };
                body = body.replace(&format!("${{{}}}", name.as_str().unwrap()), &value);
            }
            let json = serde_json::from_str(&body).unwrap_or_else(|e| {
                panic!("the dashboard body (stream mode {stream}) is not JSON: {e}")
            });
            (stream, json)
        })
        .collect()
}

pub struct TestStack {
    pub stack: Stack,
    pub http: reqwest::Client,
}

pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl TestStack {
    /// A fresh, isolated stack; `env` overrides configuration variables.
    ///
    /// `LIKES_TEST_COUNTING` in the test's environment sets `COUNTING` for
    /// stacks that do not set it themselves: `make test` runs the contract
    /// tests (openapi, validation) once more in stream mode that way.
    pub async fn start(env: &[(&str, &str)]) -> TestStack {
        let mut opts = StackOptions::isolated(repo_root().join("template.yaml"));
        if let Ok(mode) = std::env::var("LIKES_TEST_COUNTING") {
            opts.env.insert("COUNTING".into(), mode);
        }
        Self::start_with(opts, env).await
    }

    /// A stack whose emulator keeps its tables in the SQLite file `file`, so
    /// that a later stack on the same file sees them (a redeploy).
    pub async fn start_on_file(file: &std::path::Path, env: &[(&str, &str)]) -> TestStack {
        let mut opts = StackOptions::isolated(repo_root().join("template.yaml"));
        opts.dynamo = likes_local::Dynamo::Embedded {
            host: "127.0.0.1".into(),
            port: 0,
            file: Some(file.to_owned()),
        };
        Self::start_with(opts, env).await
    }

    /// Starts a stack on `opts`, with `env` over its configuration.
    async fn start_with(mut opts: StackOptions, env: &[(&str, &str)]) -> TestStack {
        // A test's reads all come from one caller, polling as fast as it
        // can: the caller's read units a minute are no bound of theirs
        // (tests/tests/read_budget.rs sets its own).
        opts.env
            .insert("CALLER_READ_UNITS_PER_MIN".into(), "0".into());
        for (k, v) in env {
            opts.env.insert((*k).into(), (*v).into());
        }
        let stack = Stack::start(opts).await.expect("stack starts");
        TestStack {
            stack,
            http: reqwest::Client::new(),
        }
    }

    /// Items of the counters table whose key starts with `prefix`.
    pub async fn scan_prefix(
        &self,
        prefix: &str,
    ) -> Vec<std::collections::HashMap<String, AttributeValue>> {
        self.scan(&self.stack.config.counters_table)
            .await
            .into_iter()
            .filter(|i| {
                i.get("pk")
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|pk| pk.starts_with(prefix))
            })
            .collect()
    }

    /// A stack whose reads are never cached, so every read is the truth.
    pub async fn uncached() -> TestStack {
        Self::start(&[("CACHE_TTL_MS", "0"), ("SETTINGS_TTL_MS", "0")]).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.stack.base_url, path)
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        user: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Reply {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, self.url(path));
        if let Some(u) = user {
            req = req.header("x-user-id", u);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await.expect("request reaches the gateway");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"));
        Reply {
            status,
            body,
            headers,
        }
    }

    pub async fn like(&self, user: &str, reel: &str) -> Reply {
        self.send("PUT", &format!("/reels/{reel}/like"), Some(user), &[], None)
            .await
    }

    pub async fn like_with_key(&self, user: &str, reel: &str, key: &str) -> Reply {
        self.send(
            "PUT",
            &format!("/reels/{reel}/like"),
            Some(user),
            &[("idempotency-key", key)],
            None,
        )
        .await
    }

    pub async fn unlike(&self, user: &str, reel: &str) -> Reply {
        self.send(
            "DELETE",
            &format!("/reels/{reel}/like"),
            Some(user),
            &[],
            None,
        )
        .await
    }

    pub async fn http_count(&self, reel: &str) -> i64 {
        let r = self
            .send("GET", &format!("/reels/{reel}/likes"), None, &[], None)
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["count"].as_i64().expect("count")
    }

    /// The reel's net likes over the last hour, 24 hours and 7 days, as a
    /// fresh read sums them (the `GET /reels/{reel}/stats` figures).
    pub async fn like_windows(&self, reel: &str) -> [i64; 3] {
        use likes::keys::window::Window;
        let c = self
            .stack
            .app
            .service
            .windows(&likes::keys::ReelId::parse(reel).expect("reel id"))
            .await
            .expect("windows");
        Window::ALL.map(|w| c.windows.get(w))
    }

    /// The reel's count as stored: every shard item (000..999) plus the base
    /// item that shrinking folds into, read directly.
    pub async fn shard_sum(&self, reel: &str) -> i64 {
        self.shards(reel).await.iter().map(|(_, n)| n).sum::<i64>()
            + self.base(reel).await
            + self.writers(reel).await.iter().map(|(_, n)| n).sum::<i64>()
    }

    /// Stream mode: the reel's writer items and their base, read directly
    /// from `WRITERS_TABLE` (sort key, n); empty in transactional mode.
    pub async fn writers(&self, reel: &str) -> Vec<(String, i64)> {
        let Some(table) = &self.stack.config.writers_table else {
            return Vec::new();
        };
        if self.stack.config.counting != likes::Counting::Stream {
            return Vec::new();
        }
        let out = self
            .stack
            .client
            .query()
            .table_name(table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(format!("l#{reel}")))
            .consistent_read(true)
            .send()
            .await
            .expect("query writers");
        out.items
            .unwrap_or_default()
            .iter()
            .map(|i| {
                let sk = i
                    .get("sk")
                    .and_then(|v| v.as_s().ok())
                    .cloned()
                    .unwrap_or_default();
                let n = i
                    .get("n")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                (sk, n)
            })
            .collect()
    }

    /// `n` of the reel's base item (0 when there is none).
    pub async fn base(&self, reel: &str) -> i64 {
        let out = self
            .stack
            .client
            .get_item()
            .table_name(&self.stack.config.counters_table)
            .key("pk", AttributeValue::S(format!("base#reel#{reel}#likes")))
            .consistent_read(true)
            .send()
            .await
            .expect("get base");
        out.item
            .and_then(|i| i.get("n").and_then(|v| v.as_n().ok()).cloned())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Every shard item of `reel`: (shard, n) (not the base item).
    pub async fn shards(&self, reel: &str) -> Vec<(u32, i64)> {
        let suffix = format!("#reel#{reel}#likes");
        let mut out = Vec::new();
        for item in self.scan(&self.stack.config.counters_table).await {
            let pk = item
                .get("pk")
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default();
            if let Some(shard) = pk
                .strip_suffix(&suffix)
                .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
            {
                let n = item
                    .get("n")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                out.push((shard.parse().expect("3-digit shard"), n));
            }
        }
        out.sort();
        out
    }

    /// Like rows of `reel`, read directly: the truth.
    pub async fn like_rows(&self, reel: &str) -> usize {
        self.scan(&self.stack.config.likes_table)
            .await
            .iter()
            .filter(|i| {
                i.get("reel_id")
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|r| r == reel)
            })
            .count()
    }

    pub async fn scan(
        &self,
        table: &str,
    ) -> Vec<std::collections::HashMap<String, AttributeValue>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let resp = self
                .stack
                .client
                .scan()
                .table_name(table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .expect("scan");
            out.extend(resp.items.unwrap_or_default());
            start = resp.last_evaluated_key;
            if start.is_none() {
                return out;
            }
        }
    }

    /// Writes a reel's settings item directly (as the reshard function will).
    pub async fn set_shards(&self, reel: &str, write: u32, read: u32) {
        self.stack
            .client
            .put_item()
            .table_name(&self.stack.config.counters_table)
            .item("pk", AttributeValue::S(format!("reel#{reel}#settings")))
            .item("write_shards", AttributeValue::N(write.to_string()))
            .item("read_shards", AttributeValue::N(read.to_string()))
            .send()
            .await
            .expect("put settings");
    }

    /// Writes a shard item directly (drift injection, pre-seeded shards).
    pub async fn put_shard(&self, reel: &str, shard: u32, n: i64) {
        self.stack
            .client
            .put_item()
            .table_name(&self.stack.config.counters_table)
            .item(
                "pk",
                AttributeValue::S(format!("{shard:03}#reel#{reel}#likes")),
            )
            .item("n", AttributeValue::N(n.to_string()))
            .send()
            .await
            .expect("put shard");
    }

    /// Adds `delta` to a shard's `n` (a drift injected under live
    /// aggregation, which an overwrite would race with).
    pub async fn add_to_shard(&self, reel: &str, shard: u32, delta: i64) {
        self.stack
            .client
            .update_item()
            .table_name(&self.stack.config.counters_table)
            .key(
                "pk",
                AttributeValue::S(format!("{shard:03}#reel#{reel}#likes")),
            )
            .update_expression("ADD n :d")
            .expression_attribute_values(":d", AttributeValue::N(delta.to_string()))
            .send()
            .await
            .expect("add to shard");
    }

    pub async fn stop(self) {
        self.stack.shutdown().await;
    }
}

/// Waits until the event source has handed the whole stream to the
/// aggregator (or fails the test after `within`).
pub async fn drained(t: &TestStack, within: std::time::Duration) {
    let started = std::time::Instant::now();
    loop {
        if t.stack
            .streams_caught_up()
            .await
            .expect("reading the stream")
        {
            return;
        }
        assert!(
            started.elapsed() < within,
            "the stream was not drained within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
