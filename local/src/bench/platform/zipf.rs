//! Who is liked and viewed: a Zipf law (s = [`S`]) over [`REELS`] reels,
//! rank 1 the most popular, with one viral reel on top of them taking a
//! fixed share ([`VIRAL_SHARE`]) of everything. Pure: a cumulative table
//! and a uniform draw, so that a seed gives the same reels every time.

/// The Zipf exponent.
pub(in crate::bench) const S: f64 = 1.1;
/// The reels of the Zipf universe (not all of them are touched by a run).
pub(in crate::bench) const REELS: u32 = 100_000;
/// The viral reel's share of the likes and the views, on top of the
/// universe (whose rank 1 takes about 1 ÷ 11 of the rest).
pub(in crate::bench) const VIRAL_SHARE: f64 = 0.2;

/// A reel drawn: the viral one, or rank `r` (1 the most popular).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(in crate::bench) enum Reel {
    Viral,
    Rank(u32),
}

impl Reel {
    /// Its id in the API: `viral`, or `z{rank}`.
    pub fn id(self) -> String {
        match self {
            Reel::Viral => super::super::VIRAL.to_owned(),
            Reel::Rank(r) => format!("z{r}"),
        }
    }
}

/// The draw: the cumulative probabilities of ranks 1..=n.
pub(in crate::bench) struct Zipf {
    cdf: Vec<f64>,
    viral_share: f64,
}

impl Zipf {
    /// Zipf(`s`) over `n` ranks, with the viral reel taking `viral_share`
    /// of the draws first.
    pub fn new(n: u32, s: f64, viral_share: f64) -> Self {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += f64::from(k).powf(-s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf, viral_share }
    }

    /// The platform's: [`REELS`], [`S`], [`VIRAL_SHARE`].
    pub fn platform() -> Self {
        Zipf::new(REELS, S, VIRAL_SHARE)
    }

    /// The probability of rank `k` (1-based) among the universe's draws
    /// (the viral reel's left out).
    #[cfg(test)]
    pub fn p(&self, k: u32) -> f64 {
        let i = k as usize - 1;
        self.cdf[i] - if i == 0 { 0.0 } else { self.cdf[i - 1] }
    }

    /// The reel of two uniform numbers in [0, 1): the first decides
    /// viral or not, the second which rank.
    pub fn pick(&self, viral: f64, u: f64) -> Reel {
        if viral < self.viral_share {
            return Reel::Viral;
        }
        let i = self.cdf.partition_point(|c| *c <= u);
        Reel::Rank(i.min(self.cdf.len() - 1) as u32 + 1)
    }

    /// A reel drawn with `rng`.
    pub fn draw(&self, rng: &mut fastrand::Rng) -> Reel {
        self.pick(rng.f64(), rng.f64())
    }
}
