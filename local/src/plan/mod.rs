//! The shard-sizing planner behind `likes-local plan`: how many shards a reel
//! needs for a planned peak, checked by a Monte-Carlo simulation of random
//! shard choice, plus what reading the count costs with and without the cache.
//!
//! The rule is `shards = ceil(peak × (1 + headroom) × units_per_like / cap)`,
//! clamped to 1..=1000. Each simulated second draws every shard's likes as an
//! independent Poisson(peak / shards) count, and the exact law of the busiest
//! shard, `P(busiest ≤ k) = F(k)^shards`, is printed beside the simulation so
//! that its sampling error shows.
//!
//! # Layout
//!
//! This file holds what to plan for ([`Inputs`]), the report ([`Plan`]) and
//! [`plan`], which puts the parts together; each part has its own file so
//! that it can be reviewed alone, and everything public is re-exported here.
//!
//! * `rule.rs`: the sizing rule, what its terms mean, and how it relates to
//!   the product's own rule ([`rule_shards`], [`product_rule`]).
//! * `law.rs`: the maths that must be right: the simulation, its exact
//!   Poisson sampler, and the exact law of the busiest shard ([`simulate`],
//!   [`Poisson`], [`exact_busiest`], [`poisson_sf`]).
//! * `render.rs`: the report as a table ([`render_table`]) and the number
//!   formatting of the table, the verdict and the notes.
//! * `cli.rs`: the command line: [`USAGE`], [`parse_args`], [`run_cli`].
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
//! (`shared/src/store/dynamodb/reads.rs`), one read unit per shard item
//! (items under 4 KB); an eventually consistent read would cost half.
//! Uncached, every read of the count costs `shards` read units. With the
//! per-instance cache (`CACHE_TTL_MS`), each function instance sums the
//! shards at most once per TTL: `instances × shards / ttl` read units a
//! second, and never more than the uncached figure. Not counted: the
//! settings item each instance reads once per `SETTINGS_TTL_MS`, and the
//! `TransactGetItems` (two units an item) readers use while a reel is
//! shrinking.

mod cli;
mod law;
mod render;
mod rule;

pub use cli::{Command, USAGE, parse_args, run_cli};
pub use law::{Busiest, Figure, Poisson, exact_busiest, poisson_sf, simulate};
pub use render::render_table;
pub use rule::{ProductRule, product_rule, rule_exact, rule_shards};

use law::summarise;
use render::{every, group, num, trim_float};
use rule::ceil_tol;
use serde::Serialize;

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
    /// The simulation's random seed: the same seed, the same figures.
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

/// An input the planner cannot use. It names the flag, so that the CLI's
/// message points at what to change: `plan: --peak: 0 is not a number in
/// (0, 100000000]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("plan: --{field}: {message}")]
pub struct PlanError {
    /// The input (CLI flag name without dashes), or `args`.
    pub field: &'static str,
    /// What is wrong with it.
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

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// What was planned for.
    pub inputs: Inputs,
    /// The shard count and the arithmetic behind it.
    pub sizing: Sizing,
    /// The busiest shard per second, as simulated.
    pub simulated: Busiest,
    /// The same figures from the exact law of the busiest shard.
    pub exact: Busiest,
    /// What reading the count costs on that many shards.
    pub reads: Reads,
    /// `true` when no simulated second went over the cap.
    pub ok: bool,
    /// One sentence: `OK` or `OVER`, and how often the exact law goes over.
    pub verdict: String,
    /// What the reader should know besides: a given count that is not the
    /// rule's, a clamp, the product's `MAX_SHARDS`, the plain counter.
    pub notes: Vec<String>,
}

/// The shard count and the arithmetic behind it.
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
    /// The product's own rule for the same peak, for comparison.
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

/// What reading the count costs, in read units a second, without the cache
/// and with it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reads {
    /// Reads a second of the count ([`Inputs::reads`]).
    pub reads_per_sec: f64,
    /// Read units one shard item costs ([`RCU_PER_SHARD_READ`]).
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

/// The read costs of `shards` shards (see "Reads" above): the cache cuts the
/// sums a second to one per instance per TTL, never above the reads.
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
