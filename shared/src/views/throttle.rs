//! Throttled reads of the views aggregator, retried within bounds.
//!
//! Planning a chunk reads: the shard's checkpoint (`GetItem`), its seen
//! items (`Query`) and the sketches of the items it updates
//! (`BatchGetItem`); a repair reads checkpoints and seen items too. The SDK
//! retries a throttled call a few times; past that, a throttled read is
//! retried here, with full-jitter backoff ([`READ_ATTEMPTS`] attempts in
//! all), each retry counted (`ViewReadThrottlesRetried`), and never with a
//! pause that would end within [`core::DEADLINE_SAFETY`] of the
//! invocation's deadline (the time kept to apply the chunk, or hand the
//! batch back). Given up (`ViewReadThrottlesGivenUp`), the batch fails as
//! before and Lambda delivers it again; nothing read was written, so
//! nothing is applied twice. `BatchGetItem`'s unprocessed keys are such a
//! throttle: the aggregator asks for the keys left again at the same pace.
//!
//! Its log lines carry the target of the aggregator's own
//! ([`super::aggregate`]: `likes::views::aggregate`), so that one filter
//! sees every line of a batch.

use crate::aggregate::core;
use crate::error::Error;
use crate::retry::Backoff;
use std::future::Future;
use std::time::Instant;

/// Attempts of a throttled read while planning a chunk (the first
/// included), each after a full-jitter pause (`crate::retry`, from
/// `RETRY_BASE_MS` to `RETRY_MAX_MS`): with the defaults (25 ms to 1 s), up
/// to about 2.6 s of pauses, half that on average; never past the
/// deadline's margin.
pub const READ_ATTEMPTS: u32 = 8;

/// The target of this module's log lines: the aggregator's.
const LOG_TARGET: &str = "likes::views::aggregate";

/// The views aggregator's metrics (flushed by its entry point).
fn metrics() -> crate::metrics::Record {
    crate::metrics::Record::of("aggregate-views")
}

/// After the `attempt`-th throttled read `op`: pauses as `backoff` says
/// and answers `Ok`, or answers [`Error::Throttled`] at once if the
/// attempts are spent or the pause would end within
/// [`core::DEADLINE_SAFETY`] of `deadline`.
pub(super) async fn pause_after_throttle(
    backoff: &Backoff,
    attempt: u32,
    deadline: Option<Instant>,
    op: &'static str,
) -> Result<(), Error> {
    let pause = backoff.delay(attempt);
    let fits = deadline.is_none_or(|d| Instant::now() + pause + core::DEADLINE_SAFETY < d);
    if !backoff.allows(attempt) || !fits {
        metrics().count("ViewReadThrottlesGivenUp", 1);
        tracing::warn!(
            target: LOG_TARGET,
            op,
            attempts = attempt,
            deadline_near = !fits,
            "views read still throttled; the batch fails and Lambda delivers it again"
        );
        return Err(Error::Throttled);
    }
    metrics().count("ViewReadThrottlesRetried", 1);
    tracing::debug!(target: LOG_TARGET, op, attempt, ?pause, "views read throttled; retrying");
    tokio::time::sleep(pause).await;
    Ok(())
}

/// `read` (the read `op`), retried while it is throttled (see the module
/// notes): its first answer that is not [`Error::Throttled`], or that
/// error once [`pause_after_throttle`] gives up.
pub(super) async fn read_retrying<T, F, Fut>(
    backoff: &Backoff,
    deadline: Option<Instant>,
    op: &'static str,
    mut read: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match read().await {
            Err(Error::Throttled) => pause_after_throttle(backoff, attempt, deadline, op).await?,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// Pauses of up to 10 s: only the deadline bounds them.
    fn slow() -> Backoff {
        Backoff {
            max_attempts: 50,
            base: Duration::from_millis(400),
            max: Duration::from_secs(10),
        }
    }

    #[tokio::test]
    async fn a_throttled_read_is_retried_until_it_goes_through() {
        let calls = AtomicU32::new(0);
        let fast = Backoff {
            max_attempts: READ_ATTEMPTS,
            base: Duration::from_millis(1),
            max: Duration::from_millis(5),
        };
        let read = || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0..3 => Err(Error::Throttled),
                _ => Ok(7),
            }
        };
        assert_eq!(read_retrying(&fast, None, "GetItem", read).await, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Other errors are not retried here.
        let calls = AtomicU32::new(0);
        let unavailable = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(Error::Unavailable)
        };
        assert_eq!(
            read_retrying(&fast, None, "GetItem", unavailable).await,
            Err(Error::Unavailable)
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Bounded: READ_ATTEMPTS in all.
        let calls = AtomicU32::new(0);
        let throttled = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(Error::Throttled)
        };
        assert_eq!(
            read_retrying(&fast, None, "Query", throttled).await,
            Err(Error::Throttled)
        );
        assert_eq!(calls.load(Ordering::SeqCst), READ_ATTEMPTS);
    }

    #[tokio::test]
    async fn a_throttled_read_never_pauses_past_the_deadline_margin() {
        for room_ms in [0, 50, 300] {
            let deadline = Instant::now() + core::DEADLINE_SAFETY + Duration::from_millis(room_ms);
            let throttled = || async { Err::<(), _>(Error::Throttled) };
            let result = read_retrying(&slow(), Some(deadline), "Query", throttled).await;
            assert_eq!(result, Err(Error::Throttled));
            // Given up before the margin begins (a read's own time aside).
            let margin_at = deadline - core::DEADLINE_SAFETY;
            let over = Instant::now().saturating_duration_since(margin_at);
            assert!(over < Duration::from_millis(100), "{room_ms} ms: {over:?}");
        }
        // A deadline already within the margin: no pause at all.
        let started = Instant::now();
        let deadline = started + Duration::from_secs(1);
        assert_eq!(
            pause_after_throttle(&slow(), 1, Some(deadline), "BatchGetItem").await,
            Err(Error::Throttled)
        );
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}
