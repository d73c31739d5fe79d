//! Wall-clock time, in one place: the stamps stored in items (`liked_at`,
//! `updated_at`, resize phases, reconciliation runs), EMF timestamps, and the
//! Lambda deadline. Every module that needs the time asks here, so none has
//! to reach into another's room for it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Time since the Unix epoch (zero if the clock is set before it).
pub(crate) fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> i64 {
    since_epoch().as_millis() as i64
}

/// The invocation's deadline as an `Instant`, from the Lambda context's
/// deadline (Unix ms). A value that is not in the future (emulators such as
/// `cargo lambda watch` pass a duration there) means "unknown": `None`.
pub fn lambda_deadline(deadline_ms: u64) -> Option<Instant> {
    let now_ms = since_epoch().as_millis() as u64;
    if deadline_ms <= now_ms {
        tracing::warn!(
            deadline_ms,
            now_ms,
            "the invocation's deadline is not in the future; ignoring it"
        );
        return None;
    }
    Some(Instant::now() + Duration::from_millis(deadline_ms - now_ms))
}
