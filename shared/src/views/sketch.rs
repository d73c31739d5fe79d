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
//!
//! # How a viewer is hashed
//!
//! A viewer id goes into a sketch as exactly these bytes: its UTF-8 bytes,
//! then one `0xff` byte ([`ViewerBytes`]). The library hashes them with
//! MurmurHash3 x64 128 (seed 9001, its `DEFAULT_UPDATE_SEED`): the low 26
//! bits of the first half are the coupon's slot (the register is their
//! low `lg_k` bits), the leading zeros of the second half + 1 (at most 63)
//! its value.
//!
//! Why pinned, and why that `0xff`: `HllSketch::update` takes any `Hash`
//! value and hashes it by feeding its `Hash` impl the library's Murmur
//! hasher. The sketches stored before issue 35 were written with
//! `update(viewer: &str)`, so through std's `Hash for str`, which writes
//! the bytes and then `0xff` (`Hasher::write_str`'s default: a framing
//! byte no UTF-8 string contains, so no id's input is a prefix of
//! another's). std does not promise that impl across compiler versions;
//! if it changed, every viewer already in a stored sketch would hash
//! somewhere else and count again (unique viewers silently inflated, with
//! nothing to tell old registers from new). [`ViewerBytes`] makes the same
//! two `Hasher::write` calls itself (std's `Hasher` API is stable), so the
//! input is ours: today's values exactly, whatever std does to `str`. The
//! library's `raw_bytes` wrapper (the bytes without the `0xff`, what the
//! Java and C++ DataSketches hash) would have moved every stored viewer.
//! The test `viewers_hash_exactly_as_the_stored_sketches_do` holds the
//! coupons of fixed ids as the deployed code computed them; the crate is
//! pinned (`=0.6.0`) because its hasher and seed are part of the stored
//! format too.

use datasketches::hll::{HllSketch, HllType, HllUnion};
use std::hash::{Hash, Hasher};

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

    /// Adds a viewer (hashed as [`ViewerBytes`]).
    pub fn add(&mut self, viewer: &str) {
        self.0.update(ViewerBytes(viewer));
    }

    /// The bytes stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.serialize()
    }
}

/// A viewer id as a sketch hashes it: its UTF-8 bytes, then `0xff`, in two
/// `Hasher::write` calls (see the module notes). Never hash a viewer id
/// any other way, and never change this: stored sketches hold its values.
pub struct ViewerBytes<'a>(pub &'a str);

impl Hash for ViewerBytes<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Hasher::write by its path: the same call, named so that no reader
        // (nor the template's grant test, which resolves calls by name)
        // takes it for the like path's `write`.
        Hasher::write(state, self.0.as_bytes());
        Hasher::write(state, &[0xff]);
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

/// The union of `sketches` (stored bytes; unreadable ones left out and
/// logged) as one stored sketch, `HLL_4` as every sketch written: what
/// compaction keeps in a base item. A union's registers are the maximum of
/// its inputs', so a union of it with others estimates what the union of
/// all the inputs does. Empty if every input is.
pub fn union_sketch<'a>(sketches: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let Ok(mut union) = HllUnion::new(LG_K) else {
        return Vec::new();
    };
    for bytes in sketches {
        if bytes.is_empty() {
            continue;
        }
        match HllSketch::deserialize(bytes) {
            Ok(s) => union.update(&s),
            Err(e) => tracing::error!(error = %e, "unreadable HLL sketch left out of a fold"),
        }
    }
    if union.is_empty() {
        return Vec::new();
    }
    union.to_sketch(HllType::Hll4).serialize()
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

    /// Viewer ids within `UserId`'s rules (1 to 256 bytes, no control
    /// characters): ASCII, the shortest, a one-byte space, an identity
    /// provider's `sub`, non-ASCII UTF-8 (2, 3 and 4-byte characters), the
    /// longest.
    fn golden_ids() -> Vec<String> {
        vec![
            "a".into(),
            " ".into(),
            "user-42".into(),
            "auth0|5f8a1c2e9b3d4e0071a2b3c4".into(),
            "Zoë".into(),
            "用户名".into(),
            "🦀👀".into(),
            "v".repeat(256),
        ]
    }

    /// The coupon each golden viewer puts in a sketch, as HLL_4 at
    /// `lg_k = 12` serializes it in LIST mode: little-endian, the low 26
    /// bits the slot (the low 26 bits of MurmurHash3's first half; the
    /// register is the slot's low 12 bits), the upper 6 the register
    /// value (the leading zeros of the second half + 1). Computed once
    /// with the code as deployed before issue 35 (`HllSketch::update(&str)`,
    /// `rustc` 1.95.0): stored sketches hold these. Never edit them to
    /// make the test pass: a change here changes what every stored sketch
    /// means (the same viewer would count twice).
    const GOLDEN_COUPONS: [u32; 8] = [
        0x0502_1545,
        0x120c_c5b8,
        0x083e_5248,
        0x0d96_f36c,
        0x0474_1f2a,
        0x12e0_90f2,
        0x0b55_3d47,
        0x0537_3247,
    ];

    #[test]
    fn viewers_hash_exactly_as_the_stored_sketches_do() {
        let ids = golden_ids();
        for (id, coupon) in ids.iter().zip(GOLDEN_COUPONS) {
            let mut s = Sketch::new();
            s.add(id);
            // The LIST mode preamble (2 ints, serial version 1, family
            // HLL, lg_k 12, lg_arr 3, compact, one coupon, HLL_4 LIST),
            // then the coupon.
            let mut want = vec![0x02, 0x01, 0x07, 0x0c, 0x03, 0x08, 0x01, 0x00];
            want.extend(coupon.to_le_bytes());
            assert_eq!(s.to_bytes(), want, "viewer {id:?}");
        }
        // Every golden viewer differs from every other.
        let distinct: std::collections::BTreeSet<u32> = GOLDEN_COUPONS.into_iter().collect();
        assert_eq!(distinct.len(), GOLDEN_COUPONS.len());
        // All eight in one sketch (SET mode, once the list of 8 is full),
        // byte for byte.
        let mut all = Sketch::new();
        for id in &ids {
            all.add(id);
        }
        assert_eq!(
            all.to_bytes(),
            [
                0x03, 0x01, 0x07, 0x0c, 0x05, 0x08, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00, 0x45, 0x15,
                0x02, 0x05, 0x47, 0x3d, 0x55, 0x0b, 0x48, 0x52, 0x3e, 0x08, 0x2a, 0x1f, 0x74, 0x04,
                0x6c, 0xf3, 0x96, 0x0d, 0xf2, 0x90, 0xe0, 0x12, 0xb8, 0xc5, 0x0c, 0x12, 0x47, 0x32,
                0x37, 0x05,
            ]
        );
        assert_eq!(union_estimate([all.to_bytes().as_slice()]), 8);
    }

    #[test]
    fn a_viewer_is_its_utf8_bytes_then_0xff() {
        /// Records what a `Hash` impl feeds a hasher.
        #[derive(Default)]
        struct Recorder(Vec<Vec<u8>>);
        impl Hasher for Recorder {
            fn finish(&self) -> u64 {
                0
            }
            fn write(&mut self, bytes: &[u8]) {
                self.0.push(bytes.to_vec());
            }
        }
        let mut r = Recorder::default();
        ViewerBytes("Zoë").hash(&mut r);
        assert_eq!(r.0, [b"Zo\xc3\xab".to_vec(), vec![0xff]]);
    }

    #[test]
    fn unreadable_bytes_start_over_instead_of_failing() {
        let s = Sketch::from_stored(b"not a sketch");
        assert_eq!(union_estimate([s.to_bytes().as_slice()]), 0);
        assert_eq!(union_estimate([b"junk".as_slice()]), 0);
        assert_eq!(union_estimate(std::iter::empty()), 0);
    }
}
