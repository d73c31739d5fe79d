//! The views aggregator: applies batches of a views-log shard to the reels'
//! view items, through the exactly-once core stream mode uses
//! ([`crate::aggregate`]'s `core`: records ordered and de-duplicated by
//! sequence number, a checkpoint per shard moved in the transaction that
//! applies a chunk, bounded retries, the rest handed back to Lambda).
//!
//! # What a chunk writes
//!
//! Every item a chunk writes belongs to its shard (its *writer*,
//! [`keys::views_writer`]): per reel, the writer's all-time item and its
//! item of the record's UTC day, each with a view count (`ADD`) and an HLL
//! sketch of the viewers (read, merged, written back). Kinesis shards never
//! write one item, so they never conflict, and the sketch read is the value
//! stored: only this shard, under its checkpoint's condition, writes it.
//!
//! # Producer retries
//!
//! A record's copies (the view function put it again after a lost answer;
//! a client retried with its `Idempotency-Key`) carry one event id and
//! arrive later than the first, on the same shard (one partition key, the
//! viewer) or, across a split, on a child of it. Each chunk records the
//! event ids it applied in one *seen* item of its shard, in the same
//! transaction; before applying a chunk, the aggregator drops the records
//! whose id its shard, or the shard's parents, applied within
//! [`super::ViewsConfig::dedup_window`] before. One write per chunk, not
//! one per event: the seen items are read back incrementally and kept in
//! memory, since they never change once written (`seen`).
//!
//! # Big records
//!
//! A record may name 100 reels: two items each would overflow a
//! transaction (100 items). Records are cut into parts of at most
//! [`PART_REELS`](super::chunk::PART_REELS) reels, each with a sequence number of its own (the
//! record's × 100 + the part), so a record applied in two transactions is
//! still applied exactly once; Lambda is handed back the record's own
//! number.
//!
//! # Throttled reads
//!
//! Planning a chunk reads: the shard's checkpoint (`GetItem`), its seen
//! items (`Query`) and the sketches of the items it updates
//! (`BatchGetItem`). A read still throttled past the SDK's retries is
//! retried with full-jitter backoff, a bounded number of times and never
//! into the invocation's deadline margin ([`super::throttle`]); given up,
//! the batch fails and Lambda delivers it again, and nothing is applied
//! twice. `BatchGetItem`'s unprocessed keys are such a throttle: the keys
//! left are asked for again at the same pace.
//!
//! # Records it cannot read
//!
//! A record of a newer format is handed back, never passed (the batch is
//! applied below it); a malformed one is applied as nothing and counted
//! (`ViewRecordsMalformed`). [`super::record::FORMAT`] says why.

use super::ViewsConfig;
use super::bound;
use super::chunk::{Part, ViewChunk, cut_with, item_groups, parts, record_seq, write_token};
use super::compact::Compaction;
use super::record::{self, KinesisEvent};
use super::seen::Seen;
use super::sketch::Sketch;
use super::throttle::{READ_ATTEMPTS, pause_after_throttle, read_retrying};
use crate::aggregate::BatchOutcome;
use crate::aggregate::core::{self, CutChunk, Planner};
use crate::aggregate::records::SequenceNumber;
use crate::error::Error;
use crate::keys::{self, window};
use crate::retry::Backoff;
use crate::store::{ChunkResult, LogStore, ViewChunkWrite, ViewItemWrite, ViewStore};
use crate::token::RequestToken;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a checkpoint outlives its last write (TTL, `expires_at`,
/// refreshed by every chunk): a year and a day. A checkpoint is needed as
/// long as a record at or below it may be delivered again, and only
/// records the stream still holds are: none past Kinesis's longest
/// retention, 365 days (8,760 hours; 24 hours is the default, and the
/// template's). Every record at or below the checkpoint arrived before its
/// last write, so none can be delivered a year after it, whatever the
/// stream's retention is or is later raised to; the day covers an
/// invocation's time and clocks. A shard's checkpoint then goes once the
/// shard is closed (or quiet) for good, instead of staying forever; the
/// record that comes to a quiet shard after that finds no checkpoint and
/// nothing left of what it covered, and is applied as the shard's first.
/// The same holds for a repair's checkpoint: the range it repairs is gone
/// from the stream by then, so a repair invoked again counts nothing.
pub const CHECKPOINT_TTL: Duration = Duration::from_secs(366 * 86_400);

/// The views aggregator's metrics (flushed by its entry point).
fn metrics() -> crate::metrics::Record {
    crate::metrics::Record::of("aggregate-views")
}

/// The views log's consumer.
pub struct ViewAggregator<S, L> {
    pub(super) store: S,
    pub(super) log: Arc<L>,
    pub(super) backoff: Backoff,
    /// The pace of throttled reads ([`READ_ATTEMPTS`]).
    pub(super) read_backoff: Backoff,
    pub(super) config: ViewsConfig,
    /// The seen partitions read so far.
    pub(super) seen: Seen,
    /// Seals written and reels queued for folding ([`super::compact`]).
    pub(super) compaction: Compaction,
    /// Views counted by this instance's batches (the `ViewsApplied`
    /// metric's source for batches; a repair counts its own).
    views_applied: std::sync::atomic::AtomicU64,
    /// Each Kinesis shard's trending sketch as this instance holds it.
    pub(super) sketches: crate::trending::Sketches,
    /// The reels ever counted: a reel is registered before its first
    /// views are written ([`crate::known`]).
    known: Option<crate::known::SharedKnown>,
}

impl<S: ViewStore, L: LogStore> ViewAggregator<S, L> {
    /// An aggregator over `store`, reading shard parents from `log`,
    /// retrying as `retries` says (`RETRY_*`).
    pub fn new(store: S, log: Arc<L>, retries: &crate::Config, config: ViewsConfig) -> Self {
        ViewAggregator {
            store,
            log,
            backoff: Backoff::from_config(retries),
            read_backoff: Backoff {
                max_attempts: READ_ATTEMPTS,
                ..Backoff::from_config(retries)
            },
            config,
            seen: Seen::default(),
            compaction: Compaction::default(),
            views_applied: Default::default(),
            sketches: Default::default(),
            known: None,
        }
    }

    /// Registers each reel in `known` before its views are first written.
    pub fn with_known(mut self, known: crate::known::SharedKnown) -> Self {
        self.known = Some(known);
        self
    }

    /// Views this instance's batches counted so far (copies of a record
    /// left out); with the views repairs count (which they add to
    /// `ViewsApplied` themselves, so that a repair running beside a batch
    /// is not counted twice), what `ViewsAccepted` of the view function
    /// should add up to.
    pub fn views_applied(&self) -> u64 {
        self.views_applied
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Registers the reels `parts` view among the known reels, before any
    /// of their views is written: the reels they count must be known to
    /// every reader by then ([`crate::known`]). Each reel, counted or not (a
    /// copy, a viewer past its bound): registering one that stays at zero
    /// costs a write once, and the edge's bounds and the reel check limit
    /// how many.
    pub(super) async fn register_viewed(&self, parts: &[Part]) -> Result<(), Error> {
        let Some(k) = &self.known else {
            return Ok(());
        };
        let mut reels: Vec<&keys::ReelId> = parts
            .iter()
            .flat_map(|p| p.views.iter().map(|(r, _)| r))
            .collect();
        reels.sort();
        reels.dedup();
        k.register(&reels).await
    }

    /// Applies one batch (see [`crate::aggregate::Aggregator::handle`]).
    pub async fn handle(
        &self,
        event: &KinesisEvent,
        deadline: Option<Instant>,
    ) -> Result<BatchOutcome, Error> {
        let batch =
            record::ordered(event).map_err(|e| Error::internal("unreadable Kinesis event", e))?;
        if batch.records.is_empty() && batch.handed_back_from().is_none() {
            return Ok(BatchOutcome::default());
        }
        if batch.out_of_order {
            tracing::warn!(shard = %batch.shard_id, duplicates = batch.duplicates, "views batch delivered out of sequence order");
        }
        if let Some(newer) = &batch.newer {
            // Counted in every delivery of it, until a reader of it comes.
            metrics().count("ViewRecordsNewerFormat", batch.newer_format as u64);
            tracing::error!(shard = %batch.shard_id, from = %newer, records = batch.newer_format, "views records of a format newer than this aggregator's: handed back until an aggregator that reads them is deployed");
        }
        for r in batch.records.iter().filter(|r| r.body.is_none()) {
            tracing::error!(shard = %batch.shard_id, seq = %r.seq.as_reported(), "a views record that is no view record of any format: applied as nothing (ViewRecordsMalformed once its checkpoint passes it)");
        }
        let lineage = self.ancestors(&batch.stream_arn, &batch.shard_id).await?;
        let ancestors = lineage
            .iter()
            .map(|a| keys::views_seen_key(&batch.stream_arn, a))
            .collect();
        let key = keys::views_checkpoint_key(&batch.stream_arn, &batch.shard_id);
        let parts = parts(&batch.records);
        self.register_viewed(&parts).await?;
        let mut planning = ViewPlanning::new(
            self,
            &batch.shard_id,
            keys::views_writer(&batch.stream_arn, &batch.shard_id),
            keys::views_seen_key(&batch.stream_arn, &batch.shard_id),
            deadline,
        );
        planning.ancestors = ancestors;
        // A malformed record is one part without an id.
        planning.malformed = parts
            .iter()
            .filter(|p| p.id.is_none())
            .map(|p| p.seq.padded().to_owned())
            .collect();
        planning.read_window(&parts).await;
        let (mut out, checkpoint) =
            core::run(&planning, &self.backoff, &key, &parts, deadline).await?;
        out.out_of_order = batch.out_of_order;
        out.failed_from = out.failed_from.map(|s| record_seq(&s));
        if out.failed_from.is_none()
            && let Some(from) = batch.handed_back_from()
        {
            out.failed_from = Some(from.to_owned());
        }
        let covered = parts
            .iter()
            .filter(|p| checkpoint.as_ref().is_some_and(|k| p.seq <= *k))
            .count();
        out.skipped = covered.saturating_sub(out.applied) + batch.duplicates;
        if checkpoint.is_some() {
            self.compact(&batch.stream_arn, &batch.shard_id, &lineage, deadline)
                .await;
        }
        Ok(out)
    }

    /// Once a chunk of `shard_id` is applied: seals its ancestors' writers
    /// (they will never write again), then folds the reels its chunks
    /// created a first item of, within bounds ([`super::compact`]). Never
    /// fails the batch: what is not done is done another time.
    async fn compact(
        &self,
        stream_arn: &str,
        shard_id: &str,
        ancestors: &[String],
        deadline: Option<Instant>,
    ) {
        let now = (self.config.clock)();
        let writers: Vec<String> = ancestors
            .iter()
            .map(|a| keys::views_writer(stream_arn, a))
            .collect();
        let key = keys::views_checkpoint_key(stream_arn, shard_id);
        self.compaction
            .seal_ancestors(&self.store, &key, &writers, now)
            .await;
        let time_left = || deadline.is_none_or(|d| Instant::now() + 2 * core::DEADLINE_SAFETY < d);
        let live = keys::views_writer(stream_arn, shard_id);
        self.compaction
            .run(&self.store, &live, now, time_left)
            .await;
    }

    /// The view items `wanted` that exist, read in rounds while some keys
    /// come back unprocessed or throttled (see the module notes and
    /// [`super::throttle`]).
    async fn view_items(
        &self,
        wanted: &[(String, String)],
        deadline: Option<Instant>,
    ) -> Result<Vec<(String, crate::store::ViewItem)>, Error> {
        let mut found = Vec::with_capacity(wanted.len());
        let mut pending = wanted.to_vec();
        let mut attempt = 0u32;
        while !pending.is_empty() {
            attempt += 1;
            match self.store.view_items(&pending).await {
                Ok((items, left)) => {
                    found.extend(items);
                    pending = left;
                    if pending.is_empty() {
                        break;
                    }
                }
                Err(Error::Throttled) => {}
                Err(e) => return Err(e),
            }
            pause_after_throttle(&self.read_backoff, attempt, deadline, "BatchGetItem").await?;
        }
        Ok(found)
    }
}

/// One batch of one shard, as the core plans it.
pub(super) struct ViewPlanning<'a, S, L> {
    pub(super) aggregator: &'a ViewAggregator<S, L>,
    /// The shard, as kept on the checkpoint for operators.
    pub(super) shard_id: &'a str,
    /// Whose view items the chunks write ([`keys::views_writer`]).
    pub(super) writer: String,
    /// The seen partition the chunks write their event ids to.
    pub(super) seen_key: String,
    /// Seen partitions read (not written) besides `seen_key`.
    pub(super) ancestors: Vec<String>,
    /// The invocation's deadline: throttled reads pause only while they
    /// end before its margin.
    pub(super) deadline: Option<Instant>,
    /// The (padded) sequence numbers of the malformed records' parts:
    /// counted (`ViewRecordsMalformed`) as a chunk applies them.
    pub(super) malformed: BTreeSet<String>,
    /// Views counted by this batch's chunks (each once, on its reel's
    /// all-time item).
    pub(super) views: AtomicU64,
    /// Whether they count in [`ViewAggregator::views_applied`] too (a
    /// batch's; not a repair's).
    pub(super) instance_views: bool,
    /// Per planned chunk (its last part), the reels whose all-time item of
    /// this writer it creates: queued for folding once it lands.
    first_items: Mutex<HashMap<String, Vec<String>>>,
    /// Per planned chunk (its last part), the views the per-viewer bound
    /// dropped: counted once it lands.
    over_bound: Mutex<HashMap<String, u64>>,
}

impl<'a, S, L> ViewPlanning<'a, S, L> {
    /// The planning of a batch of `shard_id` written as `writer` into the
    /// seen partition `seen_key`, reading no other, with no malformed
    /// records.
    pub(super) fn new(
        aggregator: &'a ViewAggregator<S, L>,
        shard_id: &'a str,
        writer: String,
        seen_key: String,
        deadline: Option<Instant>,
    ) -> Self {
        ViewPlanning {
            aggregator,
            shard_id,
            writer,
            seen_key,
            ancestors: Vec::new(),
            deadline,
            malformed: BTreeSet::new(),
            views: AtomicU64::new(0),
            instance_views: true,
            first_items: Mutex::new(HashMap::new()),
            over_bound: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: ViewStore, L: LogStore> Planner for ViewPlanning<'_, S, L> {
    type Record = Part;
    type Chunk = ViewChunk;
    type Write = ViewChunkWrite;

    fn cut(&self, pending: &[Part], _now_ms: i64) -> Vec<ViewChunk> {
        cut_with(pending, self.spent(pending))
    }

    async fn checkpoint(&self, key: &str) -> Result<Option<SequenceNumber>, Error> {
        let a = self.aggregator;
        let stored = read_retrying(&a.read_backoff, self.deadline, "GetItem", || {
            a.store.view_checkpoint(key)
        })
        .await?;
        if !a.sketches.holds(key, stored.seq.as_deref()) {
            // As the likes' aggregator: the stored sketch, read only by
            // an instance that does not hold the writer's own.
            let sketch = match stored.sketch_hour {
                Some(hour) => {
                    read_retrying(&a.read_backoff, self.deadline, "GetItem", || {
                        a.store.stored_sketch(key, hour)
                    })
                    .await?
                }
                None => None,
            };
            a.sketches.restore(key, stored.seq.as_deref(), sketch);
        }
        let seq = match stored.seq {
            None => None,
            Some(s) => Some(SequenceNumber::parse_kinesis(&s).ok_or_else(|| {
                Error::internal("unreadable views checkpoint", format_args!("{key}: {s:?}"))
            })?),
        };
        Ok(seq)
    }

    async fn plan(
        &self,
        key: &str,
        checkpoint: Option<&SequenceNumber>,
        chunk: &ViewChunk,
        now: Duration,
    ) -> Result<ViewChunkWrite, Error> {
        let a = self.aggregator;
        let oldest = chunk.parts.iter().map(|p| p.arrival_ms).min().unwrap_or(0);
        let window = a.config.dedup_window.as_millis() as i64;
        let mut partitions = self.ancestors.clone();
        partitions.push(self.seen_key.clone());
        // The window covers the per-viewer bound's minute too.
        let seen = a
            .seen
            .since(
                &a.store,
                &a.read_backoff,
                &partitions,
                &self.seen_key,
                oldest - window.max(bound::WINDOW_MS),
                self.deadline,
            )
            .await?;
        // The chunk's fresh parts: ids neither applied before nor earlier
        // in the chunk.
        let mut ids: Vec<u64> = Vec::new();
        let mut fresh: Vec<&Part> = Vec::new();
        let mut in_chunk: HashSet<u64> = HashSet::new();
        for p in &chunk.parts {
            if let Some(id) = p.id {
                if seen.contains(&id) || !in_chunk.insert(id) {
                    continue;
                }
                ids.push(id);
            }
            fresh.push(p);
        }
        // What each viewer may still count this minute (see `bound`).
        let prior = a.seen.usage(&partitions, oldest - bound::WINDOW_MS);
        let bounded = bound::bound(
            bound::ViewerAllowance {
                views: a.config.per_viewer.0,
                reels: a.config.per_viewer.1,
            },
            &prior,
            &fresh,
        );
        if let Ok(mut o) = self.over_bound.lock() {
            o.insert(chunk.last().padded().to_owned(), bounded.dropped_views);
        }
        let now_ms = now.as_millis() as i64;
        let (groups, mut windows) = item_groups(&fresh, &bounded.views, now_ms);
        // The trending sketch counts each reel's views of the chunk.
        let sketch = a.sketches.plan(
            key,
            now_ms,
            groups
                .iter()
                .filter(|((_, day), _)| day.is_none())
                .map(|((reel, _), (views, _))| (reel.as_str(), *views)),
        );
        let sort = |day: &Option<String>| match day {
            None => keys::views_all_sort(&self.writer),
            Some(d) => keys::views_day_sort(d, &self.writer),
        };
        let wanted: Vec<(String, String)> = groups
            .keys()
            .map(|(r, d)| (keys::views_reel_key(r), sort(d)))
            .collect();
        let stored: HashMap<(String, String), Vec<u8>> = a
            .view_items(&wanted, self.deadline)
            .await?
            .into_iter()
            .map(|(pk, item)| ((pk, item.sk), item.sketch))
            .collect();
        // A reel without this writer's all-time item yet: a new writer of
        // it, after which older writers' items may be foldable.
        let first: Vec<String> = groups
            .keys()
            .filter(|(_, d)| d.is_none())
            .map(|(r, d)| (keys::views_reel_key(r), sort(d)))
            .filter(|k| !stored.contains_key(k))
            .map(|(pk, _)| pk)
            .collect();
        if let Ok(mut f) = self.first_items.lock() {
            f.insert(chunk.last().padded().to_owned(), first);
        }
        let day_ttl = a.config.day_ttl.as_secs() as i64;
        let mut items = Vec::with_capacity(groups.len());
        for ((reel, day), (views, viewers)) in &groups {
            let (pk, sk) = (keys::views_reel_key(reel), sort(day));
            let mut sketch = Sketch::from_stored(
                stored
                    .get(&(pk.clone(), sk.clone()))
                    .map_or(&[][..], Vec::as_slice),
            );
            for v in viewers {
                sketch.add(v);
            }
            items.push(ViewItemWrite {
                pk,
                sk,
                views: *views,
                sketch: sketch.to_bytes(),
                day: day.clone(),
                expires_at: day.as_ref().map(|_| now.as_secs() as i64 + day_ttl),
                windows: windows
                    .remove(&(reel.clone(), day.clone()))
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
            });
        }
        let newest = chunk.newest_ms().unwrap_or(0);
        let mut write = ViewChunkWrite {
            checkpoint_key: key.to_owned(),
            shard_id: self.shard_id.to_owned(),
            expected: checkpoint.map(|c| c.padded().to_owned()),
            next: chunk.last().padded().to_owned(),
            checkpoint_expires_at: (now + CHECKPOINT_TTL).as_secs() as i64,
            seen_key: self.seen_key.clone(),
            seen_sort: keys::views_seen_sort(newest, chunk.last().padded()),
            seen_ids: ids,
            seen_usage: bound::Usage::pack(&bounded.usage),
            // Past the window and the stream's 24 hours, with a day to
            // spare: a repair of a given-up range reads them for as long as
            // the stream keeps its records (`super::repair`). TTL deletes
            // lazily, and readers bound what they read by the sort key.
            seen_expires_at: newest / 1000 + window / 1000 + 2 * 86_400,
            items,
            sketch: Some(sketch),
            window_prune: window::pruned_attrs(now_ms),
            records: chunk.parts.len() as u64,
            now_ms,
            token: RequestToken::for_fields("views", &[]),
        };
        write.token = write_token(&write);
        Ok(write)
    }

    async fn apply(&self, write: &ViewChunkWrite) -> Result<ChunkResult, Error> {
        self.aggregator.store.apply_views(write).await
    }

    fn applied(&self, key: &str, write: &ViewChunkWrite) {
        if let Some(s) = &write.sketch {
            self.aggregator
                .sketches
                .applied(key, &write.next, s, write.now_ms);
        }
        // Views counted: each once, on its reel's all-time item.
        let views: u64 = write
            .items
            .iter()
            .filter(|i| i.day.is_none())
            .map(|i| i.views)
            .sum();
        if self.instance_views {
            self.aggregator
                .views_applied
                .fetch_add(views, Ordering::Relaxed);
        }
        self.views.fetch_add(views, Ordering::Relaxed);
        // Malformed records passed by this chunk's checkpoint move: each
        // counted once, by the chunk that applied it (as nothing).
        let passed = self
            .malformed
            .iter()
            .filter(|s| write.expected.as_ref().is_none_or(|e| *s > e) && **s <= write.next)
            .count();
        metrics().count("ViewRecordsMalformed", passed as u64);
        let over = self
            .over_bound
            .lock()
            .ok()
            .and_then(|mut o| o.remove(&write.next))
            .unwrap_or(0);
        metrics().count("ViewsOverViewerBound", over);
        self.aggregator.seen.applied(write);
        let first = self
            .first_items
            .lock()
            .ok()
            .and_then(|mut f| f.remove(&write.next));
        self.aggregator
            .compaction
            .queue(first.into_iter().flatten());
    }
}
