//! Stream-aggregated counting (`COUNTING=stream`): a like writes only its
//! row; this module turns the Likes table's stream into the reels' shard
//! items, exactly once although Lambda delivers records at least once.
//!
//! # Exactly once
//!
//! Each stream shard has a checkpoint item in the counters table
//! ([`crate::keys::aggregate_checkpoint_key`]): the sequence number of the
//! last record applied. A batch is applied in sequence order (see
//! [Order](#order)), in [`chunk::Chunk`]s of consecutive records, each by
//! one `TransactWriteItems` that adds the chunk's per-reel deltas to the
//! reels' shards and moves the checkpoint from the value read to the
//! chunk's last record, conditioned on the checkpoint still holding the
//! value read and lying below the new one. So:
//!
//! * records at or below the checkpoint are skipped: a redelivered batch,
//!   or the part of a batch Lambda sends again after a partial failure,
//!   changes nothing already applied;
//! * a chunk lands whole or not at all, and never twice: two invocations
//!   holding the same records cannot both move the checkpoint from one
//!   value; the `ClientRequestToken` (derived from the whole transaction,
//!   the aggregator's clock stamped in it included: one token never names
//!   two bodies) makes a retry of one plan, the SDK's after a lost answer
//!   or the aggregator's, a replay;
//! * each shard update is also conditioned on the shard not being closed:
//!   a chunk planned before a shrink retired the shard is refused and
//!   planned again with the new settings, so the resize protocol's waits
//!   need no bound on how long an aggregation takes. The transaction
//!   touches no other item (not the reel's settings item, on which every
//!   stream shard's chunks would queue); why the fence suffices is in
//!   [`crate::reshard`].
//!
//! # Order
//!
//! Sequence numbers are compared as numbers ([`records::SequenceNumber`]).
//! Lambda hands a stream shard's records over in that order the first time
//! only: "Records are always processed in order the first time. If records
//! are processed more than once, they might be processed out of order"
//! (Lambda developer guide, tumbling windows for DynamoDB Streams), and
//! this consumer has records handed over again routinely
//! (`batchItemFailures`, function errors; never bisected halves, which
//! could come newer half first: see template.yaml). A checkpoint is a
//! high-water mark: applied in delivery order, a newer record would push
//! the older ones after it at or below the checkpoint, and a checkpoint
//! moved back would let records be applied twice. So a batch is sorted by
//! sequence number and each record kept once before it is cut
//! ([`records::ordered`]): it is applied as it was first delivered, whatever
//! order it came in (such a batch counts in `AggregateBatchesOutOfOrder`);
//! and the checkpoint item refuses a move back whatever was planned.
//!
//! Records of one key are ordered only within a stream shard, and a like
//! row's INSERT and REMOVE may come from different shards after a
//! partition split; the deltas commute, so the sums are exact either way.
//!
//! # Which shard a chunk adds to
//!
//! One derived from the stream shard ([`counter_shard`]), so one stream
//! shard's chunks never conflict with each other; chunks of different
//! stream shards may meet on one item (DynamoDB cancels a transaction that
//! touches an item another one holds in flight). Stream shards outnumber a
//! reel's shards at scale, so several share one; the one cancelled moves
//! on to the next shard for its retry and its later batches (a *turn*, kept
//! on its checkpoint item, so whichever instance takes its next batch
//! knows): stream shards whose batches come at the same moments spread
//! apart. Any shard is as exact as another; only the placement moves.
//!
//! Stream shards that outnumber a reel's shards never all spread apart, so
//! chunks that meet also count towards growing the reel: once
//! `CONTENTION_GROW_EVENTS` distinct stream shards met on one reel's shards
//! within [`crowd::CROWD_WINDOW`], its shards double (up to `MAX_SHARDS`;
//! never with `AUTO_RESHARD=off`). Doubling keeps apart the stream shards
//! that had found a shard of their own (shard numbers that differ modulo
//! W differ modulo 2W). The stream shards met are counted in the reel's
//! crowd record ([`keys::crowd_key`]), which every instance adds to: on
//! Lambda each stream shard's batches run in whichever instance is free,
//! so no instance sees a crowd by itself. Each instance tells it of a
//! (reel, stream shard) once per window, and exactly one note claims a
//! crowd (see `store/dynamodb/crowd.rs`).
//!
//! # Recent changes
//!
//! Each shard update also adds the chunk's changes of the reel to the
//! item's recent-change buckets (by a new row's `liked_at`, a removal's
//! stream timestamp; [`crate::keys::recent_delta_attr`]) and drops the
//! oldest, so reconciliation can take out of `n` what came from rows liked
//! after the moment it counted them at (see [`crate::reconcile`]). That
//! is why a reel whose like and unlike in a chunk cancel out keeps its
//! place: its removal is recorded.
//!
//! # Rooms
//!
//! `records` parses Lambda's event, `chunk` cuts it into transactions; this
//! file applies them.

pub mod chunk;
pub mod core;
pub mod records;

use crate::config::{Config, RecentWindow};
use crate::error::Error;
use crate::keys::{self, ReelId};
use crate::reshard::{self, crowd};
use crate::retry::Backoff;
use crate::store::{AggregateStore, ChunkResult, ChunkWrite, CrowdSighting};
use crate::token::RequestToken;
use records::{SequenceNumber, StreamEvent};
use std::time::{Duration, Instant};

/// How long a checkpoint outlives its last write: stream records are kept
/// 24 hours, so a closed shard's checkpoint is useless a day after its
/// last record; two days leaves room for a replay from the start.
const CHECKPOINT_TTL: Duration = Duration::from_secs(2 * 86_400);

pub use core::BatchOutcome;

/// The stream consumer: applies batches of the Likes table's stream to the
/// reels' shard items.
pub struct Aggregator<S> {
    store: S,
    backoff: Backoff,
    /// See [`Config::stream_since_ms`].
    since_ms: i64,
    /// See [`Config::aggregate_chunk_reels`].
    chunk_reels: usize,
    /// The shard items' recent-change buckets (see [`crate::reconcile`]).
    window: RecentWindow,
    /// Stream shards meeting on a reel's shards (`None` when
    /// `AUTO_RESHARD=off` or `CONTENTION_GROW_EVENTS=0`); see the module
    /// notes.
    crowd: Option<CrowdRule>,
    /// `MAX_SHARDS`.
    max_shards: u32,
}

/// The crowd rule of stream mode: how many distinct stream shards make a
/// crowd, how long a reel stays quiet after one, and what this instance
/// has already noted.
struct CrowdRule {
    needed: u32,
    quiet: Duration,
    sightings: crowd::Sightings,
}

/// `out` with its skipped records counted: those the checkpoint covers that
/// this invocation did not apply itself, and copies of a record.
fn finish(
    mut out: BatchOutcome,
    batch: &records::Batch,
    checkpoint: Option<&SequenceNumber>,
) -> BatchOutcome {
    let covered = batch
        .changes
        .iter()
        .filter(|c| checkpoint.is_some_and(|k| c.seq <= *k))
        .count();
    out.skipped = covered.saturating_sub(out.applied) + batch.duplicates;
    out
}

/// The shard of a reel with `write_shards` shards that the stream shard
/// behind `checkpoint_key` adds to after `turn` moves away from a conflict
/// (see the module notes).
pub fn counter_shard(checkpoint_key: &str, write_shards: u32, turn: u32) -> u32 {
    let home = RequestToken::for_fields("aggregate-shard", &[checkpoint_key]).shard(write_shards);
    ((u64::from(home) + u64::from(turn)) % u64::from(write_shards.max(1))) as u32
}

impl<S: AggregateStore> Aggregator<S> {
    /// An aggregator over `store`, with the retry settings of `config`.
    pub fn new(store: S, config: &Config) -> Self {
        Aggregator {
            store,
            backoff: Backoff::from_config(config),
            // Stream records are stamped rounded down to the second: the
            // boundary is the whole second at or after the one given.
            since_ms: (config.stream_since_ms + 999) / 1000 * 1000,
            chunk_reels: config.aggregate_chunk_reels,
            window: config.reconcile.recent_window(),
            // Quiet for two resize waits after a crowd: what chunks meet
            // while the grow is under way is the old placement's.
            crowd: (config.resize.auto && config.resize.contention_events > 0).then(|| CrowdRule {
                needed: config.resize.contention_events,
                quiet: config.resize_wait() * 2,
                sightings: crowd::Sightings::default(),
            }),
            max_shards: config.resize.max_shards,
        }
    }

    /// The store it writes through.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Applies one batch. `Ok` with `failed_from` set hands the rest of the
    /// batch back to Lambda; `Err` fails the whole invocation (Lambda
    /// retries it, or bisects it).
    pub async fn handle(
        &self,
        event: &StreamEvent,
        deadline: Option<Instant>,
    ) -> Result<BatchOutcome, Error> {
        if event.records.is_empty() {
            return Ok(BatchOutcome::default());
        }
        let Some(shard_id) = event.shard_id.as_deref() else {
            // Without a tumbling window Lambda does not say which shard a
            // batch is from, and there is no checkpoint to keep.
            return Err(Error::internal(
                "stream event without shardId",
                "the event source mapping needs TumblingWindowInSeconds",
            ));
        };
        let arn = event
            .event_source_arn
            .as_deref()
            .or_else(|| event.records[0].event_source_arn.as_deref())
            .unwrap_or("");
        let key = keys::aggregate_checkpoint_key(arn, shard_id);
        let batch = records::ordered(&event.records, self.since_ms);
        if let Some(bad) = &batch.unreadable {
            tracing::error!(index = bad.index, seq = %bad.raw, "stream record without a readable sequence number");
        }
        if batch.out_of_order {
            // Lambda's redelivery; applied in sequence order all the same.
            tracing::warn!(
                shard = shard_id,
                duplicates = batch.duplicates,
                "stream batch delivered out of sequence order"
            );
        }
        let planner = Planning {
            aggregator: self,
            shard_id,
        };
        let (mut out, checkpoint) =
            core::run(&planner, &self.backoff, &key, &batch.changes, deadline).await?;
        out.out_of_order = batch.out_of_order;
        if out.failed_from.is_none()
            && let Some(bad) = &batch.unreadable
        {
            out.failed_from = Some(bad.raw.clone());
        }
        Ok(finish(out, &batch, checkpoint.as_ref()))
    }

    /// Notes that a chunk of the stream shard behind `key` met another
    /// stream shard's transaction on a shard of `reel`, and doubles the
    /// reel's shards when enough stream shards did (see the module notes).
    /// A failure to start the grow is logged and left to the next crowd.
    async fn met_on(&self, reel: &ReelId, key: &str) {
        let Some(rule) = &self.crowd else { return };
        if !rule.sightings.first(reel, crowd::source(key)).await {
            return;
        }
        let now_ms = crate::clock::now_ms();
        let sighting = CrowdSighting {
            now_ms,
            window_ms: crowd::CROWD_WINDOW.as_millis() as i64,
            needed: rule.needed,
            quiet_until_ms: now_ms + rule.quiet.as_millis() as i64,
        };
        // The checkpoint key's hash names the stream shard; 64 bits of it
        // tell a crowd's members apart.
        let hash = key.strip_prefix("agg#").unwrap_or(key);
        let source = hash.get(..16).unwrap_or(hash);
        match self.store.note_crowd(reel, source, &sighting).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(reel = %reel, error = e.code(), "could not note a crowd");
                return;
            }
        }
        let max = self.max_shards;
        let double = |s: &crate::store::Settings| s.write_shards.saturating_mul(2).min(max);
        if let Err(e) =
            reshard::request_grow_to(&self.store, reel, double, "stream_conflicts").await
        {
            tracing::warn!(reel = %reel, error = e.code(), "could not start a grow");
        }
    }

    /// The stream shard's checkpoint; a stored value that is not a sequence
    /// number is a fault of ours, never read as "nothing applied".
    async fn checkpoint(&self, key: &str) -> Result<(Option<SequenceNumber>, u32), Error> {
        let stored = self.store.checkpoint(key).await?;
        let seq = match stored.seq {
            None => None,
            Some(s) => Some(SequenceNumber::parse(&s).ok_or_else(|| {
                Error::internal(
                    "unreadable aggregation checkpoint",
                    format_args!("{key}: {s:?}"),
                )
            })?),
        };
        Ok((seq, stored.turn))
    }

    /// The transaction of `chunk` under the reels' current settings (see
    /// [`chunk::Chunk::write`]).
    async fn plan(
        &self,
        key: &str,
        shard_id: &str,
        checkpoint: Option<&SequenceNumber>,
        chunk: &chunk::Chunk,
        now: Duration,
        turn: u32,
    ) -> Result<ChunkWrite, Error> {
        let reels: Vec<ReelId> = chunk.reels().map(|(r, _)| r.clone()).collect();
        let settings = if reels.is_empty() {
            Default::default()
        } else {
            self.store.settings(&reels).await?
        };
        Ok(chunk.write(key, shard_id, checkpoint, &settings, self.window, now, turn))
    }
}

/// One batch of one stream shard, as the exactly-once core plans it.
struct Planning<'a, S> {
    aggregator: &'a Aggregator<S>,
    shard_id: &'a str,
}

impl core::Sequenced for records::Change {
    fn seq(&self) -> &SequenceNumber {
        &self.seq
    }
}

impl core::CutChunk for chunk::Chunk {
    fn first(&self) -> &SequenceNumber {
        &self.first
    }
    fn last(&self) -> &SequenceNumber {
        &self.last
    }
    fn records(&self) -> usize {
        self.records
    }
    fn newest_ms(&self) -> Option<i64> {
        self.newest_ms
    }
}

impl<S: AggregateStore> core::Planner for Planning<'_, S> {
    type Record = records::Change;
    type Chunk = chunk::Chunk;
    type Write = ChunkWrite;

    fn cut(&self, pending: &[records::Change], now_ms: i64) -> Vec<chunk::Chunk> {
        let indexed: Vec<(usize, records::Change)> = pending.iter().cloned().enumerate().collect();
        let a = self.aggregator;
        chunk::chunks(&indexed, a.chunk_reels, a.window.width_ms, now_ms)
    }

    async fn checkpoint(&self, key: &str) -> Result<(Option<SequenceNumber>, u32), Error> {
        self.aggregator.checkpoint(key).await
    }

    async fn plan(
        &self,
        key: &str,
        checkpoint: Option<&SequenceNumber>,
        chunk: &chunk::Chunk,
        now: Duration,
        turn: u32,
    ) -> Result<ChunkWrite, Error> {
        self.aggregator
            .plan(key, self.shard_id, checkpoint, chunk, now, turn)
            .await
    }

    async fn apply(&self, write: &ChunkWrite) -> Result<ChunkResult, Error> {
        self.aggregator.store.apply_chunk(write).await
    }

    async fn met(&self, key: &str, write: &ChunkWrite, add: Option<usize>) {
        // Another stream shard's transaction held a shard item of a reel.
        if let Some(a) = add.and_then(|i| write.adds.get(i)) {
            self.aggregator.met_on(&a.reel, key).await;
        }
    }
}
