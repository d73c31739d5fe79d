//! The like counter itself: exactly-once like/unlike, and cached sums.
//!
//! [`LikeService`] sees storage only through [`CounterStore`]. It keeps two
//! bounded in-memory caches per function instance:
//!
//! * the summed count of a reel, for `CACHE_TTL_MS`: a viral reel is summed
//!   at most once per TTL per instance instead of on every view;
//! * a reel's settings (shard counts), for `SETTINGS_TTL_MS`: read on every
//!   like, and the reason resizing waits that long between its steps.
//!
//! Both are size-bounded (`CACHE_MAX_REELS`, least recently used evicted) and
//! coalesce concurrent misses of one reel into one DynamoDB read.

use crate::config::Config;
use crate::error::Error;
use crate::keys::{Action, ReelId, UserId};
use crate::retry::Backoff;
use crate::store::{CounterStore, LikeTx, RetryReason, Settings, TxResult};
use crate::token::{RequestIdentity, RequestToken};
use moka::future::Cache;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A summed count and when its shards were read.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    pub count: i64,
    /// When the BatchGetItem that produced `count` was sent.
    pub read_at: Instant,
}

impl Count {
    pub fn age(&self) -> Duration {
        self.read_at.elapsed()
    }
}

/// A like or unlike as the handler hands it over.
#[derive(Clone, Debug)]
pub struct WriteRequest {
    pub user: UserId,
    pub reel: ReelId,
    pub action: Action,
    /// The client's `Idempotency-Key`, if any.
    pub idempotency_key: Option<String>,
    /// The API Gateway request id, if the event carried one.
    pub request_id: Option<String>,
}

/// Which path a write took; logged, and asserted on by the fault tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePath {
    /// The transaction committed now.
    Applied,
    /// An earlier attempt with the same token had committed; DynamoDB
    /// replayed its success without writing again.
    Replayed,
    /// The like row was already in the requested state: nothing written.
    AlreadyInState,
    /// DynamoDB reported IdempotentParameterMismatch; the like row showed the
    /// request had already taken effect.
    ResolvedByRow,
}

impl WritePath {
    pub fn as_str(self) -> &'static str {
        match self {
            WritePath::Applied => "applied",
            WritePath::Replayed => "replayed",
            WritePath::AlreadyInState => "already_in_state",
            WritePath::ResolvedByRow => "resolved_by_row",
        }
    }
}

#[derive(Clone, Debug)]
pub struct WriteOutcome {
    pub liked: bool,
    /// Whether this request (or its earlier attempt) changed the like state.
    pub changed: bool,
    /// The cached total, adjusted by this request's own change.
    pub count: i64,
    pub path: WritePath,
    /// Transaction attempts beyond the first (conflicts, throttles).
    pub retries: u32,
    pub shard: u32,
}

pub struct LikeService<S> {
    store: S,
    counts: Option<Cache<ReelId, Count>>,
    settings: Option<Cache<ReelId, Settings>>,
    backoff: Backoff,
    /// See [`Config::request_budget`].
    budget: Duration,
    /// The SDK's bound on one call.
    call_timeout: Duration,
}

fn cache<V: Clone + Send + Sync + 'static>(ttl: Duration, max: u64) -> Option<Cache<ReelId, V>> {
    // A zero TTL means "do not cache" (useful in tests, costly in production).
    (!ttl.is_zero()).then(|| Cache::builder().max_capacity(max).time_to_live(ttl).build())
}

fn unshare(e: Arc<Error>) -> Error {
    (*e).clone()
}

impl<S: CounterStore> LikeService<S> {
    pub fn new(store: S, config: &Config) -> Self {
        LikeService {
            store,
            counts: cache(config.cache_ttl, config.cache_max_reels),
            settings: cache(config.settings_ttl, config.cache_max_reels),
            backoff: Backoff {
                max_attempts: config.tx_max_attempts,
                base: config.retry_base,
                max: config.retry_max,
            },
            budget: config.request_budget,
            call_timeout: config.ddb_operation_timeout,
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The settings of one reel, cached.
    pub async fn settings(&self, reel: &ReelId) -> Result<Settings, Error> {
        let load = async {
            let mut m = self.store.settings(std::slice::from_ref(reel)).await?;
            Ok(m.remove(reel).unwrap_or_default())
        };
        match &self.settings {
            Some(c) => c.try_get_with(reel.clone(), load).await.map_err(unshare),
            None => load.await,
        }
    }

    async fn settings_many(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
        let mut out = HashMap::with_capacity(reels.len());
        let mut missing = Vec::new();
        for r in reels {
            match self.settings.as_ref() {
                Some(c) => match c.get(r).await {
                    Some(s) => {
                        out.insert(r.clone(), s);
                    }
                    None => missing.push(r.clone()),
                },
                None => missing.push(r.clone()),
            }
        }
        if !missing.is_empty() {
            let fetched = self.store.settings(&missing).await?;
            for (r, s) in fetched {
                if let Some(c) = &self.settings {
                    c.insert(r.clone(), s).await;
                }
                out.insert(r, s);
            }
        }
        Ok(out)
    }

    /// The cached count of one reel (summed from its shards on a miss).
    pub async fn count(&self, reel: &ReelId) -> Result<Count, Error> {
        let load = async {
            let settings = self.settings(reel).await?;
            let read_at = Instant::now();
            let sums = self
                .store
                .sum_shards(&[(reel.clone(), settings.shards_to_sum())])
                .await?;
            Ok(Count {
                count: sums.get(reel).copied().unwrap_or(0),
                read_at,
            })
        };
        match &self.counts {
            Some(c) => c.try_get_with(reel.clone(), load).await.map_err(unshare),
            None => load.await,
        }
    }

    /// The cached counts of many reels; the misses are summed together in
    /// as few BatchGetItem calls as their shards need.
    pub async fn counts(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Count>, Error> {
        let mut out = HashMap::with_capacity(reels.len());
        let mut missing = Vec::new();
        for r in reels {
            if out.contains_key(r) || missing.contains(r) {
                continue;
            }
            match self.counts.as_ref() {
                Some(c) => match c.get(r).await {
                    Some(n) => {
                        out.insert(r.clone(), n);
                    }
                    None => missing.push(r.clone()),
                },
                None => missing.push(r.clone()),
            }
        }
        if !missing.is_empty() {
            let settings = self.settings_many(&missing).await?;
            let plan: Vec<(ReelId, u32)> = missing
                .iter()
                .map(|r| {
                    (
                        r.clone(),
                        settings.get(r).copied().unwrap_or_default().shards_to_sum(),
                    )
                })
                .collect();
            let read_at = Instant::now();
            let sums = self.store.sum_shards(&plan).await?;
            for r in missing {
                let n = Count {
                    count: sums.get(&r).copied().unwrap_or(0),
                    read_at,
                };
                if let Some(c) = &self.counts {
                    c.insert(r.clone(), n).await;
                }
                out.insert(r, n);
            }
        }
        Ok(out)
    }

    /// Whether `user` likes `reel` now (a consistent read of the like row).
    pub async fn liked(&self, user: &UserId, reel: &ReelId) -> Result<bool, Error> {
        Ok(self.store.like_row(user, reel).await?.is_some())
    }

    /// Likes or unlikes, exactly once: one transaction writes the like row
    /// (conditioned on its current state) and the shard increment together.
    pub async fn write(&self, req: WriteRequest) -> Result<WriteOutcome, Error> {
        let started = Instant::now();
        let settings = self.settings(&req.reel).await?;
        let token = match (&req.idempotency_key, &req.request_id) {
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
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let mut tx = LikeTx {
            user: req.user.clone(),
            reel: req.reel.clone(),
            action: req.action,
            shard: token.shard(settings.write_shards),
            token: token.clone(),
            now_ms,
        };
        let mut used_tokens = vec![token.clone()];
        let mut attempt = 0u32;
        let mut retries = 0u32;
        let mut last_retry = RetryReason::Conflict;
        let (path, changed) = loop {
            attempt += 1;
            if attempt > 1 {
                let delay = self.backoff.delay(attempt - 1);
                let in_budget = started.elapsed() + delay + self.call_timeout <= self.budget;
                if !self.backoff.allows(attempt - 1) || !in_budget {
                    tracing::warn!(reel = %req.reel, action = req.action.as_str(), attempts = attempt - 1, reason = ?last_retry, in_budget, "transaction retries exhausted");
                    return Err(match last_retry {
                        RetryReason::Throttled => Error::Throttled,
                        RetryReason::Conflict | RetryReason::InProgress => Error::Contended,
                    });
                }
                retries += 1;
                tokio::time::sleep(delay).await;
            }
            match self.store.write_like(&tx).await? {
                TxResult::Committed { replayed: false } => break (WritePath::Applied, true),
                TxResult::Committed { replayed: true } => break (WritePath::Replayed, true),
                TxResult::AlreadyInState => break (WritePath::AlreadyInState, false),
                TxResult::Retry(reason) => last_retry = reason,
                TxResult::ParameterMismatch => {
                    // The token is bound to a different request body: an
                    // earlier attempt of this request (before a resize moved
                    // its shard, or with another liked_at). Never count
                    // again on a guess; the like row says what happened.
                    let row = self.store.like_row(&req.user, &req.reel).await?;
                    match (req.action, row) {
                        (Action::Like, Some(row)) => {
                            let ours = row
                                .token
                                .as_deref()
                                .is_some_and(|t| used_tokens.iter().any(|u| u.as_str() == t));
                            break (WritePath::ResolvedByRow, ours);
                        }
                        // The row is gone: the earlier attempt of this very
                        // request removed it (a mismatch means DynamoDB
                        // remembers that token as committed).
                        (Action::Unlike, None) => break (WritePath::ResolvedByRow, true),
                        _ => {
                            // Not in the requested state: apply it afresh,
                            // under a new token derived from this one, still
                            // guarded by the like row's condition.
                            let next = token.follow_up(attempt);
                            tx.shard = next.shard(settings.write_shards);
                            tx.token = next.clone();
                            used_tokens.push(next);
                            last_retry = RetryReason::Conflict;
                        }
                    }
                }
            }
        };
        let committed_at = Instant::now();
        let current = self.count(&req.reel).await?;
        // A sum read after our commit already includes it.
        let own = if changed && current.read_at < committed_at {
            req.action.delta()
        } else {
            0
        };
        let count = (current.count + own).max(0);
        tracing::info!(
            reel = %req.reel,
            action = req.action.as_str(),
            shard = tx.shard,
            retries,
            outcome = path.as_str(),
            changed,
            "write"
        );
        Ok(WriteOutcome {
            liked: req.action == Action::Like,
            changed,
            count,
            path,
            retries,
            shard: tx.shard,
        })
    }

    /// Readiness: both tables reachable.
    pub async fn ready(&self) -> Result<(), Error> {
        self.store.ping().await
    }
}

#[cfg(test)]
mod tests {
    //! The retry policy of [`LikeService::write`], driven by a store that
    //! answers from a script: the faults no emulator produces (conflicts,
    //! throttling cancellations) and what the service makes of them. The
    //! DynamoDB behaviour itself is tested against dynoxide in `tests/`.
    use super::*;
    use crate::store::{LikeRow, Settings};
    use std::sync::Mutex;

    struct Scripted {
        answers: Mutex<Vec<TxResult>>,
        calls: Mutex<u32>,
    }

    impl CounterStore for Scripted {
        async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
            Ok(reels
                .iter()
                .map(|r| (r.clone(), Settings::default()))
                .collect())
        }
        async fn sum_shards(&self, reels: &[(ReelId, u32)]) -> Result<HashMap<ReelId, i64>, Error> {
            Ok(reels.iter().map(|(r, _)| (r.clone(), 41)).collect())
        }
        async fn write_like(&self, _tx: &LikeTx) -> Result<TxResult, Error> {
            *self.calls.lock().unwrap() += 1;
            let mut a = self.answers.lock().unwrap();
            Ok(if a.len() > 1 { a.remove(0) } else { a[0] })
        }
        async fn like_row(&self, _u: &UserId, _r: &ReelId) -> Result<Option<LikeRow>, Error> {
            Ok(None)
        }
        async fn ping(&self) -> Result<(), Error> {
            Ok(())
        }
    }

    fn service(answers: Vec<TxResult>, extra: &[(&str, &str)]) -> LikeService<Scripted> {
        let mut vars = vec![
            ("COUNTERS_TABLE", "c"),
            ("LIKES_TABLE", "l"),
            ("RETRY_BASE_MS", "1"),
            ("RETRY_MAX_MS", "2"),
        ];
        vars.extend_from_slice(extra);
        let config = Config::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        LikeService::new(
            Scripted {
                answers: Mutex::new(answers),
                calls: Mutex::new(0),
            },
            &config,
        )
    }

    fn like() -> WriteRequest {
        WriteRequest {
            user: UserId::parse("u").unwrap(),
            reel: ReelId::parse("r").unwrap(),
            action: Action::Like,
            idempotency_key: None,
            request_id: Some("req".into()),
        }
    }

    #[tokio::test]
    async fn conflicts_are_retried_then_succeed_with_the_retries_counted() {
        let conflict = TxResult::Retry(RetryReason::Conflict);
        let svc = service(
            vec![conflict, conflict, TxResult::Committed { replayed: false }],
            &[],
        );
        let out = svc.write(like()).await.unwrap();
        // The sum (41) was read after the commit, so it already includes it.
        assert_eq!(
            (out.path, out.retries, out.changed, out.count),
            (WritePath::Applied, 2, true, 41)
        );
        assert_eq!(*svc.store().calls.lock().unwrap(), 3);
    }

    #[tokio::test]
    async fn a_sum_cached_before_the_write_is_adjusted_by_it() {
        let svc = service(vec![TxResult::Committed { replayed: false }], &[]);
        svc.count(&ReelId::parse("r").unwrap()).await.unwrap();
        let out = svc.write(like()).await.unwrap();
        assert_eq!((out.changed, out.count), (true, 42));
        let svc = service(vec![TxResult::AlreadyInState], &[]);
        svc.count(&ReelId::parse("r").unwrap()).await.unwrap();
        let out = svc.write(like()).await.unwrap();
        assert_eq!((out.changed, out.count), (false, 41));
    }

    #[tokio::test]
    async fn retries_are_bounded_and_end_in_429_errors() {
        let svc = service(
            vec![TxResult::Retry(RetryReason::Conflict)],
            &[("TX_MAX_ATTEMPTS", "4")],
        );
        assert_eq!(svc.write(like()).await.unwrap_err(), Error::Contended);
        assert_eq!(*svc.store().calls.lock().unwrap(), 4);

        let svc = service(
            vec![TxResult::Retry(RetryReason::Throttled)],
            &[("TX_MAX_ATTEMPTS", "3")],
        );
        let err = svc.write(like()).await.unwrap_err();
        assert_eq!((err.status(), err.retry_after_secs()), (429, Some(1)));
        assert_eq!(*svc.store().calls.lock().unwrap(), 3);
    }

    #[tokio::test]
    async fn no_attempt_starts_that_could_not_finish_within_the_budget() {
        // One call may take the whole budget: no retry can fit after the first.
        let svc = service(
            vec![TxResult::Retry(RetryReason::Conflict)],
            &[
                ("TX_MAX_ATTEMPTS", "50"),
                ("REQUEST_BUDGET_MS", "100"),
                ("DDB_OPERATION_TIMEOUT_MS", "100"),
                ("RETRY_BASE_MS", "30"),
                ("RETRY_MAX_MS", "30"),
            ],
        );
        assert_eq!(svc.write(like()).await.unwrap_err(), Error::Contended);
        assert_eq!(*svc.store().calls.lock().unwrap(), 1);
    }
}
