//! [`ReconcileStore`]: what the scheduled recount ([`crate::reconcile`])
//! needs beyond [`ResizeStore`]: parallel scans of both tables, a reel's
//! view and correction ledger, the correction itself, the run's count items
//! and claims, and the run state with its checkpoint chunks.

use super::{CountItem, ResizeStore, RetryReason, Settings, ShardSum, ShardValue};
use crate::error::Error;
use crate::keys::RecentAttr;
use crate::keys::ReelId;
use std::collections::HashMap;
use std::future::Future;

/// Which table a reconciliation scan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanTable {
    /// The like rows: one reel id per row.
    Likes,
    /// The counters table: the reel of every shard, base, settings and
    /// ledger item. In stream mode the odd segments of an even total scan
    /// the writer items' table instead (segment i of the total's half):
    /// the reel of every writer item, so that a reel counted only there
    /// (all its rows gone) is met too.
    Counters,
}

/// A run's count item as a counters scan found it: the rows the likes scan
/// counted for one reel (summed over segments), or the marker of a reel
/// without rows that the check phase claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunCount {
    /// The reconciliation run that wrote the item.
    pub run_id: String,
    /// The reel counted.
    pub reel: ReelId,
    /// Like rows counted for the reel, all segments summed (0 for a marker).
    pub rows: u64,
    /// A claim marker ([`ReconcileStore::claim_rowless`]), not counted rows.
    pub claimed: bool,
}

/// One page of a parallel scan.
#[derive(Clone, Debug, Default)]
pub struct ScanPage {
    /// Likes: the reel of each row (repeated per row). Counters: the reels
    /// the page's shard, base, settings and ledger items belong to
    /// (repeats possible).
    pub reels: Vec<ReelId>,
    /// Counters: the runs' count items on the page.
    pub run_counts: Vec<RunCount>,
    /// Counters: the page's non-empty base items and shard items other
    /// than shard 0, with what they hold: the ones a reel's read range may
    /// not cover ([`ResizeStore::clear_stray`]).
    pub count_items: Vec<(ReelId, CountItem, ShardValue)>,
    /// Counters: the page's items with windowed-count buckets past every
    /// window (left by an item no write has pruned since), by key.
    pub stale_windows: Vec<(String, Vec<String>)>,
    /// Rows (items) the page held.
    pub items: u64,
    /// Likes, stream mode: rows left out of `reels` as liked at or after
    /// the run's cut (see [`crate::reconcile`]).
    pub young: u64,
    /// Where the next page starts, serialised (`None`: segment done).
    pub next: Option<String>,
    /// Read units the page consumed.
    pub read_units: f64,
}

/// A reel's correction ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Corrections applied to the reel, ever.
    pub corrections: u64,
    /// The run that applied the last one, and its drift.
    pub last_run: Option<String>,
    /// The drift that run corrected (added to shard 0; 0: none yet).
    pub last_drift: i64,
}

/// What reconciliation reads of one reel after its scan: the ledger first,
/// then the settings and the sum they name.
#[derive(Clone, Debug)]
pub struct ReelView {
    /// The reel's correction ledger (default: never corrected).
    pub ledger: Ledger,
    /// Its settings, read after the ledger.
    pub settings: Settings,
    /// The sum of the items those settings name.
    pub sum: ShardSum,
    /// Stable reels: the recent-change buckets of those items (see
    /// [`crate::keys::recent_delta_attr`]).
    pub recent: Vec<RecentBucket>,
}

/// One recent-change bucket attribute of one of a reel's items, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecentBucket {
    /// The item's key.
    pub item: String,
    /// The attribute's name.
    pub name: String,
    /// What the name says.
    pub attr: RecentAttr,
    /// Its value.
    pub value: i64,
}

/// How one correction attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorrectResult {
    /// The drift was added and the ledger advanced.
    Applied,
    /// The ledger moved on: another run corrected the reel meanwhile.
    LedgerChanged,
    /// Cancelled for a conflict or throttling: pause and try again.
    Retry(RetryReason),
}

/// The reconciliation run state as stored: its JSON document and the
/// version every write of it is conditioned on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRun {
    /// The run state document (JSON).
    pub state: String,
    /// Its version (0: never versioned).
    pub version: u64,
}

/// What reconciliation needs beyond [`ResizeStore`] (it repairs items
/// outside a reel's read range the way a resize would).
pub trait ReconcileStore: ResizeStore {
    /// One page of segment `segment` of `total`, from `start`. Likes: with
    /// `rows_before_ms`, a row liked at or after it is left out of the
    /// page's reels (and counted in `young`).
    fn scan_page(
        &self,
        table: ScanTable,
        segment: u32,
        total: u32,
        start: Option<&str>,
        limit: u32,
        rows_before_ms: Option<i64>,
    ) -> impl Future<Output = Result<ScanPage, Error>> + Send;

    /// The ledger, then the settings and shard sum, all read consistently.
    fn reel_view(&self, reel: &ReelId) -> impl Future<Output = Result<ReelView, Error>> + Send;

    /// One transaction: `ADD n :drift` on shard 0 and the ledger's next
    /// entry (stamped `at_ms`), if the ledger still counts `expected`
    /// corrections. Its token comes from the arguments: a retry must pass
    /// the same `at_ms`, or it is another body under the same token.
    fn correct(
        &self,
        reel: &ReelId,
        drift: i64,
        expected: u64,
        run_id: &str,
        at_ms: i64,
    ) -> impl Future<Output = Result<CorrectResult, Error>> + Send;

    /// Adds `rows` to segment `segment`'s count in the run's count item of
    /// `reel`, as that segment's checkpoint `seq`: applied only if the item
    /// holds no checkpoint of the segment at or after `seq`, so applying a
    /// committed checkpoint again (after a crash) changes nothing.
    fn add_run_count(
        &self,
        run_id: &str,
        reel: &ReelId,
        segment: u32,
        seq: u64,
        rows: u64,
        expires_at: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The rows counted for each of `reels` by the run (from their count
    /// items; a reel without one is absent), read consistently.
    fn run_counts(
        &self,
        run_id: &str,
        reels: &[ReelId],
    ) -> impl Future<Output = Result<HashMap<ReelId, RunCount>, Error>> + Send;

    /// Writes the run's claim marker for a reel without counted rows, as
    /// `claimer` (unique per call), unless the reel has a count item or a
    /// marker. `Ok(true)`: this caller checks it (also when its own write
    /// had landed and only the answer was lost).
    fn claim_rowless(
        &self,
        run_id: &str,
        reel: &ReelId,
        claimer: &str,
        expires_at: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Removes the attributes `names` (recent-change or windowed-count
    /// buckets no writer writes any more) from the existing item `key`.
    fn drop_attributes(
        &self,
        key: &str,
        names: &[String],
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The stored run state, if there is one.
    fn load_run(&self) -> impl Future<Output = Result<Option<StoredRun>, Error>> + Send;

    /// Writes the run state with version `expected + 1` if it is still at
    /// `expected`. `Ok(false)`: another invocation wrote it first.
    fn save_run(
        &self,
        state: &str,
        expected: u64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Stores one checkpoint chunk (expires after `expires_at`, Unix s).
    fn put_chunk(
        &self,
        key: &str,
        data: &[u8],
        expires_at: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// One checkpoint chunk as [`ReconcileStore::put_chunk`] stored it
    /// (`None`: never stored, or deleted by its TTL).
    fn get_chunk(&self, key: &str) -> impl Future<Output = Result<Option<Vec<u8>>, Error>> + Send;
}
