//! Per-viewer bounds where views are counted: what one viewer's records
//! may add within a minute, however many function instances took its
//! batches.
//!
//! # Why here
//!
//! The view function's bounds (`super::limits`) live in one instance's
//! memory; on Lambda every concurrent request may be another instance, so
//! one account posting through 200 of them is bounded by nothing (issue 36
//! measured 200,000 views of one reel from one viewer in two requests).
//! The aggregator, though, sees every record of a viewer, in order, on one
//! shard (the partition key is the viewer), or on a child of it after a
//! reshard, whose aggregator reads its parents' seen items.
//!
//! # How, exactly once
//!
//! Each chunk's seen item (written in the chunk's transaction) also holds
//! what each viewer's parts in it counted: a 32-bit tag of the viewer, the
//! views and the reel entries ([`Usage`], 8 bytes a part). Before a chunk
//! is applied, what a viewer counted in the seen items of the last
//! [`WINDOW_MS`] (before the chunk's oldest record arrived) and in the
//! chunk's earlier parts is taken from its allowance: entries past
//! `VIEW_REELS_PER_VIEWER_MINUTE` are dropped, views past
//! `VIEWS_PER_VIEWER_MINUTE` cut. The decision depends only on what was
//! applied before the part (the seen items, which change only with the
//! views they record) and on the part's place in the shard's order, so a
//! batch handed over again, in any instance, decides the same. Dropped
//! views cost no write; they are counted in `ViewsOverViewerBound`.
//!
//! Two viewers whose tags collide (about one pair in 4 × 10⁹) share an
//! allowance; a viewer's records counted on another shard (none, unless
//! the log is resharded in between, and then its parents' items are read)
//! are not seen.

use super::chunk::Part;
use crate::keys::ReelId;
use std::collections::HashMap;

/// The window the bounds are per: a minute.
pub const WINDOW_MS: i64 = 60_000;

/// What one viewer may add within [`WINDOW_MS`] (see the module notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewerAllowance {
    /// `VIEWS_PER_VIEWER_MINUTE`: views counted.
    pub views: u32,
    /// `VIEW_REELS_PER_VIEWER_MINUTE`: reel entries counted (a reel named
    /// in two records counts twice): the aggregation work one viewer can
    /// cause.
    pub reels: u32,
}

/// What one part of a viewer's record counted, as a seen item keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// [`viewer_tag`] of the viewer.
    pub viewer: u32,
    /// Views counted (capped at `u16::MAX`; a part carries at most 40
    /// entries of at most 1,000 views).
    pub views: u16,
    /// Reel entries counted.
    pub reels: u16,
}

impl Usage {
    /// Bytes one usage takes in a seen item.
    pub const BYTES: usize = 8;

    /// Packs usages as 8 bytes each, big-endian.
    pub fn pack(all: &[Usage]) -> Vec<u8> {
        all.iter()
            .flat_map(|u| {
                let mut b = [0u8; 8];
                b[..4].copy_from_slice(&u.viewer.to_be_bytes());
                b[4..6].copy_from_slice(&u.views.to_be_bytes());
                b[6..].copy_from_slice(&u.reels.to_be_bytes());
                b
            })
            .collect()
    }

    /// The inverse of [`Usage::pack`]; a trailing partial entry is ignored.
    pub fn unpack(bytes: &[u8]) -> Vec<Usage> {
        bytes
            .chunks_exact(Self::BYTES)
            .map(|c| Usage {
                viewer: u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                views: u16::from_be_bytes([c[4], c[5]]),
                reels: u16::from_be_bytes([c[6], c[7]]),
            })
            .collect()
    }
}

/// A viewer's 32-bit tag: the first four bytes of SHA-256 over a domain
/// tag and the viewer's UTF-8 bytes. Stored in seen items, so pinned: a
/// change would reset every viewer's minute once, nothing worse.
pub fn viewer_tag(viewer: &str) -> u32 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"likes/viewer-bound/v1");
    h.update(viewer.as_bytes());
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// What a chunk's fresh parts count once bounded.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Bounded {
    /// Per part (in the order given), the views it counts, by reel.
    pub views: Vec<Vec<(ReelId, u32)>>,
    /// What each part counted, for the chunk's seen item (parts that
    /// counted nothing left out).
    pub usage: Vec<Usage>,
    /// Views dropped.
    pub dropped_views: u64,
}

/// Bounds `parts` (a chunk's fresh parts, in shard order), given what each
/// viewer counted in the window before them (`prior`, by tag: views,
/// entries).
pub fn bound(
    allowance: ViewerAllowance,
    prior: &HashMap<u32, (u64, u64)>,
    parts: &[&Part],
) -> Bounded {
    let mut used: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut out = Bounded::default();
    for p in parts {
        let tag = viewer_tag(&p.viewer);
        let (pv, pr) = prior.get(&tag).copied().unwrap_or((0, 0));
        let u = used.entry(tag).or_insert((pv, pr));
        let mut counted = Vec::with_capacity(p.views.len());
        let (mut views, mut reels) = (0u64, 0u64);
        for (reel, n) in &p.views {
            let views_left = u64::from(allowance.views).saturating_sub(u.0);
            let reels_left = u64::from(allowance.reels).saturating_sub(u.1);
            let take = if reels_left == 0 {
                0
            } else {
                u64::from(*n).min(views_left)
            };
            out.dropped_views += u64::from(*n) - take;
            if take > 0 {
                counted.push((reel.clone(), take as u32));
                u.0 += take;
                u.1 += 1;
                views += take;
                reels += 1;
            }
        }
        if views > 0 {
            out.usage.push(Usage {
                viewer: tag,
                views: views.min(u64::from(u16::MAX)) as u16,
                reels: reels.min(u64::from(u16::MAX)) as u16,
            });
        }
        out.views.push(counted);
    }
    out
}

#[cfg(test)]
mod tests;
