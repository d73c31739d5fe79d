//! The sizing rule: how many shards a planned peak needs, and the product's
//! own rule for the same peak, printed alongside. Apart from the simulation
//! so that the arithmetic a plan starts from can be checked on its own.
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

use super::MAX_PLAN_SHARDS;
use serde::Serialize;

/// `x.ceil()`, forgiving the last bits of float error: `50,000 × 1.1 / 1,000`
/// is 55.00000000000001 in `f64` and must give 55, not 56.
pub(super) fn ceil_tol(x: f64) -> f64 {
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
    /// The product's `MAX_SHARDS`: the most shards it resizes a reel to.
    pub max_shards: u32,
    /// The product's `SHARD_HEADROOM`: room for the rate to grow before the
    /// next resize.
    pub shard_headroom: f64,
    /// The product's `SHARD_WRITES_PER_SEC`: likes a second it plans per
    /// shard.
    pub shard_writes_per_sec: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_tol_forgives_float_error_only() {
        // 55.00000000000001 in f64.
        let x = 50_000.0 * (1.0 + 0.1) / 1_000.0;
        assert!(x > 55.0);
        assert_eq!(ceil_tol(x), 55.0);
        assert_eq!(rule_shards(50_000.0, 0.1, 1, 1_000.0), 55);
        // A real fraction still rounds up.
        assert_eq!(ceil_tol(55.01), 56.0);
        assert_eq!(ceil_tol(1e-3), 1.0);
        assert_eq!(ceil_tol(0.0), 0.0);
    }
}
