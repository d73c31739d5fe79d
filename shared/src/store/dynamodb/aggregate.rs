//! [`AggregateStore`] on DynamoDB: a stream shard's checkpoint, and the
//! transaction that applies one chunk of its records to its writer items.

use super::error::{MaintenanceTxFailure, maintenance_tx_failure, request_build_failed, translate};
use super::ext::ItemExt;
use super::top;
use super::windows;
use super::{CheckpointMove, DynamoStore};
use crate::error::Error;
use crate::keys::tail::TailWindow;
use crate::keys::{self, top as top_keys};
use crate::store::{
    AggregateStore, Checkpoint, ChunkAdd, ChunkResult, ChunkWrite, RecentAdd, RetryReason, TailMaps,
};
use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use std::collections::{BTreeMap, HashMap};

impl AggregateStore for DynamoStore {
    async fn checkpoint(&self, key: &str) -> Result<Checkpoint, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .projection_expression("seq, #fh")
            .expression_attribute_names("#fh", top_keys::SKETCH_HOUR_ATTR)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        Ok(out.item.map_or_else(Checkpoint::default, |i| Checkpoint {
            seq: i.string("seq").map(str::to_owned),
            sketch_hour: i.int(top_keys::SKETCH_HOUR_ATTR),
        }))
    }

    async fn stored_sketch(
        &self,
        key: &str,
        hour: i64,
    ) -> Result<Option<crate::trending::HourSketch>, Error> {
        let metric = crate::trending::Metric::Likes.name();
        let writer = top_keys::sketch_writer(key);
        top::stored(&self.client, self.writers_table()?, metric, writer, hour).await
    }

    async fn writer_parts(&self, reels: &[&keys::ReelId]) -> HashMap<keys::ReelId, u32> {
        if self.writers_table.is_none() {
            return HashMap::new();
        }
        self.spread_parts(reels).await
    }

    async fn writer_tails(
        &self,
        key: &str,
        items: &[(keys::ReelId, u32)],
        window: &TailWindow,
    ) -> Result<TailMaps, Error> {
        let sk = keys::likes_writer_sort(keys::likes_writer(key));
        let mut owner = HashMap::new();
        let mut out = HashMap::new();
        for group in items.chunks(100) {
            let mut batch = Vec::with_capacity(group.len());
            for (reel, part) in group {
                let pk = keys::likes_writers_part_key(reel, *part);
                owner.insert(pk.clone(), (reel.clone(), *part));
                batch.push(HashMap::from([
                    ("pk".to_owned(), AttributeValue::S(pk)),
                    ("sk".to_owned(), AttributeValue::S(sk.clone())),
                ]));
            }
            // Whole items: a writer item is under 1 KB, one read unit
            // with or without a projection.
            let items = self
                .batch_get_keys(self.writers_table()?, batch, None)
                .await?;
            for item in items {
                if let Some(id) = item.pk().and_then(|pk| owner.get(pk)) {
                    out.insert(id.clone(), item.own_tail(window));
                }
            }
        }
        self.stats
            .tail_reads
            .fetch_add(items.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    async fn apply_chunk(&self, write: &ChunkWrite) -> Result<ChunkResult, Error> {
        let mut request = self
            .client
            .transact_write_items()
            .transact_items(self.checkpoint_item(write)?);
        for add in &write.adds {
            request = request.transact_items(writer_item(self.writers_table()?, write, add)?);
        }
        for put in top::puts(
            self.writers_table()?,
            crate::trending::Metric::Likes.name(),
            top_keys::sketch_writer(&write.checkpoint_key),
            write.sketch.as_ref(),
            write.now_ms,
        )? {
            request = request.transact_items(put);
        }
        let result = request
            .client_request_token(write.token.as_str())
            .send()
            .await;
        match result.map_err(|e| maintenance_tx_failure("aggregation", e)) {
            Ok(_) => Ok(ChunkResult::Applied),
            Err(failure) => match failure? {
                // The checkpoint is action 0, each reel's shard one after.
                // The checkpoint is action 0; writer items have no
                // condition.
                MaintenanceTxFailure::Condition(_) => Ok(ChunkResult::CheckpointMoved),
                MaintenanceTxFailure::Retry(RetryReason::Conflict) => Ok(ChunkResult::Conflict),
                MaintenanceTxFailure::Retry(reason) => Ok(ChunkResult::Retry(reason)),
                // The token is derived from the whole body, so this would
                // take a hash collision; whatever it is, nothing was
                // written: read the checkpoint again.
                MaintenanceTxFailure::Mismatch => Ok(ChunkResult::CheckpointMoved),
            },
        }
    }
}

impl DynamoStore {
    /// Action 0 of a chunk's transaction, the checkpoint's move: first, so
    /// that a refused move (another invocation got there) reads as
    /// `Condition(0)`. Its expiry is kept with it.
    fn checkpoint_item(&self, write: &ChunkWrite) -> Result<TransactWriteItem, Error> {
        let checkpoint = CheckpointMove {
            key: HashMap::from([(
                "pk".to_owned(),
                AttributeValue::S(write.checkpoint_key.clone()),
            )]),
            expected: write.expected.as_deref(),
            next: &write.next,
            shard_id: &write.shard_id,
            now_ms: write.now_ms,
            records: write.records,
        }
        .checkpoint_update(
            &self.counters_table,
            &format!(
                ", #exp = :exp{}",
                top::checkpoint_sets(write.sketch.as_ref())
            ),
        )
        .expression_attribute_names("#exp", "expires_at")
        .expression_attribute_values(":exp", n(write.expires_at));
        let checkpoint = top::with_sketch(checkpoint, write.sketch.as_ref());
        Ok(TransactWriteItem::builder()
            .update(
                checkpoint
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
            .build())
    }
}

/// The action of `add`'s writer item in a chunk's transaction: the
/// stream shard's own item of the reel in `table`. `w` counts its writes
/// and `seq` is the chunk's last record: a fold deletes the item only if
/// `seq` is still what it read, and remembers it, so a reader that saw the
/// item and the folded base together counts it once (see `writers.rs`).
/// The recent-change buckets ride along (see keys::recent_delta_attr), and
/// the oldest are dropped. No condition: no other stream shard writes the
/// item, and the checkpoint (action 0) makes the chunk land once.
fn writer_item(
    table: &str,
    write: &ChunkWrite,
    add: &ChunkAdd,
) -> Result<TransactWriteItem, Error> {
    let mut expr = String::from("ADD #n :d, #w :one");
    let update = Update::builder()
        .table_name(table)
        .key(
            "pk",
            AttributeValue::S(keys::likes_writers_part_key(&add.reel, add.part)),
        )
        .key(
            "sk",
            AttributeValue::S(keys::likes_writer_sort(keys::likes_writer(
                &write.checkpoint_key,
            ))),
        );
    let update = add_recent_buckets(update, &mut expr, write.width_ms, &add.recent);
    let update = windows::add(update, &mut expr, &add.windows);
    expr.push_str(" SET #u = :at, #s = :seq");
    let update = set_tail(
        update,
        &mut expr,
        (write.tail_width_ms, write.tail_keep_ms),
        add.tail.as_ref(),
    );
    let update = drop_old_buckets(update, &mut expr, write.width_ms, &write.prune);
    let update = windows::remove(
        update,
        &mut expr,
        &write.window_prune,
        write.prune.is_empty(),
    );
    Ok(TransactWriteItem::builder()
        .update(
            update
                .update_expression(expr)
                .expression_attribute_names("#n", "n")
                .expression_attribute_names("#w", "w")
                .expression_attribute_names("#u", "updated_at")
                .expression_attribute_names("#s", "seq")
                .expression_attribute_values(":d", n(add.delta))
                .expression_attribute_values(":one", n(1))
                .expression_attribute_values(":at", n(write.now_ms))
                .expression_attribute_values(":seq", AttributeValue::S(write.next.clone()))
                .build()
                .map_err(|e| request_build_failed("Update", &e))?,
        )
        .build())
}

/// The SET of the item's own-change tail, whole (see
/// [`crate::keys::tail`]), when the chunk gives one.
fn set_tail(
    update: UpdateBuilder,
    expr: &mut String,
    (width_ms, keep_ms): (i64, i64),
    tail: Option<&BTreeMap<i64, i64>>,
) -> UpdateBuilder {
    let Some(tail) = tail else {
        return update;
    };
    let window = TailWindow {
        width_ms,
        keep_ms,
        skew_ms: 0,
    };
    let map = tail
        .iter()
        .map(|(start, d)| (window.entry_key(*start), n(*d)))
        .collect();
    expr.push_str(", #t = :t");
    update
        .expression_attribute_names("#t", window.attr())
        .expression_attribute_values(":t", AttributeValue::M(map))
}

/// A number attribute.
fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The ADD clauses of a shard's recent-change buckets: an empty sum is
/// left out, so that a chunk creates no attribute it does not change.
fn add_recent_buckets(
    mut update: UpdateBuilder,
    expr: &mut String,
    width_ms: i64,
    recent: &[RecentAdd],
) -> UpdateBuilder {
    for (i, b) in recent.iter().enumerate() {
        if b.delta != 0 {
            expr.push_str(&format!(", #bd{i} :bd{i}"));
            update = update
                .expression_attribute_names(
                    format!("#bd{i}"),
                    keys::recent_delta_attr(width_ms, b.start_ms),
                )
                .expression_attribute_values(format!(":bd{i}"), n(b.delta));
        }
        if b.removals != 0 {
            expr.push_str(&format!(", #bx{i} :bx{i}"));
            update = update
                .expression_attribute_names(
                    format!("#bx{i}"),
                    keys::recent_removals_attr(width_ms, b.start_ms),
                )
                .expression_attribute_values(format!(":bx{i}"), n(b.removals));
        }
    }
    update
}

/// The REMOVE clause of the buckets older than any kept (`prune`, their
/// starts), if there are any: a shard item carries only the window.
fn drop_old_buckets(
    mut update: UpdateBuilder,
    expr: &mut String,
    width_ms: i64,
    prune: &[i64],
) -> UpdateBuilder {
    if prune.is_empty() {
        return update;
    }
    let mut names = Vec::with_capacity(2 * prune.len());
    for (i, start) in prune.iter().enumerate() {
        names.push(format!("#pd{i}, #px{i}"));
        update = update
            .expression_attribute_names(
                format!("#pd{i}"),
                keys::recent_delta_attr(width_ms, *start),
            )
            .expression_attribute_names(
                format!("#px{i}"),
                keys::recent_removals_attr(width_ms, *start),
            );
    }
    expr.push_str(" REMOVE ");
    expr.push_str(&names.join(", "));
    update
}
