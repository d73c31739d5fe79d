//! What one like or unlike sends and keeps across its attempts: its token,
//! its transaction, fixed before the first attempt, and the tally of the
//! attempts made.

use super::{LikeService, WriteRequest};
use crate::store::{CounterStore, KeyRecordSpec, LikeTx, RetryReason, Settings};
use crate::token::{RequestIdentity, RequestToken};
use std::time::Instant;

impl<S: CounterStore> LikeService<S> {
    /// The request's transaction as its first attempt sends it. Every
    /// field is fixed here, so that a retry is byte-identical and DynamoDB
    /// can recognise it by its token.
    pub(super) fn like_tx(
        &self,
        req: &WriteRequest,
        token: &RequestToken,
        settings: &Settings,
    ) -> LikeTx {
        let now = crate::clock::since_epoch();
        let record = req.idempotency_key.as_ref().map(|_| KeyRecordSpec {
            key_token: token.clone(),
            // Rounded up to the hour, so that the record does not differ
            // between a request's attempts for this reason.
            expires_at: ((now + self.key_ttl).as_secs() as i64 / 3600 + 1) * 3600,
        });
        LikeTx {
            user: req.user.clone(),
            reel: req.reel.clone(),
            action: req.action,
            shard: self.shard_for(token, settings.write_shards),
            token: token.clone(),
            now_ms: now.as_millis() as i64,
            record,
        }
    }
}

/// The token of a request: from its `Idempotency-Key`, else from its
/// request id, so that every delivery and retry of it sends the same one
/// and DynamoDB replays a commit rather than writing twice.
pub(super) fn request_token(req: &WriteRequest) -> RequestToken {
    match (&req.idempotency_key, &req.request_id) {
        (Some(k), _) => RequestToken::derive(
            &req.user,
            &req.reel,
            req.action,
            &RequestIdentity::ClientKey(k),
        ),
        (None, Some(id)) => RequestToken::derive(
            &req.user,
            &req.reel,
            req.action,
            &RequestIdentity::RequestId(id),
        ),
        (None, None) => RequestToken::random(),
    }
}

/// A request's transaction and its attempts at it so far: what the retry
/// policy decides on, and what the outcome and the log line report.
pub(super) struct Attempts {
    /// The transaction the next attempt sends (a follow-up changes its
    /// token and shard).
    pub(super) tx: LikeTx,
    /// Attempts started, the first included.
    pub(super) made: u32,
    pub(super) retries: u32,
    /// Follow-up tokens taken: each must differ from all before it.
    pub(super) follow_ups: u32,
    /// Why the last attempt did not settle: what giving up answers.
    pub(super) last_retry: RetryReason,
    pub(super) conflicts: u32,
    pub(super) throttles: u32,
    /// When the last attempt was sent: a sum read before it cannot hold
    /// its change.
    pub(super) sent_at: Instant,
    /// Stream mode, an unlike: the `liked_at` of the row it deletes, read
    /// before the first attempt (`None`: not read, or no row).
    pub(super) undoes_ms: Option<i64>,
}

impl Attempts {
    pub(super) fn new(tx: LikeTx) -> Self {
        Attempts {
            tx,
            made: 0,
            retries: 0,
            follow_ups: 0,
            last_retry: RetryReason::Conflict,
            conflicts: 0,
            throttles: 0,
            sent_at: Instant::now(),
            undoes_ms: None,
        }
    }
}
