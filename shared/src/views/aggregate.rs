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
//! memory, since they never change once written.
//!
//! # Big records
//!
//! A record may name 100 reels: two items each would overflow a
//! transaction (100 items). Records are cut into parts of at most
//! [`PART_REELS`](super::chunk::PART_REELS) reels, each with a sequence number of its own (the
//! record's × 100 + the part), so a record applied in two transactions is
//! still applied exactly once; Lambda is handed back the record's own
//! number.

use super::ViewsConfig;
use super::chunk::{ItemOf, Part, ViewChunk, cut, parts, record_seq};
use super::record::{self, KinesisEvent};
use super::sketch::Sketch;
use crate::aggregate::BatchOutcome;
use crate::aggregate::core::{self, CutChunk, Planner};
use crate::aggregate::records::SequenceNumber;
use crate::error::Error;
use crate::keys;
use crate::retry::Backoff;
use crate::store::{ChunkResult, LogStore, ViewChunkWrite, ViewItemWrite, ViewStore};
use crate::token::RequestToken;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How far back of the last seen item known a seen partition is read
/// again: arrival times on one shard may step back by this much.
pub(super) const ARRIVAL_SKEW_MS: i64 = 10_000;

/// A seen partition's items as this instance knows them: every item with
/// a sort key from `read_from` up to `known_to`.
#[derive(Default)]
struct SeenCache {
    /// The lowest sort key covered.
    read_from: String,
    /// The highest sort key read or written.
    known_to: String,
    /// Ids by sort key.
    items: BTreeMap<String, Vec<u64>>,
    /// A parent shard's partition: closed, read once.
    closed: bool,
}

/// The views log's consumer.
pub struct ViewAggregator<S, L> {
    pub(super) store: S,
    pub(super) log: Arc<L>,
    pub(super) backoff: Backoff,
    pub(super) config: ViewsConfig,
    seen: Mutex<HashMap<String, SeenCache>>,
    /// Views counted by this instance (the `ViewsApplied` metric's source).
    views_applied: std::sync::atomic::AtomicU64,
}

impl<S: ViewStore, L: LogStore> ViewAggregator<S, L> {
    /// An aggregator over `store`, reading shard parents from `log`,
    /// retrying as `retries` says (`RETRY_*`).
    pub fn new(store: S, log: Arc<L>, retries: &crate::Config, config: ViewsConfig) -> Self {
        ViewAggregator {
            store,
            log,
            backoff: Backoff::from_config(retries),
            config,
            seen: Mutex::default(),
            views_applied: Default::default(),
        }
    }

    /// Views this instance counted so far (copies of a record left out):
    /// what `ViewsAccepted` of the view function should add up to.
    pub fn views_applied(&self) -> u64 {
        self.views_applied
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Applies one batch (see [`crate::aggregate::Aggregator::handle`]).
    pub async fn handle(
        &self,
        event: &KinesisEvent,
        deadline: Option<Instant>,
    ) -> Result<BatchOutcome, Error> {
        let batch =
            record::ordered(event).map_err(|e| Error::internal("unreadable Kinesis event", e))?;
        if batch.records.is_empty() && batch.unreadable.is_none() {
            return Ok(BatchOutcome::default());
        }
        if batch.out_of_order {
            tracing::warn!(shard = %batch.shard_id, duplicates = batch.duplicates, "views batch delivered out of sequence order");
        }
        let malformed = batch.records.iter().filter(|r| r.body.is_none()).count();
        if malformed > 0 {
            tracing::error!(shard = %batch.shard_id, malformed, "views records this version cannot read: applied as nothing");
        }
        let ancestors = self
            .ancestors(&batch.stream_arn, &batch.shard_id)
            .await?
            .iter()
            .map(|a| keys::views_seen_key(&batch.stream_arn, a))
            .collect();
        let planning = ViewPlanning {
            aggregator: self,
            shard_id: &batch.shard_id,
            writer: keys::views_writer(&batch.stream_arn, &batch.shard_id),
            seen_key: keys::views_seen_key(&batch.stream_arn, &batch.shard_id),
            ancestors,
        };
        let key = keys::views_checkpoint_key(&batch.stream_arn, &batch.shard_id);
        let parts = parts(&batch.records);
        let (mut out, checkpoint) =
            core::run(&planning, &self.backoff, &key, &parts, deadline).await?;
        out.out_of_order = batch.out_of_order;
        out.failed_from = out.failed_from.map(|s| record_seq(&s));
        if out.failed_from.is_none()
            && let Some(bad) = &batch.unreadable
        {
            out.failed_from = Some(bad.clone());
        }
        let covered = parts
            .iter()
            .filter(|p| checkpoint.as_ref().is_some_and(|k| p.seq <= *k))
            .count();
        out.skipped = covered.saturating_sub(out.applied) + batch.duplicates;
        Ok(out)
    }

    /// The shards `shard_id` of `stream_arn` was split or merged from, and
    /// theirs (a split of a split within the dedup window), grandparents
    /// before parents.
    pub(super) async fn ancestors(
        &self,
        stream_arn: &str,
        shard_id: &str,
    ) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        for parent in self.log.parents(stream_arn, shard_id).await? {
            out.extend(self.log.parents(stream_arn, &parent).await?);
            out.push(parent);
        }
        Ok(out)
    }

    /// The event ids applied in the seen partitions `keys` (`own`: this
    /// shard's, still written; the others are closed parents) by chunks
    /// whose records arrived at or after `from_ms`.
    async fn seen_since(
        &self,
        keys: &[String],
        own: &str,
        from_ms: i64,
    ) -> Result<HashSet<u64>, Error> {
        let from = keys::views_seen_from(from_ms);
        let poisoned = || Error::internal("seen cache", "poisoned lock");
        let mut out = HashSet::new();
        for key in keys {
            // What to read: nothing (a closed parent read before), what was
            // written after the last item known, or the whole window.
            let after = {
                let seen = self.seen.lock().map_err(|_| poisoned())?;
                match seen.get(key) {
                    Some(c) if c.read_from <= from && c.closed => None,
                    // Kinesis's arrival times are approximate: read again
                    // a little before the last known item.
                    Some(c) if c.read_from <= from => {
                        let ms: i64 = c
                            .known_to
                            .get(..13)
                            .and_then(|t| t.parse().ok())
                            .unwrap_or(0);
                        Some(keys::views_seen_from(ms - ARRIVAL_SKEW_MS).max(c.read_from.clone()))
                    }
                    _ => Some(from.clone()),
                }
            };
            if let Some(after) = after {
                let items = self.store.seen_after(key, &after).await?;
                let mut seen = self.seen.lock().map_err(|_| poisoned())?;
                let c = seen.entry(key.clone()).or_default();
                if c.read_from > from || c.known_to.is_empty() {
                    *c = SeenCache {
                        read_from: from.clone(),
                        known_to: from.clone(),
                        ..SeenCache::default()
                    };
                }
                for i in items {
                    if i.sort > c.known_to {
                        c.known_to = i.sort.clone();
                    }
                    c.items.insert(i.sort, i.ids);
                }
                c.closed = key != own;
            }
            let mut seen = self.seen.lock().map_err(|_| poisoned())?;
            if let Some(c) = seen.get_mut(key) {
                // What fell out of the window is not asked for again (a
                // window starting earlier is read afresh).
                if c.read_from < from {
                    c.items = c.items.split_off(&from);
                    c.read_from = from.clone();
                }
                out.extend(c.items.values().flatten().copied());
            }
        }
        Ok(out)
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
}

impl<S: ViewStore, L: LogStore> Planner for ViewPlanning<'_, S, L> {
    type Record = Part;
    type Chunk = ViewChunk;
    type Write = ViewChunkWrite;

    fn cut(&self, pending: &[Part], _now_ms: i64) -> Vec<ViewChunk> {
        cut(pending)
    }

    async fn checkpoint(&self, key: &str) -> Result<(Option<SequenceNumber>, u32), Error> {
        let stored = self.aggregator.store.view_checkpoint(key).await?;
        let seq = match stored {
            None => None,
            Some(s) => Some(SequenceNumber::parse_kinesis(&s).ok_or_else(|| {
                Error::internal("unreadable views checkpoint", format_args!("{key}: {s:?}"))
            })?),
        };
        Ok((seq, 0))
    }

    async fn plan(
        &self,
        key: &str,
        checkpoint: Option<&SequenceNumber>,
        chunk: &ViewChunk,
        now: Duration,
        _turn: u32,
    ) -> Result<ViewChunkWrite, Error> {
        let a = self.aggregator;
        let oldest = chunk.parts.iter().map(|p| p.arrival_ms).min().unwrap_or(0);
        let window = a.config.dedup_window.as_millis() as i64;
        let mut partitions = self.ancestors.clone();
        partitions.push(self.seen_key.clone());
        let seen = a
            .seen_since(&partitions, &self.seen_key, oldest - window)
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
        // Views and viewers per item: (reel, None) all time, (reel, day).
        let mut groups: BTreeMap<ItemOf, (u64, Vec<&str>)> = BTreeMap::new();
        for p in &fresh {
            for (reel, n) in &p.views {
                for day in [None, Some(p.day.clone())] {
                    let g = groups.entry((reel.clone(), day)).or_default();
                    g.0 += u64::from(*n);
                    g.1.push(p.viewer.as_str());
                }
            }
        }
        let sort = |day: &Option<String>| match day {
            None => keys::views_all_sort(&self.writer),
            Some(d) => keys::views_day_sort(d, &self.writer),
        };
        let wanted: Vec<(String, String)> = groups
            .keys()
            .map(|(r, d)| (keys::views_reel_key(r), sort(d)))
            .collect();
        let stored: HashMap<(String, String), Vec<u8>> = a
            .store
            .view_items(&wanted)
            .await?
            .into_iter()
            .map(|(pk, item)| ((pk, item.sk), item.sketch))
            .collect();
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
            });
        }
        let newest = chunk.newest_ms().unwrap_or(0);
        let mut write = ViewChunkWrite {
            checkpoint_key: key.to_owned(),
            shard_id: self.shard_id.to_owned(),
            expected: checkpoint.map(|c| c.padded().to_owned()),
            next: chunk.last().padded().to_owned(),
            seen_key: self.seen_key.clone(),
            seen_sort: keys::views_seen_sort(newest, chunk.last().padded()),
            seen_ids: ids,
            // Past the window and the stream's 24 hours, with a day to
            // spare: a repair of a given-up range reads them for as long as
            // the stream keeps its records (`super::repair`). TTL deletes
            // lazily, and readers bound what they read by the sort key.
            seen_expires_at: newest / 1000 + window / 1000 + 2 * 86_400,
            items,
            records: chunk.parts.len() as u64,
            now_ms: now.as_millis() as i64,
            token: RequestToken::for_fields("views", &[]),
        };
        write.token = token(&write);
        Ok(write)
    }

    async fn apply(&self, write: &ViewChunkWrite) -> Result<ChunkResult, Error> {
        self.aggregator.store.apply_views(write).await
    }

    fn applied(&self, _key: &str, write: &ViewChunkWrite) {
        // Views counted: each once, on its reel's all-time item.
        let views: u64 = write
            .items
            .iter()
            .filter(|i| i.day.is_none())
            .map(|i| i.views)
            .sum();
        self.aggregator
            .views_applied
            .fetch_add(views, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut seen) = self.aggregator.seen.lock() {
            // Only a partition read before is extended: one never read
            // is read whole when first asked for.
            if let Some(c) = seen.get_mut(&write.seen_key)
                && !c.known_to.is_empty()
            {
                c.items
                    .insert(write.seen_sort.clone(), write.seen_ids.clone());
                if write.seen_sort > c.known_to {
                    c.known_to = write.seen_sort.clone();
                }
            }
        }
    }
}

/// The `ClientRequestToken` of `write`: derived from everything it sends
/// (one token never names two bodies; see `crate::aggregate::chunk`).
fn token(write: &ViewChunkWrite) -> RequestToken {
    use sha2::{Digest, Sha256};
    let ViewChunkWrite {
        checkpoint_key,
        shard_id,
        expected,
        next,
        seen_key,
        seen_sort,
        seen_ids,
        seen_expires_at,
        items,
        records,
        now_ms,
        token: _,
    } = write;
    let mut h = Sha256::new();
    for id in seen_ids {
        h.update(id.to_be_bytes());
    }
    for i in items {
        for f in [&i.pk, &i.sk, i.day.as_deref().unwrap_or("-")] {
            h.update((f.len() as u64).to_be_bytes());
            h.update(f.as_bytes());
        }
        h.update(i.views.to_be_bytes());
        h.update(i.expires_at.unwrap_or(-1).to_be_bytes());
        h.update((i.sketch.len() as u64).to_be_bytes());
        h.update(&i.sketch);
    }
    let body: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    RequestToken::for_fields(
        "views/v1",
        &[
            checkpoint_key,
            shard_id,
            expected.as_deref().unwrap_or("-"),
            next,
            seen_key,
            seen_sort,
            &seen_expires_at.to_string(),
            &records.to_string(),
            &now_ms.to_string(),
            &body,
        ],
    )
}
