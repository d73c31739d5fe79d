//! [`AggregateStore`]: what stream mode's aggregator ([`crate::aggregate`])
//! needs beyond [`CounterStore`]: a stream shard's checkpoint, and the one
//! transaction that applies a chunk of its records to the stream shard's
//! own writer items.

use super::{CounterStore, RetryReason};
use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::tail::TailWindow;
use crate::token::RequestToken;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;

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
    /// Never at or below `expected`: the store refuses such a write.
    pub next: String,
    /// The deltas, one per reel whose count the chunk changes.
    pub adds: Vec<ChunkAdd>,
    /// Records in the chunk.
    pub records: u64,
    /// The transaction's `ClientRequestToken`: derived from every other
    /// field, so that it never names two bodies.
    pub token: RequestToken,
    /// The aggregator's clock (the writer items' `updated_at`).
    pub now_ms: i64,
    /// When the checkpoint may expire (Unix seconds, TTL).
    pub expires_at: i64,
    /// The recent-change buckets' width (ms), part of their names.
    pub width_ms: i64,
    /// Starts (Unix ms) of the recent-change buckets each writer item
    /// written drops: older than any kept (see
    /// [`crate::config::RecentWindow`]).
    pub prune: Vec<i64>,
    /// The windowed-count buckets each writer item written drops
    /// ([`crate::keys::window::pruned_attrs`]).
    pub window_prune: Vec<String>,
    /// The own-change tails' bucket width (ms), part of their attribute's
    /// name ([`crate::keys::tail`]).
    pub tail_width_ms: i64,
    /// How long the own-change tails keep a bucket (ms), part of their
    /// attribute's name too.
    pub tail_keep_ms: i64,
    /// The stream shard's trending sketch after the chunk, and whether the
    /// chunk writes it ([`crate::trending::live`]); `None`: untouched.
    pub sketch: Option<crate::trending::SketchWrite>,
}

/// Writer items' own-change tails by (reel, part): bucket start, net
/// change ([`crate::keys::tail`]).
pub type TailMaps = HashMap<(ReelId, u32), BTreeMap<i64, i64>>;

/// A stream shard's checkpoint item, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The last sequence number applied, zero-padded (`None`: nothing
    /// applied yet).
    pub seq: Option<String>,
    /// The hour of the writer's trending sketch as last stored
    /// ([`crate::trending`]): [`AggregateStore::stored_sketch`] reads it.
    pub sketch_hour: Option<i64>,
}

/// A reel's net change in a [`ChunkWrite`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkAdd {
    /// The reel: its writer item of this stream shard takes the change.
    pub reel: ReelId,
    /// The part of the reel's writer items the stream shard writes to
    /// (0 unless the reel is spread: see [`crate::keys::likes_writer_part`]).
    pub part: u32,
    /// The net change of its count (may be 0: see `recent`).
    pub delta: i64,
    /// What its records add to the item's recent-change buckets (see
    /// [`crate::keys::recent_delta_attr`]), by bucket, the empty ones left
    /// out.
    pub recent: Vec<RecentAdd>,
    /// What its records add to the item's windowed-count buckets
    /// (attribute, net change; see [`crate::keys::window`]), the empty
    /// ones left out.
    pub windows: Vec<(String, i64)>,
    /// The writer item's own-change tail after the chunk, whole (bucket
    /// start, net change; [`crate::keys::tail`]); `None`: left as it is.
    pub tail: Option<BTreeMap<i64, i64>>,
}

/// A reel's changes in one recent-change bucket of a [`ChunkAdd`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RecentAdd {
    /// The bucket's start (Unix ms).
    pub start_ms: i64,
    /// The net change of its records.
    pub delta: i64,
    /// How many of them were removals.
    pub removals: i64,
}

/// What became of a [`ChunkWrite`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkResult {
    /// Committed (or replayed): the checkpoint is now its last record.
    Applied,
    /// The checkpoint was not what was read (another invocation applied
    /// records meanwhile), or `next` was not above it: nothing written.
    CheckpointMoved,
    /// Cancelled because another transaction held one of its items in
    /// flight (DynamoDB's `TransactionConflict`): another invocation of the
    /// same stream shard, or a fold of the stream shard's quiet items
    /// (never another stream shard: none writes these items). Worth
    /// another attempt after backoff.
    Conflict,
    /// Worth another attempt after backoff (throttling, the token's first
    /// attempt still in flight).
    Retry(RetryReason),
}

/// What the stream aggregator needs beyond [`CounterStore`].
pub trait AggregateStore: CounterStore {
    /// The checkpoint of the stream shard behind `key`.
    fn checkpoint(&self, key: &str) -> impl Future<Output = Result<Checkpoint, Error>> + Send;

    /// The trending sketch of `hour` that the writer of checkpoint `key`
    /// stored last (`None`: none, or a store that keeps none).
    fn stored_sketch(
        &self,
        key: &str,
        hour: i64,
    ) -> impl Future<Output = Result<Option<crate::trending::HourSketch>, Error>> + Send {
        let _ = (key, hour);
        async { Ok(None) }
    }

    /// How many parts each of `reels` is written to now (absent: one):
    /// the spread registry as this instance last read it. Never an error:
    /// a stale answer only leaves a writer busier.
    fn writer_parts(&self, reels: &[&ReelId]) -> impl Future<Output = HashMap<ReelId, u32>> + Send;

    /// The own-change tails ([`crate::keys::tail`]) of checkpoint `key`'s
    /// writer items of `items` (reel, part), read consistently (absent:
    /// none): what a chunk builds on when this instance does not know
    /// them. A store without writer items has none.
    fn writer_tails(
        &self,
        key: &str,
        items: &[(ReelId, u32)],
        window: &TailWindow,
    ) -> impl Future<Output = Result<TailMaps, Error>> + Send {
        let _ = (key, items, window);
        async { Ok(HashMap::new()) }
    }

    /// Applies `write` in one transaction (see [`ChunkWrite`]).
    fn apply_chunk(
        &self,
        write: &ChunkWrite,
    ) -> impl Future<Output = Result<ChunkResult, Error>> + Send;
}
