//! What the domain needs from storage, as a trait; [`dynamo`] implements it
//! with the AWS SDK. No SDK type crosses this boundary: errors arrive as
//! [`crate::Error`], items as the plain types below.

pub mod dynamo;

use crate::error::Error;
use crate::keys::{Action, ReelId, UserId};
use crate::token::RequestToken;
use std::collections::HashMap;
use std::future::Future;

/// A reel's shard counts (the settings item). A missing item means 1 and 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Shards new likes and unlikes go to: `0..write_shards`.
    pub write_shards: u32,
    /// Shards readers sum: `0..read_shards`.
    pub read_shards: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            write_shards: 1,
            read_shards: 1,
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
}

/// One like or unlike, as one `TransactWriteItems`.
#[derive(Clone, Debug)]
pub struct LikeTx {
    pub user: UserId,
    pub reel: ReelId,
    pub action: Action,
    pub token: RequestToken,
    pub shard: u32,
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
    pub key_token: RequestToken,
    /// Unix seconds; DynamoDB's TTL deletes the record some time after.
    pub expires_at: i64,
}

/// What a request with an `Idempotency-Key` did, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub action: Action,
    /// Whether it changed the like state.
    pub changed: bool,
}

/// How one transaction attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxResult {
    /// Committed now (`replayed == false`), or an earlier attempt with the
    /// same token had committed and DynamoDB replayed its success
    /// (`replayed == true`, recognised by the read capacity it reports).
    Committed { replayed: bool },
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryReason {
    /// `TransactionConflict`: another transaction held one of the items.
    Conflict,
    /// A throttling cancellation reason, or a throttling error that the
    /// SDK's own retries did not get past.
    Throttled,
    /// `TransactionInProgressException`: the same token is still running.
    InProgress,
}

/// A stored like row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LikeRow {
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

    /// The sum of shards `0..shards` of each reel (missing shards count 0).
    fn sum_shards(
        &self,
        reels: &[(ReelId, u32)],
    ) -> impl Future<Output = Result<HashMap<ReelId, i64>, Error>> + Send;

    /// One attempt of a like/unlike transaction.
    fn write_like(&self, tx: &LikeTx) -> impl Future<Output = Result<TxResult, Error>> + Send;

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

    /// Succeeds when both tables can be reached.
    fn ping(&self) -> impl Future<Output = Result<(), Error>> + Send;
}
