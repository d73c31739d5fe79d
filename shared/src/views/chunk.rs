//! A batch's records as the views aggregator applies them: cut into parts
//! of at most [`PART_REELS`] reels (each with a sequence number of its
//! own), and the parts into chunks whose transactions stay within
//! DynamoDB's item limit (see [`super::aggregate`]).

use super::record::{LogRecord, ViewRecord};
use crate::aggregate::core::{CutChunk, Sequenced};
use crate::aggregate::records::SequenceNumber;
use crate::keys::{self, ReelId, window};
use crate::store::ViewChunkWrite;
use crate::token::RequestToken;
use std::collections::{BTreeMap, BTreeSet};

/// Reels one part of a record carries (see the module notes): two items
/// each, plus the checkpoint, the seen item and a trending sketch's two
/// `top#` items, stay within a transaction.
pub const PART_REELS: usize = 40;

/// Items one chunk's transaction may write.
const MAX_ITEMS: usize = keys::MAX_TRANSACT_ITEMS as usize;

/// Items of a chunk's transaction besides its view items: the checkpoint,
/// the seen item, and the two `top#` items of a trending sketch's new hour
/// ([`crate::trending`]).
const OTHER_ITEMS: usize = 4;

/// Records one chunk may apply: bounds its seen item (8 bytes a record).
const MAX_CHUNK_RECORDS: usize = 2_000;

/// A view item of a reel: all time (`None`) or of a UTC day.
pub(super) type ItemOf = (ReelId, Option<String>);

/// One part of one record (see the module notes).
#[derive(Clone, Debug)]
pub struct Part {
    /// The record's sequence number × 100 + the part.
    pub(super) seq: SequenceNumber,
    /// When Kinesis accepted the record (Unix ms).
    pub(super) arrival_ms: i64,
    /// The event id of this part: its record's, mixed with the part.
    pub(super) id: Option<u64>,
    /// The viewer.
    pub(super) viewer: String,
    /// The UTC day it counts in.
    pub(super) day: String,
    /// When it was viewed (Unix ms): its day, and its windowed-count
    /// buckets.
    pub(super) at_ms: i64,
    /// Views by reel.
    pub(super) views: Vec<(ReelId, u32)>,
}

impl Sequenced for Part {
    fn seq(&self) -> &SequenceNumber {
        &self.seq
    }
}

/// The parts of the records, in order.
pub(super) fn parts(records: &[LogRecord]) -> Vec<Part> {
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let base = r.seq.as_reported();
        let Some(body) = &r.body else {
            // Unreadable data: applied as nothing (it moves the checkpoint).
            out.extend(part_seq(base, 0).map(|seq| Part {
                seq,
                arrival_ms: r.arrival_ms,
                id: None,
                viewer: String::new(),
                day: String::new(),
                at_ms: r.arrival_ms,
                views: Vec::new(),
            }));
            continue;
        };
        let ViewRecord {
            id,
            viewer,
            at_ms,
            views,
        } = body;
        for (i, group) in views.chunks(PART_REELS).enumerate() {
            let Some(seq) = part_seq(base, i) else {
                continue;
            };
            out.push(Part {
                seq,
                arrival_ms: r.arrival_ms,
                id: Some(mix(*id, i as u64)),
                viewer: viewer.clone(),
                day: keys::utc_day(*at_ms),
                at_ms: *at_ms,
                views: group.to_vec(),
            });
        }
    }
    out
}

fn part_seq(base: &str, part: usize) -> Option<SequenceNumber> {
    SequenceNumber::parse_kinesis(&format!("{base}{part:02}"))
        .or_else(|| SequenceNumber::parse(&format!("{base}{part:02}")))
}

/// The record sequence number behind a part's (Lambda's `itemIdentifier`).
pub(super) fn record_seq(part_seq: &str) -> String {
    let trimmed = &part_seq[..part_seq.len().saturating_sub(2)];
    if trimmed.is_empty() {
        "0".into()
    } else {
        trimmed.to_owned()
    }
}

/// A part's event id: the record's for its first part, a distinct mix for
/// the others (a record's parts are not copies of each other).
fn mix(id: u64, part: u64) -> u64 {
    if part == 0 {
        return id;
    }
    let mut z = id ^ part.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Consecutive parts applied by one transaction.
#[derive(Clone, Debug)]
pub struct ViewChunk {
    pub(super) parts: Vec<Part>,
}

impl CutChunk for ViewChunk {
    fn first(&self) -> &SequenceNumber {
        &self.parts[0].seq
    }
    fn last(&self) -> &SequenceNumber {
        &self.parts[self.parts.len() - 1].seq
    }
    fn records(&self) -> usize {
        self.parts.len()
    }
    fn newest_ms(&self) -> Option<i64> {
        self.parts.iter().map(|p| p.arrival_ms).max()
    }
}

/// Cuts parts into chunks whose transactions stay within DynamoDB's item
/// limit; depends only on the parts, so a redelivery cuts alike.
/// Views and viewers per item of a chunk's counted parts: (reel, None) all
/// time, (reel, day) its day; and each day item's windowed-count buckets
/// of the last hour and day ([`crate::keys::window`]; the day's own is
/// the item's views), by when each view was made, as kept at `now_ms`.
#[allow(clippy::type_complexity)]
pub(super) fn item_groups<'a>(
    parts: &[&'a Part],
    counted: &[Vec<(ReelId, u32)>],
    now_ms: i64,
) -> (
    BTreeMap<ItemOf, (u64, Vec<&'a str>)>,
    BTreeMap<ItemOf, BTreeMap<String, i64>>,
) {
    let mut groups: BTreeMap<ItemOf, (u64, Vec<&str>)> = BTreeMap::new();
    let mut windows: BTreeMap<ItemOf, BTreeMap<String, i64>> = BTreeMap::new();
    for (p, counted) in parts.iter().zip(counted) {
        for (reel, n) in counted {
            for day in [None, Some(p.day.clone())] {
                let g = groups.entry((reel.clone(), day)).or_default();
                g.0 += u64::from(*n);
                g.1.push(p.viewer.as_str());
            }
            let w = windows
                .entry((reel.clone(), Some(p.day.clone())))
                .or_default();
            for name in window::buckets_of(p.at_ms, now_ms) {
                if window::parse_attr(&name).is_some_and(|(g, _)| g != window::Grain::Day) {
                    *w.entry(name).or_default() += i64::from(*n);
                }
            }
        }
    }
    (groups, windows)
}

/// The `ClientRequestToken` of `write`: derived from everything it sends
/// (one token never names two bodies; see `crate::aggregate::chunk`).
pub(super) fn write_token(write: &ViewChunkWrite) -> RequestToken {
    use sha2::{Digest, Sha256};
    let ViewChunkWrite {
        checkpoint_key,
        shard_id,
        expected,
        next,
        checkpoint_expires_at,
        seen_key,
        seen_sort,
        seen_ids,
        seen_usage,
        seen_expires_at,
        items,
        sketch,
        window_prune,
        records,
        now_ms,
        token: _,
    } = write;
    let mut h = Sha256::new();
    for id in seen_ids {
        h.update(id.to_be_bytes());
    }
    h.update((seen_usage.len() as u64).to_be_bytes());
    h.update(seen_usage);
    for i in items {
        for f in [&i.pk, &i.sk, i.day.as_deref().unwrap_or("-")] {
            h.update((f.len() as u64).to_be_bytes());
            h.update(f.as_bytes());
        }
        h.update(i.views.to_be_bytes());
        h.update(i.expires_at.unwrap_or(-1).to_be_bytes());
        h.update((i.sketch.len() as u64).to_be_bytes());
        h.update(&i.sketch);
        for (name, v) in &i.windows {
            h.update((name.len() as u64).to_be_bytes());
            h.update(name.as_bytes());
            h.update(v.to_be_bytes());
        }
        h.update(u64::MAX.to_be_bytes());
    }
    for name in window_prune {
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
    }
    // The sketch, when the chunk writes it.
    if let Some(s) = sketch.as_ref().filter(|s| s.write) {
        let step = &s.step;
        h.update(step.current.hour.to_be_bytes());
        h.update((step.current.bytes.len() as u64).to_be_bytes());
        h.update(&step.current.bytes);
        h.update([u8::from(step.opened)]);
        if let Some(f) = &step.finished {
            h.update(f.hour.to_be_bytes());
            h.update((f.bytes.len() as u64).to_be_bytes());
            h.update(&f.bytes);
        }
    }
    let body: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    RequestToken::for_fields(
        "views/v3",
        &[
            checkpoint_key,
            shard_id,
            expected.as_deref().unwrap_or("-"),
            next,
            &checkpoint_expires_at.to_string(),
            seen_key,
            seen_sort,
            &seen_expires_at.to_string(),
            &records.to_string(),
            &now_ms.to_string(),
            &body,
        ],
    )
}

#[cfg(test)]
pub(super) fn cut(parts: &[Part]) -> Vec<ViewChunk> {
    cut_with(parts, |_| false)
}

/// [`cut`], with the parts of viewers for whom `spent` holds taking no
/// item: their minute's allowance is certainly used up, so the chunk's
/// plan counts nothing of them (see `super::bound`). A `spent` that is
/// wrong the other way (a viewer who still has allowance) would let a
/// chunk's plan exceed the item limit, so it must only ever say so of a
/// viewer whom every chunk of the batch finds spent.
pub(super) fn cut_with(parts: &[Part], spent: impl Fn(&str) -> bool) -> Vec<ViewChunk> {
    let mut out: Vec<ViewChunk> = Vec::new();
    let mut items: BTreeSet<ItemOf> = BTreeSet::new();
    for p in parts {
        let all: Vec<ItemOf> = if spent(&p.viewer) {
            Vec::new()
        } else {
            p.views
                .iter()
                .flat_map(|(r, _)| [(r.clone(), None), (r.clone(), Some(p.day.clone()))])
                .collect()
        };
        let new: Vec<ItemOf> = all.iter().filter(|k| !items.contains(k)).cloned().collect();
        let fits = out.last().is_some_and(|c| {
            c.parts.len() < MAX_CHUNK_RECORDS && OTHER_ITEMS + items.len() + new.len() <= MAX_ITEMS
        });
        if fits {
            items.extend(new);
            if let Some(c) = out.last_mut() {
                c.parts.push(p.clone());
            }
        } else {
            items = all.into_iter().collect();
            out.push(ViewChunk {
                parts: vec![p.clone()],
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_record(seq: &str, id: u64, reels: usize) -> LogRecord {
        LogRecord {
            seq: SequenceNumber::parse_kinesis(seq).unwrap(),
            arrival_ms: 1_000,
            body: Some(ViewRecord {
                id,
                viewer: "u".into(),
                at_ms: 1_700_000_000_000,
                views: (0..reels)
                    .map(|i| (ReelId::parse(&format!("r{i}")).unwrap(), 1))
                    .collect(),
            }),
        }
    }

    #[test]
    fn a_record_of_100_reels_is_applied_in_parts_that_fit_a_transaction() {
        let ps = parts(&[log_record("7", 1, 100), log_record("8", 2, 1)]);
        let seqs: Vec<&str> = ps.iter().map(|p| p.seq.as_reported()).collect();
        assert_eq!(seqs, ["700", "701", "702", "800"]);
        assert_eq!(ps[0].id, Some(1));
        assert_ne!(ps[1].id, Some(1));
        assert_ne!(ps[1].id, ps[2].id);
        let chunks = cut(&ps);
        for c in &chunks {
            let reels: BTreeSet<&ReelId> = c
                .parts
                .iter()
                .flat_map(|p| p.views.iter().map(|(r, _)| r))
                .collect();
            assert!(2 + 2 * reels.len() <= MAX_ITEMS, "{}", reels.len());
        }
        assert_eq!(chunks.iter().map(|c| c.parts.len()).sum::<usize>(), 4);
        assert_eq!(record_seq("701"), "7");
        assert_eq!(record_seq("00"), "0");
    }

    #[test]
    fn unreadable_records_take_a_part_that_counts_nothing() {
        let mut r = log_record("9", 1, 1);
        r.body = None;
        let ps = parts(&[r]);
        assert_eq!(ps.len(), 1);
        assert!(ps[0].views.is_empty() && ps[0].id.is_none());
    }
}
