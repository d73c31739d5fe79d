//! What the domain needs from storage, as traits; [`dynamodb`] implements
//! them with the AWS SDK. No SDK type crosses this boundary: errors arrive as
//! [`crate::Error`], items as the plain types re-exported here.
//!
//! # Layout
//!
//! A file per trait, with the types that trait reads and writes, mirroring
//! the trait impls in [`dynamodb`]:
//!
//! * `counter`: [`CounterStore`], what the like and read paths need
//!   (settings, shard sums, the like transaction, `Idempotency-Key`
//!   records), and the types the other traits share with it ([`Settings`],
//!   [`ShardSum`], [`ShardValue`], [`CountItem`], [`RetryReason`]).
//! * `resize`: [`ResizeStore`], built on [`CounterStore`]: single shards,
//!   folds, emptied and stray items, the resize index.
//! * `reconcile`: [`ReconcileStore`], built on [`ResizeStore`]: scans,
//!   ledgers and corrections, the run's count items, its state and chunks.
//! * `aggregate`: [`AggregateStore`], built on [`CounterStore`]: stream
//!   mode's checkpoints and chunk transactions.
//! * `views`: [`LogStore`], the views log (Kinesis; `kinesis` implements
//!   it), and [`ViewStore`], the views table (checkpoints, seen event ids,
//!   view items, seals and folds).
//! * `warm`: [`WarmStore`], the cache warmer's items (its figures, its
//!   set, the lists it ranked).
//! * `known`: [`KnownStore`], the known-reels set's items (its meta item,
//!   segments and registrations) and the backfill's scan.
//! * [`dynamodb`] (the `dynamodb` feature, on by default): `DynamoStore`,
//!   the one implementation of the four counter traits, a file per trait
//!   impl, and `DynamoViews`, of [`ViewStore`]; [`kinesis`]: `KinesisLog`,
//!   of [`LogStore`].
//!
//! The trait files are private and everything in them is re-exported
//! here, so every item's path is `crate::store::X` whichever file holds it.

#[cfg(feature = "dynamodb")]
pub mod dynamodb;
#[cfg(feature = "dynamodb")]
pub mod kinesis;

mod aggregate;
mod counter;
mod known;
mod reconcile;
mod resize;
mod views;
mod warm;

pub use aggregate::{
    AggregateStore, Checkpoint, ChunkAdd, ChunkResult, ChunkWrite, RecentAdd, TailMaps,
};
pub use counter::{
    CountItem, CounterStore, KeyRecord, KeyRecordSpec, LikeRow, LikeTx, Phase, ReadItems,
    RetryReason, Settings, ShardSum, ShardValue, TxResult, WriteSample,
};
pub use known::{KnownMeta, KnownScan, KnownScanPage, KnownSegment, KnownStore, ScanCursor};
pub use reconcile::{
    CorrectResult, Ledger, RecentBucket, ReconcileStore, ReelView, RunCount, ScanPage, ScanTable,
    StoredRun,
};
pub use resize::{FoldResult, ResizeStore};
pub use views::{
    HourSketches, LogPut, LogPutResult, LogRead, LogStore, NextRecords, ReadFrom, SeenItem,
    ViewChunkWrite, ViewFold, ViewFoldFamily, ViewFoldItem, ViewFoldResult, ViewItem,
    ViewItemWrite, ViewStore,
};
pub use warm::{SetCache, StoredList, WarmFigures, WarmLikes, WarmSet, WarmStore, WarmViews};
