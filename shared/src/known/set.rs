//! The set as an instance holds it: the segments as loaded, sorted, and the
//! fingerprints learned since (registrations read, and this instance's
//! own), merged into the segments in batches so that memory stays about
//! 4 bytes a reel.

use crate::keys::known::SEGMENTS;
#[cfg(test)]
use crate::keys::known::{decode_fps, encode_fps};
use std::collections::HashSet;

/// Fingerprints learned since the last merge, before they are merged.
const MERGE_AT: usize = 4096;

/// A set of fingerprints ([`crate::keys::known::fingerprint`]).
#[derive(Clone, Debug)]
pub struct FpSet {
    segments: Vec<Vec<u32>>,
    recent: HashSet<(usize, u32)>,
}

impl Default for FpSet {
    fn default() -> Self {
        FpSet {
            segments: vec![Vec::new(); SEGMENTS],
            recent: HashSet::new(),
        }
    }
}

impl FpSet {
    /// Whether the set holds `fp`.
    pub fn contains(&self, fp: (usize, u32)) -> bool {
        self.recent.contains(&fp)
            || self
                .segments
                .get(fp.0)
                .is_some_and(|s| s.binary_search(&fp.1).is_ok())
    }

    /// Adds `fp`.
    pub fn insert(&mut self, fp: (usize, u32)) {
        if fp.0 >= SEGMENTS || self.contains(fp) {
            return;
        }
        self.recent.insert(fp);
        if self.recent.len() >= MERGE_AT {
            self.merge();
        }
    }

    /// Replaces segment `index` by `fps` (sorted, as stored), keeping what
    /// was learned since.
    pub fn set_segment(&mut self, index: usize, fps: Vec<u32>) {
        if let Some(s) = self.segments.get_mut(index) {
            *s = fps;
        }
    }

    /// Fingerprints held.
    pub fn len(&self) -> usize {
        self.segments.iter().map(Vec::len).sum::<usize>() + self.recent.len()
    }

    /// Whether the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn merge(&mut self) {
        let mut by_segment: Vec<Vec<u32>> = vec![Vec::new(); SEGMENTS];
        for (s, f) in self.recent.drain() {
            by_segment[s].push(f);
        }
        for (s, add) in by_segment.into_iter().enumerate() {
            if !add.is_empty() {
                merge_sorted(&mut self.segments[s], add);
            }
        }
    }
}

/// Adds `add` to the sorted `into`, keeping it sorted and free of repeats:
/// how many were new.
pub fn merge_sorted(into: &mut Vec<u32>, mut add: Vec<u32>) -> usize {
    add.sort_unstable();
    add.dedup();
    add.retain(|f| into.binary_search(f).is_err());
    let n = add.len();
    if n > 0 {
        into.extend(add);
        into.sort_unstable();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_inserted_is_held_before_and_after_a_merge() {
        let mut s = FpSet::default();
        let fps: Vec<(usize, u32)> = (0..10_000u32)
            .map(|i| ((i as usize * 7) % SEGMENTS, i.wrapping_mul(2_654_435_761)))
            .collect();
        for &fp in &fps {
            s.insert(fp);
        }
        assert_eq!(s.len(), fps.len());
        assert!(fps.iter().all(|&fp| s.contains(fp)));
        assert!(!s.contains((3, 12345)));
        s.merge();
        assert!(fps.iter().all(|&fp| s.contains(fp)));
        assert!(s.segments.iter().all(|g| g.windows(2).all(|w| w[0] < w[1])));
    }

    #[test]
    fn segments_round_trip_and_bad_bytes_are_refused() {
        let mut v = vec![9, 3, 3, 7];
        assert_eq!(merge_sorted(&mut Vec::new(), v.clone()), 3);
        let mut into = vec![1, 5];
        assert_eq!(merge_sorted(&mut into, std::mem::take(&mut v)), 3);
        assert_eq!(into, vec![1, 3, 5, 7, 9]);
        assert_eq!(decode_fps(&encode_fps(&into)), Some(into));
        assert_eq!(decode_fps(&[0, 0, 1]), None);
        assert_eq!(decode_fps(&encode_fps(&[5, 1])), None);
    }
}
