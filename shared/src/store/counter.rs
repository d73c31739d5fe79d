//! [`CounterStore`]: what the like and read paths need from storage (a
//! reel's settings, the sum of its shards, the like transaction and the
//! records of `Idempotency-Key` requests), with the types it reads and
//! writes.
//!
//! The other three traits build on this one, so the types they share with it
//! live here, with their first user: [`Settings`] and [`ShardSum`] (a
//! reconciliation [`ReelView`](super::ReelView) holds both), [`ShardValue`]
//! and [`CountItem`] (what [`CounterStore::count_items`] reads, and what a
//! resize folds and reconciliation clears as stray), and [`RetryReason`]
//! (why any trait's transaction was cancelled, the like's [`TxResult`]
//! first).

use crate::error::Error;
use crate::keys::{self, Action, ReelId, UserId};
use crate::token::RequestToken;
use std::collections::HashMap;
use std::future::Future;

/// Where a reel's resize stands (the settings item's `phase`). See
/// [`crate::reshard`] for the protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// No resize in progress: `read_shards == write_shards`.
    #[default]
    Stable,
    /// Growing to `target`: readers already sum `target` shards; writers
    /// move up once every cached copy of the old settings has expired.
    Growing,
    /// Shrinking to `target`: writers already use `target` shards; once the
    /// old settings have expired everywhere, shards `target..fold_from` are
    /// folded into the reel's base item. Readers read the base item and the
    /// folded shards atomically.
    Draining,
    /// Folded: readers sum `target` shards; the shard items
    /// `target..fold_from` are checked empty (a late like folded too) and
    /// kept as closed tombstones (see [`crate::reshard`]).
    Cleanup,
}

impl Phase {
    /// The settings item's `phase` attribute, also shown by the admin
    /// routes and the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Stable => "stable",
            Phase::Growing => "growing",
            Phase::Draining => "draining",
            Phase::Cleanup => "cleanup",
        }
    }

    /// Inverse of [`Phase::as_str`]; `None` for a value no version wrote.
    pub fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "stable" => Phase::Stable,
            "growing" => Phase::Growing,
            "draining" => Phase::Draining,
            "cleanup" => Phase::Cleanup,
            _ => return None,
        })
    }
}

/// The scheduled run's last reading of a reel's total shard writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSample {
    /// Sum of the shards' `w` (writes ever applied).
    pub writes: i64,
    /// Unix milliseconds of the reading.
    pub at_ms: i64,
}

/// A reel's settings item: its shard counts and the state of a resize. A
/// missing item means one shard, stable, version 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Shards new likes and unlikes go to: `0..write_shards`.
    pub write_shards: u32,
    /// Shards readers sum: `0..read_shards`.
    pub read_shards: u32,
    /// Where the resize stands; `stable` when none is in progress.
    pub phase: Phase,
    /// The shard count the resize in progress moves to (when stable: the
    /// current count).
    pub target: u32,
    /// While shrinking: the shard count before the shrink, so shards
    /// `target..fold_from` are the ones to fold and delete.
    pub fold_from: u32,
    /// Unix milliseconds when the current phase began.
    pub phase_at_ms: i64,
    /// Bumped by every write of the item; every write is conditioned on it,
    /// so two concurrent writers cannot both act on one state.
    pub version: u64,
    /// The scheduled run's last reading of the reel's writes, from which the
    /// next run computes its rate (`None`: not sampled yet).
    pub sample: Option<WriteSample>,
    /// Since when (Unix ms) the scheduled run has seen the reel below the
    /// cool-down rate.
    pub cool_since_ms: Option<i64>,
    /// Whether the reel has a base item ([`crate::keys::base_key`]) that
    /// readers add: set by its first shrink, kept ever after.
    pub has_base: bool,
}

/// The items a reader sums for one reel, by how they must be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadItems {
    /// Read with (consistent) `BatchGetItem`: items that only single like
    /// transactions change.
    pub batch: Vec<String>,
    /// Read as one snapshot, base item first: the base item and the shards
    /// folds may be moving into it right now (the DynamoDB store reads the
    /// base item's fold counter around them, not a transaction, which
    /// writers still liking those shards would cancel).
    pub atomic: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            write_shards: 1,
            read_shards: 1,
            phase: Phase::Stable,
            target: 1,
            fold_from: 1,
            phase_at_ms: 0,
            version: 0,
            sample: None,
            cool_since_ms: None,
            has_base: false,
        }
    }
}

impl Settings {
    /// How many shards a reader sums. The resize protocol keeps
    /// `read_shards >= write_shards`; summing the larger of the two keeps a
    /// reader exact even if a settings item was edited by hand against it.
    pub fn shards_to_sum(&self) -> u32 {
        self.read_shards.max(self.write_shards)
    }

    /// The items whose `n` sum to the reel's count: shards
    /// `0..shards_to_sum()` and, once it exists, the base item. While
    /// draining, folds move counts from shards `write_shards..` into the
    /// base item, so those and the base item are read in one transaction
    /// (never half a fold); no like writes any of them by then, so that read
    /// does not contend with live likes.
    pub fn read_items(&self, reel: &ReelId) -> ReadItems {
        let shards = self.shards_to_sum().clamp(1, keys::MAX_SHARDS);
        let draining = self.phase == Phase::Draining && shards > self.write_shards;
        let mut out = ReadItems::default();
        for s in 0..shards {
            let key = keys::shard_key(reel, s);
            if draining && s >= self.write_shards {
                out.atomic.push(key);
            } else {
                out.batch.push(key);
            }
        }
        if self.has_base || draining {
            let key = keys::base_key(reel);
            if draining {
                out.atomic.insert(0, key);
            } else {
                out.batch.push(key);
            }
        }
        out
    }

    /// Whether readers add `item` to the reel's count under these settings
    /// (the items of [`Settings::read_items`]).
    pub fn sums(&self, item: CountItem) -> bool {
        match item {
            CountItem::Shard(s) => s < self.shards_to_sum().clamp(1, keys::MAX_SHARDS),
            CountItem::Base => {
                self.has_base
                    || (self.phase == Phase::Draining && self.shards_to_sum() > self.write_shards)
            }
        }
    }

    /// Whether the reel belongs in the resize index (the scheduled run and
    /// the hot-reel listing visit exactly these).
    pub fn indexed(&self) -> bool {
        self.phase != Phase::Stable || self.shards_to_sum() > 1
    }
}

/// The count of a reel summed over its shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardSum {
    /// Likes minus unlikes: the like count.
    pub n: i64,
    /// Likes plus unlikes ever applied: grows with every write, so its rate
    /// of change is the reel's write rate.
    pub w: i64,
    /// The latest `updated_at` of the items summed: the clock (Unix ms) of
    /// the request behind the last like or unlike (0: none recorded).
    pub last_write_ms: i64,
    /// The net changes of the last hour, day and week the items hold
    /// ([`crate::keys::window`]), at the read's clock.
    pub windows: crate::keys::window::WindowCounts,
    /// That clock (Unix ms).
    pub windows_at_ms: i64,
    /// Stream mode: the writer items' own-change tails, summed
    /// ([`crate::keys::tail`]); none in transactional mode.
    pub tail: crate::keys::tail::RecentTail,
}

impl From<super::WarmLikes> for ShardSum {
    fn from(l: super::WarmLikes) -> Self {
        ShardSum {
            n: l.n,
            w: l.w,
            last_write_ms: l.last_write_ms,
            windows: l.windows,
            windows_at_ms: l.windows_at_ms,
            tail: l.tail,
        }
    }
}

impl From<ShardSum> for super::WarmLikes {
    fn from(s: ShardSum) -> Self {
        super::WarmLikes {
            n: s.n,
            w: s.w,
            last_write_ms: s.last_write_ms,
            windows: s.windows,
            windows_at_ms: s.windows_at_ms,
            tail: s.tail,
        }
    }
}

/// One shard item's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardValue {
    /// The shard's part of the count (likes minus unlikes).
    pub n: i64,
    /// Likes plus unlikes ever applied to the shard.
    pub w: i64,
}

/// An item of a reel that holds part of its count: a shard, or the base
/// item that shrinking folds into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CountItem {
    /// Shard item number `0..MAX_SHARDS` ([`crate::keys::shard_key`]).
    Shard(u32),
    /// The base item ([`crate::keys::base_key`]).
    Base,
}

impl CountItem {
    /// The item's key (`pk`) in the counters table.
    pub fn key(self, reel: &ReelId) -> String {
        match self {
            CountItem::Shard(s) => keys::shard_key(reel, s),
            CountItem::Base => keys::base_key(reel),
        }
    }
}

/// One like or unlike, as one `TransactWriteItems`.
#[derive(Clone, Debug)]
pub struct LikeTx {
    /// The like row's user.
    pub user: UserId,
    /// The like row's reel, whose shard takes the delta.
    pub reel: ReelId,
    /// Like (put the row, +1) or unlike (delete it, −1).
    pub action: Action,
    /// The `ClientRequestToken`: the same for every retry of the request.
    pub token: RequestToken,
    /// The write shard, derived from `token` so a retry picks it again.
    /// `None` in stream mode: the transaction writes the row alone (and
    /// the key's record), and the aggregator adds it to a shard.
    pub shard: Option<u32>,
    /// Milliseconds since the Unix epoch, stored as `liked_at`. Fixed when the
    /// request is built, so that every retry of it is byte-identical.
    pub now_ms: i64,
    /// For a request with an `Idempotency-Key`: the record written in the
    /// same transaction, under the request's first token.
    pub record: Option<KeyRecordSpec>,
}

/// Where and until when a key's record is kept.
#[derive(Clone, Debug)]
pub struct KeyRecordSpec {
    /// The token derived from the `Idempotency-Key`: names the record.
    pub key_token: RequestToken,
    /// Unix seconds; DynamoDB's TTL deletes the record some time after.
    pub expires_at: i64,
}

/// What a request with an `Idempotency-Key` did, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    /// The action the keyed request asked for.
    pub action: Action,
    /// Whether it changed the like state.
    pub changed: bool,
}

/// How one transaction attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxResult {
    /// Committed now (`replayed == false`: the answer reports write units,
    /// which DynamoDB documents for the call that makes the changes), or an
    /// earlier attempt with the same token had committed and DynamoDB
    /// replayed its success (`replayed == true`: it reports read units only,
    /// as documented for a repeat of a token).
    Committed {
        /// Whether DynamoDB replayed an earlier attempt's success.
        replayed: bool,
    },
    /// Committed, but the answer reported neither read nor write units, so
    /// whether now or by an earlier attempt with the same token cannot be
    /// told apart.
    CommittedUnsure,
    /// The like row's condition failed: the user had already (un)liked.
    AlreadyInState,
    /// The `Idempotency-Key` record exists: an earlier request with this
    /// key already took effect (or was answered); nothing was written now.
    KeyUsed,
    /// Cancelled for a reason worth retrying after a pause.
    Retry(RetryReason),
    /// The token was used before with different parameters.
    ParameterMismatch,
}

/// Why a transaction was cancelled in a way worth retrying; the service
/// counts conflicts and throttles apart (metrics, contention growth).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryReason {
    /// `TransactionConflict`: another transaction held one of the items.
    Conflict,
    /// A throttling cancellation reason, or a throttling error that the
    /// SDK's own retries did not get past.
    Throttled,
    /// `TransactionInProgressException`: the same token is still running.
    InProgress,
    /// A like transaction's `TransactionConflict` on the caller's own items
    /// only (its like row, its key record), never on the reel's shard: the
    /// caller racing itself, no sign of a crowd on the reel.
    OwnConflict,
    /// A like transaction's throttling on the caller's own items only (the
    /// Likes table's partition of that user), never on the reel's shard.
    OwnThrottled,
}

/// A stored like row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LikeRow {
    /// When the like was written (Unix ms, the request's clock), if stored.
    pub liked_at_ms: Option<i64>,
    /// The token of the transaction that wrote the row.
    pub token: Option<String>,
}

/// Storage for sharded counters and like rows.
pub trait CounterStore: Send + Sync + 'static {
    /// The settings of each reel (missing items give the default).
    fn settings(
        &self,
        reels: &[ReelId],
    ) -> impl Future<Output = Result<HashMap<ReelId, Settings>, Error>> + Send;

    /// The sum of the items [`Settings::read_items`] names for each reel
    /// (missing items count 0), read consistently.
    fn sum_shards(
        &self,
        reels: &[(ReelId, Settings)],
    ) -> impl Future<Output = Result<HashMap<ReelId, ShardSum>, Error>> + Send;

    /// Writes `next` as the reel's settings item, with version
    /// `expected.version + 1`, if its version is still `expected.version`
    /// (0: no item). `Ok(false)`: someone else wrote it first.
    fn put_settings(
        &self,
        reel: &ReelId,
        expected: u64,
        next: &Settings,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// One attempt of a like/unlike transaction.
    fn write_like(&self, tx: &LikeTx) -> impl Future<Output = Result<TxResult, Error>> + Send;

    /// Up to `limit` reels `user` likes now, each with its row's
    /// `liked_at` (read consistently: a Query of the user's partition of
    /// the Likes table).
    fn user_likes(
        &self,
        user: &UserId,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<(ReelId, Option<i64>)>, Error>> + Send;

    /// The like row of (user, reel), read consistently.
    fn like_row(
        &self,
        user: &UserId,
        reel: &ReelId,
    ) -> impl Future<Output = Result<Option<LikeRow>, Error>> + Send;

    /// The record of a request made with an `Idempotency-Key`, read
    /// consistently.
    fn key_record(
        &self,
        key_token: &RequestToken,
    ) -> impl Future<Output = Result<Option<KeyRecord>, Error>> + Send;

    /// Records a keyed request that changed nothing, unless a record exists.
    /// Returns the record now in place.
    fn record_unchanged(
        &self,
        spec: &KeyRecordSpec,
        action: Action,
    ) -> impl Future<Output = Result<KeyRecord, Error>> + Send;

    /// What each of `items` of `reel` holds, read consistently (missing
    /// items are left out): a resize reads the items it is about to add to
    /// the read range, which must be empty.
    fn count_items(
        &self,
        reel: &ReelId,
        items: &[CountItem],
    ) -> impl Future<Output = Result<Vec<(CountItem, ShardValue)>, Error>> + Send;

    /// Adds `units` to `caller`'s read units of UTC minute `minute` (the
    /// item every instance adds to; it expires at `expires_at`, Unix s),
    /// and answers the minute's total.
    fn add_caller_reads(
        &self,
        caller: &str,
        minute: i64,
        units: u64,
        expires_at: i64,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Succeeds when both tables can be reached.
    fn ping(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Puts a like function instance's trending sketches (transactional
    /// mode, [`crate::trending::instance`]). Nothing by default: a store
    /// without trending.
    fn put_sketches(
        &self,
        flush: &crate::trending::Flush,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = (flush, now_ms);
        async { Ok(()) }
    }

    /// The cache warmer's set (`trending#warm`): which reels have warm
    /// figures ([`crate::store::WarmStore`]). None by default: a store
    /// without a warmer.
    fn warm_set(
        &self,
    ) -> impl Future<Output = Result<Option<crate::store::WarmSet>, Error>> + Send {
        async { Ok(None) }
    }

    /// The warm figures of those of `reels` that have them (eventually
    /// consistent: each says when it was summed).
    fn warm_figures(
        &self,
        reels: &[ReelId],
    ) -> impl Future<Output = Result<HashMap<ReelId, crate::store::WarmFigures>, Error>> + Send
    {
        let _ = reels;
        async { Ok(HashMap::new()) }
    }
}
