//! What the platform variant reads back: uncached reads of the probe
//! reels counted by the proxy, the served counts of every reel against
//! the truth, and the Kinesis stream split and merged.

use super::super::store::{scan_all, text};
use super::traffic::Client;
use crate::stack::Stack;
use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How long a probe waits before its read: longer than the settings
/// cache lives (`SETTINGS_TTL_MS`, 500 ms), so that the read is a cold
/// one (the count cache is off).
const SETTLE: Duration = Duration::from_millis(600);
/// Reads of each probe; the cheapest is kept (the schedule's own reads,
/// should they fall in the window, only add): the fewest read units, and
/// of those the fewest items. A read folds the quiet writer items it finds
/// only after summing them, so the first read after a quiet spell counts
/// items its own fold then removes; the second shows what reads cost
/// from then on.
const TRIES: usize = 2;

/// One uncached read as the proxy counted it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ReadCost {
    pub read_units: f64,
    pub items: u64,
}

/// `reel`'s likes and then its views read alone (`GET
/// /reels/{reel}/likes`, `.../views`), [`TRIES`] times, after [`SETTLE`]
/// each: the cheapest of each.
pub(super) async fn probe(
    proxy: &faultproxy::Proxy,
    client: &Client,
    reel: &str,
) -> Result<(ReadCost, ReadCost)> {
    let mut best: [Option<ReadCost>; 2] = [None, None];
    for _ in 0..TRIES {
        tokio::time::sleep(SETTLE).await;
        for (i, what) in ["likes", "views"].iter().enumerate() {
            let path = format!("/reels/{reel}/{what}");
            proxy.reset_stats();
            client
                .get_json(&path)
                .await
                .ok_or_else(|| anyhow!("GET {path} was not answered 200"))?;
            let cost = ReadCost {
                read_units: proxy.stats().total_read_units() + 0.0,
                items: proxy.key_loads().iter().map(|k| k.items_read).sum(),
            };
            if best[i].is_none_or(|b| cheaper(cost, b)) {
                best[i] = Some(cost);
            }
        }
    }
    match best {
        [Some(likes), Some(views)] => Ok((likes, views)),
        _ => Err(anyhow!("no probe read of {reel}")),
    }
}

/// Whether `a` costs less than `b`: fewer read units, or as many and
/// fewer items.
pub(super) fn cheaper(a: ReadCost, b: ReadCost) -> bool {
    a.read_units < b.read_units || (a.read_units == b.read_units && a.items < b.items)
}

/// Every reel's served likes and views against the truth.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Exactness {
    /// Reels compared (every reel with a like row or a view sent).
    pub reels: u64,
    /// ... whose served likes differ from their like rows.
    pub likes_wrong: u64,
    /// ... whose served views differ from the views taken.
    pub views_wrong: u64,
    /// ... that `GET /counts` did not answer for.
    pub unavailable: u64,
    /// A few of the differences: (reel, served, truth), likes then views.
    pub examples: Vec<(String, i64, i64)>,
    /// Like rows in the Likes table: every like taken.
    pub like_rows: u64,
}

impl Exactness {
    /// Every reel exact.
    pub fn exact(&self) -> bool {
        self.likes_wrong == 0 && self.views_wrong == 0 && self.unavailable == 0
    }
}

/// Like rows per reel, from a consistent scan of the Likes table.
pub(super) async fn like_rows(stack: &Stack) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for item in scan_all(stack, &stack.config.likes_table).await? {
        *out.entry(text(&item, "reel_id").to_owned()).or_default() += 1;
    }
    Ok(out)
}

/// `GET /counts` of every reel of `rows` and `views`, 100 at a time,
/// compared with them.
pub(super) async fn compare(
    client: &Client,
    rows: &BTreeMap<String, i64>,
    views: &BTreeMap<String, u64>,
) -> Result<Exactness> {
    let reels: BTreeSet<&String> = rows.keys().chain(views.keys()).collect();
    let reels: Vec<&String> = reels.into_iter().filter(|r| !r.is_empty()).collect();
    let mut e = Exactness {
        reels: reels.len() as u64,
        like_rows: rows.values().sum::<i64>() as u64,
        ..Exactness::default()
    };
    for chunk in reels.chunks(100) {
        let ids: Vec<&str> = chunk.iter().map(|r| r.as_str()).collect();
        let body = client
            .get_json(&format!("/counts?reel_ids={}", ids.join(",")))
            .await
            .context("GET /counts")?;
        let counts = body.get("counts").cloned().unwrap_or_default();
        for r in chunk {
            let Some(c) = counts.get(r.as_str()) else {
                e.unavailable += 1;
                continue;
            };
            let num = |k: &str| c.get(k).and_then(serde_json::Value::as_i64).unwrap_or(-1);
            let (likes, true_likes) = (num("likes"), rows.get(*r).copied().unwrap_or(0));
            let (seen, true_views) = (num("views"), views.get(*r).copied().unwrap_or(0) as i64);
            if likes != true_likes {
                e.likes_wrong += 1;
                if e.examples.len() < 10 {
                    e.examples.push((format!("{r} likes"), likes, true_likes));
                }
            }
            if seen != true_views {
                e.views_wrong += 1;
                if e.examples.len() < 10 {
                    e.examples.push((format!("{r} views"), seen, true_views));
                }
            }
        }
    }
    Ok(e)
}

/// The views stream's open shards: (id, first hash key, last), in hash
/// key order.
async fn open_shards(stack: &Stack) -> Result<Vec<(String, u128, u128)>> {
    let views = stack.views.as_ref().context("the views stream runs")?;
    let listed = views
        .client
        .list_shards()
        .stream_name(&views.def.stream)
        .send()
        .await
        .context("ListShards")?;
    let mut open = Vec::new();
    for s in listed.shards() {
        if s.sequence_number_range()
            .is_some_and(|r| r.ending_sequence_number().is_some())
        {
            continue;
        }
        let r = s.hash_key_range().context("a shard without a range")?;
        open.push((
            s.shard_id().to_owned(),
            r.starting_hash_key().parse()?,
            r.ending_hash_key().parse()?,
        ));
    }
    open.sort_by_key(|s| s.1);
    Ok(open)
}

/// Waits until the views stream is `ACTIVE` (after a split or a merge).
async fn active(stack: &Stack) -> Result<()> {
    let views = stack.views.as_ref().context("the views stream runs")?;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let s = views
            .client
            .describe_stream_summary()
            .stream_name(&views.def.stream)
            .send()
            .await
            .context("DescribeStreamSummary")?;
        let status = s
            .stream_description_summary()
            .map(|d| d.stream_status().as_str().to_owned());
        if status.as_deref() == Some("ACTIVE") {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(anyhow!("the views stream never came back ACTIVE"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Splits the widest open shard in two, then merges its two children back
/// (the daily peak's split and the night's merge): 3 new shards, the
/// stream's open count as before.
pub(super) async fn split_and_merge(stack: &Stack) -> Result<()> {
    let views = stack.views.as_ref().context("the views stream runs")?;
    let open = open_shards(stack).await?;
    let (id, lo, hi) = open
        .iter()
        .max_by_key(|s| s.2 - s.1)
        .cloned()
        .context("no open shard")?;
    let mid = lo + (hi - lo) / 2;
    views
        .client
        .split_shard()
        .stream_name(&views.def.stream)
        .shard_to_split(&id)
        .new_starting_hash_key((mid + 1).to_string())
        .send()
        .await
        .context("SplitShard")?;
    active(stack).await?;
    // The peak lasts a while: records go to both children first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open = open_shards(stack).await?;
    let a = open
        .iter()
        .find(|s| s.1 == lo)
        .context("the split's first child")?;
    let b = open
        .iter()
        .find(|s| s.1 == mid + 1)
        .context("the split's second child")?;
    views
        .client
        .merge_shards()
        .stream_name(&views.def.stream)
        .shard_to_merge(&a.0)
        .adjacent_shard_to_merge(&b.0)
        .send()
        .await
        .context("MergeShards")?;
    active(stack).await
}
