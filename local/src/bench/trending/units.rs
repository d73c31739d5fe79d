//! What trending and windowing add to the writes: the sketches' puts as
//! the fault proxy counted them, and the window buckets' share of the
//! items that carry them, by DynamoDB's 1 KB rule.

use std::collections::{BTreeMap, HashMap};

/// What trending and windowing add to the writes, in write units.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Extra {
    pub sketch_likes: f64,
    pub sketch_views: f64,
    pub window_likes: f64,
    pub window_views: f64,
}

pub(super) type Item = HashMap<String, aws_sdk_dynamodb::types::AttributeValue>;

/// An item's size as DynamoDB counts it, near enough (names and values;
/// a number as its digits), with and without its window buckets.
pub(super) fn sizes(item: &Item) -> (usize, usize) {
    use aws_sdk_dynamodb::types::AttributeValue as V;
    let mut all = 0;
    let mut buckets = 0;
    for (k, v) in item {
        let n = k.len()
            + match v {
                V::S(s) => s.len(),
                V::N(n) => n.len(),
                V::B(b) => b.as_ref().len(),
                V::M(m) => m
                    .iter()
                    .map(|(k, v)| k.len() + 8 + v.as_s().map_or(8, String::len))
                    .sum(),
                _ => 8,
            };
        all += n;
        if likes::keys::window::parse_attr(k).is_some() {
            buckets += n;
        }
    }
    (all, all - buckets)
}

/// Write units of an item of `bytes` (1 per started KB).
fn units(bytes: usize) -> f64 {
    (bytes.max(1) as f64 / 1024.0).ceil()
}

/// Whether `pk` is a partition whose items carry like buckets: a writer
/// partition (stream mode, views table) or a shard item (transactional
/// mode, counters table: `{NNN}#reel#{id}#likes`).
fn carries_likes(pk: &str) -> bool {
    pk.starts_with("l#")
        || (pk.ends_with("#likes") && pk.get(..9).is_some_and(|p| p.ends_with("#reel#")))
}

/// The sketches' write units (every `top#` partition's of `table`, as the
/// proxy counted them), and the window buckets' share of the items that
/// carry them (each partition's item writes times the units its items'
/// buckets add, on average, twice: they are written in transactions).
pub(super) fn extra_units(table: &str, loads: &[faultproxy::KeyLoad], items: &[Item]) -> Extra {
    let mut by_pk: BTreeMap<&str, Vec<&Item>> = BTreeMap::new();
    for i in items {
        if let Some(pk) = i.get("pk").and_then(|v| v.as_s().ok()) {
            by_pk.entry(pk.as_str()).or_default().push(i);
        }
    }
    let mut e = Extra::default();
    for l in loads {
        let Some(pk) = l.partition.strip_prefix(&format!("{table}/")) else {
            continue;
        };
        if pk.starts_with("top#likes#") {
            e.sketch_likes += l.write_units;
        } else if pk.starts_with("top#views#") {
            e.sketch_views += l.write_units;
        } else if carries_likes(pk) || pk.starts_with("v#") {
            let its = by_pk.get(pk).map_or(&[][..], Vec::as_slice);
            if its.is_empty() {
                continue;
            }
            let per_item = its
                .iter()
                .map(|i| {
                    let (with, without) = sizes(i);
                    units(with) - units(without)
                })
                .sum::<f64>()
                / its.len() as f64;
            let added = 2.0 * per_item * l.items_written as f64;
            if carries_likes(pk) {
                e.window_likes += added;
            } else {
                e.window_views += added;
            }
        }
    }
    e
}

impl std::ops::Add for Extra {
    type Output = Extra;
    fn add(self, o: Extra) -> Extra {
        Extra {
            sketch_likes: self.sketch_likes + o.sketch_likes,
            sketch_views: self.sketch_views + o.sketch_views,
            window_likes: self.window_likes + o.window_likes,
            window_views: self.window_views + o.window_views,
        }
    }
}
