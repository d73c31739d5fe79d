//! The maths of the planner, kept apart so that it can be reviewed alone:
//! the simulation of random shard choice, the exact Poisson sampler it
//! draws from, and the exact law of the busiest shard it is checked against.
//! Everything here is a pure function of its arguments (the simulation of
//! its seed too); what the figures mean for a plan is decided in `mod.rs`.
//!
//! # The simulation
//!
//! Each second, a Poisson(peak) number of likes arrives and each picks a
//! shard uniformly at random. By the splitting property of the Poisson law,
//! the shards' counts in that second are then *independent* Poisson(peak /
//! shards) counts, exactly; so the simulation draws one Poisson count per
//! shard per second (2,000 s × 20 shards = 40,000 draws) instead of one
//! random number per like (36 million at 18,000/s). Each count is drawn
//! exactly, by Hörmann's PTRS transformed rejection (about 1.2 uniform pairs
//! a draw) for means of 10 and up, by inversion below. A normal approximation
//! would be biased exactly where it matters: the busiest shard of 40,000 is
//! four standard deviations out, where the Poisson law's skew adds a few
//! writes. The workspace has no `rand_distr`, hence the hand-written sampler.
//!
//! # The exact law
//!
//! Because the counts are independent Poisson, the busiest shard's law is
//! also known exactly: `P(busiest ≤ k) = F(k)^shards`, with `F` the
//! Poisson(peak / shards) distribution function. The report prints those
//! exact figures next to the simulated ones, so the sampling error is
//! visible; the tests check one against the other.
//!
//! A second is over the cap when its busiest shard takes more write units
//! than `cap`: `writes × units_per_like > cap`. DynamoDB throttles those
//! writes unless burst or adaptive capacity absorbs them, and the product
//! retries them. Not modelled: several shards sharing one partition (right
//! after a grow), transaction conflicts between likes on one shard item, and
//! load that changes within a second.

use serde::Serialize;

/// One figure of the busiest shard, in likes (writes) and in write units.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figure {
    /// Likes a second on the shard.
    pub writes: f64,
    /// The same in write units: `writes × units_per_like`, the figure the
    /// partition's cap is counted in.
    pub write_units: f64,
}

/// The busiest shard of each second, summarised.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Busiest {
    /// Mean over the seconds of the per-second busiest shard.
    pub mean: Figure,
    /// Median of the per-second busiest shard.
    pub p50: Figure,
    /// 99th percentile of the per-second busiest shard: at most one second
    /// in a hundred is busier.
    pub p99: Figure,
    /// The busiest shard of the whole run (exact: its expected value).
    pub max: Figure,
    /// Probability that a second's busiest shard exceeds the cap
    /// (simulated: the share of seconds that did).
    pub p_over_cap: f64,
    /// Seconds over the cap in the run (exact: expected).
    pub seconds_over_cap: f64,
    /// Exact only: the 5th and 95th percentiles of the run's busiest shard,
    /// in writes: where nine runs in ten land.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_p05_p95: Option<[f64; 2]>,
}

/// The busiest shard's writes in each of `seconds` seconds: each second,
/// Poisson(`peak`) likes, each on a uniformly random one of `shards` shards;
/// drawn as independent Poisson(`peak / shards`) counts per shard (the
/// splitting property), `seconds × shards` draws in all.
pub fn simulate(peak: f64, shards: u32, seconds: u32, seed: u64) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let shards = shards.max(1);
    let poisson = Poisson::new(peak / f64::from(shards));
    (0..seconds)
        .map(|_| {
            (0..shards)
                .map(|_| poisson.sample(&mut rng))
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// The simulated seconds of [`simulate`] summarised as the report's
/// figures, comparable with those of [`exact_busiest`]: `units` write units
/// a like, over the cap above `cap_writes` likes. Percentiles are nearest
/// rank, so each is a count some second actually had.
pub(super) fn summarise(busiest: &[u64], cap_writes: u64, units: f64) -> Busiest {
    let n = busiest.len().max(1);
    let mut sorted = busiest.to_vec();
    sorted.sort_unstable();
    // Nearest rank.
    let rank = |q: f64| {
        let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
        sorted.get(i).copied().unwrap_or(0) as f64
    };
    let fig = |w: f64| Figure {
        writes: w,
        write_units: w * units,
    };
    let over = busiest.iter().filter(|&&w| w > cap_writes).count();
    Busiest {
        mean: fig(busiest.iter().map(|&w| w as f64).sum::<f64>() / n as f64),
        p50: fig(rank(0.50)),
        p99: fig(rank(0.99)),
        max: fig(sorted.last().copied().unwrap_or(0) as f64),
        p_over_cap: over as f64 / n as f64,
        seconds_over_cap: over as f64,
        max_p05_p95: None,
    }
}

/// The busiest of `shards` independent Poisson(`lambda`) counts per second
/// over `seconds` seconds, from the exact law `P(max ≤ k) = F(k)^shards`:
/// its mean, median and 99th percentile per second, the expected busiest of
/// the whole run (`F(k)^(shards × seconds)`), and the probability of going
/// over `cap_writes`.
pub fn exact_busiest(
    lambda: f64,
    shards: u32,
    seconds: u32,
    cap_writes: u64,
    units: f64,
) -> Busiest {
    let (lo, sf) = survival_table(lambda);
    let s = f64::from(shards.max(1));
    let run = s * f64::from(seconds.max(1));
    // P(max of n > k) = 1 − (1 − Q(k))^n, accurate for tiny Q(k).
    let p_max_over = |q: f64, n: f64| -(n * (-q).ln_1p()).exp_m1();
    let q_at = |k: u64| -> f64 {
        if k < lo {
            1.0
        } else {
            sf.get((k - lo) as usize).copied().unwrap_or(0.0)
        }
    };
    // E[max] = Σ_{k ≥ 0} P(max > k); P(max > k) is 1 (to f64) below `lo`.
    let mean_of = |n: f64| lo as f64 + sf.iter().map(|&q| p_max_over(q, n)).sum::<f64>();
    // The smallest k with P(max ≤ k) ≥ p.
    let quantile = |p: f64, n: f64| -> f64 {
        sf.iter()
            .position(|&q| (n * (-q).ln_1p()) >= p.ln())
            .map_or((lo + sf.len() as u64) as f64, |i| (lo + i as u64) as f64)
    };
    let fig = |w: f64| Figure {
        writes: w,
        write_units: w * units,
    };
    let p_over = p_max_over(q_at(cap_writes), s);
    Busiest {
        mean: fig(mean_of(s)),
        p50: fig(quantile(0.5, s)),
        p99: fig(quantile(0.99, s)),
        max: fig(mean_of(run)),
        p_over_cap: p_over,
        seconds_over_cap: p_over * f64::from(seconds),
        max_p05_p95: Some([quantile(0.05, run), quantile(0.95, run)]),
    }
}

/// `P(X > k)` for X ~ Poisson(`lambda`) (0 beyond 15 standard deviations
/// plus 30 above the mean).
pub fn poisson_sf(lambda: f64, k: u64) -> f64 {
    let (lo, sf) = survival_table(lambda);
    if k < lo {
        // Below the table: 1 − P(X ≤ k), with P(X ≤ k) under 1e-40.
        1.0
    } else {
        sf.get((k - lo) as usize).copied().unwrap_or(0.0)
    }
}

/// `(lo, Q)` with `Q[i] = P(X > lo + i)`, X ~ Poisson(`lambda`), over the
/// range holding all but a negligible (< 1e-40) share of the law. The tail
/// sums run from the top down, so tiny tail probabilities keep their
/// precision.
fn survival_table(lambda: f64) -> (u64, Vec<f64>) {
    let sd = lambda.sqrt();
    let lo = (lambda - 15.0 * sd - 30.0).floor().max(0.0) as u64;
    let hi = (lambda + 15.0 * sd + 30.0).ceil() as u64;
    let ln_l = lambda.ln();
    let pmf = |k: u64| (-lambda + k as f64 * ln_l - ln_factorial(k)).exp();
    let mut sf = vec![0.0; (hi - lo + 1) as usize];
    let mut tail: f64 = 0.0;
    for k in (lo..=hi).rev() {
        // Clamped: the summed rounding may pass 1, and ln_1p(−q) needs q ≤ 1.
        sf[(k - lo) as usize] = tail.min(1.0);
        tail += pmf(k);
    }
    (lo, sf)
}

/// `ln(k!)`: a sum of logarithms below 16, Stirling's series above (error
/// 2.2e-12 at 16, falling as 1/k⁷). In logs because `k!` overflows `f64`
/// past 170, and the Poisson probabilities need it far beyond.
fn ln_factorial(k: u64) -> f64 {
    if k < 16 {
        return (2..=k).map(|i| (i as f64).ln()).sum();
    }
    let x = k as f64;
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    x * x.ln() - x
        + 0.5 * (std::f64::consts::TAU * x).ln()
        + inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 / 1260.0))
}

/// An exact Poisson sampler: inversion for small means, Hörmann's PTRS
/// ("The transformed rejection method for generating Poisson random
/// variables", 1993; the method numpy uses) for means of 10 and up.
#[derive(Clone, Debug)]
pub struct Poisson {
    lambda: f64,
    kind: Kind,
}

/// The method chosen by [`Poisson::new`], with its constants worked out
/// once rather than per draw.
#[derive(Clone, Debug)]
enum Kind {
    Inversion {
        p0: f64,
    },
    Ptrs {
        ln_lambda: f64,
        a: f64,
        b: f64,
        ln_inv_alpha: f64,
        vr: f64,
    },
}

impl Poisson {
    /// A Poisson(`lambda`) sampler; `lambda` ≤ 0 (or NaN) always draws 0.
    pub fn new(lambda: f64) -> Self {
        let lambda = if lambda.is_finite() && lambda > 0.0 {
            lambda
        } else {
            0.0
        };
        let kind = if lambda < 10.0 {
            Kind::Inversion {
                p0: (-lambda).exp(),
            }
        } else {
            let b = 0.931 + 2.53 * lambda.sqrt();
            Kind::Ptrs {
                ln_lambda: lambda.ln(),
                a: -0.059 + 0.02483 * b,
                b,
                ln_inv_alpha: (1.1239 + 1.1328 / (b - 3.4)).ln(),
                vr: 0.9277 - 3.6224 / (b - 2.0),
            }
        };
        Poisson { lambda, kind }
    }

    /// The mean drawn from (0 for the `lambda` ≤ 0 or NaN given to
    /// [`Poisson::new`]).
    pub fn lambda(&self) -> f64 {
        self.lambda
    }

    /// One draw. `rng` alone decides it, so a seeded `rng` makes a run
    /// reproducible.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> u64 {
        match self.kind {
            Kind::Inversion { p0 } => {
                if self.lambda == 0.0 {
                    return 0;
                }
                let u = rng.f64();
                let (mut k, mut p, mut cdf) = (0u64, p0, p0);
                // The cap on k only matters for u within 1e-16 of 1.
                while u > cdf && k < 200 {
                    k += 1;
                    p *= self.lambda / k as f64;
                    cdf += p;
                }
                k
            }
            Kind::Ptrs {
                ln_lambda,
                a,
                b,
                ln_inv_alpha,
                vr,
            } => loop {
                let u = rng.f64() - 0.5;
                let v = rng.f64();
                let us = 0.5 - u.abs();
                let k = ((2.0 * a / us + b) * u + self.lambda + 0.43).floor();
                if us >= 0.07 && v <= vr {
                    return k as u64;
                }
                if k.is_nan() || k < 0.0 || (us < 0.013 && v > us) {
                    continue;
                }
                let k = k as u64;
                // v = 0 gives ln 0 = −∞: accepted, as it should be.
                if v.ln() + ln_inv_alpha - (a / (us * us) + b).ln()
                    <= -self.lambda + k as f64 * ln_lambda - ln_factorial(k)
                {
                    return k;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_factorial_matches_the_product() {
        let mut direct = 0.0;
        for k in 1..200u64 {
            direct += (k as f64).ln();
            assert!((ln_factorial(k) - direct).abs() < 1e-9, "k = {k}");
        }
    }

    #[test]
    fn the_survival_function_matches_the_direct_sum() {
        // 1 − F(k) summed up from P(X = 0); fine where the tail is not tiny,
        // which is all a direct sum can check.
        for lambda in [0.5f64, 3.0, 45.0, 700.0] {
            let (mut p, mut cdf) = ((-lambda).exp(), 0.0);
            for k in 0..(lambda + 5.0 * lambda.sqrt()) as u64 {
                if k > 0 {
                    p *= lambda / k as f64;
                }
                cdf += p;
                let sf = poisson_sf(lambda, k);
                assert!((sf - (1.0 - cdf)).abs() < 1e-10, "{lambda}, {k}: {sf}");
            }
        }
    }
}
