//! The `views` variant's arithmetic: items sized as DynamoDB charges
//! them, the estimate's error, freshness from answers and polls.

use super::*;

/// The write units of the chunks applied, from the items' sizes.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Sized {
    /// Total write units.
    pub(super) units: f64,
    /// Per chunk (seen item), its records.
    pub(super) records_per_chunk: Vec<f64>,
    /// The largest seen item and view item written (bytes).
    pub(super) seen_bytes_max: u64,
    pub(super) view_bytes_max: u64,
}

/// What the aggregator's chunks cost, as DynamoDB charges a transaction:
/// 2 units per started KB of each item written. Every chunk of a shard
/// wrote one seen item (its own, whose ids say its records), moved the
/// shard's checkpoint, and, this load being one reel's, updated the
/// shard's (its writer's) all-time item and day item of the viral reel;
/// an update is charged the larger of the item before and after, so the
/// items' final sizes are taken (an upper bound while the sketches were
/// still sparse). `shards` are the stream's shard ids, `arn` its ARN;
/// the seen items in `before` (`pk`, `sk`: the warm-up's) are left out.
pub(super) fn sized_units(
    items: &[Item],
    arn: &str,
    shards: &[String],
    before: &HashSet<(String, String)>,
) -> Sized {
    let units = |bytes: usize| 2.0 * bytes.max(1).div_ceil(1024) as f64;
    let s = s_attr;
    let mut out = Sized::default();
    let viral = viral_pk();
    for shard in shards {
        let seen_key = likes::keys::views_seen_key(arn, shard);
        let ck = likes::keys::views_checkpoint_key(arn, shard);
        let writer = likes::keys::views_writer(arn, shard);
        let mut chunks = 0u64;
        let mut per_chunk = 0.0;
        for i in items {
            let (Some(pk), Some(sk)) = (s(i, "pk"), s(i, "sk")) else {
                continue;
            };
            let bytes = item_bytes(i);
            if pk == seen_key {
                if before.contains(&(pk, sk)) {
                    continue;
                }
                chunks += 1;
                out.units += units(bytes);
                out.seen_bytes_max = out.seen_bytes_max.max(bytes as u64);
                let ids = i
                    .get("ids")
                    .and_then(|v| v.as_b().ok())
                    .map_or(0, |b| b.as_ref().len());
                out.records_per_chunk.push((ids / 8) as f64);
            } else if pk == ck {
                per_chunk += units(bytes);
            } else if pk == viral && sk.ends_with(&writer) {
                per_chunk += units(bytes);
                out.view_bytes_max = out.view_bytes_max.max(bytes as u64);
            }
        }
        out.units += chunks as f64 * per_chunk;
    }
    out
}

/// An item's size as DynamoDB counts it: every attribute's name and value
/// (a number: 1 byte per two significant digits, plus 1).
pub(super) fn item_bytes(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_bytes(v)).sum()
}

pub(super) fn value_bytes(v: &AttributeValue) -> usize {
    let number = |n: &str| {
        let digits: String = n.chars().filter(char::is_ascii_digit).collect();
        let significant = digits.trim_start_matches('0').trim_end_matches('0');
        significant.len().div_ceil(2) + 1
    };
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| number(n)).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_bytes(v)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| 1 + k.len() + value_bytes(v))
                .sum::<usize>()
        }
        _ => 0,
    }
}

/// (estimate − truth) ÷ truth, %; 0 when both are 0.
pub(super) fn error_pct(estimate: u64, truth: u64) -> f64 {
    if truth == 0 {
        return if estimate == 0 { 0.0 } else { f64::INFINITY };
    }
    100.0 * (estimate as f64 - truth as f64) / truth as f64
}

/// From a `202` to the table holding it, p50 and p99 in ms. `acks` are the
/// accepted requests, `(answered at, views)`; `sums` the polls, `(at,
/// views in the table)`. Taken in answer order, the k-th request's
/// cumulative views (its own and every earlier answer's) are in the table
/// at the first poll whose sum reaches them; a request whose total no poll
/// reached is left out. The table may take a request before its answer
/// (the record is in the stream first): a lag below 0 counts as 0.
pub(super) fn freshness(acks: &[(f64, u64)], sums: &[(f64, u64)]) -> (f64, f64) {
    let mut acks = acks.to_vec();
    acks.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut lags = Vec::with_capacity(acks.len());
    let (mut total, mut j) = (0u64, 0usize);
    for (at, n) in acks {
        total += n;
        // The first poll at or past this total, never one before the
        // last matched (the totals only grow).
        while j < sums.len() && sums[j].1 < total {
            j += 1;
        }
        let Some((seen, _)) = sums.get(j) else { break };
        lags.push(((seen - at) * 1000.0).max(0.0));
    }
    lags.sort_by(f64::total_cmp);
    (percentile(&lags, 0.5), percentile(&lags, 0.99))
}
