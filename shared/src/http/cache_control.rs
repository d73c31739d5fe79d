//! Which answers a browser or CDN in front of the API may keep, and for
//! how long: the `Cache-Control` of a count answer (docs/api.md).

use super::request::Command;
use lambda_http::http::HeaderValue;
use serde_json::Value;
use std::time::Duration;

/// A count answer that a browser or CDN in front of the API may keep for as
/// long as this instance would serve the same sum from its cache: a viral
/// reel's views can then be absorbed before they reach a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cacheable {
    /// The body depends on nobody: `public`.
    Shared,
    /// The body depends on the caller (`liked_by_me`): `private`.
    Caller,
}

impl Cacheable {
    pub(super) fn of(command: &Command) -> Option<Self> {
        match command {
            Command::Count { user: Some(_), .. } => Some(Cacheable::Caller),
            Command::Count { user: None, .. }
            | Command::Counts { .. }
            | Command::ReelViews { .. }
            | Command::ReelStats { .. }
            | Command::Trending { .. }
            | Command::LikesAndViews { .. } => Some(Cacheable::Shared),
            _ => None,
        }
    }

    /// `public|private, max-age=N`: N is what is left of the cache lifetime
    /// of the oldest sum in `body` (its `age_ms`), in whole seconds rounded
    /// down, so no cache keeps it past when this instance would read again.
    /// A partial batch (`unavailable`) is not cached (`None`: `no-store`).
    pub(super) fn header(self, body: &Value, ttl: Duration) -> Option<HeaderValue> {
        if body.get("unavailable").is_some() {
            return None;
        }
        let age = Duration::from_millis(body.get("age_ms")?.as_u64()?);
        let left = ttl.saturating_sub(age).as_secs();
        let scope = match self {
            Cacheable::Shared => "public",
            Cacheable::Caller => "private",
        };
        HeaderValue::from_str(&format!("{scope}, max-age={left}")).ok()
    }
}
