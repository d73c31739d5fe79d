//! Who called, read from the request API Gateway passes: the IAM principal
//! it authorized and the scopes of a user's token. Who *may* call is the
//! configuration's [`crate::config::Access`], which says why the functions
//! check again after API Gateway.

use lambda_http::Request;
use lambda_http::RequestExt;
use lambda_http::request::RequestContext;

/// The IAM principal API Gateway authorized: its ARN (`userArn`), and for
/// the logs, its caller id when there is no ARN. `None` without IAM.
pub(super) fn iam_principal(req: &Request) -> Option<(Option<String>, String)> {
    let Some(RequestContext::ApiGatewayV2(ctx)) = req.request_context_ref() else {
        return None;
    };
    let iam = ctx.authorizer.as_ref()?.iam.as_ref()?;
    let arn = iam.user_arn.clone().filter(|a| !a.is_empty());
    let shown = arn
        .clone()
        .or_else(|| iam.caller_id.clone())
        .filter(|s| !s.is_empty())?;
    Some((arn, shown))
}

/// Whether the request carries a JWT (API Gateway's JWT authorizer ran),
/// and if so whether it has `scope`: in its `scope` claim (space-separated,
/// OAuth 2.0 and Cognito access tokens), its `scp` claim (space- or
/// comma-separated, or a list API Gateway flattened to `[a b]`), or the
/// authorizer's `scopes`. Each is compared whole, never as a prefix or
/// substring.
pub(super) fn token_scope(req: &Request, scope: &str) -> Option<bool> {
    let Some(RequestContext::ApiGatewayV2(ctx)) = req.request_context_ref() else {
        return None;
    };
    let jwt = ctx.authorizer.as_ref()?.jwt.as_ref()?;
    let in_scope = jwt
        .claims
        .get("scope")
        .is_some_and(|s| s.split_whitespace().any(|t| t == scope));
    let in_scp = jwt.claims.get("scp").is_some_and(|s| {
        let s = s.trim();
        let s = s
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .unwrap_or(s);
        s.split(|c: char| c.is_whitespace() || c == ',')
            .any(|t| t.trim_matches('"') == scope)
    });
    let in_scopes = jwt
        .scopes
        .as_ref()
        .is_some_and(|all| all.iter().any(|t| t == scope));
    Some(in_scope || in_scp || in_scopes)
}
