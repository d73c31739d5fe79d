//! Fuzzes `likes::http::parse`, the request routing and validation that the
//! handlers run before any I/O, with hostile requests: any method, raw path,
//! query string, headers, body and JWT claim, under both auth modes and for
//! each function.
//!
//! Asserted for every input, besides "never panics":
//! * an `Ok` command names only reel ids that literally appear, decoded, in
//!   the request where the route takes them (the path segment, the
//!   `reel_ids` values), each valid by the documented alphabet and length;
//!   at most `MAX_BATCH_REELS` distinct ones in a batch;
//! * its user is the verified `sub` claim, or in dev mode only (and only
//!   without a claim) the `x-user-id` header; outside dev mode the header
//!   changes nothing at all; a like/unlike without identity is never `Ok`;
//! * its `Idempotency-Key` is the header's, 1–64 visible ASCII characters,
//!   and a resize's shard count is the body's `shards`;
//! * a body over `MAX_BODY_BYTES` is never `Ok`;
//! * an `Err` is a 4xx with a JSON body `{"error": {"code", "message"}}`.
//!
//! Inputs come in two formats: an API Gateway payload-2.0 event as JSON (the
//! seeds in fuzz/corpus/request are the sample events of `events/`, which
//! libFuzzer mutates as text), or anything else, decoded with `arbitrary`
//! into a structured request (method, path segments, hostile ids, query,
//! headers, claim, body). Either way the request is built the way
//! lambda_http builds one from an event (`rawPath`, the query map parsed
//! from `rawQueryString`, the request context with the authorizer), but
//! directly: lambda_http's own conversion panics on URIs and base64 bodies
//! API Gateway never sends, which says nothing about this code.

#![no_main]

use arbitrary::Arbitrary;
use lambda_http::aws_lambda_events::apigw::{
    ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerIamDescription,
    ApiGatewayRequestAuthorizerJwtDescription, ApiGatewayV2httpRequest,
    ApiGatewayV2httpRequestContext,
};
use lambda_http::aws_lambda_events::query_map::QueryMap;
use lambda_http::http::{HeaderName, HeaderValue, Method};
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt};
use libfuzzer_sys::fuzz_target;
use likes::AuthMode;
use likes::http::{Command, Function, MAX_BATCH_REELS, MAX_BODY_BYTES, parse};
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

#[derive(Arbitrary, Debug)]
struct Input {
    function: FunctionIn,
    method: MethodIn,
    path: PathIn,
    query: QueryIn,
    headers: Vec<(NameIn, ValueIn)>,
    claim: Option<TextIn>,
    iam: bool,
    body: BodyIn,
}

#[derive(Arbitrary, Debug)]
enum FunctionIn {
    Like,
    Read,
    Reshard,
}

#[derive(Arbitrary, Debug)]
enum MethodIn {
    Get,
    Put,
    Delete,
    Post,
    Head,
    Patch,
    Options,
    Other(String),
}

/// Paths are mostly made of the API's own segments, so the fuzzer reaches
/// every route quickly, with hostile ids in between.
#[derive(Arbitrary, Debug)]
enum PathIn {
    /// One of the API's paths, with a hostile id where it takes one.
    Route(RouteIn, IdIn),
    Segments(Vec<Segment>),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum RouteIn {
    Like,
    Likes,
    Batch,
    Healthz,
    AdminShards,
    AdminReels,
    Stats,
    Trending,
}

#[derive(Arbitrary, Debug)]
enum Segment {
    Reels,
    Admin,
    Like,
    Likes,
    Shards,
    Healthz,
    Empty,
    Dot,
    DotDot,
    Id(IdIn),
}

/// A reel (or user) id as a hostile client spells it.
#[derive(Arbitrary, Debug)]
enum IdIn {
    /// As is: may hold `#`, `/`, `%`, controls, any unicode.
    Plain(String),
    /// Every byte percent-encoded (`#` as `%23`, `/` as `%2F`, `.` as `%2E`).
    Encoded(String),
    /// Raw bytes, percent-encoded (`%FF`, `%00`, broken UTF-8).
    Bytes(Vec<u8>),
    /// ASCII letters swapped for fullwidth or Cyrillic look-alikes,
    /// percent-encoded as a browser would, or sent raw.
    LookAlike {
        text: String,
        cyrillic: bool,
        encode: bool,
    },
    /// `len` copies of one character: ids around and far over 64.
    Long { len: u16, ch: char },
    /// A valid id, or one almost so.
    Valid(u32),
}

#[derive(Arbitrary, Debug)]
enum QueryIn {
    None,
    Raw(String),
    ReelIds {
        ids: Vec<IdIn>,
        /// Repeat the parameter instead of joining with commas.
        repeat: bool,
        extra: Option<String>,
    },
    /// Up to 10,000 ids in one query: the same id again and again, or all
    /// distinct.
    Many {
        count: u16,
        distinct: bool,
    },
}

#[derive(Arbitrary, Debug)]
enum NameIn {
    UserId,
    IdempotencyKey,
    ContentType,
    Host,
    Authorization,
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum ValueIn {
    Text(TextIn),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum TextIn {
    Text(String),
    Id(IdIn),
    Long { len: u16, ch: char },
}

#[derive(Arbitrary, Debug)]
enum BodyIn {
    Empty,
    Text(String),
    Binary(Vec<u8>),
    Shards(i64),
    ShardsFloat(f64),
    ShardsExtra(u32, String),
    Huge { len: u32, binary: bool },
}

fn look_alike(text: &str, cyrillic: bool) -> String {
    text.chars()
        .map(|c| match (cyrillic, c) {
            (false, 'a'..='z' | 'A'..='Z' | '0'..='9') => {
                // Fullwidth forms: U+FF10.. digits, U+FF21.. upper, U+FF41.. lower.
                char::from_u32(c as u32 - 0x20 + 0xFF00).unwrap_or(c)
            }
            (true, 'a') => 'а',
            (true, 'e') => 'е',
            (true, 'o') => 'о',
            (true, 'p') => 'р',
            (true, 'c') => 'с',
            (true, 'x') => 'х',
            (true, 'y') => 'у',
            _ => c,
        })
        .collect()
}

impl IdIn {
    fn render(&self) -> String {
        match self {
            IdIn::Plain(s) => s.clone(),
            IdIn::Encoded(s) => s.bytes().map(|b| format!("%{b:02X}")).collect(),
            IdIn::Bytes(b) => b.iter().map(|b| format!("%{b:02x}")).collect(),
            IdIn::LookAlike {
                text,
                cyrillic,
                encode,
            } => {
                let s = look_alike(text, *cyrillic);
                if *encode {
                    utf8_percent_encode(&s, NON_ALPHANUMERIC).to_string()
                } else {
                    s
                }
            }
            IdIn::Long { len, ch } => std::iter::repeat_n(*ch, usize::from(*len) % 200).collect(),
            IdIn::Valid(n) => match n % 4 {
                0 => format!("reel-{n}"),
                1 => "a".repeat(64),
                2 => "a".repeat(65),
                _ => format!("r_{}-X", n / 4),
            },
        }
    }
}

impl TextIn {
    fn render(&self) -> String {
        match self {
            TextIn::Text(s) => s.clone(),
            TextIn::Id(id) => id.render(),
            TextIn::Long { len, ch } => std::iter::repeat_n(*ch, usize::from(*len)).collect(),
        }
    }
}

/// The request as lambda_http hands it to the handler, and the raw parts the
/// oracle checks the command against.
struct Built {
    req: Request,
    raw_path: String,
    /// Every `reel_ids` value the request carries, decoded: from the raw
    /// query string, or (an event without one) its query parameters.
    reel_ids: Vec<String>,
    claim: Option<String>,
    body: Vec<u8>,
}

/// The `reel_ids` values of a raw query string, form-decoded.
fn reel_ids_of(raw_query: &str) -> Vec<String> {
    form_urlencoded::parse(raw_query.as_bytes())
        .filter(|(k, _)| k == "reel_ids")
        .map(|(_, v)| v.into_owned())
        .collect()
}

fn build(input: &Input) -> Built {
    let method = match &input.method {
        MethodIn::Get => Method::GET,
        MethodIn::Put => Method::PUT,
        MethodIn::Delete => Method::DELETE,
        MethodIn::Post => Method::POST,
        MethodIn::Head => Method::HEAD,
        MethodIn::Patch => Method::PATCH,
        MethodIn::Options => Method::OPTIONS,
        // API Gateway passes any token as the method; one that is not a
        // token cannot arrive (the event would not deserialise).
        MethodIn::Other(s) => Method::from_bytes(s.as_bytes()).unwrap_or(Method::GET),
    };
    let raw_path = match &input.path {
        PathIn::Raw(s) => s.clone(),
        PathIn::Route(route, id) => match route {
            RouteIn::Like => format!("/reels/{}/like", id.render()),
            RouteIn::Likes => format!("/reels/{}/likes", id.render()),
            RouteIn::Batch => "/likes".to_owned(),
            RouteIn::Healthz => "/healthz".to_owned(),
            RouteIn::AdminShards => format!("/admin/reels/{}/shards", id.render()),
            RouteIn::AdminReels => "/admin/reels".to_owned(),
            RouteIn::Stats => format!("/reels/{}/stats", id.render()),
            RouteIn::Trending => "/trending".to_owned(),
        },
        PathIn::Segments(segs) => {
            let mut p = String::new();
            for s in segs {
                p.push('/');
                match s {
                    Segment::Reels => p.push_str("reels"),
                    Segment::Admin => p.push_str("admin"),
                    Segment::Like => p.push_str("like"),
                    Segment::Likes => p.push_str("likes"),
                    Segment::Shards => p.push_str("shards"),
                    Segment::Healthz => p.push_str("healthz"),
                    Segment::Empty => {}
                    Segment::Dot => p.push('.'),
                    Segment::DotDot => p.push_str(".."),
                    Segment::Id(id) => p.push_str(&id.render()),
                }
            }
            p
        }
    };
    let raw_query = match &input.query {
        QueryIn::None => String::new(),
        QueryIn::Raw(s) => s.clone(),
        QueryIn::ReelIds { ids, repeat, extra } => {
            let ids: Vec<String> = ids.iter().map(IdIn::render).collect();
            let mut q = if *repeat {
                ids.iter()
                    .map(|i| format!("reel_ids={i}"))
                    .collect::<Vec<_>>()
                    .join("&")
            } else {
                format!("reel_ids={}", ids.join(","))
            };
            if let Some(e) = extra {
                q.push('&');
                q.push_str(e);
            }
            q
        }
        QueryIn::Many { count, distinct } => {
            let ids: Vec<String> = (0..*count % 10_001)
                .map(|i| {
                    if *distinct {
                        format!("r{i}")
                    } else {
                        "same".to_owned()
                    }
                })
                .collect();
            format!("reel_ids={}", ids.join(","))
        }
    };
    let body: Vec<u8> = match &input.body {
        BodyIn::Empty => Vec::new(),
        BodyIn::Text(s) => s.clone().into_bytes(),
        BodyIn::Binary(b) => b.clone(),
        BodyIn::Shards(n) => format!("{{\"shards\": {n}}}").into_bytes(),
        BodyIn::ShardsFloat(f) => format!("{{\"shards\": {f}}}").into_bytes(),
        BodyIn::ShardsExtra(n, k) => serde_json::json!({ "shards": n, k.as_str(): 1 })
            .to_string()
            .into_bytes(),
        BodyIn::Huge { len, binary } => {
            // Up to the local gateway's 64 KiB; the handler's own limit is
            // 1 KiB, and what lies beyond costs only copying.
            let len = *len as usize % (64 * 1024 + 1);
            if *binary {
                vec![0xff; len]
            } else {
                vec![b'x'; len]
            }
        }
    };
    let body_value = if body.is_empty() {
        Body::Empty
    } else {
        match (&input.body, String::from_utf8(body.clone())) {
            (BodyIn::Binary(_), _) | (_, Err(_)) => Body::Binary(body.clone()),
            (_, Ok(s)) => Body::Text(s),
        }
    };

    let mut ctx = ApiGatewayV2httpRequestContext::default();
    ctx.http.method = method.clone();
    ctx.request_id = Some("fuzz-request=".to_owned());
    let claim = input.claim.as_ref().map(TextIn::render);
    if claim.is_some() || input.iam {
        let mut authorizer = ApiGatewayRequestAuthorizer::default();
        if let Some(sub) = &claim {
            let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
            jwt.claims.insert("sub".to_owned(), sub.clone());
            authorizer.jwt = Some(jwt);
        }
        if input.iam {
            let mut iam = ApiGatewayRequestAuthorizerIamDescription::default();
            iam.user_arn = Some("arn:aws:iam::123456789012:user/operator".to_owned());
            authorizer.iam = Some(iam);
        }
        ctx.authorizer = Some(authorizer);
    }

    let mut req = lambda_http::http::Request::new(body_value);
    *req.method_mut() = method;
    // lambda_http builds the URI from rawPath too; a path that is not a
    // valid URI path keeps "/" (the handler reads rawPath).
    if let Ok(uri) = raw_path.parse() {
        *req.uri_mut() = uri;
    }
    for (name, value) in &input.headers {
        let name = match name {
            NameIn::UserId => HeaderName::from_static("x-user-id"),
            NameIn::IdempotencyKey => HeaderName::from_static("idempotency-key"),
            NameIn::ContentType => HeaderName::from_static("content-type"),
            NameIn::Host => HeaderName::from_static("host"),
            NameIn::Authorization => HeaderName::from_static("authorization"),
            NameIn::Raw(s) => match HeaderName::from_bytes(s.as_bytes()) {
                Ok(n) => n,
                Err(_) => continue,
            },
        };
        let value = match value {
            ValueIn::Text(t) => HeaderValue::from_str(&t.render()),
            ValueIn::Bytes(b) => HeaderValue::from_bytes(b),
        };
        // Values with controls cannot be sent in HTTP at all.
        if let Ok(v) = value {
            req.headers_mut().append(name, v);
        }
    }
    let query: QueryMap = raw_query.parse().unwrap_or_default();
    let req = req
        .with_raw_http_path(raw_path.clone())
        .with_query_string_parameters(query)
        .with_request_context(RequestContext::ApiGatewayV2(ctx));
    Built {
        req,
        raw_path,
        reel_ids: reel_ids_of(&raw_query),
        claim,
        body,
    }
}

/// The documented reel id: 1–64 characters of `[A-Za-z0-9_-]`, checked here
/// independently of the product's code.
fn valid_reel(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The percent-decoded path segment at `index` (0 is the empty one before
/// the first `/`).
fn segment(raw_path: &str, index: usize) -> Option<String> {
    raw_path
        .split('/')
        .nth(index)
        .map(|s| percent_decode_str(s).decode_utf8_lossy().into_owned())
}

fn check(b: &Built, function: Function, mode: AuthMode, out: &Result<Command, likes::Error>) {
    let header = |name: &str| {
        b.req
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    // The identity a command may carry: the claim; the header only in dev
    // mode and only without a claim.
    let expected_user = match (&b.claim, mode) {
        (Some(c), _) => Some(c.clone()),
        (None, AuthMode::Dev) => header("x-user-id"),
        (None, AuthMode::Jwt) => None,
    };
    let user_ok = |u: &likes::keys::UserId| {
        Some(u.as_str()) == expected_user.as_deref()
            && !u.as_str().is_empty()
            && u.as_str().len() <= 256
            && !u.as_str().chars().any(char::is_control)
    };
    let decoded_path = percent_decode_str(&b.raw_path)
        .decode_utf8_lossy()
        .into_owned();
    let path_reel = |reel: &likes::keys::ReelId, index: usize| {
        assert!(valid_reel(reel.as_str()), "{reel:?}");
        assert_eq!(segment(&b.raw_path, index).as_deref(), Some(reel.as_str()));
        assert!(decoded_path.contains(reel.as_str()));
    };
    let ok = match out {
        Err(e) => {
            let status = e.status();
            assert!((400..500).contains(&status), "{e:?} is {status}");
            let body = e.body();
            let text = serde_json::to_string(&body).expect("serialisable");
            let back: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(back["error"]["code"].as_str(), Some(e.code()));
            assert!(
                back["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
            );
            return;
        }
        Ok(c) => c,
    };
    let limit = if matches!(ok, Command::Views { .. }) {
        likes::http::MAX_VIEWS_BODY_BYTES
    } else {
        MAX_BODY_BYTES
    };
    assert!(
        b.body.len() <= limit,
        "a {} byte body was accepted",
        b.body.len()
    );
    let method = b.req.method();
    match ok {
        Command::Write {
            user,
            reel,
            action,
            idempotency_key,
        } => {
            assert_eq!(function, Function::Like);
            assert!(user_ok(user), "{user:?} vs {expected_user:?}");
            path_reel(reel, 2);
            let want = if method == Method::PUT {
                likes::keys::Action::Like
            } else {
                assert_eq!(method, Method::DELETE);
                likes::keys::Action::Unlike
            };
            assert_eq!(*action, want);
            assert_eq!(
                idempotency_key.as_deref(),
                header("idempotency-key").as_deref()
            );
            if let Some(k) = idempotency_key {
                assert!((1..=64).contains(&k.len()) && k.bytes().all(|c| c.is_ascii_graphic()));
            }
        }
        Command::Count { reel, user } => {
            assert_eq!(function, Function::Read);
            assert_eq!(method, Method::GET);
            path_reel(reel, 2);
            match user {
                Some(u) => assert!(user_ok(u), "{u:?} vs {expected_user:?}"),
                // A verified claim that is no user id reads as anonymous:
                // the identity only adds liked_by_me there.
                None => assert!(
                    expected_user
                        .as_deref()
                        .is_none_or(|u| likes::keys::UserId::parse(u).is_err()),
                    "{expected_user:?} dropped"
                ),
            }
        }
        Command::Counts { reels } => {
            assert_eq!(function, Function::Read);
            assert!(!reels.is_empty() && reels.len() <= MAX_BATCH_REELS);
            let given: Vec<&str> = b.reel_ids.iter().flat_map(|v| v.split(',')).collect();
            for (i, r) in reels.iter().enumerate() {
                assert!(valid_reel(r.as_str()), "{r:?}");
                assert!(given.contains(&r.as_str()), "{r:?} not asked for");
                assert!(!reels[..i].contains(r), "{r:?} twice");
            }
        }
        Command::Health => assert_eq!(function, Function::Read),
        Command::Views {
            viewer,
            views,
            idempotency_key,
        } => {
            assert_eq!(function, Function::View);
            assert_eq!(method, Method::POST);
            assert!(user_ok(viewer), "{viewer:?} vs {expected_user:?}");
            assert!(!views.is_empty() && views.len() <= 100);
            for (r, n) in views {
                assert!(valid_reel(r.as_str()) && *n >= 1, "{r:?} {n}");
            }
            assert_eq!(
                idempotency_key.as_deref(),
                header("idempotency-key").as_deref()
            );
        }
        Command::ReelViews { reel } | Command::ReelStats { reel } => {
            assert_eq!(function, Function::Read);
            assert_eq!(method, Method::GET);
            path_reel(reel, 2);
        }
        Command::Trending { limit, .. } => {
            assert_eq!(function, Function::Read);
            assert_eq!(method, Method::GET);
            assert!((1..=likes::http::MAX_TRENDING).contains(limit), "{limit}");
        }
        Command::LikesAndViews { reels } => {
            assert_eq!(function, Function::Read);
            assert!(!reels.is_empty() && reels.len() <= MAX_BATCH_REELS);
            for r in reels {
                assert!(valid_reel(r.as_str()), "{r:?}");
            }
        }
        Command::ListResized => {
            assert_eq!(function, Function::Reshard);
            assert!(mode == AuthMode::Dev || is_iam(&b.req));
        }
        Command::ShardState { reel } => {
            assert_eq!(function, Function::Reshard);
            assert!(mode == AuthMode::Dev || is_iam(&b.req));
            path_reel(reel, 3);
        }
        Command::Resize {
            reel,
            shards,
            principal,
        } => {
            assert_eq!(function, Function::Reshard);
            assert!(mode == AuthMode::Dev || is_iam(&b.req));
            // Attributable: never empty, "dev" only in dev mode.
            assert!(!principal.is_empty());
            assert_eq!(mode == AuthMode::Dev, principal == "dev", "{principal:?}");
            assert_eq!(method, Method::POST);
            path_reel(reel, 3);
            let body: serde_json::Value = serde_json::from_slice(&b.body).expect("JSON body");
            assert_eq!(body["shards"].as_u64(), Some(u64::from(*shards)));
        }
        Command::Erase { user, principal } => {
            assert_eq!(function, Function::Like);
            assert!(mode == AuthMode::Dev || is_iam(&b.req));
            assert!(!principal.is_empty());
            assert_eq!(mode == AuthMode::Dev, principal == "dev", "{principal:?}");
            assert_eq!(method, Method::DELETE);
            assert!(!user.as_str().is_empty());
            // The user the path names, decoded strictly: a lossy decode
            // would erase another user's likes.
            let segment = b.raw_path.split('/').nth(3).unwrap_or("");
            let named = percent_decode_str(segment).decode_utf8().ok();
            assert_eq!(
                named.as_deref(),
                Some(user.as_str()),
                "erasure of another user"
            );
        }
    }
}

fn is_iam(req: &Request) -> bool {
    matches!(
        req.request_context_ref(),
        Some(RequestContext::ApiGatewayV2(ctx))
            if ctx.authorizer.as_ref().is_some_and(|a| a.iam.is_some())
    )
}

/// `LIKES_FUZZ_SHOW=1` prints every input's outcome, e.g. to see what a
/// corpus file or a crash input does:
/// `LIKES_FUZZ_SHOW=1 cargo fuzz run --sanitizer none request <file>`.
fn show() -> bool {
    static SHOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHOW.get_or_init(|| std::env::var_os("LIKES_FUZZ_SHOW").is_some())
}

/// A payload-2.0 event as Lambda receives it (JSON), made into the request
/// lambda_http would hand the handler: the seeds are the sample events of
/// `events/`, which libFuzzer then mutates as text. Events Lambda could not
/// deserialise, or whose body is not the base64 they claim, never reach
/// the handler.
fn from_event(data: &[u8]) -> Option<Built> {
    use base64::Engine;
    let ev: ApiGatewayV2httpRequest = serde_json::from_slice(data).ok()?;
    let ctx = ev.request_context;
    let raw_path = ev.raw_path.unwrap_or_default();
    // As lambda_http: the query map from rawQueryString when there is one.
    let (reel_ids, query) = match ev.raw_query_string {
        Some(q) => (reel_ids_of(&q), q.parse().unwrap_or_default()),
        None => (
            ev.query_string_parameters
                .all("reel_ids")
                .unwrap_or_default()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            ev.query_string_parameters,
        ),
    };
    let body: Vec<u8> = match &ev.body {
        None => Vec::new(),
        Some(b) if ev.is_base64_encoded => {
            base64::engine::general_purpose::STANDARD.decode(b).ok()?
        }
        Some(b) => b.clone().into_bytes(),
    };
    let body_value = match &ev.body {
        None => Body::Empty,
        Some(_) if ev.is_base64_encoded => Body::Binary(body.clone()),
        Some(b) => Body::Text(b.clone()),
    };
    let claim = ctx
        .authorizer
        .as_ref()
        .and_then(|a| a.jwt.as_ref())
        .and_then(|j| j.claims.get("sub"))
        .cloned();
    let mut req = lambda_http::http::Request::new(body_value);
    *req.method_mut() = ctx.http.method.clone();
    *req.headers_mut() = ev.headers;
    if let Some(cookies) = ev.cookies
        && let Ok(v) = HeaderValue::from_str(&cookies.join("; "))
    {
        req.headers_mut().insert("cookie", v);
    }
    if let Ok(uri) = raw_path.parse() {
        *req.uri_mut() = uri;
    }
    let req = req
        .with_raw_http_path(raw_path.clone())
        .with_query_string_parameters(query)
        .with_request_context(RequestContext::ApiGatewayV2(ctx));
    Some(Built {
        req,
        raw_path,
        reel_ids,
        claim,
        body,
    })
}

fn run(built: &Built, function: Function) {
    for mode in [AuthMode::Jwt, AuthMode::Dev] {
        let out = parse(&built.req, mode, function);
        if show() {
            eprintln!(
                "{function:?} {mode:?} {} {:?}: {out:?}",
                built.req.method(),
                built.raw_path
            );
        }
        check(built, function, mode, &out);
        if mode == AuthMode::Jwt {
            // Outside dev mode a forged x-user-id changes nothing at all.
            let mut without = lambda_http::http::Request::new(built.req.body().clone());
            *without.method_mut() = built.req.method().clone();
            *without.uri_mut() = built.req.uri().clone();
            *without.headers_mut() = built.req.headers().clone();
            without.headers_mut().remove("x-user-id");
            *without.extensions_mut() = built.req.extensions().clone();
            assert_eq!(parse(&without, mode, function), out);
        }
    }
}

// Two input formats: JSON (an API Gateway event, mutated as text from the
// seeds) when the input starts with `{`, otherwise the structured `Input`.
fuzz_target!(|data: &[u8]| {
    if data.first() == Some(&b'{') {
        if let Some(built) = from_event(data) {
            for function in [
                Function::Like,
                Function::Read,
                Function::Reshard,
                Function::View,
            ] {
                run(&built, function);
            }
        }
        return;
    }
    let Ok(input) = Input::arbitrary_take_rest(arbitrary::Unstructured::new(data)) else {
        return;
    };
    let function = match input.function {
        FunctionIn::Like => Function::Like,
        FunctionIn::Read => Function::Read,
        FunctionIn::Reshard => Function::Reshard,
    };
    run(&build(&input), function);
});
