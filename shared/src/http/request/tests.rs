//! Parsing and validation of requests, and who may call (unit tests).
use super::*;
use lambda_http::aws_lambda_events::apigw::{
    ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerIamDescription,
    ApiGatewayRequestAuthorizerJwtDescription, ApiGatewayV2httpRequestContext,
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
    let Some(Route::AdminUserLikes(Some(id))) = Route::parse("/admin/users/Jos%C3%A9/likes") else {
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

/// An admin call as API Gateway's IAM authorizer passes it on.
fn signed(method: Method, path: &str, arn: &str, body: Body) -> Request {
    let mut iam = ApiGatewayRequestAuthorizerIamDescription::default();
    iam.user_arn = Some(arn.to_owned());
    iam.caller_id = Some("AROAEXAMPLEID:session".to_owned());
    let mut authorizer = ApiGatewayRequestAuthorizer::default();
    authorizer.iam = Some(iam);
    let mut ctx = ApiGatewayV2httpRequestContext::default();
    ctx.authorizer = Some(authorizer);
    request(method, path, &[], body).with_request_context(RequestContext::ApiGatewayV2(ctx))
}

/// A user call with a verified token of these claims.
fn with_token(method: Method, path: &str, claims: &[(&str, &str)]) -> Request {
    let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
    jwt.claims = claims
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut authorizer = ApiGatewayRequestAuthorizer::default();
    authorizer.jwt = Some(jwt);
    let mut ctx = ApiGatewayV2httpRequestContext::default();
    ctx.authorizer = Some(authorizer);
    request(method, path, &[], Body::Empty).with_request_context(RequestContext::ApiGatewayV2(ctx))
}

const OPERATORS: &str = "arn:aws:iam::123456789012:role/ops/likes-operators";
const OPERATOR_SESSION: &str = "arn:aws:sts::123456789012:assumed-role/likes-operators/ops-admin";
const DPO: &str = "arn:aws:iam::123456789012:user/dpo";

fn access(admin: &str, erasure: &str, scope: Option<&str>) -> Access {
    Access {
        admin: Principals::from_list("ADMIN_PRINCIPALS", admin).unwrap(),
        erasure: Principals::from_list("ERASURE_PRINCIPALS", erasure).unwrap(),
        jwt_scope: scope.map(str::to_owned),
        read_units_per_min: 0,
    }
}

/// The admin calls, each with the function that serves it.
fn admin_calls(arn: &str) -> Vec<(Request, Function)> {
    vec![
        (
            signed(Method::GET, "/admin/reels", arn, Body::Empty),
            Function::Reshard,
        ),
        (
            signed(Method::GET, "/admin/reels/r1/shards", arn, Body::Empty),
            Function::Reshard,
        ),
        (
            signed(
                Method::POST,
                "/admin/reels/r1/shards",
                arn,
                Body::from(r#"{"shards": 8}"#),
            ),
            Function::Reshard,
        ),
    ]
}

fn erasure(arn: &str) -> Request {
    signed(Method::DELETE, "/admin/users/u1/likes", arn, Body::Empty)
}

#[test]
fn a_principal_off_the_allowlists_is_refused_on_admin_and_on_erasure() {
    // Before: any principal IAM authorized was let through.
    let stranger = "arn:aws:iam::123456789012:user/intern";
    let a = access(OPERATORS, DPO, None);
    for (req, f) in admin_calls(stranger) {
        assert_eq!(
            parse_with(&req, AuthMode::Jwt, &a, f),
            Err(Error::Forbidden)
        );
    }
    assert_eq!(
        parse_with(&erasure(stranger), AuthMode::Jwt, &a, Function::Like),
        Err(Error::Forbidden)
    );
    // Empty allowlists (the default) refuse everyone, and so does
    // `parse`, which allows no principal.
    let none = Access::default();
    for arn in [OPERATORS, OPERATOR_SESSION, DPO] {
        for (req, f) in admin_calls(arn) {
            assert_eq!(
                parse_with(&req, AuthMode::Jwt, &none, f),
                Err(Error::Forbidden)
            );
            assert_eq!(parse(&req, AuthMode::Jwt, f), Err(Error::Forbidden));
        }
        assert_eq!(
            parse_with(&erasure(arn), AuthMode::Jwt, &none, Function::Like),
            Err(Error::Forbidden)
        );
    }
    // Refused before the ids are looked at: a stranger learns nothing.
    let req = signed(
        Method::DELETE,
        "/admin/users/Jos%E9/likes",
        stranger,
        Body::Empty,
    );
    assert_eq!(
        parse_with(&req, AuthMode::Jwt, &a, Function::Like),
        Err(Error::Forbidden)
    );
    // Dev mode (the local stack) stays open.
    for (req, f) in admin_calls(stranger) {
        assert!(parse_with(&req, AuthMode::Dev, &none, f).is_ok());
    }
}

#[test]
fn an_admin_principal_may_resize_but_not_erase() {
    let a = access(&format!("{OPERATORS},{DPO}"), "", None);
    assert_eq!(
        parse_with(&erasure(DPO), AuthMode::Jwt, &a, Function::Like),
        Err(Error::Forbidden)
    );
    assert_eq!(
        parse_with(
            &erasure(OPERATOR_SESSION),
            AuthMode::Jwt,
            &a,
            Function::Like
        ),
        Err(Error::Forbidden)
    );
    // ...and an erasure principal may erase, not resize.
    let a = access(OPERATORS, DPO, None);
    assert_eq!(
        parse_with(&erasure(DPO), AuthMode::Jwt, &a, Function::Like),
        Ok(Command::Erase {
            user: UserId::parse("u1").unwrap(),
            principal: DPO.to_owned(),
        })
    );
    for (req, f) in admin_calls(DPO) {
        assert_eq!(
            parse_with(&req, AuthMode::Jwt, &a, f),
            Err(Error::Forbidden)
        );
    }
}

#[test]
fn a_session_of_an_allowlisted_role_is_accepted() {
    let a = access(OPERATORS, OPERATORS, None);
    let [list, state, resize]: [_; 3] = admin_calls(OPERATOR_SESSION)
        .into_iter()
        .map(|(req, f)| parse_with(&req, AuthMode::Jwt, &a, f))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    assert_eq!(list, Ok(Command::ListResized));
    assert_eq!(
        state,
        Ok(Command::ShardState {
            reel: ReelId::parse("r1").unwrap()
        })
    );
    assert_eq!(
        resize,
        Ok(Command::Resize {
            reel: ReelId::parse("r1").unwrap(),
            shards: 8,
            principal: OPERATOR_SESSION.to_owned(),
        })
    );
    assert_eq!(
        parse_with(
            &erasure(OPERATOR_SESSION),
            AuthMode::Jwt,
            &a,
            Function::Like
        ),
        Ok(Command::Erase {
            user: UserId::parse("u1").unwrap(),
            principal: OPERATOR_SESSION.to_owned(),
        })
    );
    // A session of another role, or of the role in another account, is not.
    for arn in [
        "arn:aws:sts::123456789012:assumed-role/likes-operators-ci/ops-admin",
        "arn:aws:sts::999999999999:assumed-role/likes-operators/ops-admin",
    ] {
        assert_eq!(
            parse_with(&erasure(arn), AuthMode::Jwt, &a, Function::Like),
            Err(Error::Forbidden)
        );
    }
}

#[test]
fn a_token_without_the_scope_is_refused_and_with_it_accepted() {
    let a = access("", "", Some("likes/api"));
    let sub = ("sub", "u1");
    let calls = [
        (Method::PUT, "/reels/r1/like", Function::Like),
        (Method::DELETE, "/reels/r1/like", Function::Like),
        (Method::GET, "/reels/r1/likes", Function::Read),
        (Method::GET, "/reels/r1/views", Function::Read),
    ];
    // Before: an ID token (no scope), another client's scope, or one
    // that only starts like it, acted as the user.
    for claims in [
        vec![sub, ("token_use", "id")],
        vec![sub, ("scope", "likes/read openid")],
        vec![sub, ("scope", "likes/api-admin likes/apis")],
        vec![sub, ("scp", "[likes/api2 profile]")],
    ] {
        for (m, path, f) in &calls {
            let req = with_token(m.clone(), path, &claims);
            assert_eq!(
                parse_with(&req, AuthMode::Jwt, &a, *f),
                Err(Error::InsufficientScope),
                "{m} {path} {claims:?}"
            );
        }
    }
    for claims in [
        vec![sub, ("scope", "openid likes/api")],
        vec![sub, ("scp", "[profile likes/api]")],
        vec![sub, ("scp", "likes/api")],
    ] {
        for (m, path, f) in &calls {
            let req = with_token(m.clone(), path, &claims);
            assert!(
                parse_with(&req, AuthMode::Jwt, &a, *f).is_ok(),
                "{m} {path} {claims:?}"
            );
        }
    }
    // The authorizer's own list of the token's scopes counts too.
    let mut req = with_token(Method::PUT, "/reels/r1/like", &[sub]);
    if let Some(RequestContext::ApiGatewayV2(ctx)) = req.extensions_mut().get_mut() {
        ctx.authorizer
            .as_mut()
            .unwrap()
            .jwt
            .as_mut()
            .unwrap()
            .scopes = Some(vec!["likes/api".into()]);
    }
    assert!(parse_with(&req, AuthMode::Jwt, &a, Function::Like).is_ok());
    // The scope is checked before the ids, after the identity.
    let bad_reel = with_token(Method::PUT, "/reels/a%23b/like", &[sub]);
    assert_eq!(
        parse_with(&bad_reel, AuthMode::Jwt, &a, Function::Like),
        Err(Error::InsufficientScope)
    );
    let no_sub = with_token(Method::PUT, "/reels/r1/like", &[("scope", "x")]);
    assert_eq!(
        parse_with(&no_sub, AuthMode::Jwt, &a, Function::Like),
        Err(Error::Unauthorized)
    );
    // No scope configured (JWT_SCOPE empty), or dev mode: no check.
    let id_token = with_token(Method::PUT, "/reels/r1/like", &[sub, ("token_use", "id")]);
    assert!(parse_with(&id_token, AuthMode::Jwt, &Access::default(), Function::Like).is_ok());
    assert!(parse_with(&id_token, AuthMode::Dev, &a, Function::Like).is_ok());
    // /healthz has no authorizer and needs no scope.
    let health = with_token(Method::GET, "/healthz", &[sub]);
    assert_eq!(
        parse_with(&health, AuthMode::Jwt, &a, Function::Read),
        Ok(Command::Health)
    );
}
