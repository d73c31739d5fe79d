//! A local stand-in for API Gateway (HTTP API, payload format 2.0): matches
//! the template's routes, builds the same event API Gateway would send, and
//! runs the real handler of the function the template wires to the route.

use crate::apps::Apps;
use crate::template::{RouteDef, match_path};
use anyhow::{Result, bail};
use axum::body::{Body as AxumBody, to_bytes};
use axum::http::{HeaderMap, Method, Request as HttpRequest, Response as HttpResponse, StatusCode};
use base64::Engine;
use lambda_http::Body;
use likes::http::Function;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// API Gateway refuses payloads above 10 MB; the local gateway stops reading
/// far earlier, since no route takes a body (the handler's own 1 KiB limit
/// answers 413 for anything between).
const GATEWAY_BODY_LIMIT: usize = 64 * 1024;

/// A matched route: its definition, the function serving it, its path
/// parameters.
type Matched<'a> = (&'a RouteDef, Function, Vec<(String, String)>);

pub(crate) struct Gateway {
    /// The function instance requests go to (one for every function, as
    /// locally they share a cold start).
    apps: Arc<Apps>,
    routes: Vec<(RouteDef, Function)>,
    /// The address the gateway listens on: the `host` of every event, as
    /// API Gateway puts its own domain there.
    host: String,
}

impl Gateway {
    /// Fails when the template routes to a function this crate cannot run,
    /// so "every route of the template" is never silently short of one.
    pub(crate) fn new(apps: Arc<Apps>, routes: &[RouteDef], host: String) -> Result<Self> {
        let mut out = Vec::new();
        for r in routes {
            let function = match r.code_uri.rsplit('/').next() {
                Some("like") => Function::Like,
                Some("read") => Function::Read,
                Some("reshard") => Function::Reshard,
                Some("view") => Function::View,
                _ => bail!(
                    "no local handler for {} (CodeUri {})",
                    r.function,
                    r.code_uri
                ),
            };
            out.push((r.clone(), function));
        }
        Ok(Gateway {
            apps,
            routes: out,
            host,
        })
    }

    /// API Gateway's choice: the most specific matching route (fewer path
    /// variables first, an explicit method before ANY), `$default` last.
    fn pick(&self, method: &Method, path: &str) -> Option<Matched<'_>> {
        let mut best: Option<(usize, Matched<'_>)> = None;
        for (r, f) in &self.routes {
            let method_ok = r.method == "ANY" || r.method == method.as_str();
            if !method_ok {
                continue;
            }
            let (rank, params) = if r.path == "$default" {
                (usize::MAX, Vec::new())
            } else {
                match match_path(&r.path, path) {
                    Some(p) => (p.len() * 2 + usize::from(r.method == "ANY"), p),
                    None => continue,
                }
            };
            if best.as_ref().is_none_or(|b| rank < b.0) {
                best = Some((rank, (r, *f, params)));
            }
        }
        best.map(|(_, m)| m)
    }

    pub(crate) async fn serve(
        self: Arc<Self>,
        req: HttpRequest<AxumBody>,
    ) -> HttpResponse<AxumBody> {
        let (parts, body) = req.into_parts();
        let bytes = match to_bytes(body, GATEWAY_BODY_LIMIT).await {
            Ok(b) => b,
            Err(_) => {
                let mut r = plain_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "request body too large",
                );
                // The rest of the body is left unread, so the server closes
                // the connection after this answer; saying so keeps a
                // client from reusing it for its next request (which would
                // fail with the connection half closed under it).
                r.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
                return r;
            }
        };
        let path = parts.uri.path().to_owned();
        let Some((route, function, params)) = self.pick(&parts.method, &path) else {
            // Only reachable for a template without a `$default` route.
            return plain_error(StatusCode::NOT_FOUND, "not_found", "no such route");
        };
        let event = build_event(
            &parts.method,
            &parts.uri,
            &parts.headers,
            &bytes,
            route,
            &params,
            &self.host,
        );
        let request = match lambda_http::request::from_str(&event.to_string()) {
            Ok(r) => r,
            Err(_) => {
                return plain_error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "request could not be represented as an API Gateway event",
                );
            }
        };
        let app = self.apps.current();
        let resp = crate::meter::invoke(
            function.name(),
            0,
            0,
            likes::http::handle(&app, function, request),
        )
        .await;
        let (parts, body) = resp.into_parts();
        let bytes: Vec<u8> = match body {
            Body::Text(t) => t.into_bytes(),
            Body::Binary(b) => b,
            _ => Vec::new(),
        };
        HttpResponse::from_parts(parts, AxumBody::from(bytes))
    }
}

fn plain_error(status: StatusCode, code: &str, message: &str) -> HttpResponse<AxumBody> {
    let body = json!({ "error": { "code": code, "message": message } }).to_string();
    let mut r = HttpResponse::new(AxumBody::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        "application/json".parse().expect("static header"),
    );
    r
}

fn request_id() -> String {
    // API Gateway's ids look like "JKJaXmPLvHcESHA=": 15 characters and '='.
    let mut s: String = (0..15).map(|_| fastrand::alphanumeric()).collect();
    s.push('=');
    s
}

/// The payload-format-2.0 event API Gateway would send for this request.
fn build_event(
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: &[u8],
    route: &RouteDef,
    params: &[(String, String)],
    host: &str,
) -> Value {
    let mut hdrs = Map::new();
    let mut cookies = Vec::new();
    for (name, value) in headers {
        let v = String::from_utf8_lossy(value.as_bytes()).into_owned();
        // API Gateway sets these itself, whatever the client sent; lambda_http
        // builds the request URI from them and panics on ones that do not
        // parse, so a client's are never passed on.
        if name.as_str() == "host" || name.as_str().starts_with("x-forwarded-") {
            continue;
        }
        if name.as_str() == "cookie" {
            cookies.push(v);
            continue;
        }
        match hdrs.get_mut(name.as_str()) {
            // API Gateway joins repeated headers with commas.
            Some(Value::String(prev)) => {
                prev.push(',');
                prev.push_str(&v);
            }
            _ => {
                hdrs.insert(name.as_str().to_owned(), Value::String(v));
            }
        }
    }
    hdrs.insert("host".into(), Value::String(host.to_owned()));
    hdrs.insert("x-forwarded-proto".into(), Value::String("http".into()));
    hdrs.insert("x-forwarded-for".into(), Value::String("127.0.0.1".into()));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let route_key = if route.path == "$default" {
        "$default".to_owned()
    } else {
        format!("{} {}", route.method, route.path)
    };
    let mut query = Map::new();
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_encoding::percent_decode_str(k)
            .decode_utf8_lossy()
            .into_owned();
        let v = percent_encoding::percent_decode_str(&v.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned();
        match query.get_mut(&k) {
            Some(Value::String(prev)) => {
                prev.push(',');
                prev.push_str(&v);
            }
            _ => {
                query.insert(k, Value::String(v));
            }
        }
    }
    let (body_value, is_b64) = if body.is_empty() {
        (Value::Null, false)
    } else {
        match std::str::from_utf8(body) {
            Ok(s) => (Value::String(s.to_owned()), false),
            Err(_) => (
                Value::String(base64::engine::general_purpose::STANDARD.encode(body)),
                true,
            ),
        }
    };
    let path_params: Map<String, Value> = params
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let user_agent = headers
        .get("user-agent")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut event = json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": uri.path(),
        "rawQueryString": uri.query().unwrap_or(""),
        "headers": hdrs,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": "localhost",
            "domainPrefix": "localhost",
            "http": {
                "method": method.as_str(),
                "path": uri.path(),
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": user_agent,
            },
            "requestId": request_id(),
            "routeKey": route_key,
            "stage": "$default",
            "time": "",
            "timeEpoch": now.as_millis() as u64,
        },
        "isBase64Encoded": is_b64,
    });
    if !cookies.is_empty() {
        event["cookies"] = json!(cookies);
    }
    if !query.is_empty() {
        event["queryStringParameters"] = Value::Object(query);
    }
    if !path_params.is_empty() {
        event["pathParameters"] = Value::Object(path_params);
    }
    if !body_value.is_null() {
        event["body"] = body_value;
    }
    event
}
