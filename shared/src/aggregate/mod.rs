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
//! stream shard's own writer items of those reels (see
//! [Writer items](#writer-items)) and moves the checkpoint from the value
//! read to the chunk's last record, conditioned on the checkpoint still
//! holding the value read and lying below the new one. So:
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
//! * no other stream shard's transaction touches any of its items, so
//!   the only conflicts left are an overlapping invocation of the same
//!   stream shard (which the checkpoint sorts out) and a fold of the
//!   stream shard's quiet items (retried).
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
//! # Writer items
//!
//! A chunk adds a reel's delta to the reel's item *of this stream shard*
//! (`l#{reel}` / `w#{writer}` in `WRITERS_TABLE`,
//! [`keys::likes_writers_key`], the writer being the checkpoint key's
//! hash), never to an item another stream shard writes. Like rows are
//! keyed by user, so every busy stream shard carries likes of every
//! popular reel: with shared shard items, a chunk of 49 cold reels met
//! some other stream shard's transaction on one of them most of the time
//! (63–86 % of chunks at 2 likes/s per reel), and a viral reel's shards
//! were fought over by every stream shard. With items of its own, a chunk
//! conflicts with nothing but a fold, by construction, whatever the
//! number of stream shards or reels; there is no placement to move and
//! no crowd to grow for. The price is on the read side: a reader queries
//! the reel's partition and sums its items, one per stream shard that
//! counted the reel lately plus a base item, since quiet items are folded
//! into the base (`store/dynamodb/writers.rs`). Counts that earlier
//! versions added to shard items stay there and are summed too.
//!
//! # Recent changes
//!
//! Each writer item's update also adds the chunk's changes of the reel to the
//! item's recent-change buckets (by a new row's `liked_at`, a removal's
//! stream timestamp; [`crate::keys::recent_delta_attr`]) and drops the
//! oldest, so reconciliation can take out of `n` what came from rows liked
//! after the moment it counted them at (see [`crate::reconcile`]). That
//! is why a reel whose like and unlike in a chunk cancel out keeps its
//! place: its removal is recorded.
//!
//! # Own-change tails
//!
//! Each writer item's update also sets its own-change tail whole: the net
//! change of its records per short bucket of their own time, over the
//! last seconds ([`crate::keys::tail`]), so that a reader can cut a sum
//! before an own unlike's like (`LikeService::serve_own_change`). What the
//! item holds comes from this instance's own last writes while the
//! checkpoint is where it left it, and is read otherwise
//! ([`tails::Tails`]).
//!
//! # Rooms
//!
//! `records` parses Lambda's event, `chunk` cuts it into transactions,
//! `tails` keeps what this instance knows of its writer items' own-change
//! tails ([`crate::keys::tail`]); this file applies them.

pub mod chunk;
pub mod core;
pub mod records;
pub mod tails;

use crate::config::{Config, RecentWindow};
use crate::error::Error;
use crate::keys::tail::TailWindow;
use crate::keys::{self, ReelId};
use crate::retry::Backoff;
use crate::store::{AggregateStore, ChunkResult, ChunkWrite};
use crate::trending::Sketches;
use records::{SequenceNumber, StreamEvent};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a checkpoint outlives its last write: stream records are kept
/// 24 hours, so a closed shard's checkpoint is useless a day after its
/// last record; two days leaves room for a replay from the start.
const CHECKPOINT_TTL: Duration = Duration::from_secs(2 * 86_400);

pub use core::BatchOutcome;

/// The stream consumer: applies batches of the Likes table's stream to the
/// stream shards' writer items.
pub struct Aggregator<S> {
    store: S,
    backoff: Backoff,
    /// See [`Config::stream_since_ms`].
    since_ms: i64,
    /// See [`Config::aggregate_chunk_reels`].
    chunk_reels: usize,
    /// The writer items' recent-change buckets (see [`crate::reconcile`]).
    window: RecentWindow,
    /// Each stream shard's trending sketch as this instance holds it.
    sketches: Sketches,
    /// The writer items' own-change tails (see [`crate::keys::tail`]).
    tail: TailWindow,
    /// Each stream shard's tails as this instance knows them.
    tails: tails::Tails,
    /// The reels ever counted ([`Aggregator::with_known`]).
    known: Option<crate::known::SharedKnown>,
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
            sketches: Sketches::default(),
            tail: config.own_tail(),
            tails: tails::Tails::default(),
            known: None,
        }
    }

    /// Registers each reel of a batch in `known` before it is counted: a
    /// like the like function registered is known already (nothing is
    /// put); one written by a release that did not register, still in the
    /// stream when this one started, is registered here
    /// ([`crate::known`]).
    pub fn with_known(mut self, known: crate::known::SharedKnown) -> Self {
        self.known = Some(known);
        self
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
        if let Some(k) = &self.known {
            let mut reels: Vec<&ReelId> = batch
                .changes
                .iter()
                .filter_map(|c| c.reel.as_ref())
                .collect();
            reels.sort();
            reels.dedup();
            k.register(&reels).await?;
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

    /// The stream shard's checkpoint; a stored value that is not a sequence
    /// number is a fault of ours, never read as "nothing applied".
    async fn checkpoint(&self, key: &str) -> Result<Option<SequenceNumber>, Error> {
        let stored = self.store.checkpoint(key).await?;
        if !self.sketches.holds(key, stored.seq.as_deref()) {
            // Another instance moved the checkpoint (or this one never
            // held it): its stored sketch is where the next chunk adds.
            let sketch = match stored.sketch_hour {
                Some(hour) => self.store.stored_sketch(key, hour).await?,
                None => None,
            };
            self.sketches.restore(key, stored.seq.as_deref(), sketch);
        }
        if !self.tails.holds(key, stored.seq.as_deref()) {
            // A shard that never applied a chunk has no writer item yet
            // (they are written with its checkpoint): nothing to read.
            let since = match stored.seq {
                Some(_) => crate::clock::now_ms(),
                None => 0,
            };
            let now = crate::clock::now_ms();
            self.tails
                .restart(key, stored.seq.as_deref(), since, &self.tail, now);
        }
        let seq = match stored.seq {
            None => None,
            Some(s) => Some(SequenceNumber::parse(&s).ok_or_else(|| {
                Error::internal(
                    "unreadable aggregation checkpoint",
                    format_args!("{key}: {s:?}"),
                )
            })?),
        };
        Ok(seq)
    }

    /// The transaction of `chunk` (see [`chunk::Chunk::write`]).
    fn plan(
        &self,
        key: &str,
        shard_id: &str,
        checkpoint: Option<&SequenceNumber>,
        chunk: &chunk::Chunk,
        now: Duration,
        items: &chunk::ItemPlan,
    ) -> ChunkWrite {
        // The trending sketch counts the likes the chunk adds (a reel's
        // net gain: an unlike takes nothing off a candidate).
        let likes = chunk
            .reels()
            .filter(|(_, d)| *d > 0)
            .map(|(r, d)| (r.as_str(), d as u64));
        let sketch = self.sketches.plan(key, now.as_millis() as i64, likes);
        chunk::with_sketch(
            chunk.write(key, shard_id, checkpoint, self.window, now, items),
            sketch,
        )
    }

    /// Where `chunk` writes each reel (`parts`, the spread registry as
    /// last read) and the own-change tails those writer items hold after
    /// it, at `now_ms`: from what this instance knows of them, the others
    /// read.
    async fn items(
        &self,
        key: &str,
        chunk: &chunk::Chunk,
        parts: HashMap<ReelId, u32>,
        now_ms: i64,
    ) -> Result<chunk::ItemPlan, Error> {
        let writer = keys::likes_writer(key);
        let items: Vec<tails::ItemId> = chunk
            .reels()
            .map(|(r, _)| {
                let n = parts.get(r).copied().unwrap_or(1);
                (r.clone(), keys::likes_writer_part(writer, n))
            })
            .collect();
        let mut plan = chunk::ItemPlan {
            parts,
            tail_width_ms: self.tail.width_ms,
            tail_keep_ms: self.tail.keep_ms,
            tails: HashMap::new(),
        };
        if !self.tail.enabled() {
            return Ok(plan);
        }
        let mut known = self.tails.known(key, &items, &self.tail, now_ms);
        if !known.unknown.is_empty() {
            let mut read = self
                .store
                .writer_tails(key, &known.unknown, &self.tail)
                .await?;
            for id in known.unknown.drain(..) {
                let map = read.remove(&id).unwrap_or_default();
                known.maps.insert(id, map);
            }
        }
        // Every item written gets its map, empty or not: a reader takes a
        // recent item without one as written by an aggregator that keeps
        // none (or another window), and does not cut.
        for id in items {
            let prior = known.maps.remove(&id).unwrap_or_default();
            let own = chunk.own.get(&id.0).into_iter().flatten();
            let adds = own.map(|(t, d)| (self.tail.start_of(*t), *d));
            plan.tails
                .insert(id.0, self.tail.merged(&prior, adds, now_ms));
        }
        Ok(plan)
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

    async fn checkpoint(&self, key: &str) -> Result<Option<SequenceNumber>, Error> {
        self.aggregator.checkpoint(key).await
    }

    async fn plan(
        &self,
        key: &str,
        checkpoint: Option<&SequenceNumber>,
        chunk: &chunk::Chunk,
        now: Duration,
    ) -> Result<ChunkWrite, Error> {
        let reels: Vec<&ReelId> = chunk.reels().map(|(r, _)| r).collect();
        let parts = self.aggregator.store.writer_parts(&reels).await;
        let now_ms = now.as_millis() as i64;
        let items = self.aggregator.items(key, chunk, parts, now_ms).await?;
        Ok(self
            .aggregator
            .plan(key, self.shard_id, checkpoint, chunk, now, &items))
    }

    async fn apply(&self, write: &ChunkWrite) -> Result<ChunkResult, Error> {
        self.aggregator.store.apply_chunk(write).await
    }

    fn applied(&self, key: &str, write: &ChunkWrite) {
        let a = self.aggregator;
        a.tails
            .applied(key, &write.next, &write.adds, &a.tail, write.now_ms);
        if let Some(s) = &write.sketch {
            self.aggregator
                .sketches
                .applied(key, &write.next, s, write.now_ms);
        }
    }
}
