//! Compaction: a reel's view items of writers that will never write again,
//! folded into the reel's base items, so that a read touches a bounded
//! number of items however long the reel lives.
//!
//! # Why
//!
//! Every writer that ever counted a reel keeps its own items in the reel's
//! partition (all-time, and one per day): every Kinesis shard, and an
//! on-demand stream makes about a dozen new shard ids a day, and every
//! repair. Unfolded, a year is thousands of all-time items per reel, a
//! dozen `Query` pages per uncached read.
//!
//! # Sealed writers
//!
//! A writer is **sealed** once it will never write again, recorded by a
//! seal item ([`keys::views_seal_key`], written once, no TTL):
//!
//! * a Kinesis shard, once an aggregator has applied a chunk of one of its
//!   children: Lambda (and the local event source) process a parent to its
//!   end before its children. The child's aggregator seals its ancestors,
//!   once per instance per shard ([`Compaction::seal_ancestors`]);
//! * a repair's writer, once the repair completed: invoked again, it
//!   counts nothing ([`super::repair`]).
//!
//! A seal is an optimisation, not a premise of exactness: a writer that
//! writes after its items were folded finds no item, and creates a new one
//! with its new views and viewers (`ADD` and a sketch read as empty), which
//! readers sum with the base. A transaction of it in flight across a fold
//! either changes the item's views before the fold lands (the fold is
//! cancelled) or lands after it and recreates the item with only its own
//! increment. So sums are exact whatever the seals say.
//!
//! # The fold
//!
//! One `TransactWriteItems` per fold ([`ViewFold`], at most 100 actions):
//! per family (all-time, or one day), the base item (`all#base`,
//! `d#{day}#base`) gets the folded items' views added and its sketch
//! replaced by the union of its own and theirs, conditioned on its fold
//! version as read (`fv`, or its absence); each folded item is deleted,
//! conditioned on its views as read (every write of a writer adds at least
//! one view, so its sketch is as read too). A crash leaves the whole fold
//! or none of it; of two concurrent folds the second is cancelled and
//! reads again; a lost answer retried with the same token lands once, and
//! a fold read again finds the items gone. The views summed and the union
//! of the sketches are the same before and after.
//!
//! # When, and what it costs
//!
//! When an aggregator creates its own all-time item of a reel (its first
//! chunk for the reel: a new writer), the reel is queued; after the batch,
//! the instance folds at most [`FOLD_REELS_PER_BATCH`] queued reels, each
//! with one consistent read of the reel's all-time items and its day items
//! of the read window ([`super::read::WINDOW_DAYS`]; two `Query` calls, as
//! a reader's), one `BatchGetItem` of the writers' seals, and a
//! transaction if any is sealed. So per (reel, new writer): one read of
//! the partition, one BatchGet, maybe one transaction. A repair's chunks
//! queue their reels the same way, folded by the instance's next batch. A fold that fails, is throttled or does not fit in the
//! batch's time is skipped and counted (`ViewFoldsSkipped`), never failing
//! the batch: the sums are right either way, and the next new writer of
//! the reel folds what is left. A read then touches the live writers'
//! items, the base, and the writers sealed since the reel's last new
//! writer.

use super::read::WINDOW_DAYS;
use super::sketch::union_sketch;
use crate::error::Error;
use crate::keys;
use crate::store::{ViewFold, ViewFoldFamily, ViewFoldItem, ViewFoldResult, ViewStore};
use crate::token::RequestToken;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;

/// Reels one batch's invocation folds at most, after its chunks: a bound
/// on the time a batch spends on compaction (a few reads and a transaction
/// each).
pub const FOLD_REELS_PER_BATCH: usize = 8;

/// Reels an instance keeps queued for folding at most; past it a reel is
/// left for its next new writer (counted as skipped).
const QUEUE_MAX: usize = 1_000;

/// Reads of one reel at most per turn: a second reads again after a
/// concurrent fold or write changed (or held) what the first read.
const READS_PER_REEL: u32 = 2;

/// The views aggregator's metrics (flushed by its entry point).
fn metrics() -> crate::metrics::Record {
    crate::metrics::Record::of("aggregate-views")
}

/// What compacting one reel did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Fold transactions that landed.
    pub folds: u64,
    /// Writers' items folded (and deleted) by them.
    pub items: u64,
}

/// An aggregator instance's compaction state: the shards whose ancestors
/// it sealed, and the reels queued for folding.
#[derive(Debug, Default)]
pub struct Compaction {
    sealed_for: Mutex<HashSet<String>>,
    queue: Mutex<BTreeSet<String>>,
}

impl Compaction {
    /// Seals `ancestors` (the writers of the shards a shard was split or
    /// merged from, and theirs: see the module notes), once per instance
    /// per shard (`shard_key`, its checkpoint key). A failure is logged and
    /// tried again next batch.
    pub async fn seal_ancestors<S: ViewStore>(
        &self,
        store: &S,
        shard_key: &str,
        ancestors: &[String],
        now_ms: i64,
    ) {
        let done = |s: &Self| s.sealed_for.lock().map_or(true, |d| d.contains(shard_key));
        if ancestors.is_empty() || done(self) {
            return;
        }
        for writer in ancestors {
            if let Err(e) = store.seal(writer, now_ms).await {
                tracing::warn!(error = %e, writer, "could not seal a parent shard's writer; trying again next batch");
                return;
            }
        }
        if let Ok(mut d) = self.sealed_for.lock() {
            d.insert(shard_key.to_owned());
        }
    }

    /// Queues the reels (partition keys) a chunk created its writer's
    /// first item of.
    pub fn queue(&self, reels: impl IntoIterator<Item = String>) {
        let Ok(mut q) = self.queue.lock() else {
            return;
        };
        let mut dropped = 0;
        for pk in reels {
            if q.len() < QUEUE_MAX {
                q.insert(pk);
            } else if !q.contains(&pk) {
                dropped += 1;
            }
        }
        metrics().count("ViewFoldsSkipped", dropped);
    }

    /// Takes up to `n` queued reels.
    fn take(&self, n: usize) -> Vec<String> {
        let Ok(mut q) = self.queue.lock() else {
            return Vec::new();
        };
        let out: Vec<String> = q.iter().take(n).cloned().collect();
        for pk in &out {
            q.remove(pk);
        }
        out
    }

    /// Folds up to [`FOLD_REELS_PER_BATCH`] queued reels while `time_left`
    /// says there is time; failures are skipped and counted.
    pub async fn run<S: ViewStore>(
        &self,
        store: &S,
        live: &str,
        now_ms: i64,
        time_left: impl Fn() -> bool,
    ) -> Compacted {
        let mut total = Compacted::default();
        let mut due = self.take(FOLD_REELS_PER_BATCH).into_iter();
        while let Some(pk) = due.next() {
            if !time_left() {
                // Left for this instance's next batch.
                self.queue(std::iter::once(pk).chain(due));
                break;
            }
            match fold_reel(store, &pk, Some(live), now_ms).await {
                Ok(c) => {
                    total.folds += c.folds;
                    total.items += c.items;
                }
                Err(e) => {
                    metrics().count("ViewFoldsSkipped", 1);
                    tracing::warn!(error = %e, reel = pk, "compaction of a reel's views skipped");
                }
            }
        }
        total
    }
}

/// Folds the items of `pk`'s sealed writers (not `live`'s) into its base
/// items, reading again once if a concurrent fold or write came first
/// (see the module notes). `Err`: a read failed or a fold was refused for
/// now; nothing is lost, the rest is folded another time.
pub async fn fold_reel<S: ViewStore>(
    store: &S,
    pk: &str,
    live: Option<&str>,
    now_ms: i64,
) -> Result<Compacted, Error> {
    let today = keys::utc_day(now_ms);
    let first = keys::utc_day(now_ms - (WINDOW_DAYS - 1) * 86_400_000);
    let (from, to) = keys::views_day_range(&first, &today);
    let mut done = Compacted::default();
    let mut retry = false;
    for _ in 0..READS_PER_REEL {
        retry = false;
        let items = store.fold_items(pk, (&from, &to)).await?;
        let writers: BTreeSet<String> = items
            .iter()
            .filter_map(|i| keys::parse_views_sort(&i.sk).map(|(_, w)| w))
            .filter(|w| *w != keys::VIEWS_BASE_WRITER && Some(*w) != live)
            .map(str::to_owned)
            .collect();
        if writers.is_empty() {
            break;
        }
        let sealed: HashSet<String> = store
            .sealed(&writers.into_iter().collect::<Vec<_>>())
            .await?
            .into_iter()
            .collect();
        let folds = plan(pk, &items, &sealed, now_ms);
        if folds.is_empty() {
            break;
        }
        let mut changed = false;
        for fold in &folds {
            match store.fold_views(fold).await? {
                ViewFoldResult::Folded => {
                    let items: usize = fold.families.iter().map(|f| f.folded.len()).sum();
                    done.folds += 1;
                    done.items += items as u64;
                    metrics().count("ViewFolds", 1);
                    metrics().count("ViewItemsFolded", items as u64);
                }
                ViewFoldResult::Changed => {
                    changed = true;
                    break;
                }
                // Throttled, or in conflict with another transaction on
                // these items (most likely another fold): read again.
                ViewFoldResult::Retry => {
                    retry = true;
                    break;
                }
            }
        }
        if !changed && !retry {
            return Ok(done);
        }
    }
    if retry {
        return Err(Error::Throttled);
    }
    Ok(done)
}

/// The folds that move the items of `sealed` writers among `items` into
/// the base items, in the order they must land: a family with more items
/// than one transaction takes is folded in several, each expecting the
/// version the one before leaves.
pub fn plan(
    pk: &str,
    items: &[ViewFoldItem],
    sealed: &HashSet<String>,
    now_ms: i64,
) -> Vec<ViewFold> {
    // Per family (None: all time; Some(day)), its base and its sealed items.
    type Family<'a> = (Option<&'a ViewFoldItem>, Vec<&'a ViewFoldItem>);
    let mut families: BTreeMap<Option<&str>, Family> = BTreeMap::new();
    for i in items {
        let Some((day, writer)) = keys::parse_views_sort(&i.sk) else {
            continue;
        };
        if writer == keys::VIEWS_BASE_WRITER {
            families.entry(day).or_default().0 = Some(i);
        } else if sealed.contains(writer) {
            families.entry(day).or_default().1.push(i);
        }
    }
    let max = keys::MAX_TRANSACT_ITEMS as usize;
    let mut groups: Vec<ViewFoldFamily> = Vec::new();
    for (day, (base, folded)) in families {
        if folded.is_empty() {
            continue;
        }
        let mut version = base.map(|b| b.version);
        let mut sketch = base.map(|b| b.sketch.clone()).unwrap_or_default();
        let mut expires = base.and_then(|b| b.expires_at);
        let base_sk = match day {
            None => keys::views_all_sort(keys::VIEWS_BASE_WRITER),
            Some(d) => keys::views_day_sort(d, keys::VIEWS_BASE_WRITER),
        };
        for part in folded.chunks(max - 1) {
            sketch = union_sketch(
                std::iter::once(sketch.as_slice()).chain(part.iter().map(|i| i.sketch.as_slice())),
            );
            expires = part
                .iter()
                .filter_map(|i| i.expires_at)
                .chain(expires)
                .max();
            let mut windows: BTreeMap<&str, i64> = BTreeMap::new();
            for (name, v) in part.iter().flat_map(|i| &i.windows) {
                if keys::window::parse_attr(name)
                    .is_some_and(|(g, start)| keys::window::is_kept(g, start, now_ms))
                {
                    *windows.entry(name).or_default() += v;
                }
            }
            groups.push(ViewFoldFamily {
                base_sk: base_sk.clone(),
                base_version: version,
                views: part.iter().map(|i| i.views).sum(),
                sketch: sketch.clone(),
                day: day.map(str::to_owned),
                expires_at: day.and(expires),
                folded: part.iter().map(|i| (i.sk.clone(), i.views)).collect(),
                windows: windows
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
            });
            // `ADD fv 1` on the base: 1 for a new one.
            version = Some(version.map_or(1, |v| v + 1));
        }
    }
    // Families packed into transactions in order, never two parts of one
    // family in one (one item, one action), never past `max` actions.
    let mut out: Vec<ViewFold> = Vec::new();
    let mut current: Vec<ViewFoldFamily> = Vec::new();
    for g in groups {
        let actions: usize = current.iter().map(|f| f.folded.len() + 1).sum();
        let same = current.iter().any(|f| f.base_sk == g.base_sk);
        if !current.is_empty() && (same || actions + g.folded.len() + 1 > max) {
            out.push(fold_of(pk, std::mem::take(&mut current), now_ms));
        }
        current.push(g);
    }
    if !current.is_empty() {
        out.push(fold_of(pk, current, now_ms));
    }
    out
}

/// A fold of `families`, with its token derived from all it sends.
fn fold_of(pk: &str, families: Vec<ViewFoldFamily>, now_ms: i64) -> ViewFold {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for f in &families {
        let version = f.base_version.map_or(-1, |v| v as i64);
        for field in [f.base_sk.as_str(), f.day.as_deref().unwrap_or("-")] {
            h.update((field.len() as u64).to_be_bytes());
            h.update(field.as_bytes());
        }
        h.update(version.to_be_bytes());
        h.update(f.views.to_be_bytes());
        h.update(f.expires_at.unwrap_or(-1).to_be_bytes());
        h.update((f.sketch.len() as u64).to_be_bytes());
        h.update(&f.sketch);
        for (sk, v) in &f.folded {
            h.update((sk.len() as u64).to_be_bytes());
            h.update(sk.as_bytes());
            h.update(v.to_be_bytes());
        }
        for (name, v) in &f.windows {
            h.update((name.len() as u64).to_be_bytes());
            h.update(name.as_bytes());
            h.update(v.to_be_bytes());
        }
    }
    let body: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    ViewFold {
        pk: pk.to_owned(),
        families,
        now_ms,
        token: RequestToken::for_fields("views-fold/v2", &[pk, &now_ms.to_string(), &body]),
    }
}

#[cfg(test)]
mod tests;
