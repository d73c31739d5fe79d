//! What this instance knows of its stream shards' own-change tails
//! ([`crate::keys::tail`]): a chunk sets its writer items' maps whole, so
//! it must start from what they hold, without a read before every write.
//!
//! A stream shard's writer items are written by its chunks alone, one at a
//! time, each moving the shard's checkpoint. So while the checkpoint read
//! is the one this instance's last chunk moved it to, no one else wrote
//! them since, and the maps it set are what they hold ([`Tails::holds`],
//! as the trending sketch is kept: `trending::live`). An item it has not
//! written is read ([`crate::store::AggregateStore::writer_tails`]),
//! unless this instance has held the shard for longer than a map lives
//! (then nothing written before is still in the window). So reads happen
//! when Lambda hands a shard's batches to another instance, for the items
//! its first chunks write within `keep_ms` of that.

use crate::keys::ReelId;
use crate::keys::tail::TailWindow;
use crate::store::ChunkAdd;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Stream shards followed at most before the quiet ones are forgotten.
const MAX_SHARDS: usize = 1024;

/// One writer item of a stream shard: (reel, part).
pub type ItemId = (ReelId, u32);

/// Each stream shard's (by checkpoint key) tails as this instance knows
/// them.
#[derive(Debug, Default)]
pub struct Tails(Mutex<HashMap<String, Known>>);

#[derive(Debug, Default)]
struct Known {
    /// The checkpoint they go with.
    seq: Option<String>,
    /// When this instance began to follow the shard (its clock, Unix ms).
    since_ms: i64,
    /// The maps this instance set since, by item; an item left out has
    /// none in the window, if `since_ms` is old enough.
    items: HashMap<ItemId, BTreeMap<i64, i64>>,
}

/// What [`Tails::known`] can say of a chunk's items.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KnownTails {
    /// The maps of the items it knows (empty ones included).
    pub maps: HashMap<ItemId, BTreeMap<i64, i64>>,
    /// The items it does not know: to be read.
    pub unknown: Vec<ItemId>,
}

impl Tails {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether what this instance knows of `key`'s tails goes with the
    /// checkpoint `seq` just read.
    pub fn holds(&self, key: &str, seq: Option<&str>) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|k| k.seq.as_deref() == seq)
    }

    /// The checkpoint of `key` is `seq`, and another instance may have
    /// written since this one last did: it knows what it writes from
    /// `since_ms` on (0: the shard has written nothing yet, so every item
    /// is known to hold none).
    pub fn restart(
        &self,
        key: &str,
        seq: Option<&str>,
        since_ms: i64,
        window: &TailWindow,
        now_ms: i64,
    ) {
        let mut m = self.lock();
        if m.len() >= MAX_SHARDS {
            // Shards roll over every few hours, and Lambda hands them to
            // other instances: forget those with nothing left in the
            // window (followed again, their items are read as unknown).
            let from = window.kept_from(now_ms);
            m.retain(|_, k| {
                k.items
                    .values()
                    .any(|map| map.last_key_value().is_some_and(|(s, _)| *s >= from))
            });
        }
        m.insert(
            key.to_owned(),
            Known {
                seq: seq.map(str::to_owned),
                since_ms,
                items: HashMap::new(),
            },
        );
    }

    /// What `key`'s `items` hold now (`now_ms`), as far as this instance
    /// knows.
    pub fn known(
        &self,
        key: &str,
        items: &[ItemId],
        window: &TailWindow,
        now_ms: i64,
    ) -> KnownTails {
        let m = self.lock();
        let mut out = KnownTails::default();
        let Some(k) = m.get(key) else {
            out.unknown = items.to_vec();
            return out;
        };
        // A map written before this instance followed the shard holds
        // nothing a write now keeps: its entries are within the clock
        // skew after its write, and all older than the window.
        let outlived = k.since_ms + window.skew_ms + window.keep_ms + window.width_ms <= now_ms;
        for id in items {
            match k.items.get(id) {
                Some(map) => {
                    out.maps.insert(id.clone(), map.clone());
                }
                None if outlived => {
                    out.maps.insert(id.clone(), BTreeMap::new());
                }
                None => out.unknown.push(id.clone()),
            }
        }
        out
    }

    /// A chunk of `key` landed, moving its checkpoint to `next`: its items
    /// hold the maps it set. Maps the window has left are forgotten.
    pub fn applied(
        &self,
        key: &str,
        next: &str,
        adds: &[ChunkAdd],
        window: &TailWindow,
        now_ms: i64,
    ) {
        let mut m = self.lock();
        let k = m.entry(key.to_owned()).or_insert_with(|| Known {
            since_ms: now_ms,
            ..Known::default()
        });
        k.seq = Some(next.to_owned());
        for add in adds {
            if let Some(map) = &add.tail {
                k.items.insert((add.reel.clone(), add.part), map.clone());
            }
        }
        let from = window.kept_from(now_ms);
        k.items
            .retain(|_, map| map.last_key_value().is_some_and(|(s, _)| *s >= from));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> TailWindow {
        TailWindow::new(2000, 10_000, 5000)
    }

    fn id(reel: &str) -> ItemId {
        (ReelId::parse(reel).unwrap(), 0)
    }

    fn add(reel: &str, tail: Option<BTreeMap<i64, i64>>) -> ChunkAdd {
        ChunkAdd {
            reel: ReelId::parse(reel).unwrap(),
            part: 0,
            delta: 1,
            recent: Vec::new(),
            windows: Vec::new(),
            tail,
        }
    }

    #[test]
    fn a_shard_taken_over_is_read_until_its_old_maps_have_left_the_window() {
        let w = window();
        let t = Tails::default();
        // Never seen: everything is read.
        let k = t.known("k", &[id("a")], &w, 100_000);
        assert_eq!(k.unknown, [id("a")]);
        t.restart("k", Some("5"), 100_000, &w, 100_000);
        assert!(t.holds("k", Some("5")));
        assert!(!t.holds("k", Some("6")));
        assert_eq!(t.known("k", &[id("a")], &w, 110_000).unknown, [id("a")]);
        // What it wrote itself it knows; the rest, once older than skew
        // plus the window, holds nothing that counts.
        t.applied(
            "k",
            "7",
            &[
                add("b", Some(BTreeMap::from([(110_000, 2)]))),
                add("c", None),
            ],
            &w,
            110_000,
        );
        assert!(t.holds("k", Some("7")));
        let k = t.known("k", &[id("a"), id("b"), id("c")], &w, 110_500);
        assert_eq!(k.unknown, [id("a"), id("c")]);
        assert_eq!(k.maps[&id("b")], BTreeMap::from([(110_000, 2)]));
        let later = 100_000 + 5000 + 18_000 + 1000;
        let k = t.known("k", &[id("a"), id("b")], &w, later);
        assert!(k.unknown.is_empty());
        assert!(k.maps[&id("a")].is_empty());
        // A map the window has left is forgotten when the next chunk lands.
        t.applied("k", "8", &[], &w, 110_000 + 18_000 + 1000);
        let k = t.known("k", &[id("b")], &w, later + 10_000);
        assert!(k.maps[&id("b")].is_empty());
    }
}
