//! The event ids a views aggregator instance knows were applied: the seen
//! items of the partitions it reads (its shard's, the shard's parents'),
//! read back incrementally and kept in memory, since a seen item never
//! changes once written (see [`super::aggregate`]'s producer retries).

use super::throttle::read_retrying;
use crate::error::Error;
use crate::keys;
use crate::retry::Backoff;
use crate::store::{ViewChunkWrite, ViewStore};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

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
    /// Ids, and the packed usage of each viewer ([`super::bound`]), by
    /// sort key.
    items: BTreeMap<String, (Vec<u64>, Vec<u8>)>,
    /// A parent shard's partition: closed, read once.
    closed: bool,
}

/// The seen partitions this instance read, by key.
#[derive(Default)]
pub(super) struct Seen(Mutex<HashMap<String, SeenCache>>);

impl Seen {
    /// The event ids applied in the seen partitions `keys` (`own`: this
    /// shard's, still written; the others are closed parents) by chunks
    /// whose records arrived at or after `from_ms`, those not known yet
    /// read from `store`, retried as `backoff` says while throttled.
    pub(super) async fn since<S: ViewStore>(
        &self,
        store: &S,
        backoff: &Backoff,
        keys: &[String],
        own: &str,
        from_ms: i64,
        deadline: Option<Instant>,
    ) -> Result<HashSet<u64>, Error> {
        let from = keys::views_seen_from(from_ms);
        let poisoned = || Error::internal("seen cache", "poisoned lock");
        let mut out = HashSet::new();
        for key in keys {
            // What to read: nothing (a closed parent read before), what was
            // written after the last item known, or the whole window.
            let after = {
                let seen = self.0.lock().map_err(|_| poisoned())?;
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
                let items =
                    read_retrying(backoff, deadline, "Query", || store.seen_after(key, &after))
                        .await?;
                let mut seen = self.0.lock().map_err(|_| poisoned())?;
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
                    c.items.insert(i.sort, (i.ids, i.usage));
                }
                c.closed = key != own;
            }
            let mut seen = self.0.lock().map_err(|_| poisoned())?;
            if let Some(c) = seen.get_mut(key) {
                // What fell out of the window is not asked for again (a
                // window starting earlier is read afresh).
                if c.read_from < from {
                    c.items = c.items.split_off(&from);
                    c.read_from = from.clone();
                }
                out.extend(c.items.values().flat_map(|(ids, _)| ids).copied());
            }
        }
        Ok(out)
    }

    /// What each viewer counted (views, reel entries), by
    /// [`super::bound::viewer_tag`], in the chunks of the seen partitions
    /// `keys` whose newest record arrived at or after `from_ms`, as this
    /// instance knows them: what [`Seen::since`] read for a window that
    /// covers `from_ms`. Deterministic in the items: every instance that
    /// read them decides the same.
    pub(super) fn usage(&self, keys: &[String], from_ms: i64) -> HashMap<u32, (u64, u64)> {
        let from = keys::views_seen_from(from_ms);
        let mut out: HashMap<u32, (u64, u64)> = HashMap::new();
        let Ok(seen) = self.0.lock() else {
            return out;
        };
        for key in keys {
            let Some(c) = seen.get(key) else { continue };
            for (_, usage) in c.items.range(from.clone()..).map(|(_, v)| v) {
                for u in super::bound::Usage::unpack(usage) {
                    let e = out.entry(u.viewer).or_default();
                    e.0 += u64::from(u.views);
                    e.1 += u64::from(u.reels);
                }
            }
        }
        out
    }

    /// Extends the partition `write` wrote its ids to by them, once
    /// `write` is applied.
    pub(super) fn applied(&self, write: &ViewChunkWrite) {
        if let Ok(mut seen) = self.0.lock() {
            // Only a partition read before is extended: one never read
            // is read whole when first asked for.
            if let Some(c) = seen.get_mut(&write.seen_key)
                && !c.known_to.is_empty()
            {
                c.items.insert(
                    write.seen_sort.clone(),
                    (write.seen_ids.clone(), write.seen_usage.clone()),
                );
                if write.seen_sort > c.known_to {
                    c.known_to = write.seen_sort.clone();
                }
            }
        }
    }
}
