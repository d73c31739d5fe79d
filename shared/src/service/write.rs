//! The like/unlike write path: exactly once, retried within the request's
//! budget, answered with the count adjusted by the request's own change.

use super::attempts::{Attempts, request_token};
use super::read::Cached;
use super::served::OwnChange;
use super::{Count, LikeService, WriteOutcome, WritePath, WriteRequest};
use crate::config::Counting;
use crate::error::Error;
use crate::keys::{Action, ReelId};
use crate::store::{CounterStore, RetryReason, Settings, TxResult};
use crate::token::RequestToken;
use moka::ops::compute::{CompResult, Op};
use std::sync::atomic::Ordering;
use std::time::Instant;

impl<S: CounterStore> LikeService<S> {
    /// Likes or unlikes, exactly once: one transaction writes the like row
    /// (conditioned on its current state) and the shard increment together,
    /// and for a request with an `Idempotency-Key` also the key's record.
    pub async fn write(&self, req: WriteRequest) -> Result<WriteOutcome, Error> {
        // Before anything is read or written: a refused write costs nothing.
        self.limits
            .admit(&req.user, &req.reel, req.idempotency_key.is_some())
            .await?;
        if req.action == Action::Like {
            self.reels.admit(&req.reel).await?;
            // Before the like is written: once it is acknowledged, every
            // instance's set holds the reel within `CACHE_TTL_MS`.
            if let Some(k) = &self.known {
                k.register(&[&req.reel]).await?;
            }
        }
        self.write_unbounded(req).await
    }

    /// [`Self::write`] without the caller's bounds (an operator's erasure).
    pub(super) async fn write_unbounded(&self, req: WriteRequest) -> Result<WriteOutcome, Error> {
        let started = Instant::now();
        let settings = self.settings(&req.reel).await?;
        let token = request_token(&req);
        let mut tries = Attempts::new(self.like_tx(&req, &token, &settings));
        tries.undoes_ms = self.liked_at_before_unlike(&req).await;
        let (path, changed) = loop {
            tries.made += 1;
            if tries.made > 1 {
                self.wait_to_retry(&req, started, &mut tries).await?;
            }
            tries.sent_at = Instant::now();
            let result = self.store.write_like(&tries.tx).await?;
            if let Some(done) = self
                .settle(&req, &token, &settings, &mut tries, result)
                .await?
            {
                break done;
            }
        };
        let committed_at = Instant::now();
        let keyed = tries.tx.record.is_some();
        self.sketch_like(&req, path, keyed).await;
        let count = self
            .count_after_write(&req, path, keyed, &tries, committed_at)
            .await?;
        // The ordinary write (applied at once, or already so) logs at
        // DEBUG: at INFO a like would log its request twice, and
        // CloudWatch Logs charges by the byte. A write that retried or took
        // any other path is worth a line at INFO.
        macro_rules! write_line {
            ($level:ident) => {
                tracing::$level!(
                    reel = %req.reel,
                    action = req.action.as_str(),
                    shard = ?tries.tx.shard,
                    retries = tries.retries,
                    outcome = path.as_str(),
                    changed,
                    keyed,
                    "write"
                )
            };
        }
        if tries.retries == 0 && matches!(path, WritePath::Applied | WritePath::AlreadyInState) {
            write_line!(debug);
        } else {
            write_line!(info);
        }
        Ok(WriteOutcome {
            // Every path ends in the state asked for: written now, by an
            // earlier attempt, or already so.
            liked: req.action == Action::Like,
            changed,
            count: count.max(0),
            path,
            retries: tries.retries,
            conflicts: tries.conflicts,
            throttles: tries.throttles,
            shard: tries.tx.shard,
        })
    }

    /// The retry policy, before every attempt but the first: waits out the
    /// backoff, or gives up when the policy allows no more attempts or one
    /// more could not finish within the request's budget.
    async fn wait_to_retry(
        &self,
        req: &WriteRequest,
        started: Instant,
        tries: &mut Attempts,
    ) -> Result<(), Error> {
        let delay = self.backoff.delay(tries.made - 1);
        let in_budget = started.elapsed() + delay + self.call_timeout <= self.budget;
        if !self.backoff.allows(tries.made - 1) || !in_budget {
            tracing::warn!(reel = %req.reel, action = req.action.as_str(), attempts = tries.made - 1, reason = ?tries.last_retry, in_budget, "transaction retries exhausted");
            return Err(match tries.last_retry {
                RetryReason::Throttled | RetryReason::OwnThrottled => Error::Throttled,
                RetryReason::Conflict | RetryReason::OwnConflict | RetryReason::InProgress => {
                    Error::Contended
                }
            });
        }
        tries.retries += 1;
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// What one attempt's `result` settles: the path and whether this
    /// request changed the like, or `None` to try again.
    async fn settle(
        &self,
        req: &WriteRequest,
        token: &RequestToken,
        settings: &Settings,
        tries: &mut Attempts,
        result: TxResult,
    ) -> Result<Option<(WritePath, bool)>, Error> {
        Ok(Some(match result {
            TxResult::Committed { replayed: false } => (WritePath::Applied, true),
            TxResult::Committed { replayed: true } => (WritePath::Replayed, true),
            TxResult::CommittedUnsure => (WritePath::Committed, true),
            TxResult::AlreadyInState => match &tries.tx.record {
                // Record that this key changed nothing, so that a retry
                // after the user changed state does not act on it then.
                Some(spec) => {
                    let r = self.store.record_unchanged(spec, req.action).await?;
                    let path = if r.changed {
                        WritePath::ResolvedByRecord
                    } else {
                        WritePath::AlreadyInState
                    };
                    (path, r.changed)
                }
                None => (WritePath::AlreadyInState, false),
            },
            TxResult::KeyUsed => {
                let changed = self
                    .store
                    .key_record(token)
                    .await?
                    .is_some_and(|r| r.changed);
                (WritePath::ResolvedByRecord, changed)
            }
            TxResult::Retry(reason) => {
                self.note_retry(req, settings, tries, reason).await;
                return Ok(None);
            }
            TxResult::ParameterMismatch if tries.tx.record.is_some() => {
                // The token is bound to another body: an earlier request
                // with this key (a like carries its own liked_at; a
                // resize may have moved the shard). Its record, written
                // atomically with any change it made, is the answer.
                if let Some(r) = self.store.key_record(token).await? {
                    return Ok(Some((WritePath::ResolvedByRecord, r.changed)));
                }
                // No record: nothing committed under this key, so acting
                // now is not acting twice. A fresh token, the same record.
                tries.follow_ups += 1;
                tries.tx.token = token.follow_up(tries.follow_ups);
                tries.tx.shard = self.shard_for(&tries.tx.token, settings.write_shards);
                tries.last_retry = RetryReason::Conflict;
                return Ok(None);
            }
            TxResult::ParameterMismatch => (
                WritePath::ResolvedByRow,
                self.changed_by_first_delivery(req, token).await?,
            ),
        }))
    }

    /// Counts a retry by its reason, for the request's metrics and the
    /// instance's totals, and tells the observer of a crowd on the reel.
    async fn note_retry(
        &self,
        req: &WriteRequest,
        settings: &Settings,
        tries: &mut Attempts,
        reason: RetryReason,
    ) {
        tries.last_retry = reason;
        match reason {
            RetryReason::Conflict | RetryReason::OwnConflict => {
                tries.conflicts += 1;
                self.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            RetryReason::Throttled | RetryReason::OwnThrottled => {
                tries.throttles += 1;
                self.throttles.fetch_add(1, Ordering::Relaxed);
            }
            RetryReason::InProgress => {}
        }
        // Only a conflict on the reel's own item, the shard, says a
        // crowd is at it. The caller's row or record says nothing of
        // the reel (one user racing themselves), and a throttle says
        // nothing of the reel either: DynamoDB throttles a table's or
        // an account's capacity, so a throttled table would grow every
        // reel it touches (×SATURATED_GROWTH for an hour each). A truly
        // hot shard shows in the write rate the schedule sizes by.
        if reason == RetryReason::Conflict {
            self.observe_contention(&req.reel, &req.user, settings)
                .await;
        }
    }

    /// Whether an unkeyed request whose token DynamoDB found bound to
    /// another body changed the like when first delivered.
    async fn changed_by_first_delivery(
        &self,
        req: &WriteRequest,
        token: &RequestToken,
    ) -> Result<bool, Error> {
        // Without a key the token comes from the request id: the
        // same request delivered again after a resize moved its
        // shard. Never write again; the like row tells the state.
        let row = self.store.like_row(&req.user, &req.reel).await?;
        // DynamoDB remembers the token, so the first delivery
        // most likely committed: answer as it did. A like knows
        // for sure (its row carries the token); an unlike's row
        // is gone either way, so its `changed` is a best guess.
        Ok(match (req.action, row) {
            (Action::Like, Some(row)) => row.token.as_deref() == Some(token.as_str()),
            (Action::Like, None) => false,
            (Action::Unlike, _) => true,
        })
    }

    /// Stream mode, an unlike: the `liked_at` of the row it is about to
    /// delete (one consistent read), so that its answer takes the like off
    /// only a count that may hold it ([`OwnChange::undoes_ms`]). `None` in
    /// transactional mode, for a like, or when the read fails (the count
    /// is then taken as holding the like, as before).
    async fn liked_at_before_unlike(&self, req: &WriteRequest) -> Option<i64> {
        if self.counting != Counting::Stream || req.action != Action::Unlike {
            return None;
        }
        match self.store.like_row(&req.user, &req.reel).await {
            Ok(row) => row.and_then(|r| r.liked_at_ms),
            Err(e) => {
                tracing::debug!(reel = %req.reel, error = e.code(), "the like row before an unlike was not read");
                None
            }
        }
    }

    /// The count a write answers with, `path` the way it went and `keyed`
    /// whether it carried an `Idempotency-Key`.
    async fn count_after_write(
        &self,
        req: &WriteRequest,
        path: WritePath,
        keyed: bool,
        tries: &Attempts,
        committed_at: Instant,
    ) -> Result<i64, Error> {
        let sent_at = tries.sent_at;
        let own = OwnChange {
            delta: req.action.delta(),
            at_ms: tries.tx.now_ms,
            undoes_ms: tries.undoes_ms,
        };
        Ok(match path {
            // Stream mode: the shards get the change only once the stream
            // has carried it to the aggregator.
            WritePath::Applied if self.counting == Counting::Stream => {
                self.count_after_own_streamed_change(&req.reel, own, committed_at)
                    .await?
            }
            // The same for an unkeyed write that an earlier attempt of this
            // very request committed (its token is the request's own: the
            // SDK's retry after a lost answer), just now. A keyed one may
            // replay a commit of minutes ago, counted since: read below.
            WritePath::Replayed | WritePath::Committed
                if self.counting == Counting::Stream && !keyed =>
            {
                self.count_after_own_streamed_change(&req.reel, own, committed_at)
                    .await?
            }
            WritePath::Applied => {
                self.count_after_own_change(&req.reel, req.action.delta(), sent_at, committed_at)
                    .await?
            }
            // Committed during this request (the SDK retried after a lost
            // response) or by an earlier one: which, and so whether a cached
            // sum has it, is unknown. Read afresh, sent now: not a load
            // already in flight, which may have been sent before the commit.
            WritePath::Replayed | WritePath::Committed => {
                let fresh = self.sum_fresh(&req.reel).await?;
                self.serve(&req.reel, fresh).await.count
            }
            // Nothing was written now: the cached total stands as it is.
            _ => self.count(&req.reel).await?.count,
        })
    }

    /// The write shard for `token`: the one its hash picks among
    /// `write_shards`, or none in stream mode (the row alone is written).
    pub(super) fn shard_for(&self, token: &RequestToken, write_shards: u32) -> Option<u32> {
        (self.counting == Counting::Transactional)
            .then(|| self.shard_key.shard(token, write_shards))
    }

    /// Stream mode: the count after this instance committed `own`, a like
    /// row change, at `committed_at`, which no shard holds yet.
    ///
    /// The answer is what this instance would serve now plus the change
    /// (the value served last if the cached sum would not replace it: an
    /// earlier own change may be in the former and not yet in the latter),
    /// recorded by the guard as the newest value whatever it served before
    /// ([`Self::serve_own_change`]): an unlike after a like answers without
    /// that like, and takes nothing off a value that cannot hold the like
    /// (the like made on another instance, not yet carried). It is served
    /// with `covers` set [`Config::stream_visible`] ahead: until then a sum
    /// read without the change cannot replace it (a larger one only lifts
    /// it to what it proves), after that the aggregator has applied it and
    /// a fresh sum holds it.
    ///
    /// [`Config::stream_visible`]: crate::config::Config::stream_visible
    async fn count_after_own_streamed_change(
        &self,
        reel: &ReelId,
        own: OwnChange,
        committed_at: Instant,
    ) -> Result<i64, Error> {
        let current = self.cached(reel).await?;
        let adjusted = self
            .serve_own_change(reel, current, own, committed_at + self.stream_visible)
            .await;
        if let Some(c) = &self.counts {
            c.entry(reel.clone())
                .and_compute_with(|entry| async move {
                    match entry.map(|e| e.into_value()) {
                        // Still the lineage read above, not adjusted as far
                        // (a concurrent own change may have gone further):
                        // it now holds the change.
                        Some(n) if n.load == adjusted.load && n.adjusted < adjusted.adjusted => {
                            Op::Put(adjusted)
                        }
                        _ => Op::Nop,
                    }
                })
                .await;
        }
        Ok(adjusted.count.count)
    }

    /// The count after this instance committed `delta` with a transaction
    /// sent at `sent_at` that returned at `committed_at`.
    ///
    /// A cached sum whose read finished before the transaction was sent
    /// cannot include it and is adjusted in place (its expiry stays anchored
    /// to when it was read), so this instance's own likes and unlikes show
    /// in what it serves next. A sum read after the commit includes it as it
    /// is. A read that overlapped the transaction is ambiguous: it is
    /// dropped and the shards are read again. The adjusted sum is then
    /// served through the guard; only if the guard keeps the value of
    /// another read instead (one the adjusted sum predates, which may lack
    /// this change) are the shards read again.
    ///
    /// The guard decides after the adjustment, not before: under concurrent
    /// likes two loads of one reel routinely overlap, one cached and one
    /// served, with the same value. Refusing every such entry up front sent
    /// every later like of the instance to a fresh read (measured: a
    /// `BatchGetItem` for a third of all likes, 16 at a time on one reel,
    /// and a third of the like path's throughput); adjusted by the like, the
    /// entry is the larger and is served.
    async fn count_after_own_change(
        &self,
        reel: &ReelId,
        delta: i64,
        sent_at: Instant,
        committed_at: Instant,
    ) -> Result<i64, Error> {
        let Some(c) = &self.counts else {
            let fresh = self.sum_now(reel).await?;
            return Ok(self.serve(reel, fresh).await.count);
        };
        for _ in 0..3 {
            let current = self.cached(reel).await?;
            if current.count.read_at >= committed_at {
                return Ok(self.serve(reel, current).await.count);
            }
            let excludes_ours = current.count.done_at < sent_at;
            let result = c
                .entry(reel.clone())
                .and_compute_with(|entry| async move {
                    match entry.map(|e| e.into_value()) {
                        // Still the entry we looked at (other writes of this
                        // instance may have adjusted it meanwhile).
                        Some(n) if n.load == current.load && n.adjusted == current.adjusted => {
                            if excludes_ours {
                                Op::Put(Cached {
                                    count: Count {
                                        count: n.count.count + delta,
                                        ..n.count
                                    },
                                    adjusted: n.adjusted.saturating_add(1),
                                    covers: n.covers.max(committed_at),
                                    ..n
                                })
                            } else {
                                Op::Remove
                            }
                        }
                        _ => Op::Nop,
                    }
                })
                .await;
            if let CompResult::ReplacedWith(e) = result {
                match self.serve_from(reel, e.into_value()).await {
                    (count, true) => return Ok(count.count),
                    // The guard kept another read's value, which may lack
                    // this change.
                    (_, false) => break,
                }
            }
        }
        // Still racing other loads, or the guard kept a value this change
        // may be missing from: a sum read now includes the commit.
        let fresh = self.sum_fresh(reel).await?;
        Ok(self.serve(reel, fresh).await.count)
    }
}

#[cfg(test)]
mod tests;
