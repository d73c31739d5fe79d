//! What the domain needs from storage, as a trait; [`dynamodb`] implements it
//! with the AWS SDK. No SDK type crosses this boundary: errors arrive as
//! [`crate::Error`], items as the plain types below.

#[cfg(feature = "dynamodb")]
pub mod dynamodb;

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
    /// Folded: readers sum `target` shards; the emptied shard items
    /// `target..fold_from` are deleted.
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
}

/// One shard item's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardValue {
    /// The shard's part of the count (likes minus unlikes).
    pub n: i64,
    /// Likes plus unlikes ever applied to the shard.
    pub w: i64,
}

/// How one fold attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldResult {
    /// The shard's counts moved to the base item (or it was already empty).
    Folded,
    /// The shard no longer holds the value read (a late write): read again.
    ShardChanged,
    /// The settings item moved on (another run advanced the resize).
    SettingsChanged,
    /// Cancelled for a conflict or throttling: pause and try again.
    Retry(RetryReason),
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

    /// Succeeds when both tables can be reached.
    fn ping(&self) -> impl Future<Output = Result<(), Error>> + Send;
}

/// What resizing needs beyond [`CounterStore`]: single shards, folds,
/// deletes, and the index of reels that are not at one stable shard.
pub trait ResizeStore: CounterStore {
    /// One shard item, read consistently (`None`: no item).
    fn shard(
        &self,
        reel: &ReelId,
        shard: u32,
    ) -> impl Future<Output = Result<Option<ShardValue>, Error>> + Send;

    /// One `TransactWriteItems`: adds `seen` to the reel's base item and
    /// subtracts it from `shard`, conditioned on `shard` still holding
    /// exactly `seen` and on the settings item still being at
    /// `settings_version`. `attempt` tells apart the tokens of successive
    /// attempts that happen to see the same value.
    fn fold(
        &self,
        reel: &ReelId,
        shard: u32,
        seen: ShardValue,
        settings_version: u64,
        attempt: u32,
    ) -> impl Future<Output = Result<FoldResult, Error>> + Send;

    /// Deletes the shard item if it holds zero (or is gone). `Ok(false)`: it
    /// holds something (a late write) and must be folded first.
    fn delete_empty_shard(
        &self,
        reel: &ReelId,
        shard: u32,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// One transaction: deletes `item` of `reel` if it still holds exactly
    /// `seen` and the settings item is still at `settings_version` (0: no
    /// settings item). For items outside the reel's read range: no reader
    /// counts them, so removing them changes no count.
    fn clear_stray(
        &self,
        reel: &ReelId,
        item: CountItem,
        seen: ShardValue,
        settings_version: u64,
    ) -> impl Future<Output = Result<FoldResult, Error>> + Send;

    /// Every reel whose settings are [`Settings::indexed`], from the sparse
    /// index (eventually consistent: read each reel's settings after).
    fn indexed_reels(&self) -> impl Future<Output = Result<Vec<ReelId>, Error>> + Send;
}

/// Which table a reconciliation scan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanTable {
    /// The like rows: one reel id per row.
    Likes,
    /// The counters table: the reel of every shard, base, settings and
    /// ledger item.
    Counters,
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
    /// Rows (items) the page held.
    pub items: u64,
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
    /// Stream mode: a drift seen and not yet corrected, waiting to be seen
    /// again unchanged (see `ReconcileConfig::stream_settle`).
    pub settling: Option<Settling>,
}

/// A reel's state when a drift was seen in stream mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settling {
    /// The like rows counted.
    pub rows: u64,
    /// The sum of its shards' `n`.
    pub n: i64,
    /// The sum of its shards' `w` (every aggregation write moves it).
    pub w: i64,
    /// When it was seen (Unix ms).
    pub at_ms: i64,
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
    /// One page of segment `segment` of `total`, from `start`.
    fn scan_page(
        &self,
        table: ScanTable,
        segment: u32,
        total: u32,
        start: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = Result<ScanPage, Error>> + Send;

    /// The ledger, then the settings and shard sum, all read consistently.
    fn reel_view(&self, reel: &ReelId) -> impl Future<Output = Result<ReelView, Error>> + Send;

    /// One transaction: `ADD n :drift` on shard 0 and the ledger's next
    /// entry, if the ledger still counts `expected` corrections.
    fn correct(
        &self,
        reel: &ReelId,
        drift: i64,
        expected: u64,
        run_id: &str,
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

    /// Records that a drift of `reel` was seen as `settling` (stream mode),
    /// for a later run to compare with.
    fn note_settling(
        &self,
        reel: &ReelId,
        settling: &Settling,
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

/// One chunk of a stream shard's records, as one transaction (stream mode,
/// see [`crate::aggregate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkWrite {
    /// The stream shard's checkpoint item.
    pub checkpoint_key: String,
    /// The stream shard's id, kept on the checkpoint for operators.
    pub shard_id: String,
    /// The checkpoint read (zero-padded sequence number), `None`: none yet.
    pub expected: Option<String>,
    /// The checkpoint once applied: the chunk's last record, zero-padded.
    pub next: String,
    /// The deltas, one per reel whose count the chunk changes.
    pub adds: Vec<ChunkAdd>,
    /// Records in the chunk.
    pub records: u64,
    /// The transaction's `ClientRequestToken`.
    pub token: RequestToken,
    /// The aggregator's clock (the shards' `updated_at`).
    pub now_ms: i64,
    /// When the checkpoint may expire (Unix seconds, TTL).
    pub expires_at: i64,
}

/// A reel's net change in a [`ChunkWrite`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkAdd {
    /// The reel.
    pub reel: ReelId,
    /// The shard it is added to (below the settings' `write_shards`).
    pub shard: u32,
    /// The net change of its count.
    pub delta: i64,
    /// The settings version it was planned with (0: no settings item).
    pub settings_version: u64,
}

/// What became of a [`ChunkWrite`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkResult {
    /// Committed (or replayed): the checkpoint is now its last record.
    Applied,
    /// The checkpoint was not what was read (another invocation applied
    /// records meanwhile): nothing written.
    CheckpointMoved,
    /// A reel's settings changed since they were read: plan again.
    SettingsChanged,
    /// Worth another attempt after backoff.
    Retry(RetryReason),
}

/// What the stream aggregator needs beyond [`CounterStore`].
pub trait AggregateStore: CounterStore {
    /// The checkpoint of the stream shard behind `key`: the last sequence
    /// number applied, zero-padded (`None`: nothing applied yet).
    fn checkpoint(&self, key: &str) -> impl Future<Output = Result<Option<String>, Error>> + Send;

    /// Applies `write` in one transaction (see [`ChunkWrite`]).
    fn apply_chunk(
        &self,
        write: &ChunkWrite,
    ) -> impl Future<Output = Result<ChunkResult, Error>> + Send;
}
