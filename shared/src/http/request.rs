//! Request parsing and validation: routes, ids, headers, identity.
//!
//! [`parse`] turns a request into a [`Command`] or an [`Error`] without any
//! I/O. The handler runs it before it touches DynamoDB, and acts only on the
//! ids a `Command` carries, so this module is the whole input surface: the
//! property tests and the fuzz target call `parse` directly.

use super::access::{iam_principal, token_scope};
use super::routes::{Function, Route, route};
use crate::config::Access;
use crate::config::AuthMode;
use crate::config::access::Principals;
use crate::error::Error;
use crate::keys::window::Window;
use crate::keys::{Action, ReelId, UserId};
use crate::token::MAX_IDEMPOTENCY_KEY_LEN;
use crate::trending::Metric;
use lambda_http::http::Method;
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt};

/// Largest request body accepted on routes that take none (all but
/// `POST /admin/reels/{reel_id}/shards`' small one and `POST /views`): a
/// small one is tolerated (some clients send `{}`), a large one is refused
/// with 413.
pub const MAX_BODY_BYTES: usize = 1024;

/// The largest `POST /views` body accepted: 100 entries of the longest reel
/// id with room for whitespace.
pub const MAX_VIEWS_BODY_BYTES: usize = 16 * 1024;
/// Most reels one `GET /likes` may ask for (one feed screen).
pub const MAX_BATCH_REELS: usize = 100;

/// A request that was routed and validated: what the handler will do, with
/// every id it will touch already checked. Only [`parse`] makes one, and the
/// handler reads and writes the keys of these ids and no others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `PUT` (like) or `DELETE` (unlike) `/reels/{reel_id}/like`.
    Write {
        /// The caller, as the JWT authorizer (or, in dev, `x-user-id`) named.
        user: UserId,
        /// The reel liked or unliked.
        reel: ReelId,
        /// Like (`PUT`) or unlike (`DELETE`).
        action: Action,
        /// The `Idempotency-Key` header, already checked.
        idempotency_key: Option<String>,
    },
    /// `GET /reels/{reel_id}/likes`; `user` when the caller has an identity,
    /// for `liked_by_me`.
    Count {
        /// The reel counted.
        reel: ReelId,
        /// The caller, if identified; `None` leaves `liked_by_me` out.
        user: Option<UserId>,
    },
    /// `GET /likes?reel_ids=...`: 1 to [`MAX_BATCH_REELS`] distinct reels, in
    /// the order given.
    Counts {
        /// The reels, deduplicated, in the order of the query.
        reels: Vec<ReelId>,
    },
    /// `GET /healthz`.
    Health,
    /// `POST /views`: a viewer's batch of views.
    Views {
        /// The viewer, as the JWT authorizer (or, in dev, `x-user-id`) named.
        viewer: UserId,
        /// Views per reel, each reel once, checked.
        views: Vec<(ReelId, u32)>,
        /// The `Idempotency-Key` header, already checked.
        idempotency_key: Option<String>,
    },
    /// `GET /reels/{reel_id}/views`.
    ReelViews {
        /// The reel.
        reel: ReelId,
    },
    /// `GET /reels/{reel_id}/stats`.
    ReelStats {
        /// The reel.
        reel: ReelId,
    },
    /// `GET /trending?metric=likes|views&window=1h|24h&limit=1..100`.
    Trending {
        /// What is ranked (default likes).
        metric: Metric,
        /// Over which window (default 1h).
        window: Window,
        /// How many reels at most (default 10).
        limit: u32,
    },
    /// `GET /counts?reel_ids=...`: likes and views of 1 to
    /// [`MAX_BATCH_REELS`] distinct reels.
    LikesAndViews {
        /// The reels, deduplicated, in the order of the query.
        reels: Vec<ReelId>,
    },
    /// `GET /admin/reels`.
    ListResized,
    /// `GET /admin/reels/{reel_id}/shards`.
    ShardState {
        /// The reel whose shards and resize state are shown.
        reel: ReelId,
    },
    /// `POST /admin/reels/{reel_id}/shards` with `{"shards": M}` (M's range
    /// is the resharder's to check).
    Resize {
        /// The reel to resize.
        reel: ReelId,
        /// The shard count asked for, unchecked.
        shards: u32,
        /// Who asked: the IAM principal API Gateway authorized (its ARN,
        /// else its caller id), `dev` in dev mode. Logged with the resize.
        principal: String,
    },
    /// `DELETE /admin/users/{user_id}/likes`: removes every like of the
    /// user, exactly once each (see `LikeService::erase`).
    Erase {
        /// Whose likes.
        user: UserId,
        /// Who asked (as for [`Command::Resize`]), logged with the erasure.
        principal: String,
    },
}

/// Routes and validates one request, without any I/O: the method, the raw
/// path, the query string, the headers, the body and the identity (the JWT
/// authorizer's `sub` claim; the `x-user-id` header only under
/// [`AuthMode::Dev`]) become a [`Command`], or the [`Error`] the handler
/// answers with (always a 4xx). `function` is the Lambda function answering:
/// a route it does not serve is `NotFound`, as the template wires them.
///
/// Who may call is [`Access`]: this is [`parse_with`] under
/// `Access::default()`, which allows no IAM principal (outside dev mode
/// every admin and erasure call is refused) and checks no scope. The
/// handler runs [`parse_with`] with the configuration's [`Access`].
pub fn parse(req: &Request, auth_mode: AuthMode, function: Function) -> Result<Command, Error> {
    parse_with(req, auth_mode, &Access::default(), function)
}

/// [`parse`] under `access`: the admin routes only for a principal of
/// `access.admin`, erasure only for one of `access.erasure` (both refused
/// with 403 `forbidden`, and logged once with the principal), and a user
/// route's token only with `access.jwt_scope` (403 `insufficient_scope`).
/// Under [`AuthMode::Dev`] none of these apply (the local stack has no
/// authorizer; its admin routes are open).
///
/// This is exactly what [`super::handle`] runs before it touches DynamoDB;
/// it is public so that property tests and the fuzz target can drive the
/// whole input surface without a store.
pub fn parse_with(
    req: &Request,
    auth_mode: AuthMode,
    access: &Access,
    function: Function,
) -> Result<Command, Error> {
    let route = route(req, function).ok_or(Error::NotFound)?;
    let method = req.method();
    let allowed = match &route {
        Route::Like(_) => *method == Method::PUT || *method == Method::DELETE,
        Route::AdminShards(_) => *method == Method::GET || *method == Method::POST,
        Route::AdminUserLikes(_) => *method == Method::DELETE,
        Route::Views => *method == Method::POST,
        _ => *method == Method::GET,
    };
    if !allowed {
        return Err(Error::MethodNotAllowed {
            allow: route.allow(),
        });
    }
    check_body(req, &route)?;
    // The order of the checks below decides which error a request with
    // several faults gets; clients and tests rely on it (identity first on
    // a like, so an anonymous caller learns nothing about ids).
    match route {
        Route::Like(raw) => {
            let user = identity(req, auth_mode)?.ok_or(Error::Unauthorized)?;
            require_scope(req, auth_mode, access)?;
            let reel = reel_id(&raw)?;
            let idempotency_key = idempotency_key(req)?;
            let action = if *method == Method::PUT {
                Action::Like
            } else {
                Action::Unlike
            };
            Ok(Command::Write {
                user,
                reel,
                action,
                idempotency_key,
            })
        }
        Route::ReelLikes(raw) => {
            // The identity only adds `liked_by_me`: a verified token whose
            // subject is no user id reads as anonymous (the contract has
            // the function answer 401 on no read route).
            let user = match identity(req, auth_mode) {
                Err(Error::Unauthorized) => None,
                other => other?,
            };
            require_scope(req, auth_mode, access)?;
            let reel = reel_id(&raw)?;
            Ok(Command::Count { reel, user })
        }
        Route::BatchLikes => {
            require_scope(req, auth_mode, access)?;
            Ok(Command::Counts {
                reels: batch_reel_ids(req)?,
            })
        }
        Route::Health => Ok(Command::Health),
        Route::Views => {
            let viewer = identity(req, auth_mode)?.ok_or(Error::Unauthorized)?;
            require_scope(req, auth_mode, access)?;
            let idempotency_key = idempotency_key(req)?;
            let views = crate::views::accept::parse_batch(body_bytes(req))?;
            Ok(Command::Views {
                viewer,
                views,
                idempotency_key,
            })
        }
        Route::ReelViews(raw) => {
            require_scope(req, auth_mode, access)?;
            Ok(Command::ReelViews {
                reel: reel_id(&raw)?,
            })
        }
        Route::ReelStats(raw) => {
            require_scope(req, auth_mode, access)?;
            Ok(Command::ReelStats {
                reel: reel_id(&raw)?,
            })
        }
        Route::Trending => {
            require_scope(req, auth_mode, access)?;
            trending_query(req)
        }
        Route::Counts => {
            require_scope(req, auth_mode, access)?;
            Ok(Command::LikesAndViews {
                reels: batch_reel_ids(req)?,
            })
        }
        Route::AdminReels => {
            require_admin(req, auth_mode, &access.admin, "admin")?;
            Ok(Command::ListResized)
        }
        Route::AdminShards(raw) => {
            let principal = require_admin(req, auth_mode, &access.admin, "admin")?;
            let reel = reel_id(&raw)?;
            if *method == Method::GET {
                return Ok(Command::ShardState { reel });
            }
            let shards = shards_body(req)?;
            Ok(Command::Resize {
                reel,
                shards,
                principal,
            })
        }
        Route::AdminUserLikes(raw) => {
            let principal = require_admin(req, auth_mode, &access.erasure, "erasure")?;
            let raw = raw.ok_or_else(|| {
                Error::bad_request("invalid_user_id", "user id must be UTF-8 once decoded")
            })?;
            let user =
                UserId::parse(&raw).map_err(|e| Error::bad_request("invalid_user_id", e.0))?;
            Ok(Command::Erase { user, principal })
        }
    }
}

fn check_body(req: &Request, route: &Route) -> Result<(), Error> {
    let limit = match route {
        Route::Views => MAX_VIEWS_BODY_BYTES,
        _ => MAX_BODY_BYTES,
    };
    let len = match req.body() {
        Body::Empty => 0,
        Body::Text(t) => t.len(),
        Body::Binary(b) => b.len(),
        _ => 0,
    };
    if len > limit {
        return Err(Error::PayloadTooLarge { limit });
    }
    Ok(())
}

fn reel_id(raw: &str) -> Result<ReelId, Error> {
    ReelId::parse(raw).map_err(|e| Error::bad_request("invalid_reel_id", e.0))
}

/// `reel_ids=a,b,c` (the parameter may also be repeated): 1 to 100 valid,
/// distinct-after-dedup ids, in the order given.
fn batch_reel_ids(req: &Request) -> Result<Vec<ReelId>, Error> {
    let params = req.query_string_parameters();
    let values = params.all("reel_ids").unwrap_or_default();
    if values.is_empty() {
        return Err(Error::bad_request(
            "missing_reel_ids",
            "query parameter reel_ids is required (comma-separated)",
        ));
    }
    let mut out: Vec<ReelId> = Vec::new();
    for raw in values.iter().flat_map(|v| v.split(',')) {
        let reel = ReelId::parse(raw)
            .map_err(|e| Error::bad_request("invalid_reel_id", format!("in reel_ids: {}", e.0)))?;
        if !out.contains(&reel) {
            if out.len() == MAX_BATCH_REELS {
                return Err(Error::bad_request(
                    "too_many_reel_ids",
                    format!("at most {MAX_BATCH_REELS} reel ids per request"),
                ));
            }
            out.push(reel);
        }
    }
    Ok(out)
}

/// Reels a trending list holds at most.
pub const MAX_TRENDING: u32 = crate::trending::MAX_LIST as u32;

/// `GET /trending`'s query: `metric` (`likes`, `views`), `window` (`1h`,
/// `24h`: the windows its sketches are kept for; a longer one is refused,
/// never answered short) and `limit` (1 to [`MAX_TRENDING`]).
fn trending_query(req: &Request) -> Result<Command, Error> {
    let params = req.query_string_parameters();
    let one = |name: &str| -> Result<Option<String>, Error> {
        match params.all(name).unwrap_or_default().as_slice() {
            [] => Ok(None),
            [v] => Ok(Some((*v).to_owned())),
            _ => Err(Error::bad_request(
                "bad_request",
                format!("query parameter {name} is given more than once"),
            )),
        }
    };
    let metric = match one("metric")? {
        None => Metric::Likes,
        Some(m) => Metric::parse(&m)
            .ok_or_else(|| Error::bad_request("invalid_metric", "metric must be likes or views"))?,
    };
    let window = match one("window")? {
        None => Window::Hour,
        Some(w) => Window::parse(&w)
            .filter(|w| *w != Window::Week)
            .ok_or_else(|| {
                Error::bad_request(
                    "invalid_window",
                    "window must be 1h or 24h: trending sketches are kept for a day",
                )
            })?,
    };
    let limit = match one("limit")? {
        None => 10,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=MAX_TRENDING).contains(l))
            .ok_or_else(|| {
                Error::bad_request(
                    "invalid_limit",
                    format!("limit must be a whole number from 1 to {MAX_TRENDING}"),
                )
            })?,
    };
    Ok(Command::Trending {
        metric,
        window,
        limit,
    })
}

/// The optional `Idempotency-Key`: 1–64 visible ASCII characters.
fn idempotency_key(req: &Request) -> Result<Option<String>, Error> {
    let Some(v) = req.headers().get("idempotency-key") else {
        return Ok(None);
    };
    let bad = || {
        Error::bad_request(
            "invalid_idempotency_key",
            format!(
                "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
            ),
        )
    };
    let s = v.to_str().map_err(|_| bad())?;
    if s.is_empty() || s.len() > MAX_IDEMPOTENCY_KEY_LEN || !s.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad());
    }
    Ok(Some(s.to_owned()))
}

/// Whom a read is charged to ([`crate::service::LikeService::charge_reads`]):
/// the caller's user (as [`identity`] finds it), else the request's source
/// address, else one shared key for requests with neither.
#[cfg(feature = "dynamodb")]
pub(crate) fn caller(req: &Request, mode: AuthMode) -> String {
    if let Ok(Some(user)) = identity(req, mode) {
        return format!("u:{}", user.as_str());
    }
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx
            .http
            .source_ip
            .as_deref()
            .map_or_else(|| "anon".to_owned(), |ip| format!("ip:{ip}")),
        _ => "anon".to_owned(),
    }
}

/// The caller's identity: the `sub` claim verified by the API Gateway JWT
/// authorizer; in dev mode only, the `x-user-id` header when no claim is
/// present. Outside dev mode the header is ignored, never trusted.
fn identity(req: &Request, mode: AuthMode) -> Result<Option<UserId>, Error> {
    let claim = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx
            .authorizer
            .as_ref()
            .and_then(|a| a.jwt.as_ref())
            .and_then(|jwt| jwt.claims.get("sub"))
            .cloned(),
        _ => None,
    };
    if let Some(sub) = claim {
        // A verified token whose subject we cannot store is not an identity.
        return UserId::parse(&sub)
            .map(Some)
            .map_err(|_| Error::Unauthorized);
    }
    if mode == AuthMode::Dev
        && let Some(v) = req.headers().get("x-user-id")
    {
        let s = v
            .to_str()
            .map_err(|_| Error::bad_request("invalid_user_id", "x-user-id must be text"))?;
        return UserId::parse(s)
            .map(Some)
            .map_err(|e| Error::bad_request("invalid_user_id", e.0));
    }
    Ok(None)
}

/// Admin routes and erasure: allowed when API Gateway authorized the call
/// with IAM (SigV4; the template sets `AWS_IAM` on them) *and* the
/// principal is on `allowed` (`ADMIN_PRINCIPALS` or `ERASURE_PRINCIPALS`,
/// as `what` says; see [`super::access`]), or in dev mode. A JWT (user)
/// identity is never enough. Returns who called (see [`Command::Resize`]),
/// so that a change can be attributed; a principal refused is logged once,
/// here, with its ARN (or caller id).
fn require_admin(
    req: &Request,
    mode: AuthMode,
    allowed: &Principals,
    what: &'static str,
) -> Result<String, Error> {
    if mode == AuthMode::Dev {
        return Ok("dev".into());
    }
    let (arn, shown) = iam_principal(req).ok_or(Error::Forbidden)?;
    match arn {
        Some(arn) if allowed.admits(&arn) => Ok(arn),
        _ => {
            tracing::warn!(
                principal = %shown,
                allowlist = if what == "admin" { "ADMIN_PRINCIPALS" } else { "ERASURE_PRINCIPALS" },
                "{what} call refused: principal not allowlisted"
            );
            Err(Error::Forbidden)
        }
    }
}

/// A user route's token must carry the configured scope (`JWT_SCOPE`), as
/// API Gateway's JWT authorizer already demands when
/// `JwtAuthorizationScope` is set: checked again here, so that an ID token
/// or another client's token is refused even if that setting is lost. A
/// request without a token is left to the identity rules (401 on a like,
/// anonymous on a read); dev mode and an empty `JWT_SCOPE` check nothing.
fn require_scope(req: &Request, mode: AuthMode, access: &Access) -> Result<(), Error> {
    let Some(scope) = access
        .jwt_scope
        .as_deref()
        .filter(|_| mode == AuthMode::Jwt)
    else {
        return Ok(());
    };
    match token_scope(req, scope) {
        Some(false) => {
            tracing::warn!(scope, "user call refused: the token lacks the scope");
            Err(Error::InsufficientScope)
        }
        _ => Ok(()),
    }
}

/// The body of `POST /admin/reels/{reel_id}/shards`: `{"shards": M}`, M a
/// whole number (its range is checked by the resharder).
/// The request body's bytes (empty when there is none).
fn body_bytes(req: &Request) -> &[u8] {
    match req.body() {
        lambda_http::Body::Text(t) => t.as_bytes(),
        lambda_http::Body::Binary(b) => b,
        _ => b"",
    }
}

fn shards_body(req: &Request) -> Result<u32, Error> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        shards: serde_json::Value,
    }
    let bytes: &[u8] = match req.body() {
        lambda_http::Body::Empty => b"",
        lambda_http::Body::Text(t) => t.as_bytes(),
        lambda_http::Body::Binary(b) => b,
        _ => b"",
    };
    let invalid = |m: &str| Error::bad_request("invalid_body", m.to_owned());
    if bytes.is_empty() {
        return Err(invalid("expected a JSON body {\"shards\": <number>}"));
    }
    let body: Body = serde_json::from_slice(bytes)
        .map_err(|_| invalid("expected a JSON body {\"shards\": <number>} and nothing else"))?;
    body.shards
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| Error::bad_request("invalid_shards", "shards must be a whole number"))
}

/// The API Gateway request id, or the Lambda invocation id for other events.
// Only the handlers ask for it (not built without `dynamodb`).
#[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
pub(crate) fn request_id(req: &Request) -> Option<String> {
    if let Some(RequestContext::ApiGatewayV2(ctx)) = req.request_context_ref()
        && let Some(id) = ctx.request_id.as_ref().filter(|s| !s.is_empty())
    {
        return Some(id.clone());
    }
    req.lambda_context_ref()
        .map(|c| c.request_id.clone())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests;
