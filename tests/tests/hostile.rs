//! Hostile input: generated requests (any method; paths with percent-encoded
//! `#`, `/` and `..`, `%00`, broken UTF-8, fullwidth and Cyrillic look-alikes
//! and very long segments; query strings up to 10,000 reel ids; forged
//! `x-user-id`, huge `Idempotency-Key` and non-UTF-8 header bytes; empty,
//! huge and non-UTF-8 bodies) through the real handlers against a real
//! DynamoDB (embedded dynoxide through the real SDK) always get a 2xx valid
//! answer or a 4xx JSON error `{"error": {"code", "message"}}`, never a 5xx,
//! and change the tables only in the keys of the (user, reel) the request
//! validly named: both tables are scanned before and after every case.
//!
//! Three properties: over HTTP through the local gateway (dev mode, as `make
//! serve` runs); the handlers called directly with hand-built API Gateway
//! requests in JWT mode (the production setting: the identity is the
//! authorizer's `sub` claim, a forged `x-user-id` is ignored, no identity on
//! a like is 401, admin routes need IAM); and `likes::http::parse`, the pure
//! validation the handlers run first, on many more cases than the stack can
//! take. Plus fixed cases for the limits (10,000 ids, huge key, huge body).

mod common;

use aws_sdk_dynamodb::types::AttributeValue;
use common::TestStack;
use lambda_http::aws_lambda_events::apigw::{
    ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerIamDescription,
    ApiGatewayRequestAuthorizerJwtDescription, ApiGatewayV2httpRequestContext,
};
use lambda_http::aws_lambda_events::query_map::QueryMap;
use lambda_http::http::{HeaderName, HeaderValue, Method};
use lambda_http::request::RequestContext;
use lambda_http::{Body, RequestExt};
use likes::App;
use likes::http::{
    Command, Function, MAX_BATCH_REELS, MAX_BODY_BYTES, MAX_VIEWS_BODY_BYTES, handle, parse,
};
use likes::keys::{Action, ReelId, UserId};
use likes::store::dynamodb::DynamoStore;
use likes::token::{RequestIdentity, RequestToken};
use likes::{AuthMode, Error};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestCaseError, TestError, TestRunner};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};

// ---------------------------------------------------------------- inputs --

/// One hostile request, as a client (or API Gateway, for `claim` and `iam`)
/// would send it.
#[derive(Clone, Debug)]
struct Hostile {
    method: String,
    /// The raw path, exactly as sent (over HTTP the client may still
    /// normalise it; the oracle reads what was actually sent).
    path: String,
    query: Option<String>,
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Vec<u8>>,
    /// The `sub` claim of a JWT the authorizer verified (direct calls only).
    claim: Option<String>,
    /// Whether API Gateway authorized the call with IAM (direct calls only).
    iam: bool,
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "content-length",
    "expect",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

const USERS: &[&str] = &["attacker", "victim", "fan"];
/// Valid reels, one of them already liked by "victim" before any case.
const REELS: &[&str] = &["good", "victim-reel", "r1", "A_b-9"];

fn valid_reel() -> BoxedStrategy<String> {
    prop_oneof![
        3 => proptest::sample::select(REELS).prop_map(str::to_owned),
        1 => "[A-Za-z0-9_-]{1,64}",
        1 => Just("a".repeat(64)),
    ]
    .boxed()
}

/// A reel id segment as a hostile client spells it.
fn hostile_reel() -> BoxedStrategy<String> {
    let fixed: Vec<String> = vec![
        "good%23x".into(),
        "x%23reel%23good".into(),
        "%23".into(),
        "good%23settings".into(),
        "000%23reel%23victim-reel%23likes".into(),
        "..".into(),
        ".".into(),
        "%2e%2e".into(),
        "%2E%2E%2Fvictim-reel".into(),
        "..%2Fvictim-reel".into(),
        "victim-reel%2Flike".into(),
        "%2F".into(),
        "%00".into(),
        "good%00".into(),
        "%ff%fe".into(),
        "good%".into(),
        "%zz".into(),
        "go od".into(),
        "go%20od".into(),
        "victim-reel%0A".into(),
        // Fullwidth "ｇood", raw and percent-encoded.
        "\u{ff47}ood".into(),
        "%EF%BD%87ood".into(),
        // Cyrillic "о" and "е" in "victim-reеl"/"gооd".
        "g\u{43e}\u{43e}d".into(),
        "victim-re%D0%B5l".into(),
        // Zero-width space before a valid id.
        "%E2%80%8Bgood".into(),
        "a".repeat(65),
        "v".repeat(5000),
        "%41".repeat(64),
        "%41".repeat(65),
    ];
    prop_oneof![
        3 => valid_reel(),
        4 => proptest::sample::select(fixed),
        1 => any::<String>().prop_map(|s| s.chars().take(80).collect()),
        1 => proptest::collection::vec(any::<u8>(), 0..40)
            .prop_map(|b| b.iter().map(|b| format!("%{b:02X}")).collect()),
    ]
    .boxed()
}

fn hostile_path() -> BoxedStrategy<String> {
    let segment = prop_oneof![
        proptest::sample::select(vec![
            "reels",
            "admin",
            "like",
            "likes",
            "shards",
            "healthz",
            "",
            ".",
            "..",
            "%2e",
            "Reels",
            "LIKE",
            "\u{ff52}eels",
        ])
        .prop_map(str::to_owned),
        hostile_reel(),
    ];
    prop_oneof![
        4 => hostile_reel().prop_map(|r| format!("/reels/{r}/like")),
        3 => hostile_reel().prop_map(|r| format!("/reels/{r}/likes")),
        2 => hostile_reel().prop_map(|r| format!("/admin/reels/{r}/shards")),
        2 => proptest::sample::select(vec![
            "/likes", "/healthz", "/admin/reels", "/", "", "/reels/good/like/",
            "//reels/good/like", "/reels/good/../victim-reel/like", "/reels/./good/like",
            "/reels/good/like/../../victim-reel/like", "/reels/good%2Flike",
        ])
        .prop_map(str::to_owned),
        2 => proptest::collection::vec(segment, 0..6).prop_map(|s| format!("/{}", s.join("/"))),
        1 => any::<String>().prop_map(|s| format!("/{}", s.chars().take(200).collect::<String>())),
    ]
    .boxed()
}

fn hostile_query() -> BoxedStrategy<Option<String>> {
    let ids = proptest::collection::vec(hostile_reel(), 0..8);
    prop_oneof![
        3 => Just(None),
        3 => ids.clone().prop_map(|ids| Some(format!("reel_ids={}", ids.join(",")))),
        1 => ids.prop_map(|ids| Some(
            ids.iter().map(|i| format!("reel_ids={i}")).collect::<Vec<_>>().join("&")
        )),
        1 => (0usize..140).prop_map(|n| Some(format!(
            "reel_ids={}", (0..n).map(|i| format!("r{i}")).collect::<Vec<_>>().join(",")
        ))),
        1 => proptest::sample::select(vec![
            // 10,000 ids: the same one, all distinct, and valid ones ending
            // in an invalid one.
            format!("reel_ids={}", vec!["good"; 10_000].join(",")),
            format!("reel_ids={}", (0..10_000).map(|i| format!("r{i}")).collect::<Vec<_>>().join(",")),
            format!("reel_ids={},x%23reel%23victim-reel", vec!["r1"; 9_999].join(",")),
            "reel_ids=".to_owned(),
            "reel_ids=a,,b".to_owned(),
            "reel_ids=good%2Cvictim-reel".to_owned(),
            "reel%5Fids=good".to_owned(),
            "reel_ids=good&reel_ids=victim-reel&x=%ff".to_owned(),
            "reel_ids=%00".to_owned(),
            "reel_ids=%EF%BD%87ood".to_owned(),
            "reel_ids=good#victim-reel".to_owned(),
        ]).prop_map(Some),
        1 => any::<String>().prop_map(|s| Some(s.chars().take(200).collect())),
    ]
    .boxed()
}

fn hostile_headers() -> BoxedStrategy<Vec<(String, Vec<u8>)>> {
    let name = prop_oneof![
        4 => Just("x-user-id".to_owned()),
        3 => Just("idempotency-key".to_owned()),
        1 => proptest::sample::select(vec![
            "content-type", "authorization", "host", "x-forwarded-for", "x-forwarded-proto",
            "cookie", "X-User-Id", "x-amzn-trace-id",
        ]).prop_map(str::to_owned),
        1 => "[a-z][a-z0-9-]{0,20}",
    ];
    let value = prop_oneof![
        4 => proptest::sample::select(USERS).prop_map(|s| s.as_bytes().to_vec()),
        2 => "[!-~]{1,64}".prop_map(String::into_bytes),
        1 => (65usize..16 * 1024).prop_map(|n| vec![b'k'; n]),
        1 => (257usize..2000).prop_map(|n| vec![b'u'; n]),
        1 => Just(Vec::new()),
        1 => Just(b"has space".to_vec()),
        // Non-UTF-8 (obs-text) bytes, which HTTP allows in a header value.
        1 => proptest::collection::vec(0x80u8.., 1..32),
        1 => any::<String>().prop_map(|s| s.into_bytes()),
        1 => Just("\u{ff56}ictim".as_bytes().to_vec()),
    ];
    proptest::collection::vec((name, value), 0..4).boxed()
}

fn hostile_body() -> BoxedStrategy<Option<Vec<u8>>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(Vec::new())),
        1 => Just(Some(b"{}".to_vec())),
        2 => (0u64..200).prop_map(|n| Some(format!("{{\"shards\": {n}}}").into_bytes())),
        1 => proptest::sample::select(vec![
            "{\"shards\": -1}", "{\"shards\": 1e2}", "{\"shards\": \"5\"}",
            "{\"shards\": 5, \"reel_id\": \"victim-reel\"}", "{\"shards\": 99999999999}",
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
        ]).prop_map(|s| Some(s.as_bytes().to_vec())),
        1 => proptest::collection::vec(any::<u8>(), 0..2048).prop_map(Some),
        1 => (MAX_BODY_BYTES + 1..300 * 1024).prop_map(|n| Some(vec![b'x'; n])),
        1 => (1usize..4096).prop_map(|n| Some(vec![0xff; n])),
    ]
    .boxed()
}

fn hostile_method() -> BoxedStrategy<String> {
    prop_oneof![
        6 => proptest::sample::select(vec!["GET", "PUT", "DELETE", "POST"]),
        1 => proptest::sample::select(vec!["PATCH", "OPTIONS", "HEAD", "TRACE", "FOO", "get", "put"]),
    ]
    .prop_map(str::to_owned)
    .boxed()
}

/// Requests that reach the write path with plausible ids often, so that the
/// "only the named keys change" half of the property is exercised on real
/// writes too, not only on refusals.
fn plausible_write() -> BoxedStrategy<Hostile> {
    (
        proptest::sample::select(vec!["PUT", "DELETE"]),
        valid_reel(),
        proptest::sample::select(USERS),
        proptest::option::of("[!-~]{1,64}"),
        // The verified claim: the header's user, another user, or none (a
        // forged header alone, which only dev mode accepts).
        0u8..3,
        proptest::sample::select(USERS),
    )
        .prop_map(|(m, reel, user, key, claim, other)| {
            let mut headers = vec![("x-user-id".to_owned(), user.as_bytes().to_vec())];
            if let Some(k) = key {
                headers.push(("idempotency-key".to_owned(), k.into_bytes()));
            }
            Hostile {
                method: m.to_owned(),
                path: format!("/reels/{reel}/like"),
                query: None,
                headers,
                body: None,
                claim: match claim {
                    0 => Some(user.to_owned()),
                    1 => Some(other.to_owned()),
                    _ => None,
                },
                iam: false,
            }
        })
        .boxed()
}

/// The methods a path's route takes, so that most generated requests get
/// past the method check to the validation behind it.
fn fitting_methods(path: &str) -> &'static [&'static str] {
    if path.ends_with("/like") {
        &["PUT", "DELETE"]
    } else if path.ends_with("/shards") {
        &["GET", "POST"]
    } else {
        &["GET"]
    }
}

fn hostile() -> BoxedStrategy<Hostile> {
    let claim = prop_oneof![
        2 => Just(None),
        3 => proptest::sample::select(USERS).prop_map(|u| Some(u.to_owned())),
        1 => proptest::sample::select(vec![
            String::new(), "a\nb".to_owned(), "x".repeat(257), "\u{ff56}ictim".to_owned(),
        ]).prop_map(Some),
        1 => any::<String>().prop_map(Some),
    ];
    let general = (
        (hostile_method(), 0u8..4, any::<u8>()),
        hostile_path(),
        hostile_query(),
        hostile_headers(),
        hostile_body(),
        claim,
        any::<bool>(),
    )
        .prop_map(
            |((method, fit, pick), path, query, headers, body, claim, iam)| {
                let fitting = fitting_methods(&path);
                let method = if fit == 0 {
                    method
                } else {
                    fitting[usize::from(pick) % fitting.len()].to_owned()
                };
                Hostile {
                    method,
                    path,
                    query,
                    headers,
                    body,
                    claim,
                    iam,
                }
            },
        );
    prop_oneof![3 => general, 1 => plausible_write()].boxed()
}

// ---------------------------------------------------------------- oracle --

/// The documented reel id (docs/operations.md, Limits), checked independently of the
/// product's code.
fn documented_reel(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn decode(s: &str) -> String {
    percent_decode(s.as_bytes())
}

fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a request validly names: the reels (from the route's path segment
/// or `reel_ids`, only those of the documented alphabet), the user and the
/// `Idempotency-Key`.
#[derive(Debug, Default)]
struct Named {
    reels: BTreeSet<String>,
    user: Option<String>,
    key: Option<String>,
    action: Option<Action>,
}

fn named(
    method: &str,
    path: &str,
    query: Option<&str>,
    user: Option<String>,
    key: Option<String>,
) -> Named {
    let segs: Vec<&str> = path.split('/').collect();
    let mut reels = BTreeSet::new();
    match segs.as_slice() {
        ["", "reels", id, "like" | "likes"] | ["", "admin", "reels", id, "shards"] => {
            reels.insert(decode(id));
        }
        _ => {}
    }
    for (k, v) in form_pairs(query.unwrap_or("")) {
        if k == "reel_ids" {
            reels.extend(v.split(',').map(str::to_owned));
        }
    }
    reels.retain(|r| documented_reel(r));
    let action = match method {
        "PUT" => Some(Action::Like),
        "DELETE" => Some(Action::Unlike),
        _ => None,
    };
    Named {
        reels,
        user,
        key,
        action,
    }
}

/// `application/x-www-form-urlencoded` pairs, decoded (`+` is a space).
fn form_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(&k.replace('+', " ")), decode(&v.replace('+', " ")))
        })
        .collect()
}

type Item = HashMap<String, AttributeValue>;

struct Snapshot {
    counters: BTreeMap<String, Item>,
    likes: BTreeMap<(String, String), Item>,
}

fn s_attr(item: &Item, name: &str) -> String {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .cloned()
        .unwrap_or_default()
}

async fn snapshot(t: &TestStack) -> Snapshot {
    let counters = t
        .scan(&t.stack.config.counters_table)
        .await
        .into_iter()
        .map(|i| (s_attr(&i, "pk"), i))
        .collect();
    let likes = t
        .scan(&t.stack.config.likes_table)
        .await
        .into_iter()
        .map(|i| ((s_attr(&i, "user_id"), s_attr(&i, "reel_id")), i))
        .collect();
    Snapshot { counters, likes }
}

fn changed<K: Ord + Clone>(a: &BTreeMap<K, Item>, b: &BTreeMap<K, Item>) -> Vec<K> {
    let keys: BTreeSet<&K> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// Whether a counters-table key belongs to `reel` (docs/guarantees.md, Data model):
/// a shard `NNN#reel#{id}#likes`, the base, the settings or the ledger.
fn counter_key_of(pk: &str, reel: &str) -> bool {
    if let Some(shard) = pk.strip_suffix(&format!("#reel#{reel}#likes")) {
        return shard == "base" || (shard.len() == 3 && shard.bytes().all(|b| b.is_ascii_digit()));
    }
    pk == format!("reel#{reel}#settings") || pk == format!("reel#{reel}#reconcile")
}

/// Every change between `before` and `after` belongs to the (user, reel)
/// the request validly named; a request that was refused, or that does not
/// write, changed nothing.
fn check_changes(
    before: &Snapshot,
    after: &Snapshot,
    n: &Named,
    status: u16,
    writes: bool,
) -> Result<(), TestCaseError> {
    let counters = changed(&before.counters, &after.counters);
    let likes = changed(&before.likes, &after.likes);
    if !(200..300).contains(&status) || !writes {
        prop_assert!(
            counters.is_empty() && likes.is_empty(),
            "status {status}, writes {writes}: changed {counters:?} {likes:?} ({n:?})"
        );
        return Ok(());
    }
    let key_records: BTreeSet<String> = match (&n.user, &n.key, n.action) {
        (Some(u), Some(k), Some(a)) => n
            .reels
            .iter()
            .filter_map(|r| {
                let token = RequestToken::derive(
                    &UserId::parse(u).ok()?,
                    &ReelId::parse(r).ok()?,
                    a,
                    &RequestIdentity::ClientKey(k),
                );
                Some(format!("idem#{}", token.as_str()))
            })
            .collect(),
        _ => BTreeSet::new(),
    };
    for pk in &counters {
        prop_assert!(
            n.reels.iter().any(|r| counter_key_of(pk, r)) || key_records.contains(pk),
            "{pk:?} changed, not a key of {n:?}"
        );
    }
    for (u, r) in &likes {
        prop_assert!(
            n.user.as_deref() == Some(u.as_str()) && n.reels.contains(r),
            "like row ({u:?}, {r:?}) changed, not the one of {n:?}"
        );
    }
    Ok(())
}

/// A 2xx valid answer or a 4xx JSON error, never a 5xx.
fn check_answer(status: u16, body: &[u8], head: bool, n: &Named) -> Result<Value, TestCaseError> {
    prop_assert!(
        status < 500,
        "status {status}: {}",
        String::from_utf8_lossy(body)
    );
    prop_assert!(
        (200..300).contains(&status) || (400..500).contains(&status),
        "status {status}"
    );
    if head {
        // No body comes back for HEAD.
        return Ok(Value::Null);
    }
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => {
            return Err(TestCaseError::fail(format!(
                "status {status}, not JSON: {:?}",
                String::from_utf8_lossy(body)
            )));
        }
    };
    if status >= 400 {
        prop_assert!(
            v["error"]["code"].as_str().is_some_and(|c| !c.is_empty())
                && v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        return Ok(v);
    }
    prop_assert!(v.get("error").is_none(), "{v}");
    if let Some(r) = v.get("reel_id") {
        prop_assert!(
            r.as_str().is_some_and(|r| n.reels.contains(r)),
            "answered for {r} ({n:?})"
        );
    }
    if let Some(counts) = v.get("counts") {
        let counts = counts.as_object().expect("counts is an object");
        prop_assert!(!counts.is_empty() && counts.len() <= MAX_BATCH_REELS);
        for r in counts.keys() {
            prop_assert!(n.reels.contains(r), "counted {r} ({n:?})");
        }
    }
    Ok(v)
}

// ------------------------------------------------------------- the stack --

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A stack where nothing writes but the requests: no scheduled runs, no
/// automatic resizes, so every change in a case is that case's. In stream
/// mode (`LIKES_TEST_COUNTING=stream`) the aggregator is held back too: it
/// would write the named reel's shard and its stream shard's checkpoint
/// later, during another case.
async fn quiet_stack() -> TestStack {
    let t = TestStack::start(&[
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("CACHE_TTL_MS", "0"),
    ])
    .await;
    for source in &t.stack.streams {
        source.pause(true);
    }
    let r = t.like("victim", "victim-reel").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = t.like_with_key("victim", "good", "victim-key").await;
    assert_eq!(r.status, 200, "{}", r.body);
    t
}

/// What the cases of a property did, printed at its end (`--nocapture`),
/// so a generator that stopped reaching the write path shows.
#[derive(Default)]
struct Stats(std::sync::Mutex<(BTreeMap<u16, u32>, u32)>);

impl Stats {
    fn record(&self, status: u16, before: &Snapshot, after: &Snapshot) {
        let wrote = !changed(&before.counters, &after.counters).is_empty()
            || !changed(&before.likes, &after.likes).is_empty();
        if let Ok(mut s) = self.0.lock() {
            *s.0.entry(status).or_default() += 1;
            s.1 += u32::from(wrote);
        }
    }

    fn summary(&self) -> String {
        match self.0.lock() {
            Ok(s) => format!(
                "{} cases, {} of them writing; statuses {:?}",
                s.0.values().sum::<u32>(),
                s.1,
                s.0
            ),
            Err(_) => "no stats".to_owned(),
        }
    }
}

fn cases(default: u32) -> u32 {
    std::env::var("HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run<S: Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let config = PropConfig {
        cases,
        failure_persistence: None,
        // Shrinking replays cases on the live stack: keep it bounded.
        max_shrink_iters: 256,
        ..PropConfig::default()
    };
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, test) {
        Ok(()) => {}
        Err(TestError::Fail(why, input)) => panic!("{why}\nminimal failing input: {input:#?}"),
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------- properties --

/// Over HTTP, through the local gateway in dev mode: the identity is the
/// `x-user-id` header (joined with commas when repeated, as API Gateway
/// joins headers).
#[test]
fn hostile_http_requests_get_4xx_json_or_a_valid_answer_and_touch_only_their_keys() {
    let rt = runtime();
    let t = rt.block_on(quiet_stack());
    let started = std::time::Instant::now();
    let stats = Stats::default();
    run(cases(96), hostile(), |h| {
        rt.block_on(async {
            let target = format!(
                "{}{}{}",
                t.stack.base_url,
                h.path,
                h.query
                    .as_ref()
                    .map(|q| format!("?{q}"))
                    .unwrap_or_default()
            );
            // What the client cannot send at all is not a case.
            let Ok(url) = reqwest::Url::parse(&target) else {
                return Ok(());
            };
            let Ok(method) = reqwest::Method::from_bytes(h.method.as_bytes()) else {
                return Ok(());
            };
            let mut req = t.http.request(method.clone(), url.clone());
            let mut users = Vec::new();
            let mut keys = Vec::new();
            for (name, value) in &h.headers {
                let (Ok(n), Ok(v)) = (
                    reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                    reqwest::header::HeaderValue::from_bytes(value),
                ) else {
                    continue;
                };
                // Connection-level headers steer the HTTP client and server,
                // not the API (API Gateway never passes them on).
                if HOP_BY_HOP.contains(&n.as_str()) {
                    continue;
                }
                // The gateway passes header bytes on as (lossy) UTF-8 and
                // joins repeated ones with commas, as API Gateway does.
                let text = String::from_utf8_lossy(value).into_owned();
                if n == "x-user-id" {
                    users.push(text);
                } else if n == "idempotency-key" {
                    keys.push(text);
                }
                req = req.header(n, v);
            }
            if let Some(b) = &h.body {
                req = req.body(b.clone());
            }
            let before = snapshot(&t).await;
            let resp = req.send().await.expect("the gateway answers");
            let status = resp.status().as_u16();
            let body = resp.bytes().await.expect("body");
            let after = snapshot(&t).await;
            stats.record(status, &before, &after);
            let join = |v: Vec<String>| (!v.is_empty()).then(|| v.join(","));
            let n = named(
                method.as_str(),
                url.path(),
                url.query(),
                join(users),
                join(keys),
            );
            check_answer(status, &body, method == reqwest::Method::HEAD, &n)?;
            let writes = matches!(method.as_str(), "PUT" | "DELETE" | "POST");
            check_changes(&before, &after, &n, status, writes)
        })
    });
    eprintln!(
        "HTTP, dev mode: {} in {:.1}s",
        stats.summary(),
        started.elapsed().as_secs_f64()
    );
    rt.block_on(t.stop());
}

/// The request lambda_http hands the handler for an API Gateway payload-2.0
/// event: raw path, the query map parsed from the raw query string, the
/// request context with the authorizer's claims or IAM identity.
fn lambda_request(h: &Hostile) -> Option<lambda_http::Request> {
    let method = Method::from_bytes(h.method.as_bytes()).ok()?;
    let body = match &h.body {
        None => Body::Empty,
        Some(b) if b.is_empty() => Body::Empty,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => Body::Text(s.to_owned()),
            Err(_) => Body::Binary(b.clone()),
        },
    };
    let mut ctx = ApiGatewayV2httpRequestContext::default();
    ctx.http.method = method.clone();
    ctx.request_id = Some(format!("hostile-{}=", fastrand_id()));
    if h.claim.is_some() || h.iam {
        let mut a = ApiGatewayRequestAuthorizer::default();
        if let Some(sub) = &h.claim {
            let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
            jwt.claims.insert("sub".to_owned(), sub.clone());
            a.jwt = Some(jwt);
        }
        if h.iam {
            let mut iam = ApiGatewayRequestAuthorizerIamDescription::default();
            iam.user_arn = Some("arn:aws:iam::123456789012:user/operator".to_owned());
            a.iam = Some(iam);
        }
        ctx.authorizer = Some(a);
    }
    let mut req = lambda_http::http::Request::new(body);
    *req.method_mut() = method;
    if let Ok(uri) = h.path.parse() {
        *req.uri_mut() = uri;
    }
    for (name, value) in &h.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            req.headers_mut().append(n, v);
        }
    }
    let query: QueryMap = h.query.as_deref().unwrap_or("").parse().unwrap_or_default();
    Some(
        req.with_raw_http_path(h.path.clone())
            .with_query_string_parameters(query)
            .with_request_context(RequestContext::ApiGatewayV2(ctx)),
    )
}

fn fastrand_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{:015}", N.fetch_add(1, Ordering::Relaxed))
}

/// The function the template routes a path to (the API's `$default` route
/// goes to the read function), or any function: each must answer 404 for
/// routes it does not serve.
fn functions() -> impl Strategy<Value = Option<Function>> {
    prop_oneof![
        3 => Just(None),
        1 => proptest::sample::select(vec![Function::Like, Function::Read, Function::Reshard])
            .prop_map(Some),
    ]
}

fn routed_function(path: &str) -> Function {
    let segs: Vec<&str> = path.split('/').collect();
    match segs.as_slice() {
        ["", "reels", _, "like"] => Function::Like,
        ["", "admin", "reels", ..] => Function::Reshard,
        _ => Function::Read,
    }
}

/// The production setting, the handlers called directly: identity only from
/// the authorizer's `sub` claim, admin routes only with IAM. Raw paths reach
/// the handler exactly as generated (no client normalises `..` here).
#[test]
fn hostile_api_gateway_events_in_jwt_mode_ignore_forged_users_and_touch_only_their_keys() {
    let rt = runtime();
    let t = rt.block_on(quiet_stack());
    let mut config = t.stack.config.clone();
    config.auth_mode = AuthMode::Jwt;
    let app = App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    );
    let started = std::time::Instant::now();
    let stats = Stats::default();
    run(cases(96), (hostile(), functions()), |(h, f)| {
        rt.block_on(async {
            let Some(req) = lambda_request(&h) else {
                return Ok(());
            };
            let function = f.unwrap_or_else(|| routed_function(&h.path));
            let key = req
                .headers()
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let before = snapshot(&t).await;
            let resp = handle(&app, function, req).await;
            let after = snapshot(&t).await;
            let status = resp.status().as_u16();
            stats.record(status, &before, &after);
            let body: Vec<u8> = match resp.body() {
                Body::Text(s) => s.clone().into_bytes(),
                Body::Binary(b) => b.clone(),
                _ => Vec::new(),
            };
            prop_assert_eq!(
                resp.headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok()),
                Some("application/json")
            );
            // The claim is the only identity: a forged x-user-id never is.
            let n = named(&h.method, &h.path, h.query.as_deref(), h.claim.clone(), key);
            let v = check_answer(status, &body, false, &n)?;
            let like_route = function == Function::Like
                && matches!(
                    h.path.split('/').collect::<Vec<_>>().as_slice(),
                    ["", "reels", _, "like"]
                )
                && matches!(h.method.as_str(), "PUT" | "DELETE");
            if like_route
                && h.claim.is_none()
                && h.body.as_ref().is_none_or(|b| b.len() <= MAX_BODY_BYTES)
            {
                prop_assert_eq!(status, 401, "a like without a claim: {}", v);
            }
            if status < 300 && v.get("liked_by_me").is_some() {
                prop_assert!(h.claim.is_some(), "liked_by_me without a claim: {}", v);
            }
            let admin = matches!(h.path.split('/').nth(1), Some("admin"));
            if function == Function::Reshard
                && admin
                && !h.iam
                && status != 404
                && status != 405
                && status != 413
            {
                prop_assert_eq!(status, 403, "an admin call without IAM: {}", v);
            }
            let writes = matches!(h.method.as_str(), "PUT" | "DELETE" | "POST");
            check_changes(&before, &after, &n, status, writes)
        })
    });
    eprintln!(
        "direct, JWT mode: {} in {:.1}s",
        stats.summary(),
        started.elapsed().as_secs_f64()
    );
    rt.block_on(t.stop());
}

/// `likes::http::parse`, the validation every handler runs before any I/O,
/// on many more cases than a stack can take: an `Ok` names only ids that
/// appear, decoded, where the route takes them, and only the identity the
/// auth mode allows; an `Err` is a 4xx JSON error; outside dev mode the
/// `x-user-id` header changes nothing.
#[test]
fn parse_names_only_what_the_request_names() {
    run(cases(2000), (hostile(), functions()), |(h, f)| {
        let Some(req) = lambda_request(&h) else {
            return Ok(());
        };
        let function = f.unwrap_or_else(|| routed_function(&h.path));
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        for mode in [AuthMode::Jwt, AuthMode::Dev] {
            let out = parse(&req, mode, function);
            let user = match (&h.claim, mode) {
                (Some(c), _) => Some(c.clone()),
                (None, AuthMode::Dev) => header("x-user-id"),
                (None, AuthMode::Jwt) => None,
            };
            let n = named(
                &h.method,
                &h.path,
                h.query.as_deref(),
                user,
                header("idempotency-key"),
            );
            check_parsed(&out, &n, &h)?;
            if mode == AuthMode::Jwt {
                let mut forged = h.clone();
                forged
                    .headers
                    .retain(|(k, _)| !k.eq_ignore_ascii_case("x-user-id"));
                forged
                    .headers
                    .push(("x-user-id".into(), b"victim".to_vec()));
                let forged = lambda_request(&forged).expect("same request");
                prop_assert_eq!(parse(&forged, mode, function), out);
            }
        }
        Ok(())
    });
}

fn check_parsed(out: &Result<Command, Error>, n: &Named, h: &Hostile) -> Result<(), TestCaseError> {
    let c = match out {
        Err(e) => {
            prop_assert!((400..500).contains(&e.status()), "{e:?}");
            let b = e.body();
            prop_assert_eq!(b["error"]["code"].as_str(), Some(e.code()));
            prop_assert!(
                b["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
            );
            return Ok(());
        }
        Ok(c) => c,
    };
    let limit = if matches!(c, Command::Views { .. }) {
        MAX_VIEWS_BODY_BYTES
    } else {
        MAX_BODY_BYTES
    };
    prop_assert!(h.body.as_ref().is_none_or(|b| b.len() <= limit));
    let reel_named = |r: &ReelId| n.reels.contains(r.as_str());
    let user_named = |u: &UserId| n.user.as_deref() == Some(u.as_str());
    match c {
        Command::Write {
            user,
            reel,
            action,
            idempotency_key,
        } => {
            prop_assert!(reel_named(reel) && user_named(user), "{c:?} vs {n:?}");
            prop_assert_eq!(Some(*action), n.action);
            prop_assert_eq!(idempotency_key, &n.key);
        }
        Command::Count { reel, user } => {
            prop_assert!(reel_named(reel), "{c:?} vs {n:?}");
            // A verified claim that is no user id reads as anonymous: the
            // identity only adds liked_by_me there.
            let identity = n.user.as_deref().filter(|u| UserId::parse(u).is_ok());
            prop_assert_eq!(user.as_ref().map(UserId::as_str), identity);
        }
        Command::Counts { reels } => {
            prop_assert!(!reels.is_empty() && reels.len() <= MAX_BATCH_REELS);
            prop_assert!(reels.iter().all(reel_named), "{c:?} vs {n:?}");
        }
        Command::ShardState { reel }
        | Command::ReelViews { reel }
        | Command::ReelStats { reel } => {
            prop_assert!(reel_named(reel), "{c:?} vs {n:?}");
        }
        Command::Trending { limit, .. } => {
            prop_assert!((1..=likes::http::MAX_TRENDING).contains(limit), "{c:?}");
        }
        Command::LikesAndViews { reels } => {
            prop_assert!(!reels.is_empty() && reels.len() <= MAX_BATCH_REELS);
            prop_assert!(reels.iter().all(reel_named), "{c:?} vs {n:?}");
        }
        Command::Views {
            viewer,
            views,
            idempotency_key,
        } => {
            // The reels of a batch are named in its body, not its path.
            prop_assert!(user_named(viewer), "{c:?} vs {n:?}");
            prop_assert_eq!(idempotency_key, &n.key);
            prop_assert!(!views.is_empty() && views.len() <= 100, "{c:?}");
            let body = String::from_utf8_lossy(h.body.as_deref().unwrap_or_default());
            for (reel, count) in views {
                prop_assert!(body.contains(reel.as_str()) && *count >= 1, "{c:?}");
            }
        }
        Command::Resize {
            reel, principal, ..
        } => {
            prop_assert!(reel_named(reel), "{c:?} vs {n:?}");
            // Attributable: the IAM principal API Gateway authorized (or the
            // local stack's dev mode), never empty.
            prop_assert!(
                principal == "arn:aws:iam::123456789012:user/operator" || principal == "dev",
                "{c:?}"
            );
        }
        Command::Erase { principal, .. } => {
            prop_assert!(
                principal == "arn:aws:iam::123456789012:user/operator" || principal == "dev",
                "{c:?}"
            );
        }
        Command::Health | Command::ListResized => {}
    }
    Ok(())
}

// ----------------------------------------------------------- fixed cases --

/// The limits, each at its edge and far past it, over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_hold_at_and_far_past_their_edges() {
    let t = quiet_stack().await;
    let before = snapshot(&t).await;
    let same = vec!["good"; 10_000].join(",");
    let r = t
        .send("GET", &format!("/likes?reel_ids={same}"), None, &[], None)
        .await;
    assert_eq!(
        (r.status, &r.body["counts"]),
        (200, &serde_json::json!({"good": 1}))
    );
    let hundred = (0..100)
        .map(|i| format!("r{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let r = t
        .send(
            "GET",
            &format!("/likes?reel_ids={hundred}"),
            None,
            &[],
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["counts"].as_object().map(|m| m.len()), Some(100));
    let distinct = (0..10_000)
        .map(|i| format!("r{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let r = t
        .send(
            "GET",
            &format!("/likes?reel_ids={distinct}"),
            None,
            &[],
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("too_many_reel_ids"))
    );
    let r = t
        .send(
            "GET",
            &format!("/likes?reel_ids={same},victim-reel%23settings"),
            None,
            &[],
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("invalid_reel_id"))
    );

    let key64 = "k".repeat(64);
    let r = t
        .send(
            "PUT",
            "/reels/r1/like",
            Some("fan"),
            &[("idempotency-key", &key64)],
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let huge_key = "k".repeat(16 * 1024);
    let r = t
        .send(
            "PUT",
            "/reels/r2/like",
            Some("fan"),
            &[("idempotency-key", &huge_key)],
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("invalid_idempotency_key"))
    );

    let r = t
        .send(
            "PUT",
            "/reels/r2/like",
            Some("fan"),
            &[],
            Some(vec![b' '; MAX_BODY_BYTES]),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    for size in [MAX_BODY_BYTES + 1, 60 * 1024, 1024 * 1024] {
        let r = t
            .send(
                "PUT",
                "/reels/r3/like",
                Some("fan"),
                &[],
                Some(vec![0xff; size]),
            )
            .await;
        assert_eq!(
            (r.status, r.body["error"]["code"].as_str()),
            (413, Some("payload_too_large")),
            "{size}"
        );
    }
    let long = "a".repeat(64);
    let r = t.like("fan", &long).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = t.like("fan", &"a".repeat(65)).await;
    assert_eq!(r.status, 400);
    let r = t.like(&"u".repeat(256), "r4").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = t.like(&"u".repeat(257), "r4").await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (400, Some("invalid_user_id"))
    );

    // Exactly the writes that were answered 200, nothing else.
    let after = snapshot(&t).await;
    let rows: BTreeSet<(String, String)> =
        changed(&before.likes, &after.likes).into_iter().collect();
    let want: BTreeSet<(String, String)> = [
        ("fan".to_owned(), "r1"),
        ("fan".to_owned(), "r2"),
        ("fan".to_owned(), long.as_str()),
        ("u".repeat(256), "r4"),
    ]
    .into_iter()
    .map(|(u, r)| (u, r.to_owned()))
    .collect();
    assert_eq!(rows, want);
    for pk in changed(&before.counters, &after.counters) {
        assert!(
            ["r1", "r2", long.as_str(), "r4"]
                .iter()
                .any(|r| counter_key_of(&pk, r))
                || pk.starts_with("idem#")
                // The readers' read units (the caller's budget).
                || pk.starts_with("caller#"),
            "{pk}"
        );
    }
    t.stop().await;
}

/// JWT mode: no identity is 401 however the caller dresses it up, a forged
/// `x-user-id` never acts for anyone, and a claim the service cannot store
/// is not an identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_verified_identity_a_like_is_401_and_forged_users_are_ignored() {
    let t = quiet_stack().await;
    let mut config = t.stack.config.clone();
    config.auth_mode = AuthMode::Jwt;
    let app = App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    );
    let before = snapshot(&t).await;
    let req = |method: &str, path: &str, claim: Option<&str>, forged: &[u8]| {
        lambda_request(&Hostile {
            method: method.into(),
            path: path.into(),
            query: None,
            headers: vec![("x-user-id".into(), forged.to_vec())],
            body: None,
            claim: claim.map(str::to_owned),
            iam: false,
        })
        .expect("a request")
    };
    for forged in [&b"victim"[..], b"", b"\xff\xfe", b"fan", &[b'u'; 300][..]] {
        for method in ["PUT", "DELETE"] {
            let resp = handle(
                &app,
                Function::Like,
                req(method, "/reels/victim-reel/like", None, forged),
            )
            .await;
            assert_eq!(resp.status(), 401, "{method} {forged:?}");
        }
        // A read answers, but never for the forged user.
        let resp = handle(
            &app,
            Function::Read,
            req("GET", "/reels/victim-reel/likes", None, forged),
        )
        .await;
        let Body::Text(b) = resp.body() else {
            panic!("a text body")
        };
        let v: Value = serde_json::from_str(b).expect("JSON");
        assert_eq!(
            (resp.status().as_u16(), v.get("liked_by_me")),
            (200, None),
            "{v}"
        );
    }
    // A claim the service cannot store (empty, control characters, too
    // long) is not an identity, whatever the header says.
    for sub in ["", "a\u{0}b", "a\nb", &"x".repeat(257)] {
        let resp = handle(
            &app,
            Function::Like,
            req("PUT", "/reels/victim-reel/like", Some(sub), b"victim"),
        )
        .await;
        assert_eq!(resp.status(), 401, "{sub:?}");
    }
    // Admin routes want IAM, not a JWT or a forged header.
    for method in ["GET", "POST"] {
        let resp = handle(
            &app,
            Function::Reshard,
            req(
                method,
                "/admin/reels/victim-reel/shards",
                Some("victim"),
                b"victim",
            ),
        )
        .await;
        assert_eq!(resp.status(), 403, "{method}");
    }
    // With a claim, the claim acts and the header is ignored.
    let resp = handle(
        &app,
        Function::Like,
        req("DELETE", "/reels/victim-reel/like", Some("fan"), b"victim"),
    )
    .await;
    let Body::Text(b) = resp.body() else {
        panic!("a text body")
    };
    assert_eq!(resp.status(), 200, "{b}");
    let after = snapshot(&t).await;
    assert!(
        changed(&before.likes, &after.likes).is_empty(),
        "fan had no like to remove; victim's stays"
    );
    assert_eq!(t.like_rows("victim-reel").await, 1);
    t.stop().await;
}
