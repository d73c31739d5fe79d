//! The shard-sizing planner behind `likes-local plan`: how many shards a reel
//! needs for a planned peak, checked by a Monte-Carlo simulation of random
//! shard choice, plus what reading the count costs with and without the cache.
//!
//! # The rule
//!
//! ```text
//! shards = ceil(peak × (1 + headroom) × units_per_like / cap)    clamped to 1..=1000
//! ```
//!
//! * `peak`: planned likes (and unlikes) a second on one reel.
//! * `cap`: write units a second one DynamoDB partition takes (1,000).
//! * `units_per_like`: write units one like costs *on its shard item*. The
//!   product's like is one `TransactWriteItems` of two items: the like row
//!   (likes table, keyed by user, so it spreads by itself) and the shard item
//!   (the hot key). A transaction writes every item twice (prepare and
//!   commit), so the shard item costs 2 write units per like (items up to
//!   1 KB): `units_per_like = 2`, the default. `--units 1` models the plain,
//!   non-transactional counter of the background article.
//! * `headroom`: a fraction: 0.3 plans for 30 % above the peak, at the full
//!   cap. It is the allowance for the unevenness of random shard choice and
//!   for growth; the simulation shows whether it is enough.
//!
//! The rule counts write units, so the same 14,000 likes a second need about
//! twice the shards with transactional writes (37) as with a plain counter
//! (19).
//!
//! # How it relates to the product's own rule
//!
//! The product resizes with [`likes::config::ResizeConfig::shards_for_rate`]:
//! `ceil(rate × SHARD_HEADROOM / SHARD_WRITES_PER_SEC)`, by default
//! `ceil(rate × 2.0 / 400)`, at most `MAX_SHARDS` (100, the `TransactGetItems`
//! limit that readers of a shrinking reel use). In this planner's terms the
//! product's partition ceiling is `cap / units = 1,000 / 2 = 500` likes a
//! shard; `SHARD_WRITES_PER_SEC = 400` keeps 25 % of it (500 / 400 = 1.25)
//! for unevenness, and `SHARD_HEADROOM = 2.0` is room for the rate to double
//! before the next resize. So the product plans for `2.0 × 1.25 = 2.5` times
//! the observed rate at the full cap: the same as `--units 2 --headroom 1.5`
//! here. This planner's default `--headroom 0.3` is a tighter plan for a
//! *known* peak; the report prints the product's figure alongside, and says
//! when the planned count passes `MAX_SHARDS` (the product would stop there).
//!
//! The background article sizes differently: it takes a safe rate per key of
//! `cap × (1 − 0.3) = 700` and divides, `14,000 / 700 = 20` shards. That is
//! `peak × 1/(1 − h) / cap`, a factor 1.43 where this rule's `1 + h` is 1.3
//! (19 shards). Its 20 shards are `--headroom 0.42857` (about 3/7) here, or checked
//! directly with `--shards 20`.
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
//!
//! # The published example
//!
//! With `--units 1 --shards 20` over 2,000 s: at 14,000 likes/s the busiest
//! shard of the whole run is expected at 813 writes (exact; 5 %–95 % of runs:
//! 803–828), against the article's 810; the busiest shard of a typical second
//! is 750. At 18,000 likes/s the run's busiest is expected at 1,028 (the
//! article: 1,019), and about 1 % of seconds (19.5 of 2,000) cross 1,000.
//!
//! # Reads
//!
//! The product sums a reel's shards with a *consistent* `BatchGetItem`
//! (`shared/src/store/dynamo.rs`), one read unit per shard item (items under
//! 4 KB); an eventually consistent read would cost half. Uncached, every
//! read of the count costs `shards` read units. With the per-instance cache
//! (`CACHE_TTL_MS`), each function instance sums the shards at most once per
//! TTL: `instances × shards / ttl` read units a second, and never more than
//! the uncached figure. Not counted: the settings item each instance reads
//! once per `SETTINGS_TTL_MS`, and the `TransactGetItems` (two units an item)
//! readers use while a reel is shrinking.

use serde::Serialize;
use std::fmt::{self, Write as _};

/// DynamoDB's per-partition write limit, write units a second.
pub const DEFAULT_CAP: f64 = 1_000.0;
/// The default headroom: plan for 30 % above the peak.
pub const DEFAULT_HEADROOM: f64 = 0.3;
/// Write units a like costs on its shard item: 2, the transactional update.
pub const DEFAULT_UNITS: u32 = 2;
/// The article's planned peak.
pub const DEFAULT_PEAK: f64 = 14_000.0;
/// Seconds simulated by default (the article's 2,000).
pub const DEFAULT_SECONDS: u32 = 2_000;
/// The default seed, so that two runs print the same figures.
pub const DEFAULT_SEED: u64 = 1;
/// The article's read load: 50,000 views a second of the viral reel...
pub const DEFAULT_READS: f64 = 50_000.0;
/// ...cached for 2 s (the product's `CACHE_TTL_MS` default)...
pub const DEFAULT_CACHE_TTL_MS: u64 = 2_000;
/// ...on 40 servers (function instances).
pub const DEFAULT_INSTANCES: u32 = 40;
/// The most shards the planner plans or checks.
pub const MAX_PLAN_SHARDS: u32 = 1_000;
/// Read units per shard item summed: the product's `BatchGetItem` is
/// consistent (1 unit per item up to 4 KB).
pub const RCU_PER_SHARD_READ: f64 = 1.0;
/// The most Poisson draws (seconds × shards) one simulation makes.
pub const MAX_DRAWS: u64 = 100_000_000;

/// What to plan for. [`Inputs::default`] is the article's 14,000 likes/s
/// with transactional writes and the default headroom.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Inputs {
    /// Planned peak, likes a second on one reel.
    pub peak: f64,
    /// Per-partition cap, write units a second.
    pub cap: f64,
    /// Fraction above the peak to plan for (0.3 = 30 %).
    pub headroom: f64,
    /// Write units one like costs on its shard item (2: transactional; 1:
    /// a plain counter; more for shard items over 1 KB).
    pub units: u32,
    /// Check this shard count instead of the rule's.
    pub shards: Option<u32>,
    /// Seconds simulated.
    pub seconds: u32,
    pub seed: u64,
    /// Reads a second of the reel's count.
    pub reads: f64,
    /// The count cache's TTL, ms (0: no cache).
    pub cache_ttl_ms: u64,
    /// Function instances, each with its own cache.
    pub instances: u32,
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs {
            peak: DEFAULT_PEAK,
            cap: DEFAULT_CAP,
            headroom: DEFAULT_HEADROOM,
            units: DEFAULT_UNITS,
            shards: None,
            seconds: DEFAULT_SECONDS,
            seed: DEFAULT_SEED,
            reads: DEFAULT_READS,
            cache_ttl_ms: DEFAULT_CACHE_TTL_MS,
            instances: DEFAULT_INSTANCES,
        }
    }
}

/// An input the planner cannot use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    /// The input (CLI flag name without dashes), or `args`.
    pub field: &'static str,
    pub message: String,
}

impl PlanError {
    fn new(field: &'static str, message: impl Into<String>) -> Self {
        PlanError {
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plan: --{}: {}", self.field, self.message)
    }
}

impl std::error::Error for PlanError {}

impl Inputs {
    /// Refuses inputs the planner cannot use (never panics on them).
    pub fn validate(&self) -> Result<(), PlanError> {
        let pos = |field, x: f64, max: f64| {
            if x.is_finite() && x > 0.0 && x <= max {
                Ok(())
            } else {
                Err(PlanError::new(
                    field,
                    format!("{x} is not a number in (0, {max}]"),
                ))
            }
        };
        pos("peak", self.peak, 1e8)?;
        pos("cap", self.cap, 1e7)?;
        if !(self.headroom.is_finite() && (0.0..=100.0).contains(&self.headroom)) {
            return Err(PlanError::new(
                "headroom",
                format!("{} is not a fraction in [0, 100]", self.headroom),
            ));
        }
        if !(1..=10).contains(&self.units) {
            return Err(PlanError::new(
                "units",
                format!(
                    "{} is not 1 (plain) or 2 (transactional), at most 10",
                    self.units
                ),
            ));
        }
        if let Some(n) = self.shards
            && !(1..=MAX_PLAN_SHARDS).contains(&n)
        {
            return Err(PlanError::new(
                "shards",
                format!("{n} is not in 1..={MAX_PLAN_SHARDS}"),
            ));
        }
        if !(1..=1_000_000).contains(&self.seconds) {
            return Err(PlanError::new(
                "seconds",
                format!("{} is not in 1..=1000000", self.seconds),
            ));
        }
        if !(self.reads.is_finite() && (0.0..=1e9).contains(&self.reads)) {
            return Err(PlanError::new(
                "reads",
                format!("{} is not a number in [0, 1e9]", self.reads),
            ));
        }
        if self.cache_ttl_ms > 86_400_000 {
            return Err(PlanError::new(
                "cache-ttl-ms",
                format!("{} is more than a day", self.cache_ttl_ms),
            ));
        }
        if !(1..=1_000_000).contains(&self.instances) {
            return Err(PlanError::new(
                "instances",
                format!("{} is not in 1..=1000000", self.instances),
            ));
        }
        Ok(())
    }
}

/// `x.ceil()`, forgiving the last bits of float error: `10,000 × 1.3 / 1,000`
/// is 13.000000000000002 in `f64` and must give 13, not 14.
fn ceil_tol(x: f64) -> f64 {
    (x - x.abs() * 1e-9).ceil()
}

/// The rule's shard count before clamping: `peak × (1 + headroom) × units /
/// cap`, unrounded.
pub fn rule_exact(peak: f64, headroom: f64, units: u32, cap: f64) -> f64 {
    peak * (1.0 + headroom) * f64::from(units) / cap
}

/// The rule: `ceil(peak × (1 + headroom) × units / cap)`, between 1 and
/// [`MAX_PLAN_SHARDS`].
pub fn rule_shards(peak: f64, headroom: f64, units: u32, cap: f64) -> u32 {
    let n = ceil_tol(rule_exact(peak, headroom, units, cap));
    if n.is_nan() {
        return 1;
    }
    n.clamp(1.0, f64::from(MAX_PLAN_SHARDS)) as u32
}

/// The product's own sizing with its default configuration: the count
/// [`likes::config::ResizeConfig::shards_for_rate`] gives for `peak`, and
/// its `MAX_SHARDS`, `SHARD_HEADROOM` and `SHARD_WRITES_PER_SEC`.
pub fn product_rule(peak: f64) -> ProductRule {
    let resize = likes::Config::from_lookup(|k| match k {
        "COUNTERS_TABLE" | "LIKES_TABLE" => Some("plan".into()),
        _ => None,
    })
    .expect("the default configuration is valid")
    .resize;
    let unclamped = ceil_tol(peak.max(0.0) * resize.headroom / resize.shard_writes_per_sec);
    ProductRule {
        shards: resize.shards_for_rate(peak),
        unclamped: unclamped.max(1.0),
        max_shards: resize.max_shards,
        shard_headroom: resize.headroom,
        shard_writes_per_sec: resize.shard_writes_per_sec,
    }
}

/// The product's sizing of the same peak (see [`product_rule`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProductRule {
    /// What `shards_for_rate` returns (at most `max_shards`).
    pub shards: u32,
    /// The rule before the `MAX_SHARDS` clamp.
    pub unclamped: f64,
    pub max_shards: u32,
    pub shard_headroom: f64,
    pub shard_writes_per_sec: f64,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub inputs: Inputs,
    pub sizing: Sizing,
    /// The busiest shard per second, as simulated.
    pub simulated: Busiest,
    /// The same figures from the exact law of the busiest shard.
    pub exact: Busiest,
    pub reads: Reads,
    /// `true` when no simulated second went over the cap.
    pub ok: bool,
    pub verdict: String,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sizing {
    /// `"ceil(14000 × 1.3 × 2 / 1000)"`.
    pub rule: String,
    /// The rule before rounding.
    pub rule_exact: f64,
    /// The rule's count, clamped to 1..=1000.
    pub rule_shards: u32,
    /// The count checked: `--shards`, or the rule's.
    pub shards: u32,
    /// `"rule"` or `"given"`.
    pub shards_from: &'static str,
    /// The rule's count for the same peak, headroom and cap at 1 unit a like
    /// (a plain counter) and at 2 (the transactional update).
    pub rule_shards_units_1_2: [u32; 2],
    /// The rule wanted more than [`MAX_PLAN_SHARDS`].
    pub rule_clamped: bool,
    /// The checked count is above the product's `MAX_SHARDS`.
    pub over_max_shards: bool,
    pub product: ProductRule,
    /// Likes a second the shards take if perfectly even: `shards × cap /
    /// units`.
    pub ceiling_likes_per_sec: f64,
    /// `peak / ceiling`.
    pub peak_share_of_ceiling: f64,
    /// `peak / shards`, likes a second on an average shard.
    pub per_shard_mean_writes: f64,
    /// The same, in write units.
    pub per_shard_mean_units: f64,
    /// The most likes one shard takes in a second within the cap:
    /// `floor(cap / units)`.
    pub cap_writes: u64,
}

/// One figure of the busiest shard, in likes (writes) and in write units.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figure {
    pub writes: f64,
    pub write_units: f64,
}

/// The busiest shard of each second, summarised.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Busiest {
    /// Mean over the seconds of the per-second busiest shard.
    pub mean: Figure,
    pub p50: Figure,
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

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reads {
    pub reads_per_sec: f64,
    pub rcu_per_shard_read: f64,
    /// `reads × shards × rcu`.
    pub uncached_rcu_per_sec: f64,
    /// Shard sums a second with the cache: `instances / ttl`, at most
    /// `reads`.
    pub cached_sums_per_sec: f64,
    /// `cached sums × shards × rcu`.
    pub cached_rcu_per_sec: f64,
}

/// Plans and checks. Pure: the same inputs (seed included) give the same
/// plan.
pub fn plan(inputs: &Inputs) -> Result<Plan, PlanError> {
    inputs.validate()?;
    let Inputs {
        peak,
        cap,
        headroom,
        units,
        seconds,
        seed,
        ..
    } = *inputs;
    let u = f64::from(units);
    let exact_rule = rule_exact(peak, headroom, units, cap);
    let rule = rule_shards(peak, headroom, units, cap);
    let shards = inputs.shards.unwrap_or(rule);
    if u64::from(seconds) * u64::from(shards) > MAX_DRAWS {
        return Err(PlanError::new(
            "seconds",
            format!("{seconds} s × {shards} shards is more than {MAX_DRAWS} draws"),
        ));
    }
    let product = product_rule(peak);
    let lambda = peak / f64::from(shards);
    // Within the cap: writes × units ≤ cap.
    let cap_writes = (cap / u + 1e-9).floor() as u64;
    let ceiling = f64::from(shards) * cap / u;
    let sizing = Sizing {
        rule: format!(
            "ceil({} × {} × {} / {})",
            trim_float(peak),
            trim_float(1.0 + headroom),
            units,
            trim_float(cap)
        ),
        rule_exact: exact_rule,
        rule_shards: rule,
        shards,
        shards_from: if inputs.shards.is_some() {
            "given"
        } else {
            "rule"
        },
        rule_shards_units_1_2: [
            rule_shards(peak, headroom, 1, cap),
            rule_shards(peak, headroom, 2, cap),
        ],
        rule_clamped: ceil_tol(exact_rule) > f64::from(MAX_PLAN_SHARDS),
        over_max_shards: shards > product.max_shards,
        product,
        ceiling_likes_per_sec: ceiling,
        peak_share_of_ceiling: peak / ceiling,
        per_shard_mean_writes: lambda,
        per_shard_mean_units: lambda * u,
        cap_writes,
    };

    let busiest = simulate(peak, shards, seconds, seed);
    let simulated = summarise(&busiest, cap_writes, u);
    let exact = exact_busiest(lambda, shards, seconds, cap_writes, u);
    let reads = read_cost(inputs, shards);

    let over = simulated.seconds_over_cap as u64;
    let ok = over == 0;
    let verdict = if ok {
        format!(
            "OK: the busiest shard stayed within {} write units in all {} simulated seconds; \
             by the exact law it goes over {}",
            num(cap),
            group(u64::from(seconds)),
            every(exact.p_over_cap)
        )
    } else {
        format!(
            "OVER: the busiest shard went over {} write units in {} of {} simulated seconds; \
             by the exact law it goes over {}: plan more shards",
            num(cap),
            group(over),
            group(u64::from(seconds)),
            every(exact.p_over_cap)
        )
    };

    let mut notes = Vec::new();
    if inputs.shards.is_some() && shards != rule {
        notes.push(format!(
            "checking the given {shards} shards; the rule gives {rule}"
        ));
    }
    if sizing.rule_clamped {
        notes.push(format!(
            "the rule wants {} shards; clamped to {MAX_PLAN_SHARDS}",
            trim_float(ceil_tol(exact_rule))
        ));
    }
    if sizing.over_max_shards {
        notes.push(format!(
            "{shards} shards is above the product's MAX_SHARDS {} (the TransactGetItems \
             limit): the product stops at {}, which takes at most {} likes/s",
            sizing.product.max_shards,
            sizing.product.max_shards,
            group((f64::from(sizing.product.max_shards) * cap / u) as u64)
        ));
    }
    if units == 1 {
        notes.push(
            "units 1 models a plain (non-transactional) counter, as in the article; the \
             product's like is a transaction: 2 write units on the shard item (--units 2)"
                .into(),
        );
    }
    Ok(Plan {
        inputs: inputs.clone(),
        sizing,
        simulated,
        exact,
        reads,
        ok,
        verdict,
        notes,
    })
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

fn summarise(busiest: &[u64], cap_writes: u64, units: f64) -> Busiest {
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

/// `ln(k!)`: a table below 16, Stirling's series above (error < 1e-12).
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

    pub fn lambda(&self) -> f64 {
        self.lambda
    }

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

fn read_cost(inputs: &Inputs, shards: u32) -> Reads {
    let s = f64::from(shards);
    let uncached_sums = inputs.reads;
    let cached_sums = if inputs.cache_ttl_ms == 0 {
        uncached_sums
    } else {
        (f64::from(inputs.instances) * 1000.0 / inputs.cache_ttl_ms as f64).min(uncached_sums)
    };
    Reads {
        reads_per_sec: inputs.reads,
        rcu_per_shard_read: RCU_PER_SHARD_READ,
        uncached_rcu_per_sec: uncached_sums * s * RCU_PER_SHARD_READ,
        cached_sums_per_sec: cached_sums,
        cached_rcu_per_sec: cached_sums * s * RCU_PER_SHARD_READ,
    }
}

/// The usage of `likes-local plan`.
pub const USAGE: &str = "\
usage: likes-local plan [--peak N] [--cap N] [--headroom F] [--units 1|2] [--shards N]
                        [--seconds N] [--seed N] [--reads N] [--cache-ttl-ms N]
                        [--instances N] [--json]

Shard count for a planned peak, shards = ceil(peak × (1 + headroom) × units / cap),
checked by simulating random shard choice second by second.

  --peak N          planned peak, likes/s on one reel (default 14000)
  --cap N           per-partition cap, write units/s (default 1000)
  --headroom F      plan for peak × (1 + F) (default 0.3)
  --units 1|2       write units a like costs on its shard: 2 = the product's
                    transactional update (default), 1 = a plain counter
  --shards N        check N shards instead of the rule's count (1..=1000)
  --seconds N       seconds simulated (default 2000)
  --seed N          random seed (default 1)
  --reads N         reads/s of the reel's count (default 50000)
  --cache-ttl-ms N  count cache TTL, ms; 0 = no cache (default 2000)
  --instances N     function instances, each with its own cache (default 40)
  --json            print JSON instead of the table
";

/// What the command line asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Plan { inputs: Inputs, json: bool },
    Help,
}

/// Parses the arguments after `plan` (`--flag value` or `--flag=value`).
pub fn parse_args(args: &[String]) -> Result<Command, PlanError> {
    let mut inputs = Inputs::default();
    let mut json = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--json" => {
                json = true;
                continue;
            }
            _ => {}
        }
        let field: &'static str = match flag {
            "--peak" => "peak",
            "--cap" => "cap",
            "--headroom" => "headroom",
            "--units" => "units",
            "--shards" => "shards",
            "--seconds" => "seconds",
            "--seed" => "seed",
            "--reads" => "reads",
            "--cache-ttl-ms" => "cache-ttl-ms",
            "--instances" => "instances",
            other => {
                return Err(PlanError::new(
                    "args",
                    format!("unknown argument {other:?}; see likes-local plan --help"),
                ));
            }
        };
        let value = match inline.or_else(|| it.next().cloned()) {
            Some(v) => v,
            None => return Err(PlanError::new(field, "needs a value")),
        };
        let bad = |what: &str| PlanError::new(field, format!("{value:?} is not {what}"));
        let float = || {
            value
                .trim()
                .replace('_', "")
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| bad("a number"))
        };
        let whole = || {
            value
                .trim()
                .replace('_', "")
                .parse::<u64>()
                .map_err(|_| bad("a whole number"))
        };
        let small = || whole().and_then(|n| u32::try_from(n).map_err(|_| bad("that small")));
        match field {
            "peak" => inputs.peak = float()?,
            "cap" => inputs.cap = float()?,
            "headroom" => inputs.headroom = float()?,
            "units" => inputs.units = small()?,
            "shards" => inputs.shards = Some(small()?),
            "seconds" => inputs.seconds = small()?,
            "seed" => inputs.seed = whole()?,
            "reads" => inputs.reads = float()?,
            "cache-ttl-ms" => inputs.cache_ttl_ms = whole()?,
            "instances" => inputs.instances = small()?,
            _ => unreachable!("every field is matched above"),
        }
    }
    inputs.validate()?;
    Ok(Command::Plan { inputs, json })
}

/// `likes-local plan ARGS`: the text to print (table, JSON or usage). Times
/// the planning (simulation and exact law) and reports it as `elapsed_ms`.
pub fn run_cli(args: &[String]) -> Result<String, PlanError> {
    match parse_args(args)? {
        Command::Help => Ok(USAGE.to_owned()),
        Command::Plan { inputs, json } => {
            let started = std::time::Instant::now();
            let plan = plan(&inputs)?;
            let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
            Ok(if json {
                let mut v = serde_json::to_value(&plan).unwrap_or_default();
                if let Some(map) = v.as_object_mut() {
                    map.insert(
                        "elapsed_ms".into(),
                        serde_json::json!((elapsed_ms * 1000.0).round() / 1000.0),
                    );
                }
                let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
                s.push('\n');
                s
            } else {
                render_table(&plan, Some(elapsed_ms))
            })
        }
    }
}

/// The plan as a readable table; `elapsed_ms`, when given, ends it.
pub fn render_table(plan: &Plan, elapsed_ms: Option<f64>) -> String {
    let p = plan;
    let i = &p.inputs;
    let s = &p.sizing;
    let mut o = String::new();
    let units_note = if i.units == 2 {
        "transactional shard update"
    } else if i.units == 1 {
        "plain counter"
    } else {
        "large shard items"
    };
    let _ = writeln!(o, "likes shard-sizing plan");
    let _ = writeln!(o);
    let _ = writeln!(o, "sizing");
    let _ = writeln!(o, "  peak            {} likes/s", num(i.peak));
    let _ = writeln!(
        o,
        "  cap             {} write units/s per partition",
        num(i.cap)
    );
    let _ = writeln!(o, "  units per like  {} ({units_note})", i.units);
    let _ = writeln!(
        o,
        "  headroom        {} (plan for peak × {})",
        trim_float(i.headroom),
        trim_float(1.0 + i.headroom)
    );
    let _ = writeln!(
        o,
        "  rule            {} = ceil({:.2}) = {} shards{}",
        s.rule,
        s.rule_exact,
        s.rule_shards,
        if s.rule_clamped { " (clamped)" } else { "" }
    );
    let [r1, r2] = s.rule_shards_units_1_2;
    let _ = writeln!(
        o,
        "                  at 1 unit a like (plain): {r1} shards; at 2 (transactional): {r2}"
    );
    let _ = writeln!(
        o,
        "  shards          {}{}",
        s.shards,
        if s.shards_from == "given" {
            " (given with --shards)"
        } else {
            " (the rule's)"
        }
    );
    let _ = writeln!(
        o,
        "  product rule    {} shards: ceil({} × {} / {}) with the defaults SHARD_HEADROOM, \
         SHARD_WRITES_PER_SEC; MAX_SHARDS {}",
        s.product.shards,
        num(i.peak),
        trim_float(s.product.shard_headroom),
        trim_float(s.product.shard_writes_per_sec),
        s.product.max_shards
    );
    let _ = writeln!(
        o,
        "  ceiling         {} likes/s = {} shards × {} ÷ {} (peak is {:.0}% of it)",
        num(s.ceiling_likes_per_sec),
        s.shards,
        num(i.cap),
        i.units,
        s.peak_share_of_ceiling * 100.0
    );
    let _ = writeln!(
        o,
        "  per shard       {:.1} likes/s = {:.1} write units/s on average; within the cap: {} likes/s",
        s.per_shard_mean_writes,
        s.per_shard_mean_units,
        group(s.cap_writes)
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "busiest shard per second ({} s simulated, seed {}; exact = the Poisson law)",
        group(u64::from(i.seconds)),
        i.seed
    );
    let _ = writeln!(o, "                      simulated            exact");
    let _ = writeln!(
        o,
        "                      likes/s   units/s    likes/s   units/s"
    );
    let row = |o: &mut String, name: &str, a: Figure, b: Figure, dec: usize| {
        let _ = writeln!(
            o,
            "  {name:<18}{:>9.dec$} {:>9.dec$}  {:>9.1} {:>9.1}",
            a.writes, a.write_units, b.writes, b.write_units
        );
    };
    row(&mut o, "mean", p.simulated.mean, p.exact.mean, 1);
    row(&mut o, "p50", p.simulated.p50, p.exact.p50, 0);
    row(&mut o, "p99", p.simulated.p99, p.exact.p99, 0);
    row(&mut o, "run max (exp.)", p.simulated.max, p.exact.max, 0);
    if let Some([lo, hi]) = p.exact.max_p05_p95 {
        let _ = writeln!(
            o,
            "  (nine runs in ten have a run max of {lo:.0}–{hi:.0} likes/s, {:.0}–{:.0} units/s)",
            lo * f64::from(i.units),
            hi * f64::from(i.units)
        );
    }
    let _ = writeln!(
        o,
        "  over the cap      {} of {} s ({})    p = {} a second, {} s expected",
        group(p.simulated.seconds_over_cap as u64),
        group(u64::from(i.seconds)),
        pct(p.simulated.p_over_cap),
        sci(p.exact.p_over_cap),
        sci(p.exact.seconds_over_cap)
    );
    let _ = writeln!(o);
    let r = &p.reads;
    let _ = writeln!(
        o,
        "reads of the count (consistent BatchGetItem: {} RCU per shard item)",
        trim_float(r.rcu_per_shard_read)
    );
    let _ = writeln!(
        o,
        "  uncached        {} reads/s × {} shards = {} RCU/s",
        num(r.reads_per_sec),
        s.shards,
        num(r.uncached_rcu_per_sec)
    );
    if i.cache_ttl_ms == 0 {
        let _ = writeln!(
            o,
            "  cached          no cache (--cache-ttl-ms 0): as uncached"
        );
    } else {
        let _ = writeln!(
            o,
            "  cached          {} sums/s ({} instances, one sum per {} ms each, at most the reads) \
             × {} shards = {} RCU/s",
            num(r.cached_sums_per_sec),
            group(u64::from(i.instances)),
            group(i.cache_ttl_ms),
            s.shards,
            num(r.cached_rcu_per_sec)
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "{}", p.verdict);
    for n in &p.notes {
        let _ = writeln!(o, "note: {n}");
    }
    if let Some(ms) = elapsed_ms {
        let _ = writeln!(o, "elapsed_ms {ms:.2} (simulation and exact law)");
    }
    o
}

/// `"once every 2.8 hours at peak"`, from a per-second probability.
fn every(p: f64) -> String {
    if p <= 0.0 {
        return "never (p below f64 precision)".into();
    }
    if p >= 0.5 {
        return format!("in {} of seconds at peak", pct(p));
    }
    let secs = 1.0 / p;
    let (v, unit) = if secs < 120.0 {
        (secs, "seconds")
    } else if secs < 7_200.0 {
        (secs / 60.0, "minutes")
    } else if secs < 172_800.0 {
        (secs / 3_600.0, "hours")
    } else if secs < 63_115_200.0 {
        (secs / 86_400.0, "days")
    } else {
        (secs / 31_557_600.0, "years")
    };
    let v = if v < 1e6 {
        format!("{v:.1}")
    } else {
        format!("{v:.1e}")
    };
    format!("once every {v} {unit} at peak (p = {} a second)", sci(p))
}

fn pct(p: f64) -> String {
    if p == 0.0 {
        "0%".into()
    } else if p < 0.001 {
        format!("{:.3}%", p * 100.0)
    } else {
        format!("{:.1}%", p * 100.0)
    }
}

fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if (0.01..1e6).contains(&x.abs()) {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

/// `1234567` → `"1,234,567"`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Grouped when whole, else with its decimals.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        let g = group(x.abs() as u64);
        if x < 0.0 { format!("-{g}") } else { g }
    } else if x.abs() >= 1000.0 {
        let g = group(x.abs().round() as u64);
        format!("{}{g}", if x < 0.0 { "-" } else { "" })
    } else {
        trim_float(x)
    }
}

/// `1.3` → `"1.3"`, `2.0` → `"2"`, `0.30000000000000004` → `"0.3"`.
fn trim_float(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_owned() }
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
    fn grouping() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(num(14_000.0), "14,000");
        assert_eq!(trim_float(1.0 + 0.3), "1.3");
    }
}
