//! What views need from storage ([`crate::views`]): the log the view
//! function appends to ([`ViewLog`], Kinesis), and the items the views
//! aggregator writes and readers sum ([`ViewStore`], DynamoDB).

use super::ChunkResult;
use crate::error::Error;
use crate::token::RequestToken;
use std::future::Future;

/// One record for the log: its partition key (the viewer: a viewer's
/// batches stay in order on one shard) and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogPut {
    /// The partition key.
    pub partition_key: String,
    /// The record's data.
    pub data: Vec<u8>,
}

/// What the log did with one record of a put, in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogPutResult {
    /// Durably in the log.
    Stored,
    /// Refused (the shard's throughput, an internal failure): not in the
    /// log, worth another attempt.
    Failed {
        /// The error code the log gave.
        code: String,
    },
}

/// The views log: an append-only stream of records.
pub trait LogStore: Send + Sync {
    /// Appends `records` in one call. `Ok` says what became of each (in
    /// order); `Err` means the call's outcome is unknown or nothing was
    /// stored ([`Error::Unavailable`], [`Error::Throttled`]): a retry must
    /// expect that some records may already be in the log.
    fn put(
        &self,
        records: &[LogPut],
    ) -> impl Future<Output = Result<Vec<LogPutResult>, Error>> + Send;

    /// The shards `shard_id` of the stream `stream_arn` was split or
    /// merged from (empty for an original shard), as the log lists them.
    fn parents(
        &self,
        stream_arn: &str,
        shard_id: &str,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// The shards split or merged from `shard_id` of the stream
    /// `stream_arn` (empty while it is open), as the log lists them now.
    fn children(
        &self,
        stream_arn: &str,
        shard_id: &str,
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// The records of shard `shard_id` from sequence number `from` to `to`
    /// (both inclusive, decimal digits) that the log still holds, in shard
    /// order: what Lambda gave up on, read back to be applied. Empty once
    /// they are past the stream's retention.
    fn read_range(
        &self,
        stream_arn: &str,
        shard_id: &str,
        from: &str,
        to: &str,
    ) -> impl Future<Output = Result<Vec<LogRead>, Error>> + Send;

    /// Up to `n` records of shard `shard_id` from `from`, in shard order,
    /// read until `n` are found, the shard ends (closed, read to its end),
    /// or every record not read yet arrived after `after_ms` (Unix ms), in
    /// a few calls at most.
    fn next_records(
        &self,
        stream_arn: &str,
        shard_id: &str,
        from: ReadFrom<'_>,
        n: usize,
        after_ms: i64,
    ) -> impl Future<Output = Result<NextRecords, Error>> + Send;
}

/// What [`LogStore::next_records`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NextRecords {
    /// The records, in shard order.
    pub records: Vec<LogRead>,
    /// Fewer than asked for: the shard ended (closed) after them.
    pub ended: bool,
    /// Fewer than asked for: every record after them arrived after
    /// `after_ms` (or none is written yet). Neither this nor `ended`: the
    /// calls ran out, and what follows is unknown.
    pub rest_after: bool,
}

/// Where [`LogStore::next_records`] starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom<'a> {
    /// The shard's oldest record still kept.
    Oldest,
    /// The record with this sequence number.
    At(&'a str),
    /// The record after the one with this sequence number.
    After(&'a str),
}

/// A record as [`LogStore::read_range`] reads it back.
#[derive(Clone, Debug, PartialEq)]
pub struct LogRead {
    /// Its sequence number (decimal digits).
    pub sequence: String,
    /// When the log accepted it (Unix ms).
    pub arrival_ms: i64,
    /// Its data.
    pub data: Vec<u8>,
}

/// A view item's update in a [`ViewChunkWrite`]: views added, and the
/// writer's unique-viewer sketch replaced by its union with the chunk's
/// viewers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewItemWrite {
    /// Its partition key ([`crate::keys::views_reel_key`]).
    pub pk: String,
    /// Its sort key ([`crate::keys::views_all_sort`] or
    /// [`crate::keys::views_day_sort`]).
    pub sk: String,
    /// Views added.
    pub views: u64,
    /// The sketch after the chunk (serialized HLL).
    pub sketch: Vec<u8>,
    /// A day item's day (`YYYY-MM-DD`), kept for a future index of days.
    pub day: Option<String>,
    /// A day item's expiry (Unix seconds, TTL).
    pub expires_at: Option<i64>,
    /// What the chunk adds to a day item's windowed-count buckets of the
    /// last hour and day (attribute, views; see [`crate::keys::window`]);
    /// its 7-day window is the day items' views.
    pub windows: Vec<(String, i64)>,
}

/// One chunk of a Kinesis shard's records, as one transaction: the
/// checkpoint moved from the value read to the chunk's last record, the
/// chunk's event ids recorded, the view items updated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewChunkWrite {
    /// The shard's checkpoint item ([`crate::keys::views_checkpoint_key`]).
    pub checkpoint_key: String,
    /// The shard's id, kept on the checkpoint for operators.
    pub shard_id: String,
    /// The checkpoint read (padded), `None`: none yet.
    pub expected: Option<String>,
    /// The checkpoint once applied (padded); the store refuses a move that
    /// is not forwards.
    pub next: String,
    /// When the checkpoint item may expire (Unix seconds, TTL), set anew
    /// by every chunk: long past any delivery of the shard's records again
    /// (see `crate::views::aggregate::CHECKPOINT_TTL`).
    pub checkpoint_expires_at: i64,
    /// The seen item: partition ([`crate::keys::views_seen_key`]) and sort
    /// key ([`crate::keys::views_seen_sort`]).
    pub seen_key: String,
    /// See `seen_key`.
    pub seen_sort: String,
    /// The event ids the chunk applied (duplicates left out).
    pub seen_ids: Vec<u64>,
    /// What each viewer's parts counted (see [`SeenItem::usage`]).
    pub seen_usage: Vec<u8>,
    /// When the seen item may expire (Unix seconds, TTL).
    pub seen_expires_at: i64,
    /// The view items it updates.
    pub items: Vec<ViewItemWrite>,
    /// The Kinesis shard's trending sketch after the chunk, and whether
    /// the chunk writes it ([`crate::trending::live`]).
    pub sketch: Option<crate::trending::SketchWrite>,
    /// The windowed-count buckets each day item it updates drops
    /// ([`crate::keys::window::pruned_attrs`]).
    pub window_prune: Vec<String>,
    /// Records in the chunk (applied or recognised as duplicates).
    pub records: u64,
    /// The aggregator's clock.
    pub now_ms: i64,
    /// The transaction's `ClientRequestToken`, derived from every other
    /// field.
    pub token: RequestToken,
}

/// A stored view item, as a reader or the aggregator reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewItem {
    /// Its sort key.
    pub sk: String,
    /// Its views.
    pub views: u64,
    /// Its sketch (serialized HLL; empty if none yet).
    pub sketch: Vec<u8>,
    /// Its windowed-count buckets (a day item's; see
    /// [`ViewItemWrite::windows`]).
    pub windows: Vec<(String, i64)>,
}

/// One round of [`ViewStore::view_items`]: the items found (partition key,
/// item), and the keys `(pk, sk)` not read.
pub type ViewItemsRound = (Vec<(String, ViewItem)>, Vec<(String, String)>);

/// A seen item, as read: its sort key and its event ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenItem {
    /// Its sort key ([`crate::keys::views_seen_sort`]).
    pub sort: String,
    /// The event ids applied by its chunk.
    pub ids: Vec<u64>,
    /// What each viewer's parts in its chunk counted, packed as the
    /// aggregator packs it (`views::bound::Usage`); empty in items written
    /// before it was kept.
    pub usage: Vec<u8>,
}

/// A reel's view item as compaction reads it ([`ViewStore::fold_items`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewFoldItem {
    /// Its sort key (a writer's, or the base's).
    pub sk: String,
    /// Its views.
    pub views: u64,
    /// Its sketch (serialized HLL; empty if none).
    pub sketch: Vec<u8>,
    /// Its expiry (a day item's TTL), if any.
    pub expires_at: Option<i64>,
    /// A base item's fold version (`fv`: folds that landed on it); 0 for
    /// the others.
    pub version: u64,
    /// Its windowed-count buckets (attribute, views).
    pub windows: Vec<(String, i64)>,
}

/// One base item's part of a [`ViewFold`]: the base updated, the folded
/// writers' items deleted, in one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewFoldFamily {
    /// The base item's sort key (`all#base`, `d#{day}#base`).
    pub base_sk: String,
    /// The base's fold version as read; `None`: no base item yet. The
    /// update is conditioned on it, so two folds never both land.
    pub base_version: Option<u64>,
    /// Views added to the base: the folded items' sum.
    pub views: u64,
    /// The base's sketch after the fold: the union of its own and the
    /// folded items'.
    pub sketch: Vec<u8>,
    /// A day base's day (`YYYY-MM-DD`).
    pub day: Option<String>,
    /// A day base's expiry (TTL): the latest of its own and the folded
    /// items'.
    pub expires_at: Option<i64>,
    /// The folded items: sort key and views as read. Each delete is
    /// conditioned on those views, which every write of a writer raises.
    pub folded: Vec<(String, u64)>,
    /// The folded items' windowed-count buckets still kept, summed: added
    /// to the base's.
    pub windows: Vec<(String, i64)>,
}

/// One fold of a reel's sealed writers' items: one `TransactWriteItems`
/// of at most [`crate::keys::MAX_TRANSACT_ITEMS`] actions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewFold {
    /// The reel's partition ([`crate::keys::views_reel_key`]).
    pub pk: String,
    /// The bases it updates, each with the items folded into it.
    pub families: Vec<ViewFoldFamily>,
    /// The folder's clock (`updated_at`).
    pub now_ms: i64,
    /// The transaction's `ClientRequestToken`, derived from every other
    /// field: a retry of a lost answer lands once.
    pub token: RequestToken,
}

/// What became of a [`ViewFold`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewFoldResult {
    /// It landed, whole.
    Folded,
    /// A condition failed (another fold landed first, a writer wrote
    /// again): nothing written; read again.
    Changed,
    /// Throttled or in conflict: nothing written; worth another try later.
    Retry,
}

/// An hour's trending sketches as stored, one per writer (serialized).
pub type HourSketches = Vec<Vec<u8>>;

/// The views table.
pub trait ViewStore: Send + Sync {
    /// The cache warmer's set (see [`super::CounterStore::warm_set`]).
    fn warm_set(
        &self,
    ) -> impl Future<Output = Result<Option<crate::store::WarmSet>, Error>> + Send {
        async { Ok(None) }
    }

    /// A reel's warm figures, if it has them (see
    /// [`super::CounterStore::warm_figures`]).
    fn warm_figures(
        &self,
        reel: &crate::keys::ReelId,
    ) -> impl Future<Output = Result<Option<crate::store::WarmFigures>, Error>> + Send {
        let _ = reel;
        async { Ok(None) }
    }

    /// The checkpoint of the Kinesis shard behind `key`: its padded
    /// sequence number (`None` if nothing was applied yet) and the hour of
    /// its trending sketch.
    fn view_checkpoint(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<super::Checkpoint, Error>> + Send;

    /// The trending sketch of `hour` that the Kinesis shard behind
    /// checkpoint `key` stored last (`None`: none, or a store that keeps
    /// none).
    fn stored_sketch(
        &self,
        key: &str,
        hour: i64,
    ) -> impl Future<Output = Result<Option<crate::trending::HourSketch>, Error>> + Send {
        let _ = (key, hour);
        async { Ok(None) }
    }

    /// The seen items of partition `key` whose sort keys are above `after`
    /// (strictly), read consistently, in sort-key order.
    fn seen_after(
        &self,
        key: &str,
        after: &str,
    ) -> impl Future<Output = Result<Vec<SeenItem>, Error>> + Send;

    /// The seen items of partition `key` whose sort keys are from `from`
    /// to `to` (both inclusive), read consistently, in sort-key order.
    fn seen_between(
        &self,
        key: &str,
        from: &str,
        to: &str,
    ) -> impl Future<Output = Result<Vec<SeenItem>, Error>> + Send;

    /// Takes the lease `key` for `holder` until `until_ms` (Unix ms), if it
    /// is free: never taken, given back, expired by `now_ms`, or already
    /// `holder`'s. `Ok(false)`: another holder has it.
    fn take_lease(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Gives the lease `key` back, if `holder` still has it.
    fn release_lease(
        &self,
        key: &str,
        holder: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// One round of reading the view items `(pk, sk)`, consistently: those
    /// that exist among the keys read (with their partition keys), and the
    /// keys not read this round (`UnprocessedKeys`, or a part of them
    /// refused as throttled), to be asked for again after a pause. The caller paces the rounds: it
    /// knows its deadline (`crate::views::aggregate`). `Err` for anything
    /// else, or [`Error::Throttled`] when no key was read at all.
    fn view_items(
        &self,
        keys: &[(String, String)],
    ) -> impl Future<Output = Result<ViewItemsRound, Error>> + Send;

    /// Applies `write` in one transaction.
    fn apply_views(
        &self,
        write: &ViewChunkWrite,
    ) -> impl Future<Output = Result<ChunkResult, Error>> + Send;

    /// A reel's view items in partition `pk`: the all-time ones, and the
    /// day items with sort keys in `days` (inclusive), eventually
    /// consistent (a reader's sum is cached for seconds anyway).
    fn reel_views(
        &self,
        pk: &str,
        days: (&str, &str),
    ) -> impl Future<Output = Result<(Vec<ViewItem>, Vec<ViewItem>), Error>> + Send;

    /// A reel's view items in partition `pk` for compaction, read
    /// consistently: the all-time ones, and the day items with sort keys
    /// in `days` (inclusive). A store that keeps no seals (a test's
    /// wrapper) finds none, so nothing is folded.
    fn fold_items(
        &self,
        pk: &str,
        days: (&str, &str),
    ) -> impl Future<Output = Result<Vec<ViewFoldItem>, Error>> + Send {
        let _ = (pk, days);
        std::future::ready(Ok(Vec::new()))
    }

    /// Which of `writers` are sealed ([`crate::keys::views_seal_key`]).
    /// A seal it could not read (throttled) counts as none.
    fn sealed(
        &self,
        writers: &[String],
    ) -> impl Future<Output = Result<Vec<String>, Error>> + Send {
        let _ = writers;
        std::future::ready(Ok(Vec::new()))
    }

    /// Records that `writer` will never write again (once; writing it
    /// again changes nothing).
    fn seal(&self, writer: &str, now_ms: i64) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = (writer, now_ms);
        std::future::ready(Ok(()))
    }

    /// The trending sketches of `metric`'s writers in `hour`
    /// ([`crate::trending`]), as each writer stored it last.
    fn hour_sketches(
        &self,
        metric: &str,
        hour: i64,
    ) -> impl Future<Output = Result<HourSketches, Error>> + Send {
        let _ = (metric, hour);
        std::future::ready(Ok(Vec::new()))
    }

    /// Applies `fold` in one transaction, or nothing of it.
    fn fold_views(
        &self,
        fold: &ViewFold,
    ) -> impl Future<Output = Result<ViewFoldResult, Error>> + Send {
        let _ = fold;
        std::future::ready(Ok(ViewFoldResult::Changed))
    }
}
