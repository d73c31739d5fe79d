//! Unique viewers: HyperLogLog sketches (Apache DataSketches' `datasketches`
//! crate, pinned), one per writer per reel per day and all time; readers
//! merge them (a union).
//!
//! # Why `lg_k = 12`, HLL_4
//!
//! A sketch of 2^12 registers estimates with a relative standard error of
//! about 1.04 / √4096 ≈ **1.6 %** ([`RELATIVE_STANDARD_ERROR`]) and
//! serializes as HLL_4 to 2,088 bytes when dense (a 40-byte header and
//! 2,048 bytes of 4-bit registers), plus 4 bytes for each register that
//! overflows its 4 bits: a handful in practice, not a bound the format
//! sets. Sparse sketches (few viewers) are smaller.
//! Each chunk a writer applies rewrites the sketch items it touches, and a
//! DynamoDB write costs a unit per KB in a transaction twice: 3 KB items cost
//! 6 units, where `lg_k = 14` (8,232 bytes and up, ≈ 0.8 %) would cost 18. The
//! product shows "about 1.2 M viewers"; halving an error nobody sees is not
//! worth tripling the write cost. The hash seed is the library's fixed
//! default, so sketches written by different invocations, writers and
//! versions of this code merge.

use datasketches::hll::{HllSketch, HllType, HllUnion};

/// log2 of the registers of every sketch written.
pub const LG_K: u8 = 12;

/// The relative standard error of an estimate, as the docs state it.
pub const RELATIVE_STANDARD_ERROR: f64 = 1.04 / 64.0;

/// One writer's sketch of a reel, to add viewers to.
pub struct Sketch(HllSketch);

impl Sketch {
    /// The sketch stored as `bytes`, or a new one if there are none (or
    /// they are not a sketch: logged, and the writer starts over rather
    /// than stop counting views).
    pub fn from_stored(bytes: &[u8]) -> Self {
        if !bytes.is_empty() {
            match HllSketch::deserialize(bytes) {
                Ok(s) => return Sketch(s),
                Err(e) => tracing::error!(error = %e, "unreadable HLL sketch; starting a new one"),
            }
        }
        Sketch::new()
    }

    /// An empty sketch.
    pub fn new() -> Self {
        // LG_K is within the library's 4..=21: this cannot fail.
        Sketch(HllSketch::new(LG_K, HllType::Hll4).unwrap_or_else(|_| unreachable!()))
    }

    /// Adds a viewer.
    pub fn add(&mut self, viewer: &str) {
        self.0.update(viewer);
    }

    /// The bytes stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.serialize()
    }
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch::new()
    }
}

/// The estimated number of distinct viewers in the union of `sketches`
/// (stored bytes; unreadable ones left out and logged).
pub fn union_estimate<'a>(sketches: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let Ok(mut union) = HllUnion::new(LG_K) else {
        return 0;
    };
    for bytes in sketches {
        if bytes.is_empty() {
            continue;
        }
        match HllSketch::deserialize(bytes) {
            Ok(s) => union.update(&s),
            Err(e) => tracing::error!(error = %e, "unreadable HLL sketch left out of a union"),
        }
    }
    if union.is_empty() {
        return 0;
    }
    union.estimate().round().max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeat_viewers_do_not_raise_the_estimate_and_writers_merge() {
        let mut a = Sketch::new();
        let mut b = Sketch::new();
        for i in 0..5_000 {
            a.add(&format!("user-{i}"));
            // b sees half of a's viewers again, and 5,000 of its own.
            if i % 2 == 0 {
                b.add(&format!("user-{i}"));
            }
            b.add(&format!("other-{i}"));
        }
        let (ab, bb) = (a.to_bytes(), b.to_bytes());
        let alone = union_estimate([ab.as_slice()]);
        // A union of several sketches estimates from the registers alone
        // (the library's composite estimator), one sketch by its HIP
        // accumulator: the same registers, estimates within the error.
        let twice = union_estimate([ab.as_slice(), ab.as_slice()]);
        assert!((alone as f64 - twice as f64).abs() / (alone as f64) < RELATIVE_STANDARD_ERROR);
        let both = union_estimate([ab.as_slice(), bb.as_slice()]) as f64;
        let err = (both - 10_000.0).abs() / 10_000.0;
        assert!(err < 3.0 * RELATIVE_STANDARD_ERROR, "{both}");
        // Stored and read back, a sketch goes on where it was: viewers
        // seen before change nothing.
        let untouched = Sketch::from_stored(&ab).to_bytes();
        let mut again = Sketch::from_stored(&ab);
        for i in 0..5_000 {
            again.add(&format!("user-{i}"));
        }
        assert_eq!(
            union_estimate([again.to_bytes().as_slice()]),
            union_estimate([untouched.as_slice()])
        );
        let mut thrice = Sketch::new();
        for _ in 0..3 {
            for i in 0..5_000 {
                thrice.add(&format!("user-{i}"));
            }
        }
        assert_eq!(union_estimate([thrice.to_bytes().as_slice()]), alone);
        // Dense HLL_4 at lg_k 12: the header and registers, plus a few
        // 4-byte overflow entries (not a format bound: a sanity check).
        assert!((2_088..=2_200).contains(&ab.len()), "{}", ab.len());
    }

    #[test]
    fn unreadable_bytes_start_over_instead_of_failing() {
        let s = Sketch::from_stored(b"not a sketch");
        assert_eq!(union_estimate([s.to_bytes().as_slice()]), 0);
        assert_eq!(union_estimate([b"junk".as_slice()]), 0);
        assert_eq!(union_estimate(std::iter::empty()), 0);
    }
}
