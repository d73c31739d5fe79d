//! Erasure: every like of one user removed, exactly once each (a user's
//! right to be forgotten; `DELETE /admin/users/{user_id}/likes`).
//!
//! Each like row is undone by the unlike path itself, so the count goes
//! down with the row in one transaction (transactional mode) or through the
//! stream (stream mode), and a row already gone changes nothing. The unlike
//! of a row is named by the row itself (its reel and `liked_at`), so a retry
//! of it within DynamoDB's token lifetime is a replay, never a second
//! decrement, and a like made again later is another row, erased anew. Nothing else is kept: a call that stops (its deadline, a
//! throttle) leaves the remaining rows in place, and the next call finds
//! them again; calls may overlap. The answer says whether rows remain.
//!
//! What is not erased here: `Idempotency-Key` records hold no user id (their
//! key is a hash of user, reel, action and the client's key; their body is
//! the action and whether it changed anything) and expire with
//! `IDEMPOTENCY_TTL`; logs keep user ids for their retention.

use super::{LikeService, WriteRequest};
use crate::error::Error;
use crate::keys::{Action, UserId};
use crate::store::CounterStore;
use std::time::{Duration, Instant};

/// Like rows read per Query.
const PAGE: u32 = 100;

/// What one erasure call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Erased {
    /// Likes this call removed (each counted down once).
    pub removed: u64,
    /// No like of the user is left.
    pub complete: bool,
}

impl<S: CounterStore> LikeService<S> {
    /// Removes `user`'s likes until none is left or `within` has passed.
    pub async fn erase(&self, user: &UserId, within: Duration) -> Result<Erased, Error> {
        let until = Instant::now() + within;
        let mut removed = 0;
        loop {
            let reels = self.store.user_likes(user, PAGE).await?;
            if reels.is_empty() {
                return Ok(Erased {
                    removed,
                    complete: true,
                });
            }
            for (reel, liked_at) in reels {
                if Instant::now() >= until {
                    return Ok(Erased {
                        removed,
                        complete: false,
                    });
                }
                let out = self
                    .write_unbounded(WriteRequest {
                        user: user.clone(),
                        reel,
                        action: Action::Unlike,
                        idempotency_key: None,
                        request_id: Some(format!("erase-{}", liked_at.unwrap_or(0))),
                    })
                    .await?;
                removed += u64::from(out.changed);
            }
        }
    }
}
