//! [`KnownStore`]: the known-reels set's items (`crate::keys::known`): its
//! meta item, its segments, the registrations, and the backfill's scan.

use crate::error::Error;
use std::future::Future;

/// The set's meta item: how far the segments hold the registrations, and
/// whether the set is complete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownMeta {
    /// The segments hold every registration made before this (Unix ms;
    /// registration times are their writers' clocks).
    pub to_ms: i64,
    /// When the backfill was (last) started (Unix ms): it scans a while
    /// after, once no writer without registrations can still be running.
    pub first_ms: i64,
    /// When the fold last ran (Unix ms): a gap means a backfill again.
    pub seen_ms: i64,
    /// The backfill is done: every reel counted before registrations began
    /// is in the segments.
    pub complete: bool,
    /// A segment reached its bound: the set is no longer complete, for good.
    pub full: bool,
    /// Where the backfill's scan goes on, while it is not done.
    pub cursor: Option<ScanCursor>,
    /// Counts the meta item's writes: each is conditioned on the last.
    pub version: u64,
}

/// Which table the backfill scans, and the last key it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanCursor {
    /// The table scanned now.
    pub table: KnownScan,
    /// The last evaluated key: the partition key and, in the views table,
    /// the sort key. `None`: the table's scan has not started.
    pub last: Option<(String, Option<String>)>,
}

/// The tables whose items name reels with counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownScan {
    /// Shard, base, settings and ledger items.
    Counters,
    /// Views, and stream mode's writer items of likes.
    Views,
}

impl KnownScan {
    /// The name stored in the meta item.
    pub fn as_str(self) -> &'static str {
        match self {
            KnownScan::Counters => "counters",
            KnownScan::Views => "views",
        }
    }

    /// Inverse of [`KnownScan::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "counters" => Some(KnownScan::Counters),
            "views" => Some(KnownScan::Views),
            _ => None,
        }
    }
}

/// One segment as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownSegment {
    /// Its number (`0..SEGMENTS`).
    pub index: usize,
    /// Its fingerprints, sorted, without repeats.
    pub fps: Vec<u32>,
    /// Counts its writes: each is conditioned on the last (0: not stored).
    pub version: u64,
}

/// A page of the backfill's scan: the reels its items name (repeats
/// possible), and where the scan goes on (`None`: that table is done).
#[derive(Clone, Debug, Default)]
pub struct KnownScanPage {
    /// The reels the page's items name.
    pub reels: Vec<String>,
    /// The page's last key, where the next page starts.
    pub next: Option<(String, Option<String>)>,
}

/// Storage of the known-reels set.
pub trait KnownStore: Send + Sync {
    /// The meta item, read strongly consistent; `None` before the first
    /// fold.
    fn known_meta(&self) -> impl Future<Output = Result<Option<KnownMeta>, Error>> + Send;

    /// Every stored segment, read strongly consistent (one unit per 4 KB).
    fn known_segments(&self) -> impl Future<Output = Result<Vec<KnownSegment>, Error>> + Send;

    /// The registrations put in `minute` (Unix ms / 60,000) at or after
    /// `from_ms`, read strongly consistent: (time, reel).
    fn registrations(
        &self,
        minute: i64,
        from_ms: i64,
    ) -> impl Future<Output = Result<Vec<(i64, String)>, Error>> + Send;

    /// Puts one registration per reel, stamped `at_ms`.
    fn register(
        &self,
        at_ms: i64,
        reels: &[String],
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Writes `segment` if its stored version is still `segment.version`
    /// (then stored as one more); false when another fold wrote it since.
    fn put_segment(
        &self,
        segment: &KnownSegment,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Writes `meta` if its stored version is still `meta.version` (0:
    /// none stored); false when another fold wrote it since.
    fn put_meta(&self, meta: &KnownMeta) -> impl Future<Output = Result<bool, Error>> + Send;

    /// One page of the backfill's scan of `table` (keys only), after
    /// `last`.
    fn scan_known(
        &self,
        table: KnownScan,
        last: Option<&(String, Option<String>)>,
    ) -> impl Future<Output = Result<KnownScanPage, Error>> + Send;
}
