//! Transactional mode's trending candidates for likes
//! ([`crate::trending::instance`]): a like this request committed feeds
//! this instance's sketch, and a put it makes due is made before the like
//! answers (on Lambda nothing runs after the answer until the next
//! request). A put that fails or takes longer than [`PUT_TIMEOUT`] fails
//! nothing: the like is committed and counted, and the sketch goes with
//! the next put.

use super::{LikeService, WritePath, WriteRequest};
use crate::keys::Action;
use crate::store::CounterStore;
use std::time::Duration;

/// The longest a like waits for its instance's sketch puts: they name
/// candidates only, and the like is committed already, so a slow or
/// throttled views table never holds a like's answer for longer.
pub const PUT_TIMEOUT: Duration = Duration::from_millis(300);

impl<S: CounterStore> LikeService<S> {
    /// `req` went `path` (`keyed`: with an `Idempotency-Key`): a like this
    /// request's own attempts committed feeds the sketch (transactional
    /// mode; in stream mode the aggregator keeps the sketches). A keyed
    /// replay may be a commit of minutes ago, already in the sketch of the
    /// instance that made it; a write that changed nothing adds nothing.
    pub(super) async fn sketch_like(&self, req: &WriteRequest, path: WritePath, keyed: bool) {
        let Some(sketch) = &self.sketch else {
            return;
        };
        let committed_here = match path {
            WritePath::Applied => true,
            WritePath::Replayed | WritePath::Committed => !keyed,
            _ => false,
        };
        if !committed_here || req.action != Action::Like {
            return;
        }
        let now = crate::clock::now_ms();
        let Some(flush) = sketch.add(req.reel.as_str(), now) else {
            return;
        };
        let error =
            match tokio::time::timeout(PUT_TIMEOUT, self.store.put_sketches(&flush, now)).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.code(),
                Err(_) => "timeout",
            };
        tracing::info!(
            error,
            writer = sketch.writer(),
            "trending sketch not put: it goes with the next put"
        );
        sketch.failed(flush);
    }
}
