//! The one test store of the service's tests: a single counter whose sum
//! reads and like transactions answer as each test configures them (from
//! a script, after set delays, or held at a gate the test opens), for the
//! faults and races no emulator produces. The DynamoDB behaviour itself is
//! tested against dynoxide in `tests/`.

use super::{LikeService, WriteRequest};
use crate::config::Config;
use crate::error::Error;
use crate::keys::{Action, ReelId, UserId};
use crate::store::{
    CountItem, CounterStore, KeyRecord, KeyRecordSpec, LikeRow, LikeTx, Settings, ShardSum,
    ShardValue, TxResult,
};
use crate::token::RequestToken;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// One counter, every reel at default settings. By default a sum read
/// answers the counter at once and every like transaction commits (its
/// delta added to the counter); the options below change that.
pub(super) struct Fake {
    /// What a sum read answers, for every reel it asks for (shared with
    /// a [`Fake::twin`]).
    truth: Arc<AtomicI64>,
    /// The `last_write_ms` a sum read answers: when the aggregator last
    /// wrote the shards (stream mode; see [`Fake::apply`]).
    applied_ms: Arc<AtomicI64>,
    /// The like rows committed, by user: their `liked_at`.
    rows: Arc<Mutex<HashMap<String, i64>>>,
    /// Whether a committed transaction adds its delta to `truth`; without,
    /// every read answers the count the fake was made with.
    commits_count: bool,
    /// The answers of the like transactions, in order; the last one
    /// repeats. Empty: every transaction commits (not a replay).
    answers: Mutex<Vec<TxResult>>,
    /// A reel whose sum always fails (a read that stays contended): any
    /// sum read that includes it.
    failing: Option<&'static str>,
    /// A reel whose sum DynamoDB always throttles ([`Error::Throttled`],
    /// the store's retries spent).
    throttled: Option<&'static str>,
    /// A sum read captures the count this long after it is sent.
    sum_delay: Duration,
    /// A transaction commits this long after it is sent, and its answer
    /// arrives `after_commit` later.
    before_commit: Duration,
    after_commit: Duration,
    /// Sum read number `hold` (1-based), once it captured the count, says
    /// so (`held`) and answers only once released (`release`).
    hold: Option<u32>,
    held: Notify,
    release: Notify,
    /// Sum reads sent.
    sums: AtomicU32,
    /// Like transactions sent.
    calls: AtomicU32,
    /// Settings items written (automatic grows).
    puts: Mutex<Vec<Settings>>,
}

impl Fake {
    /// A counter at `truth`, with the default behaviour.
    pub(super) fn new(truth: i64) -> Self {
        Fake {
            truth: Arc::new(AtomicI64::new(truth)),
            applied_ms: Arc::new(AtomicI64::new(0)),
            rows: Arc::new(Mutex::new(HashMap::new())),
            commits_count: true,
            answers: Mutex::new(Vec::new()),
            failing: None,
            throttled: None,
            sum_delay: Duration::ZERO,
            before_commit: Duration::ZERO,
            after_commit: Duration::ZERO,
            hold: None,
            held: Notify::new(),
            release: Notify::new(),
            sums: AtomicU32::new(0),
            calls: AtomicU32::new(0),
            puts: Mutex::new(Vec::new()),
        }
    }

    /// Like transactions answer `answers` in order, the last one repeated;
    /// what they commit leaves the counter as it is.
    pub(super) fn scripted(self, answers: Vec<TxResult>) -> Self {
        Fake {
            answers: Mutex::new(answers),
            commits_count: false,
            ..self
        }
    }

    /// Like transactions answer a commit, a replay where `replayed` says so
    /// (per like, in order; then not); each adds its like to the counter.
    pub(super) fn replays(self, replayed: &[bool]) -> Self {
        let answers = replayed
            .iter()
            .map(|&replayed| TxResult::Committed { replayed })
            .chain(std::iter::once(TxResult::Committed { replayed: false }))
            .collect();
        Fake {
            answers: Mutex::new(answers),
            ..self
        }
    }

    /// Every sum read that includes `reel` fails ([`Error::Contended`]).
    pub(super) fn failing(self, reel: &'static str) -> Self {
        Fake {
            failing: Some(reel),
            ..self
        }
    }

    /// A sum read captures the count `sum` after it is sent; a transaction
    /// commits `commit` after it is sent, and answers `answer` later.
    pub(super) fn timed(self, sum: Duration, commit: Duration, answer: Duration) -> Self {
        Fake {
            sum_delay: sum,
            before_commit: commit,
            after_commit: answer,
            ..self
        }
    }

    /// Sum read number `n` (1-based) is held once it captured the count:
    /// [`Fake::held`] returns then, and it answers at [`Fake::release`].
    pub(super) fn hold(self, n: u32) -> Self {
        Fake {
            hold: Some(n),
            ..self
        }
    }

    /// The counter now.
    pub(super) fn truth(&self) -> i64 {
        self.truth.load(Ordering::SeqCst)
    }

    /// Stream mode: the aggregator applied changes, leaving the shards at
    /// `n`, and wrote them at its clock `at_ms` (Unix ms).
    pub(super) fn apply(&self, n: i64, at_ms: i64) {
        self.truth.store(n, Ordering::SeqCst);
        self.applied_ms.store(at_ms, Ordering::SeqCst);
    }

    /// Another function instance's view of the same tables: the counter
    /// and the like rows shared, everything else its own and as new.
    pub(super) fn twin(&self) -> Self {
        Fake {
            truth: self.truth.clone(),
            applied_ms: self.applied_ms.clone(),
            rows: self.rows.clone(),
            commits_count: self.commits_count,
            answers: Mutex::new(self.answers.lock().unwrap().clone()),
            ..Fake::new(0)
        }
    }

    /// Sum reads sent so far.
    pub(super) fn sums(&self) -> u32 {
        self.sums.load(Ordering::SeqCst)
    }

    /// Like transactions sent so far.
    pub(super) fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Settings items written so far.
    pub(super) fn puts(&self) -> Vec<Settings> {
        self.puts.lock().unwrap().clone()
    }

    /// Waits until the held sum read has captured the count.
    pub(super) async fn held(&self) {
        self.held.notified().await;
    }

    /// Lets the held sum read answer.
    pub(super) fn release(&self) {
        self.release.notify_one();
    }
}

impl CounterStore for Fake {
    async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
        Ok(reels
            .iter()
            .map(|r| (r.clone(), Settings::default()))
            .collect())
    }
    async fn sum_shards(
        &self,
        reels: &[(ReelId, Settings)],
    ) -> Result<HashMap<ReelId, ShardSum>, Error> {
        if let Some(failing) = self.failing
            && reels.iter().any(|(r, _)| r.as_str() == failing)
        {
            return Err(Error::Contended);
        }
        if let Some(throttled) = self.throttled
            && reels.iter().any(|(r, _)| r.as_str() == throttled)
        {
            return Err(Error::Throttled);
        }
        let i = self.sums.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.sum_delay.is_zero() {
            tokio::time::sleep(self.sum_delay).await;
        }
        let n = self.truth.load(Ordering::SeqCst);
        let last_write_ms = self.applied_ms.load(Ordering::SeqCst);
        if self.hold == Some(i) {
            self.held.notify_one();
            self.release.notified().await;
        }
        Ok(reels
            .iter()
            .map(|(r, _)| {
                (
                    r.clone(),
                    ShardSum {
                        n,
                        w: n,
                        last_write_ms,
                        ..ShardSum::default()
                    },
                )
            })
            .collect())
    }
    async fn put_settings(&self, _r: &ReelId, _v: u64, next: &Settings) -> Result<bool, Error> {
        self.puts.lock().unwrap().push(*next);
        Ok(true)
    }
    async fn write_like(&self, tx: &LikeTx) -> Result<TxResult, Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.before_commit.is_zero() {
            tokio::time::sleep(self.before_commit).await;
        }
        let answer = {
            let mut a = self.answers.lock().unwrap();
            match a.len() {
                0 => TxResult::Committed { replayed: false },
                1 => a[0],
                _ => a.remove(0),
            }
        };
        let committed = matches!(
            answer,
            TxResult::Committed { .. } | TxResult::CommittedUnsure
        );
        if committed {
            let mut rows = self.rows.lock().unwrap();
            match tx.action {
                Action::Like => rows.insert(tx.user.as_str().to_owned(), tx.now_ms),
                Action::Unlike => rows.remove(tx.user.as_str()),
            };
        }
        if committed && self.commits_count {
            self.truth.fetch_add(tx.action.delta(), Ordering::SeqCst);
        }
        if !self.after_commit.is_zero() {
            tokio::time::sleep(self.after_commit).await;
        }
        Ok(answer)
    }
    async fn user_likes(
        &self,
        _u: &UserId,
        _limit: u32,
    ) -> Result<Vec<(ReelId, Option<i64>)>, Error> {
        Ok(Vec::new())
    }
    async fn like_row(&self, u: &UserId, _r: &ReelId) -> Result<Option<LikeRow>, Error> {
        let rows = self.rows.lock().unwrap();
        Ok(rows.get(u.as_str()).map(|&at| LikeRow {
            liked_at_ms: Some(at),
            token: None,
        }))
    }
    async fn key_record(&self, _t: &RequestToken) -> Result<Option<KeyRecord>, Error> {
        Ok(None)
    }
    async fn record_unchanged(
        &self,
        _s: &KeyRecordSpec,
        action: Action,
    ) -> Result<KeyRecord, Error> {
        Ok(KeyRecord {
            action,
            changed: false,
        })
    }
    async fn count_items(
        &self,
        _r: &ReelId,
        _i: &[CountItem],
    ) -> Result<Vec<(CountItem, ShardValue)>, Error> {
        // This store holds no items outside a reel's read range.
        Ok(Vec::new())
    }
    async fn add_caller_reads(&self, _c: &str, _m: i64, units: u64, _e: i64) -> Result<u64, Error> {
        Ok(units)
    }

    async fn ping(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// A configuration with both tables named and `vars` set.
pub(super) fn config(vars: &[(&str, &str)]) -> Config {
    Config::from_lookup(|k| match k {
        "COUNTERS_TABLE" | "LIKES_TABLE" => Some("t".into()),
        _ => vars
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string()),
    })
    .unwrap()
}

/// The store of the retry-policy tests: a sum of 41 whatever commits,
/// reel `failing` whose sum always fails, reel `throttled` whose sum is
/// always throttled, transactions answering
/// `answers`, and retries 1–2 ms apart (plus `extra` settings).
pub(super) fn scripted(answers: Vec<TxResult>, extra: &[(&str, &str)]) -> LikeService<Fake> {
    let mut vars = vec![("RETRY_BASE_MS", "1"), ("RETRY_MAX_MS", "2")];
    vars.extend_from_slice(extra);
    LikeService::new(
        Fake {
            throttled: Some("throttled"),
            ..Fake::new(41).scripted(answers).failing("failing")
        },
        &config(&vars),
    )
}

/// A like of reel `r` by `user`, delivered as API request `request_id`.
pub(super) fn like(user: &str, request_id: &str) -> WriteRequest {
    WriteRequest {
        user: UserId::parse(user).unwrap(),
        reel: ReelId::parse("r").unwrap(),
        action: Action::Like,
        idempotency_key: None,
        request_id: Some(request_id.into()),
    }
}

/// An unlike of reel `r` by `user`, delivered as API request `request_id`.
pub(super) fn unlike(user: &str, request_id: &str) -> WriteRequest {
    WriteRequest {
        action: Action::Unlike,
        ..like(user, request_id)
    }
}
