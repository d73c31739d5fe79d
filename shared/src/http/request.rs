//! Request parsing and validation: routes, ids, headers, identity.
//!
//! [`parse`] turns a request into a [`Command`] or an [`Error`] without any
//! I/O. The handler runs it before it touches DynamoDB, and acts only on the
//! ids a `Command` carries, so this module is the whole input surface: the
//! property tests and the fuzz target call `parse` directly.

use super::routes::{Function, Route, route};
use crate::config::AuthMode;
use crate::error::Error;
use crate::keys::{Action, ReelId, UserId};
use crate::token::MAX_IDEMPOTENCY_KEY_LEN;
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
/// This is exactly what [`super::handle`] runs before it touches DynamoDB;
/// it is public so that property tests and the fuzz target can drive the
/// whole input surface without a store.
pub fn parse(req: &Request, auth_mode: AuthMode, function: Function) -> Result<Command, Error> {
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
            let reel = reel_id(&raw)?;
            Ok(Command::Count { reel, user })
        }
        Route::BatchLikes => Ok(Command::Counts {
            reels: batch_reel_ids(req)?,
        }),
        Route::Health => Ok(Command::Health),
        Route::Views => {
            let viewer = identity(req, auth_mode)?.ok_or(Error::Unauthorized)?;
            let idempotency_key = idempotency_key(req)?;
            let views = crate::views::accept::parse_batch(body_bytes(req))?;
            Ok(Command::Views {
                viewer,
                views,
                idempotency_key,
            })
        }
        Route::ReelViews(raw) => Ok(Command::ReelViews {
            reel: reel_id(&raw)?,
        }),
        Route::Counts => Ok(Command::LikesAndViews {
            reels: batch_reel_ids(req)?,
        }),
        Route::AdminReels => {
            require_admin(req, auth_mode)?;
            Ok(Command::ListResized)
        }
        Route::AdminShards(raw) => {
            let principal = require_admin(req, auth_mode)?;
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
            let principal = require_admin(req, auth_mode)?;
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

/// Admin routes: allowed when API Gateway authorized the call with IAM
/// (SigV4; the template sets `AWS_IAM` on them), or in dev mode. A JWT
/// (user) identity is never enough. Returns who called (see
/// [`Command::Resize`]), so that a change can be attributed.
fn require_admin(req: &Request, mode: AuthMode) -> Result<String, Error> {
    if mode == AuthMode::Dev {
        return Ok("dev".into());
    }
    let principal = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx
            .authorizer
            .as_ref()
            .and_then(|a| a.iam.as_ref())
            .and_then(|iam| iam.user_arn.clone().or_else(|| iam.caller_id.clone())),
        _ => None,
    };
    principal.ok_or(Error::Forbidden)
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
mod tests {
    use super::*;
    use lambda_http::aws_lambda_events::apigw::{
        ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerJwtDescription,
        ApiGatewayV2httpRequestContext,
    };

    #[test]
    fn routes_match_exact_paths_only() {
        assert_eq!(
            Route::parse("/reels/abc/like"),
            Some(Route::Like("abc".into()))
        );
        assert_eq!(
            Route::parse("/reels/abc/likes"),
            Some(Route::ReelLikes("abc".into()))
        );
        assert_eq!(Route::parse("/likes"), Some(Route::BatchLikes));
        assert_eq!(Route::parse("/healthz"), Some(Route::Health));
        assert_eq!(
            Route::parse("/admin/reels/abc/shards"),
            Some(Route::AdminShards("abc".into()))
        );
        for p in [
            "",
            "/",
            "/reels",
            "/reels/abc",
            "/reels/abc/like/",
            "/reels//like",
            "//likes",
            "/Likes",
            "/reels/a/b/like",
            "likes",
        ] {
            let r = Route::parse(p);
            assert!(
                r.is_none() || matches!(&r, Some(Route::Like(id)) if id.is_empty()),
                "{p:?} -> {r:?}"
            );
        }
    }

    #[test]
    fn encoded_separators_reach_validation_decoded() {
        let Some(Route::Like(id)) = Route::parse("/reels/a%23b/like") else {
            panic!()
        };
        assert_eq!(id, "a#b");
        assert!(reel_id(&id).is_err());
        let Some(Route::Like(id)) = Route::parse("/reels/%2e%2e/like") else {
            panic!()
        };
        assert!(reel_id(&id).is_err());
        let Some(Route::Like(id)) = Route::parse("/reels/%ff%fe/like") else {
            panic!()
        };
        assert!(reel_id(&id).is_err());
    }

    #[test]
    fn an_erasure_of_a_user_id_that_is_not_utf8_is_refused() {
        // Before: decoded lossily to "Jos\u{FFFD}", a valid user id, so the
        // erasure ran for another user and answered 200.
        let req = request(
            Method::DELETE,
            "/admin/users/Jos%E9/likes",
            &[],
            Body::Empty,
        );
        let e = parse(&req, AuthMode::Dev, Function::Like).unwrap_err();
        assert_eq!((e.status(), e.code()), (400, "invalid_user_id"), "{e:?}");
        let Some(Route::AdminUserLikes(Some(id))) = Route::parse("/admin/users/Jos%C3%A9/likes")
        else {
            panic!()
        };
        assert_eq!(id, "José");
    }

    fn request(method: Method, path: &str, headers: &[(&str, &str)], body: Body) -> Request {
        let mut req = lambda_http::http::Request::new(body);
        *req.method_mut() = method;
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (
                lambda_http::http::HeaderName::from_bytes(k.as_bytes()),
                lambda_http::http::HeaderValue::from_str(v),
            ) {
                req.headers_mut().append(k, v);
            }
        }
        req.with_raw_http_path(path)
    }

    #[test]
    fn parse_checks_method_then_body_then_identity_then_ids() {
        let like = |m: Method, headers: &[(&str, &str)], body: Body| {
            parse(
                &request(m, "/reels/a%23b/like", headers, body),
                AuthMode::Dev,
                Function::Like,
            )
        };
        let big = Body::Binary(vec![0; MAX_BODY_BYTES + 1]);
        let code = |r: Result<Command, Error>| r.map_err(|e| e.code());
        assert_eq!(
            code(like(Method::GET, &[], big.clone())),
            Err("method_not_allowed")
        );
        assert_eq!(code(like(Method::PUT, &[], big)), Err("payload_too_large"));
        // Identity before ids: an anonymous caller learns nothing about them.
        assert_eq!(
            code(like(Method::PUT, &[], Body::Empty)),
            Err("unauthorized")
        );
        assert_eq!(
            code(like(Method::PUT, &[("x-user-id", "u")], Body::Empty)),
            Err("invalid_reel_id")
        );
        // A function answers only its own routes.
        let req = request(
            Method::PUT,
            "/reels/a/like",
            &[("x-user-id", "u")],
            Body::Empty,
        );
        assert_eq!(
            parse(&req, AuthMode::Dev, Function::Read),
            Err(Error::NotFound)
        );
        assert_eq!(
            parse(&req, AuthMode::Dev, Function::Like),
            Ok(Command::Write {
                user: UserId::parse("u").unwrap(),
                reel: ReelId::parse("a").unwrap(),
                action: Action::Like,
                idempotency_key: None,
            })
        );
    }

    #[test]
    fn a_forged_user_header_is_no_identity_outside_dev_mode() {
        let h = [("x-user-id", "victim")];
        let req = request(Method::DELETE, "/reels/a/like", &h, Body::Empty);
        assert_eq!(
            parse(&req, AuthMode::Jwt, Function::Like),
            Err(Error::Unauthorized)
        );
        let req = request(Method::GET, "/reels/a/likes", &h, Body::Empty);
        assert_eq!(
            parse(&req, AuthMode::Jwt, Function::Read),
            Ok(Command::Count {
                reel: ReelId::parse("a").unwrap(),
                user: None,
            })
        );
        // A verified token whose subject is no user id (over 256 bytes):
        // no identity for a like, an anonymous read of the count. Before,
        // the read answered 401, which openapi.yaml rules out there.
        let with_sub = |method: Method, path: &str| {
            let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
            jwt.claims = [("sub".to_owned(), "u".repeat(300))].into();
            let mut authorizer = ApiGatewayRequestAuthorizer::default();
            authorizer.jwt = Some(jwt);
            let mut ctx = ApiGatewayV2httpRequestContext::default();
            ctx.authorizer = Some(authorizer);
            request(method, path, &[], Body::Empty)
                .with_request_context(RequestContext::ApiGatewayV2(ctx))
        };
        assert_eq!(
            parse(
                &with_sub(Method::PUT, "/reels/a/like"),
                AuthMode::Jwt,
                Function::Like
            ),
            Err(Error::Unauthorized)
        );
        assert_eq!(
            parse(
                &with_sub(Method::GET, "/reels/a/likes"),
                AuthMode::Jwt,
                Function::Read
            ),
            Ok(Command::Count {
                reel: ReelId::parse("a").unwrap(),
                user: None,
            })
        );
        let req = request(Method::GET, "/admin/reels", &h, Body::Empty);
        assert_eq!(
            parse(&req, AuthMode::Jwt, Function::Reshard),
            Err(Error::Forbidden)
        );
        assert_eq!(
            parse(&req, AuthMode::Dev, Function::Reshard),
            Ok(Command::ListResized)
        );
    }
}
