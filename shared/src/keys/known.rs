//! The known-reels set's items in the views table ([`crate::known`]): which
//! reels have ever had a like or a view counted, so that a read of a reel
//! that has none costs no read of its own.
//!
//! A reel is known by a fingerprint of its id: 64 bits of its SHA-256,
//! whose top 8 bits pick one of [`SEGMENTS`] segments and whose next 32
//! bits are what the segment holds. Two reels share a fingerprint with a
//! chance of one in 2³² per segment member, which only ever costs the read
//! a never-counted reel would have had anyway.
//!
//! * `x~set`, sort key `s{segment:03}`: a segment, its fingerprints sorted
//!   (4 bytes each, big-endian, attribute [`SEGMENT_FPS_ATTR`]) and the
//!   registration time up to which it holds every registration
//!   ([`SEGMENT_TO_ATTR`]). Written only by the fold.
//! * `x~set`, sort key [`META_SORT`]: whether the set is complete (the
//!   backfill of reels counted before registrations began is done) and the
//!   backfill's progress.
//! * `x~new#{minute}`, sort key `{ms:013}#{reel}`: a registration, put by
//!   the writer that first counts a reel the set does not hold, kept by TTL
//!   for [`REGISTRATION_TTL_SECS`]; instances read the recent ones, the
//!   fold merges them into the segments.

use sha2::{Digest, Sha256};

/// Segments of the set: each holds the reels whose fingerprint starts with
/// its number, at most [`SEGMENT_MAX_FPS`].
pub const SEGMENTS: usize = 256;

/// The partition of the segments and the meta item.
pub const SET_KEY: &str = "x~set";

/// The meta item's sort key (after every segment's).
pub const META_SORT: &str = "~meta";

/// A segment's fingerprints, sorted, 4 bytes each.
pub const SEGMENT_FPS_ATTR: &str = "f";

/// A segment holds every registration whose time is before this (Unix ms).
pub const SEGMENT_TO_ATTR: &str = "to";

/// Fingerprints one segment item holds at most: 4 bytes each within
/// DynamoDB's 400 KB item limit, with room for the key and attributes.
/// 256 segments × 98,000: about 25 million reels. Past it the fold stops
/// merging into the full segment, and the set is no longer complete
/// (reads read every reel, as without the set).
pub const SEGMENT_MAX_FPS: usize = 98_000;

/// How long a registration is kept: the fold must have merged it by then,
/// or the set is no longer complete (instances stop trusting it).
pub const REGISTRATION_TTL_SECS: i64 = 86_400;

/// A reel's fingerprint: its segment and the 32 bits the segment holds.
pub fn fingerprint(reel: &str) -> (usize, u32) {
    let d = Sha256::digest(reel.as_bytes());
    (
        usize::from(d[0]),
        u32::from_be_bytes([d[1], d[2], d[3], d[4]]),
    )
}

/// A segment's sort key.
pub fn segment_sort(segment: usize) -> String {
    format!("s{segment:03}")
}

/// The segment a sort key names, if it is one.
pub fn parse_segment_sort(sk: &str) -> Option<usize> {
    let n: usize = sk.strip_prefix('s')?.parse().ok()?;
    (n < SEGMENTS && sk.len() == 4).then_some(n)
}

/// The partition of the registrations put in `minute` (Unix ms / 60,000).
pub fn registrations_key(minute: i64) -> String {
    format!("x~new#{minute}")
}

/// A registration's sort key: its time, then the reel.
pub fn registration_sort(at_ms: i64, reel: &str) -> String {
    format!("{at_ms:013}#{reel}")
}

/// The first sort key at or after `from_ms`.
pub fn registrations_from(from_ms: i64) -> String {
    format!("{:013}#", from_ms.max(0))
}

/// A registration's time and reel.
pub fn parse_registration_sort(sk: &str) -> Option<(i64, &str)> {
    let (at, reel) = sk.split_once('#')?;
    Some((at.parse().ok()?, reel))
}

/// The reel a views-table partition key counts for: a reel's views
/// (`v#{reel}`) or stream mode's writer items of its likes (`l#{reel}`,
/// `l#{reel}#{part}`); none for any other item.
pub fn reel_of_views_key(pk: &str) -> Option<super::ReelId> {
    if let Some(reel) = pk.strip_prefix("v#") {
        return super::ReelId::parse(reel).ok();
    }
    super::parse_likes_writers_key(pk).map(|(reel, _)| reel)
}

/// A segment's fingerprints as stored: 4 bytes each, big-endian.
pub fn encode_fps(fps: &[u32]) -> Vec<u8> {
    fps.iter().flat_map(|f| f.to_be_bytes()).collect()
}

/// Inverse of [`encode_fps`]; `None` for a length that is no multiple of 4 or
/// fingerprints out of order (an item another release wrote).
pub fn decode_fps(bytes: &[u8]) -> Option<Vec<u32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let fps: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let sorted = fps.iter().zip(fps.iter().skip(1)).all(|(a, b)| a < b);
    sorted.then_some(fps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_pinned() {
        // A change would make every stored segment wrong: pinned.
        assert_eq!(fingerprint("reel-1"), fingerprint("reel-1"));
        let (s, f) = fingerprint("abc");
        // SHA-256("abc") = ba7816bf 8f01cfea ...
        assert_eq!((s, f), (0xba, 0x7816_bf8f));
    }

    #[test]
    fn sort_keys_round_trip() {
        assert_eq!(parse_segment_sort(&segment_sort(7)), Some(7));
        assert_eq!(parse_segment_sort(&segment_sort(255)), Some(255));
        assert_eq!(parse_segment_sort(META_SORT), None);
        assert_eq!(parse_segment_sort("s256"), None);
        let sk = registration_sort(1_700_000_000_123, "a#b");
        assert_eq!(
            parse_registration_sort(&sk),
            Some((1_700_000_000_123, "a#b"))
        );
        assert!(registrations_from(1_700_000_000_123).as_str() <= sk.as_str());
        assert!(registrations_from(1_700_000_000_124).as_str() > sk.as_str());
        assert!(META_SORT > segment_sort(255).as_str());
    }

    #[test]
    fn the_views_table_keys_that_name_a_reel() {
        let r = super::super::ReelId::parse("r-1").unwrap();
        for pk in [
            super::super::views_reel_key(&r),
            super::super::likes_writers_key(&r),
            super::super::likes_writers_part_key(&r, 3),
        ] {
            assert_eq!(reel_of_views_key(&pk), Some(r.clone()), "{pk}");
        }
        for pk in [
            SET_KEY.to_owned(),
            registrations_key(5),
            "l~spread".to_owned(),
        ] {
            assert_eq!(reel_of_views_key(&pk), None, "{pk}");
        }
    }
}
