//! The plan as the table `likes-local plan` prints, and the number
//! formatting it shares with the verdict and notes of [`plan`](super::plan).
//! Apart from the planner because none of it changes a figure: it only
//! decides how one reads. `BENCHMARKS.md` embeds this table, so a change here
//! shows in the next `make benchmarks`.

use super::{Figure, Plan};
use std::fmt::Write as _;

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
pub(super) fn every(p: f64) -> String {
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

/// A share as a percentage: 3 decimals below 0.1 %, so that a rare share
/// does not print as 0.0 %.
fn pct(p: f64) -> String {
    if p == 0.0 {
        "0%".into()
    } else if p < 0.001 {
        format!("{:.3}%", p * 100.0)
    } else {
        format!("{:.1}%", p * 100.0)
    }
}

/// 3 decimals from 0.01 to a million, else scientific: the tiny
/// probabilities of a well-sized plan would print as 0.000.
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
pub(super) fn group(n: u64) -> String {
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
pub(super) fn num(x: f64) -> String {
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
pub(super) fn trim_float(x: f64) -> String {
    let s = format!("{x:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

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
