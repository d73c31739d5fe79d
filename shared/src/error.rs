//! The one error type of the crate, and its single mapping to HTTP.
//!
//! SDK errors are translated into it at the store boundary
//! (`crate::store::dynamodb`); request validation produces it directly. Every
//! variant has exactly one status and one stable `code`; the `message` shown
//! to clients never carries internal detail (SDK messages, table names,
//! ARNs): that goes to the logs where the error is created.

use serde_json::json;

/// Every way a request can fail, each with one HTTP status ([`Error::status`])
/// and one stable `code` ([`Error::code`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// 400: the request is malformed (bad reel id, bad query, bad header).
    #[error("{message}")]
    BadRequest {
        /// The stable code of the JSON body, naming what was wrong
        /// (`invalid_reel_id`, …).
        code: &'static str,
        /// The client-facing explanation; no internal detail.
        message: String,
    },
    /// 401: a like/unlike without a verified identity.
    #[error("authentication required")]
    Unauthorized,
    /// 403: an admin route (or erasure) called without the IAM
    /// authorization the template requires, or by an IAM principal not on
    /// its allowlist (`ADMIN_PRINCIPALS`, `ERASURE_PRINCIPALS`; outside
    /// `AUTH_MODE=dev`).
    #[error("this route requires IAM authorization by an allowed principal")]
    Forbidden,
    /// 403: a user route called with a token that lacks the scope the
    /// deployment requires (`JWT_SCOPE`), such as an ID token.
    #[error("the token lacks the required scope")]
    InsufficientScope,
    /// 404: no such route.
    #[error("no such route")]
    NotFound,
    /// 404: a like of an id the deployment's reel check says is no reel
    /// (`service::reels`); nothing was written.
    #[error("no such reel")]
    UnknownReel,
    /// 405: the route exists, the method does not. `allow` lists the methods.
    #[error("method not allowed")]
    MethodNotAllowed {
        /// The methods the route accepts, as the `Allow` header lists them
        /// (`"GET, POST"`).
        allow: &'static str,
    },
    /// 409: the request conflicts with the current state (a resize to
    /// another shard count is in progress; likes ranked by a deployment
    /// counting in transactional mode).
    #[error("{message}")]
    Conflict {
        /// The stable code of the JSON body (`resize_in_progress`, …).
        code: &'static str,
        /// The client-facing explanation; no internal detail.
        message: String,
    },
    /// 413: the request body is larger than `limit` bytes.
    #[error("request body too large")]
    PayloadTooLarge {
        /// The largest body accepted, in bytes.
        limit: usize,
    },
    /// 429: DynamoDB still throttled after the bounded retries.
    #[error("throttled by the database")]
    Throttled,
    /// 429: the caller passed one of its write bounds (see
    /// `service::limits`); nothing was written.
    #[error("too many writes from this caller; retry later")]
    RateLimited {
        /// Seconds until the bound frees up.
        retry_after: u32,
    },
    /// 429: the transaction still conflicted with concurrent ones after the
    /// bounded retries (a very hot shard: the reel needs more shards).
    #[error("too much contention on this reel")]
    Contended,
    /// 503: DynamoDB could not be reached, timed out, or answered 5xx.
    #[error("the database is unavailable")]
    Unavailable,
    /// 500: a fault of ours (misconfiguration, a malformed stored item).
    #[error("internal error")]
    Internal,
}

impl Error {
    /// A 400 with the given stable `code` and client-facing `message`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Error::BadRequest {
            code,
            message: message.into(),
        }
    }

    /// A 500 for a fault of ours (a malformed stored item, a value that
    /// cannot be encoded, a misconfiguration): the one place such a fault
    /// is logged, with `what` failed, its `cause` and the caller's source
    /// location, so every 500 has its cause in the logs exactly once. The
    /// client sees only [`Error::Internal`], never the cause.
    #[track_caller]
    pub fn internal(what: &str, cause: impl std::fmt::Display) -> Self {
        let at = std::panic::Location::caller();
        tracing::error!(what, cause = %cause, at = %at, "internal error");
        Error::Internal
    }

    /// The HTTP status of this error: the only place it is decided.
    pub fn status(&self) -> u16 {
        match self {
            Error::BadRequest { .. } => 400,
            Error::Unauthorized => 401,
            Error::Forbidden | Error::InsufficientScope => 403,
            Error::NotFound | Error::UnknownReel => 404,
            Error::MethodNotAllowed { .. } => 405,
            Error::Conflict { .. } => 409,
            Error::PayloadTooLarge { .. } => 413,
            Error::Throttled | Error::Contended | Error::RateLimited { .. } => 429,
            Error::Internal => 500,
            Error::Unavailable => 503,
        }
    }

    /// The stable, machine-readable code of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            Error::BadRequest { code, .. } => code,
            Error::Unauthorized => "unauthorized",
            Error::Forbidden => "forbidden",
            Error::InsufficientScope => "insufficient_scope",
            Error::NotFound => "not_found",
            Error::UnknownReel => "reel_not_found",
            Error::MethodNotAllowed { .. } => "method_not_allowed",
            Error::Conflict { code, .. } => code,
            Error::PayloadTooLarge { .. } => "payload_too_large",
            Error::Throttled => "throttled",
            Error::RateLimited { .. } => "rate_limited",
            Error::Contended => "contended",
            Error::Internal => "internal",
            Error::Unavailable => "unavailable",
        }
    }

    /// Seconds a client should wait before retrying, for 429 and 503:
    /// drawn from 1 to 3, so that clients refused together (a throttled
    /// table refuses many at once) do not all come back in the same second.
    pub fn retry_after_secs(&self) -> Option<u32> {
        match self {
            Error::Throttled | Error::Contended | Error::Unavailable => Some(fastrand::u32(1..=3)),
            // A bound configured very low could ask for hours; the contract
            // caps the header.
            Error::RateLimited { retry_after } => {
                Some((*retry_after).clamp(1, MAX_RETRY_AFTER_SECS))
            }
            _ => None,
        }
    }

    /// `{"error": {"code": "...", "message": "..."}}`
    pub fn body(&self) -> serde_json::Value {
        let message = match self {
            Error::PayloadTooLarge { limit } => {
                format!("request body too large (limit {limit} bytes)")
            }
            other => other.to_string(),
        };
        json!({ "error": { "code": self.code(), "message": message } })
    }
}

/// The longest `Retry-After` answered (openapi.yaml's maximum): an hour.
pub const MAX_RETRY_AFTER_SECS: u32 = 3600;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_stays_within_the_contract() {
        // Before: a like bound of 0.0001 writes a second asked for 10,000 s.
        let long = Error::RateLimited {
            retry_after: 10_000,
        };
        assert_eq!(long.retry_after_secs(), Some(MAX_RETRY_AFTER_SECS));
        let none = Error::RateLimited { retry_after: 0 };
        assert_eq!(none.retry_after_secs(), Some(1));
    }

    #[test]
    fn every_variant_maps_to_a_status_and_json() {
        let all = [
            Error::bad_request("invalid_reel_id", "x"),
            Error::Unauthorized,
            Error::Forbidden,
            Error::InsufficientScope,
            Error::NotFound,
            Error::UnknownReel,
            Error::MethodNotAllowed { allow: "GET" },
            Error::Conflict {
                code: "resize_in_progress",
                message: "busy".into(),
            },
            Error::PayloadTooLarge { limit: 10 },
            Error::Throttled,
            Error::Contended,
            Error::RateLimited { retry_after: 7 },
            Error::Unavailable,
            Error::Internal,
        ];
        let statuses: Vec<u16> = all.iter().map(Error::status).collect();
        assert_eq!(
            statuses,
            [
                400, 401, 403, 403, 404, 404, 405, 409, 413, 429, 429, 429, 503, 500
            ]
        );
        for e in &all {
            let b = e.body();
            assert_eq!(b["error"]["code"], e.code());
            assert!(
                b["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
            );
        }
        let waits: std::collections::BTreeSet<u32> = (0..200)
            .filter_map(|_| Error::Throttled.retry_after_secs())
            .collect();
        assert_eq!(waits, (1..=3).collect(), "jittered over 1-3 s");
        assert_eq!(Error::NotFound.retry_after_secs(), None);
    }

    /// A 500's cause reaches the logs once, with where it arose, and never
    /// the client's body.
    #[test]
    fn internal_logs_its_cause_once_and_shows_none() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let e = tracing::subscriber::with_default(subscriber, || {
            Error::internal("decoding a chunk", "bad byte at 3")
        });
        assert_eq!(e, Error::Internal);
        let logged = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(logged.matches("internal error").count(), 1, "{logged}");
        for part in ["decoding a chunk", "bad byte at 3", "error.rs"] {
            assert!(logged.contains(part), "{part} missing from {logged}");
        }
        assert!(!e.body().to_string().contains("bad byte"));
    }
}
