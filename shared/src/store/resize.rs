//! [`ResizeStore`]: what resizing needs beyond [`CounterStore`]: single
//! shards, the fold of a shard into the base item that retires it, the
//! reopening of retired shards, the emptying of stray items, and the index
//! of reels not at one stable shard. The protocol that drives it is
//! [`crate::reshard`].

use std::ops::Range;

use super::{CountItem, CounterStore, RetryReason, ShardValue};
use crate::error::Error;
use crate::keys::ReelId;
use std::future::Future;

/// How one fold attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldResult {
    /// The shard's counts moved to the base item (none if it was empty)
    /// and the shard is closed; for a stray item: it was emptied.
    Folded,
    /// The shard no longer holds the value read (a late write): read again.
    ShardChanged,
    /// The settings item moved on (another run advanced the resize).
    SettingsChanged,
    /// Cancelled for a conflict or throttling: pause and try again.
    Retry(RetryReason),
}

/// What resizing needs beyond [`CounterStore`]: single shards, folds,
/// reopening, strays, and the index of reels that are not at one stable
/// shard.
pub trait ResizeStore: CounterStore {
    /// One shard item, read consistently (`None`: no item).
    fn shard(
        &self,
        reel: &ReelId,
        shard: u32,
    ) -> impl Future<Output = Result<Option<ShardValue>, Error>> + Send;

    /// One `TransactWriteItems`: adds `seen` to the reel's base item,
    /// subtracts it from `shard` and marks the shard closed
    /// ([`crate::keys::SHARD_CLOSED`]), conditioned on `shard` still holding
    /// exactly `seen` and on the settings item still being at
    /// `settings_version`. With `seen` zero the base item is left alone and
    /// the shard only closed (its tombstone made if it has no item).
    /// `attempt` tells apart the tokens of successive attempts that happen
    /// to see the same value.
    fn fold(
        &self,
        reel: &ReelId,
        shard: u32,
        seen: ShardValue,
        settings_version: u64,
        attempt: u32,
    ) -> impl Future<Output = Result<FoldResult, Error>> + Send;

    /// Reopens the closed shards among `shards` (removes the mark), each in
    /// one transaction conditioned on the settings item still being at
    /// `settings_version`. `Ok(false)`: the settings moved on.
    fn reopen(
        &self,
        reel: &ReelId,
        shards: Range<u32>,
        settings_version: u64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// One transaction: empties `item` of `reel` (subtracts `seen`) if it
    /// still holds exactly `seen` and the settings item is still at
    /// `settings_version` (0: no settings item). For items outside the
    /// reel's read range: no reader counts them, so emptying them changes no
    /// count. The item is kept, not deleted: a closed shard's tombstone
    /// must stay closed.
    fn clear_stray(
        &self,
        reel: &ReelId,
        item: CountItem,
        seen: ShardValue,
        settings_version: u64,
    ) -> impl Future<Output = Result<FoldResult, Error>> + Send;

    /// Every reel whose settings are
    /// [`Settings::indexed`](super::Settings::indexed), from the sparse
    /// index (eventually consistent: read each reel's settings after).
    fn indexed_reels(&self) -> impl Future<Output = Result<Vec<ReelId>, Error>> + Send;
}
