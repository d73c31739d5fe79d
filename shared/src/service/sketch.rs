//! Transactional mode's trending candidates for likes
//! ([`crate::trending::instance`]): a like this request committed feeds
//! this instance's sketch, and a put it makes due is made before the like
//! answers (on Lambda nothing runs after the answer until the next
//! request). A put that fails fails nothing: the like is committed and
//! counted, and the sketch goes with the next put.

use super::LikeService;
use crate::keys::ReelId;
use crate::store::CounterStore;

impl<S: CounterStore> LikeService<S> {
    /// `reel` was liked by this request (transactional mode; nothing in
    /// stream mode, where the aggregator keeps the sketches).
    pub(super) async fn sketch_like(&self, reel: &ReelId) {
        let Some(sketch) = &self.sketch else {
            return;
        };
        let now = crate::clock::now_ms();
        let Some(flush) = sketch.add(reel.as_str(), now) else {
            return;
        };
        if let Err(e) = self.store.put_sketches(&flush, now).await {
            tracing::info!(
                error = e.code(),
                writer = sketch.writer(),
                "trending sketch not put: it goes with the next put"
            );
            sketch.failed(flush);
        }
    }
}
