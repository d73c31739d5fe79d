//! Stream mode's writer items of the likes ([`crate::aggregate`]): how a
//! reel's writer partition is read and summed, and how its quiet items are
//! folded into its base item, so that a read stays bounded however many
//! stream shards have come and gone.
//!
//! # The partition
//!
//! `l#{reel}` in `WRITERS_TABLE` (or one of its further parts, once the
//! reel is spread: see `spread.rs`; each part is a partition of its own,
//! read, summed and folded as below) holds one item per stream shard that
//! counted the reel (`w#{writer}`: `n`, `w` writes, `seq` the last chunk
//! applied, `updated_at`, the recent-change buckets) and the base item
//! (`~base`: `n`, the buckets folded in, `updated_at`, the fold version
//! `fv` and `fs`, what the last fold took). A reader sums it with one
//! consistent `Query`.
//!
//! # Folding
//!
//! DynamoDB stream shards close about every four hours and their children
//! take over, so without folding a reel liked for a year would keep
//! thousands of items. A reader that finds at least [`FOLD_MIN_ITEMS`]
//! items quiet for [`fold_quiet_ms`] folds them (at most
//! [`FOLD_MAX_ITEMS`]) in one `TransactWriteItems`:
//!
//! * the base item gets their `n` and their buckets added (not their
//!   own-change tails: a read soon after a fold of items written lately
//!   does not cut, `keys::tail`), `updated_at`
//!   raised to the latest of theirs (reconciliation judges a reel's quiet
//!   by it), buckets older than any kept removed, `fv` raised by one and
//!   `fs` set to the folded items' sort keys and `seq`s, conditioned on
//!   `fv` as read;
//! * each folded item is deleted, conditioned on its `seq` as read (every
//!   write of its stream shard moves it).
//!
//! An instance folds a reel once at a time ([`InFlight`]): every read
//! of a busy reel finds the same quiet items, and a second fold of them
//! would only meet the first (its token in flight, or its items held) and
//! be refused. Across instances two may still meet; one lands.
//!
//! So a fold lands whole or not at all, two folds of one reel cannot both
//! land, a chunk of the item's stream shard in flight cancels the fold (or
//! lands after it and recreates the item with its own delta alone), and
//! the sum is the same before and after. Folding an item that is not quiet
//! would be just as exact; quiet ones are chosen because their stream
//! shard has most likely closed, so they do not come back.
//!
//! A `Query` is not a snapshot across items. The base sorts after every
//! writer item, so a reader reads it last: a fold landing mid-read shows
//! the items before it and the base after it, never the other way round,
//! and the items the base's `fs` names (same sort key, same `seq`) are then
//! left out: counted once, in the base.
//!
//! # What it costs
//!
//! A read: one `Query`, consistent, of the live writers' items (a few
//! hundred bytes each) plus the base: one read unit per 4 KB. A fold:
//! one write unit per item deleted and two for the base (transactional),
//! once per [`FOLD_MIN_ITEMS`] or more quiet items, which the stream's roll
//! makes about every four hours per stream shard that carried the reel.

use super::DynamoStore;
use super::error::{maintenance_tx_failure, request_build_failed, translate};
use super::ext::{Item, ItemExt};
use crate::config::{Config, RecentWindow};
use crate::error::Error;
use crate::keys::tail::{RecentTail, TailWindow};
use crate::keys::{self, window};
use crate::token::RequestToken;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, TransactWriteItem, Update};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Quiet writer items a reader folds, at the fewest. Every item is folded
/// once in the end, at two write units (its delete, in a transaction) plus
/// its share of the base's two: 3 units an item at two a fold, 2.5 at
/// four. Two keeps a read at its live writers, the base and one quiet item
/// at the most (at four: three), which for a reel carried by a few stream
/// shards is what bounds its read at any age.
pub const FOLD_MIN_ITEMS: usize = 2;

/// Items one fold takes at most: with the base, within DynamoDB's 100
/// actions per transaction.
pub const FOLD_MAX_ITEMS: usize = 98;

/// The longest a writer item must be quiet before it is folded.
const FOLD_QUIET_MAX_MS: i64 = 10 * 60 * 1000;

/// How long a writer item must have been quiet (no chunk of its stream
/// shard) before a reader folds it: the stream's settle time, at most ten
/// minutes (a stream shard that closed delivers nothing after its last
/// batches; ten minutes keeps the items of those that rolled lately few).
pub(super) fn fold_quiet_ms(config: &Config) -> i64 {
    (config.reconcile.stream_settle.as_millis() as i64).clamp(1, FOLD_QUIET_MAX_MS)
}

/// The writer partitions (by partition key) whose fold this instance has
/// in flight.
#[derive(Clone, Debug, Default)]
pub(super) struct InFlight(Arc<Mutex<HashSet<String>>>);

impl InFlight {
    /// Claims the fold of partition `pk` for this instance: `None` if one
    /// is in flight. The claim ends when the guard is dropped.
    fn claim(&self, pk: &str) -> Option<Claim> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(pk.to_owned()).then(|| Claim {
            set: self.0.clone(),
            pk: pk.to_owned(),
        })
    }
}

/// A fold claimed by [`InFlight::claim`], released on drop.
struct Claim {
    set: Arc<Mutex<HashSet<String>>>,
    pk: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(&self.pk);
    }
}

/// One reel's writer partition, summed.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Partition {
    /// The count the items and the base hold.
    pub n: i64,
    /// The latest `updated_at` among them.
    pub last_write_ms: i64,
    /// The writer items' writes (`w`), summed: a reader's rate sample.
    pub w: i64,
    /// Items read (the base included).
    pub items: usize,
    /// Writer items quiet long enough to fold: sort key, `seq`, and the
    /// item itself.
    pub quiet: Vec<(String, String, Item)>,
    /// The base item as read (`None`: none yet).
    pub base: Option<Item>,
    /// Every counted item's recent-change buckets: (sort key, name, what
    /// it says, value).
    pub buckets: Vec<(String, String, keys::RecentAttr, i64)>,
    /// The windowed counts the counted items hold at the read's clock.
    pub windows: window::WindowCounts,
    /// The counted items' own-change tails, summed at the read's clock.
    pub tail: RecentTail,
}

/// Sums a reel's partition `items` (as one `Query` returned them) at
/// `now_ms`, their own-change tails in `tail`'s buckets; items quiet for
/// `quiet_ms` are listed for folding.
pub(super) fn sum_partition(
    items: Vec<Item>,
    now_ms: i64,
    quiet_ms: i64,
    tail: &TailWindow,
) -> Result<Partition, Error> {
    let mut p = Partition {
        items: items.len(),
        tail: RecentTail::new(tail, now_ms),
        ..Partition::default()
    };
    let base = items
        .iter()
        .find(|i| i.string("sk") == Some(keys::LIKES_WRITERS_BASE_SORT))
        .cloned();
    // What the base's last fold took: counted there, whatever the read
    // showed of the items themselves.
    let folded: HashMap<&str, &str> = base
        .as_ref()
        .and_then(|b| match b.get("fs") {
            Some(AttributeValue::M(m)) => Some(m),
            _ => None,
        })
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str(), v.as_s().ok()?.as_str())))
                .collect()
        })
        .unwrap_or_default();
    for item in &items {
        let sk = item.string("sk").unwrap_or_default();
        let is_base = sk == keys::LIKES_WRITERS_BASE_SORT;
        if !is_base && !sk.starts_with(keys::LIKES_WRITER_PREFIX) {
            continue;
        }
        let seq = item.string("seq").unwrap_or_default();
        if !is_base && folded.get(sk) == Some(&seq) {
            continue;
        }
        p.n = p.n.saturating_add(item.counter("n")?);
        if !is_base {
            p.w = p.w.saturating_add(item.counter("w")?);
        }
        let at = item.int("updated_at").unwrap_or(0);
        p.last_write_ms = p.last_write_ms.max(at);
        for (name, _) in item.iter() {
            if let Some(attr) = keys::parse_recent_attr(name) {
                let value = item.int(name).unwrap_or(0);
                p.buckets.push((sk.to_owned(), name.clone(), attr, value));
            } else if name.starts_with('c') {
                let value = item.int(name).unwrap_or(0);
                p.windows.add_attr(name, value, now_ms);
            }
        }
        for (start, d) in item.own_tail(tail) {
            p.tail.add(start, d);
        }
        // Written lately without a tail this reader can use (an aggregator
        // that keeps none or another window; for the base, a fold, which
        // keeps none): its records in the window are in no tail.
        let recent = now_ms.saturating_sub(at) < tail.lives_ms();
        if tail.enabled() && recent && (is_base || !item.contains_key(&tail.attr())) {
            p.tail.break_off();
        }
        if !is_base && now_ms.saturating_sub(at) >= quiet_ms && !seq.is_empty() {
            p.quiet.push((sk.to_owned(), seq.to_owned(), item.clone()));
        }
    }
    p.base = base;
    Ok(p)
}

impl DynamoStore {
    /// The table of the writer items: set in stream mode, which writes
    /// them; `WRITERS_TABLE` missing there is a deployment fault.
    pub(super) fn writers_table(&self) -> Result<&str, Error> {
        self.writers_table.as_deref().ok_or_else(|| {
            Error::internal(
                "stream mode without WRITERS_TABLE",
                "set WRITERS_TABLE (the template points it at the views table)",
            )
        })
    }

    /// Every item of partition `pk` of `WRITERS_TABLE` (a writer part, or
    /// the spread registry), page by page, and the pages it took.
    pub(super) async fn query_writers(
        &self,
        pk: &str,
        consistent: bool,
    ) -> Result<(Vec<Item>, u64), Error> {
        let table = self.writers_table()?;
        let (mut items, mut pages) = (Vec::new(), 0);
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(table)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", AttributeValue::S(pk.to_owned()))
                .consistent_read(consistent)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| translate("Query", e))?;
            pages += 1;
            items.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key.filter(|k| !k.is_empty());
            if start.is_none() {
                return Ok((items, pages));
            }
        }
    }

    /// One writer partition (`pk`, a part of a reel's writer items), read
    /// consistently and summed; its quiet items folded by the way, unless
    /// this instance is folding it already.
    pub(super) async fn read_part(&self, pk: &str) -> Result<Partition, Error> {
        let (items, pages) = self.query_writers(pk, true).await?;
        self.stats
            .writer_queries
            .fetch_add(pages, Ordering::Relaxed);
        self.stats
            .writer_items
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        let now_ms = crate::clock::now_ms();
        let p = sum_partition(items, now_ms, self.fold_quiet_ms, &self.own_tail)?;
        if p.quiet.len() >= FOLD_MIN_ITEMS
            && let Some(_claim) = self.folding.claim(pk)
        {
            self.fold_writers(pk, &p).await;
        }
        Ok(p)
    }

    /// Folds `p`'s quiet items into the base (see the module notes). A
    /// fold refused, cancelled or failed changes nothing and is left to the
    /// next reader: the sum is right either way.
    async fn fold_writers(&self, pk: &str, p: &Partition) {
        match self.try_fold(pk, p).await {
            Ok(true) => {
                self.stats.writer_folds.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {
                tracing::debug!(
                    partition = pk,
                    "writer fold cancelled; left to the next read"
                )
            }
            Err(e) => {
                tracing::warn!(
                    partition = pk,
                    error = e.code(),
                    "writer fold failed; left to the next read"
                )
            }
        }
    }

    async fn try_fold(&self, pk: &str, p: &Partition) -> Result<bool, Error> {
        let table = self.writers_table()?;
        let pk = pk.to_owned();
        let taken = &p.quiet[..p.quiet.len().min(FOLD_MAX_ITEMS)];
        let plan = FoldPlan::new(p, taken, self.window, crate::clock::now_ms());
        let mut request = self
            .client
            .transact_write_items()
            .transact_items(plan.base_update(self.writers_table()?, &pk, taken)?);
        for (sk, seq, _) in taken {
            let delete = Delete::builder()
                .table_name(table)
                .key("pk", AttributeValue::S(pk.clone()))
                .key("sk", AttributeValue::S(sk.clone()))
                .condition_expression("#s = :s")
                .expression_attribute_names("#s", "seq")
                .expression_attribute_values(":s", AttributeValue::S(seq.clone()))
                .build()
                .map_err(|e| request_build_failed("Delete", &e))?;
            request = request.transact_items(TransactWriteItem::builder().delete(delete).build());
        }
        let result = request
            .client_request_token(plan.token(&pk, taken).as_str())
            .send()
            .await;
        match result.map_err(|e| maintenance_tx_failure("writer fold", e)) {
            Ok(_) => Ok(true),
            Err(failure) => failure.map(|_| false),
        }
    }
}

/// What one fold writes to the base item.
struct FoldPlan {
    /// `fv` as read (0: no base yet).
    version: i64,
    /// The folded items' `n`, summed.
    n: i64,
    /// The base's new `updated_at`.
    updated_at: i64,
    /// Bucket sums to add, by attribute name (only buckets still kept).
    add: BTreeMap<String, i64>,
    /// The base's buckets older than any kept, to remove.
    remove: Vec<String>,
}

impl FoldPlan {
    fn new(
        p: &Partition,
        taken: &[(String, String, Item)],
        recent: RecentWindow,
        now_ms: i64,
    ) -> Self {
        let kept_from = now_ms - recent.keep_ms;
        let base = p.base.as_ref();
        let mut plan = FoldPlan {
            version: base.and_then(|b| b.int("fv")).unwrap_or(0),
            n: 0,
            updated_at: base.and_then(|b| b.int("updated_at")).unwrap_or(0),
            add: BTreeMap::new(),
            remove: Vec::new(),
        };
        for (_, _, item) in taken {
            plan.n = plan.n.saturating_add(item.int("n").unwrap_or(0));
            plan.updated_at = plan.updated_at.max(item.int("updated_at").unwrap_or(0));
            for (name, _) in item.iter() {
                let kept = match keys::parse_recent_attr(name) {
                    Some(attr) => attr.start_ms + attr.width_ms > kept_from,
                    None => window::parse_attr(name)
                        .is_some_and(|(g, start)| window::is_kept(g, start, now_ms)),
                };
                if kept {
                    *plan.add.entry(name.clone()).or_default() += item.int(name).unwrap_or(0);
                }
            }
        }
        if let Some(b) = base {
            for (name, _) in b.iter() {
                let stale = match keys::parse_recent_attr(name) {
                    Some(attr) => attr.start_ms + attr.width_ms <= kept_from,
                    None => window::parse_attr(name)
                        .is_some_and(|(g, start)| !window::is_kept(g, start, now_ms)),
                };
                if stale && !plan.add.contains_key(name) {
                    plan.remove.push(name.clone());
                }
            }
        }
        plan
    }

    /// Action 0: the base item's update, conditioned on its fold version.
    fn base_update(
        &self,
        table: &str,
        pk: &str,
        taken: &[(String, String, Item)],
    ) -> Result<TransactWriteItem, Error> {
        let mut expr = String::from("ADD #n :n, #fv :one");
        let mut update = Update::builder()
            .table_name(table)
            .key("pk", AttributeValue::S(pk.to_owned()))
            .key(
                "sk",
                AttributeValue::S(keys::LIKES_WRITERS_BASE_SORT.to_owned()),
            );
        for (i, (name, v)) in self.add.iter().enumerate() {
            expr.push_str(&format!(", #b{i} :b{i}"));
            update = update
                .expression_attribute_names(format!("#b{i}"), name)
                .expression_attribute_values(format!(":b{i}"), num(*v));
        }
        expr.push_str(" SET #u = :u, #fs = :fs");
        if !self.remove.is_empty() {
            let names: Vec<String> = (0..self.remove.len()).map(|i| format!("#r{i}")).collect();
            expr.push_str(" REMOVE ");
            expr.push_str(&names.join(", "));
            for (i, name) in self.remove.iter().enumerate() {
                update = update.expression_attribute_names(format!("#r{i}"), name);
            }
        }
        let update = if self.version == 0 {
            update.condition_expression("attribute_not_exists(#fv)")
        } else {
            update
                .condition_expression("#fv = :fv")
                .expression_attribute_values(":fv", num(self.version))
        };
        Ok(TransactWriteItem::builder()
            .update(
                update
                    .update_expression(expr)
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_names("#fv", "fv")
                    .expression_attribute_names("#u", "updated_at")
                    .expression_attribute_names("#fs", "fs")
                    .expression_attribute_values(":n", num(self.n))
                    .expression_attribute_values(":one", num(1))
                    .expression_attribute_values(":u", num(self.updated_at))
                    .expression_attribute_values(":fs", Self::folded(taken))
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
            .build())
    }

    /// The fold's `ClientRequestToken`: from the partition, the version it
    /// starts from and each item taken with its `seq`, so that a retry of
    /// this fold is a replay and any other fold another transaction.
    fn token(&self, pk: &str, taken: &[(String, String, Item)]) -> RequestToken {
        let mut fields = vec![pk.to_owned(), self.version.to_string()];
        for (sk, seq, _) in taken {
            fields.push(format!("{sk}={seq}"));
        }
        let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
        RequestToken::for_fields("writer-fold/v1", &fields)
    }

    /// `fs`: the folded items' sort keys and `seq`s.
    fn folded(taken: &[(String, String, Item)]) -> AttributeValue {
        AttributeValue::M(
            taken
                .iter()
                .map(|(sk, seq, _)| (sk.clone(), AttributeValue::S(seq.clone())))
                .collect(),
        )
    }
}

/// A number attribute.
fn num(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

#[cfg(test)]
mod tests;
