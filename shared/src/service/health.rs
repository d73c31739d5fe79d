//! Readiness (`GET /healthz`), answered from a short-lived cached probe.
//! It belongs to the service, whose store it probes, so the HTTP handler and
//! [`crate::App`] need nothing but [`super::LikeService::ready`].
//!
//! The route is unauthenticated, so its cost must not scale with how often
//! it is called: one data-plane probe of both tables
//! ([`CounterStore::ping`]) answers every check for [`HEALTH_TTL`], and
//! concurrent checks on a miss wait for that one probe. Every failure is
//! 503: a throttled probe means the tables cannot take traffic right now,
//! which is what readiness reports, not a client's fault (429).

use crate::error::Error;
use crate::store::CounterStore;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// How long one probe's result answers readiness checks.
pub const HEALTH_TTL: Duration = Duration::from_secs(5);

/// The last probe's result and when it was taken.
#[derive(Default)]
pub(super) struct Health {
    last: Mutex<Option<(Instant, Result<(), Error>)>>,
}

impl Health {
    /// Ready, or [`Error::Unavailable`] (or [`Error::Internal`] for a fault
    /// of ours, such as a malformed configuration).
    pub(super) async fn check<S: CounterStore>(&self, store: &S) -> Result<(), Error> {
        // Held across the probe: concurrent checks share one probe.
        let mut last = self.last.lock().await;
        if let Some((at, result)) = &*last
            && at.elapsed() < HEALTH_TTL
        {
            return result.clone();
        }
        let result = store.ping().await.map_err(|e| match e {
            Error::Internal => Error::Internal,
            other => {
                tracing::warn!(error = other.code(), "readiness probe failed");
                Error::Unavailable
            }
        });
        *last = Some((Instant::now(), result.clone()));
        result
    }
}
