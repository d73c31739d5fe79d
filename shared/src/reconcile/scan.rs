//! The likes scan: every segment of the Likes table counted from its
//! cursor, its rows checkpointed into chunks and added to the count items.

use super::pace::{read_units, write_units};
use super::state::{CHUNK_TTL_SECS, Pending, Segment, decode_counts, encode_counts, part_name};
use super::{CHECK_CONCURRENCY, Inv, Reconciler, Task, near};
use crate::clock::now_ms;
use crate::error::Error;
use crate::keys::{self, ReelId};
use crate::store::{ReconcileStore, ScanPage, ScanTable};
use futures::StreamExt;
use std::collections::HashMap;

/// Count-item updates sent at once, and between two deadline checks.
const APPLY_BATCH: usize = 64;

/// How far an invocation's likes scan got.
pub(super) struct LikesScan {
    /// Every segment is done, its counts in the count items.
    pub(super) all_done: bool,
    /// Segments it scanned (part of).
    pub(super) segments: usize,
}

impl<S: ReconcileStore> Reconciler<S> {
    /// The likes scan: every unfinished segment at once. Returns whether
    /// all segments are done (with their counts in the count items), and
    /// how many it scanned (part of).
    pub(super) async fn scan_likes(&self, inv: &Inv<'_>) -> Result<LikesScan, Error> {
        let mut todo: Vec<(usize, Segment)> = {
            let g = inv.run.lock().await;
            g.state
                .segments
                .iter()
                .cloned()
                .enumerate()
                .filter(|(_, s)| !s.done || s.pending.is_some())
                .collect()
        };
        if let Some(k) = inv.opts.stop_after_segments {
            todo.truncate(k);
        }
        let n = todo.len();
        let tasks: Vec<Task<'_, Result<(), Error>>> = todo
            .into_iter()
            .map(|(i, seg)| Box::pin(self.scan_segment(inv, i, seg)) as Task<'_, _>)
            .collect();
        let results: Vec<Result<(), Error>> = futures::stream::iter(tasks)
            .buffer_unordered(self.cfg.segments as usize)
            .collect()
            .await;
        for r in results {
            r?;
        }
        let all_done = inv
            .run
            .lock()
            .await
            .state
            .segments
            .iter()
            .all(|s| s.done && s.pending.is_none());
        Ok(LikesScan {
            all_done,
            segments: n,
        })
    }

    /// Scans one segment from its cursor, first finishing the checkpoint a
    /// previous invocation left pending. The rows counted since the last
    /// checkpoint are all it holds in memory.
    async fn scan_segment(
        &self,
        inv: &Inv<'_>,
        index: usize,
        mut seg: Segment,
    ) -> Result<(), Error> {
        if seg.pending.is_some() && !self.apply_pending(inv, index, &mut seg, None).await? {
            return Ok(());
        }
        if seg.done {
            return Ok(());
        }
        let mut delta: HashMap<ReelId, u64> = HashMap::new();
        let mut pages = 0u32;
        let mut unsaved = 0u32;
        loop {
            let page_limit = inv.opts.stop_after_pages.is_some_and(|max| pages >= max);
            // At least one page per invocation, however near its deadline:
            // every invocation moves the run on.
            if page_limit || (pages > 0 && near(inv.opts.deadline)) {
                if unsaved > 0 {
                    self.checkpoint_segment(inv, index, &mut seg, &mut delta)
                        .await?;
                }
                return Ok(());
            }
            let page = self.next_page(inv, ScanTable::Likes, index, &seg).await?;
            for r in page.reels {
                *delta.entry(r).or_default() += 1;
            }
            seg.rows += page.items;
            seg.young += page.young;
            seg.cursor = page.next;
            seg.done = seg.cursor.is_none();
            pages += 1;
            unsaved += 1;
            if seg.done
                || unsaved >= self.cfg.checkpoint_pages
                || delta.len() >= self.cfg.checkpoint_reels as usize
            {
                if !self
                    .checkpoint_segment(inv, index, &mut seg, &mut delta)
                    .await?
                {
                    return Ok(());
                }
                unsaved = 0;
            }
            if seg.done {
                return Ok(());
            }
        }
    }

    /// The next page of a segment of either scan, paid for in the read
    /// limiter and the run's statistics.
    pub(super) async fn next_page(
        &self,
        inv: &Inv<'_>,
        table: ScanTable,
        index: usize,
        seg: &Segment,
    ) -> Result<ScanPage, Error> {
        // The run's own segment count: RECONCILE_SEGMENTS may have changed
        // since the run started.
        let (total, rows_before_ms) = {
            let g = inv.run.lock().await;
            match table {
                ScanTable::Likes => (g.state.segments.len(), g.state.cut_ms),
                ScanTable::Counters => (g.state.counter_segments.len(), None),
            }
        };
        let page = self
            .store
            .scan_page(
                table,
                index as u32,
                total as u32,
                seg.cursor.as_deref(),
                self.cfg.page_items,
                rows_before_ms,
            )
            .await?;
        inv.reads.take(page.read_units).await;
        inv.run.lock().await.state.stats.scan_read_units += page.read_units;
        Ok(page)
    }

    /// Checkpoint `seq + 1` of a segment: the rows counted since the last
    /// one go to chunk items keyed by this invocation (no other
    /// invocation's chunks are ever overwritten), then the cursor and the
    /// pending mark are committed in one conditional write of the run state
    /// (a crash in between leaves the previous checkpoint whole), then the
    /// counts are added to the count items. Returns `false` if the deadline
    /// came while adding them (what was added is committed).
    async fn checkpoint_segment(
        &self,
        inv: &Inv<'_>,
        index: usize,
        seg: &mut Segment,
        delta: &mut HashMap<ReelId, u64>,
    ) -> Result<bool, Error> {
        let (run_id, owner, dry) = {
            let g = inv.run.lock().await;
            (
                g.state.run_id.clone(),
                g.state.lease_owner.clone(),
                g.state.dry_run,
            )
        };
        let mut written = None;
        let lines = delta.len() as u64;
        if dry {
            let mut all = inv.dry_counts.lock().await;
            for (r, n) in delta.drain() {
                *all.entry(r).or_default() += n;
            }
        } else if !delta.is_empty() {
            let seq = seg.seq + 1;
            let chunks = encode_counts(delta);
            let expires = now_ms() / 1000 + CHUNK_TTL_SECS;
            let name = part_name(index, seq, &owner);
            for (i, data) in chunks.iter().enumerate() {
                inv.writes.take(write_units(data.len())).await;
                let key = keys::reconcile_chunk_key(&run_id, &name, i as u32);
                self.store.put_chunk(&key, data, expires).await?;
                let stats = &mut inv.run.lock().await.state.stats;
                stats.largest_item_bytes = stats.largest_item_bytes.max(data.len() as u64);
            }
            seg.seq = seq;
            seg.pending = Some(Pending {
                seq,
                owner,
                chunks: chunks.len() as u32,
                applied: 0,
            });
            delta.clear();
            written = Some(chunks);
        }
        {
            let mut g = inv.run.lock().await;
            g.state.segments[index] = seg.clone();
            g.state.stats.rows_scanned = g.state.segments.iter().map(|s| s.rows).sum();
            g.state.stats.rows_after_cut = g.state.segments.iter().map(|s| s.young).sum();
            g.state.stats.checkpoints += 1;
            g.state.stats.count_lines += written.as_ref().map_or(0, |_| lines);
        }
        self.commit(inv).await?;
        match written {
            Some(chunks) => self.apply_pending(inv, index, seg, Some(chunks)).await,
            None => Ok(true),
        }
    }

    /// Adds the segment's pending checkpoint to the count items, from
    /// `chunks` (as just written) or from its stored chunks, skipping what
    /// was already recorded as added. At the deadline it commits how far it
    /// got and returns `false`; done, it clears the mark (committed with the
    /// next commit) and returns `true`.
    async fn apply_pending(
        &self,
        inv: &Inv<'_>,
        index: usize,
        seg: &mut Segment,
        chunks: Option<Vec<Vec<u8>>>,
    ) -> Result<bool, Error> {
        let Some(pending) = seg.pending.clone() else {
            return Ok(true);
        };
        let run_id = inv.run.lock().await.state.run_id.clone();
        let chunks = match chunks {
            Some(c) => c,
            None => {
                let name = part_name(index, pending.seq, &pending.owner);
                let mut out = Vec::with_capacity(pending.chunks as usize);
                for i in 0..pending.chunks {
                    let key = keys::reconcile_chunk_key(&run_id, &name, i);
                    let data = self.store.get_chunk(&key).await?.ok_or_else(|| {
                        Error::internal("a committed checkpoint chunk is missing", &key)
                    })?;
                    inv.reads.take(read_units(data.len())).await;
                    out.push(data);
                }
                out
            }
        };
        let mut lines = Vec::new();
        for c in &chunks {
            decode_counts(c, &mut lines)?;
        }
        let expires = now_ms() / 1000 + CHUNK_TTL_SECS;
        // A count item holds two small numbers per segment.
        let units = write_units(64 + 24 * inv.run.lock().await.state.segments.len());
        let mut applied = (pending.applied as usize).min(lines.len());
        let mut first = true;
        while applied < lines.len() {
            if !first && near(inv.opts.deadline) {
                if let Some(p) = seg.pending.as_mut() {
                    p.applied = applied as u64;
                }
                inv.run.lock().await.state.segments[index] = seg.clone();
                self.commit(inv).await?;
                return Ok(false);
            }
            first = false;
            let batch = &lines[applied..(applied + APPLY_BATCH).min(lines.len())];
            let run_id = &run_id;
            let tasks: Vec<Task<'_, Result<(), Error>>> = batch
                .iter()
                .map(|(reel, rows)| {
                    Box::pin(async move {
                        inv.writes.take(units).await;
                        self.store
                            .add_run_count(run_id, reel, index as u32, pending.seq, *rows, expires)
                            .await
                    }) as Task<'_, _>
                })
                .collect();
            let results: Vec<Result<(), Error>> = futures::stream::iter(tasks)
                .buffer_unordered(CHECK_CONCURRENCY)
                .collect()
                .await;
            for r in results {
                r?;
            }
            applied += batch.len();
            inv.run.lock().await.state.stats.count_writes += batch.len() as u64;
        }
        seg.pending = None;
        inv.run.lock().await.state.segments[index] = seg.clone();
        Ok(true)
    }
}
