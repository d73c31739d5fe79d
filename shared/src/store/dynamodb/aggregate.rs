//! [`AggregateStore`] on DynamoDB: a stream shard's checkpoint, and the
//! transaction that applies one chunk of its records.

use super::error::{
    MaintenanceTxFailure, cancellation_codes, maintenance_tx_failure, request_build_failed,
    translate,
};
use super::ext::ItemExt;
use super::{CheckpointMove, DynamoStore};
use crate::error::Error;
use crate::keys;
use crate::keys::ReelId;
use crate::store::{
    AggregateStore, Checkpoint, ChunkAdd, ChunkResult, ChunkWrite, CrowdSighting, RecentAdd,
    RetryReason,
};
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use std::collections::HashMap;

impl AggregateStore for DynamoStore {
    async fn checkpoint(&self, key: &str) -> Result<Checkpoint, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .projection_expression("seq, turn")
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        Ok(out.item.map_or_else(Checkpoint::default, |i| Checkpoint {
            seq: i.string("seq").map(str::to_owned),
            turn: i
                .int("turn")
                .and_then(|t| u32::try_from(t).ok())
                .unwrap_or(0),
        }))
    }

    async fn note_crowd(
        &self,
        reel: &ReelId,
        source: &str,
        sighting: &CrowdSighting,
    ) -> Result<bool, Error> {
        self.crowd_note(reel, source, sighting).await
    }

    async fn apply_chunk(&self, write: &ChunkWrite) -> Result<ChunkResult, Error> {
        let mut request = self
            .client
            .transact_write_items()
            .transact_items(self.checkpoint_item(write)?);
        for add in &write.adds {
            request = request.transact_items(self.shard_item(write, add)?);
        }
        let result = request
            .client_request_token(write.token.as_str())
            .send()
            .await;
        // Which shard item a conflict was on, read before the error is
        // classified (which consumes it): the aggregator grows a reel
        // whose shards its chunks meet on.
        let conflicted = conflicted_add(&result);
        match result.map_err(|e| maintenance_tx_failure("aggregation", e)) {
            Ok(_) => Ok(ChunkResult::Applied),
            Err(failure) => match failure? {
                // The checkpoint is action 0, each reel's shard one after.
                MaintenanceTxFailure::Condition(0) => Ok(ChunkResult::CheckpointMoved),
                MaintenanceTxFailure::Condition(_) => Ok(ChunkResult::SettingsChanged),
                MaintenanceTxFailure::Retry(RetryReason::Conflict) => {
                    Ok(ChunkResult::Conflict { add: conflicted })
                }
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
    /// `Condition(0)`. Its expiry and turn are kept with it.
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
        .checkpoint_update(&self.counters_table, ", #exp = :exp, #t = :turn")
        .expression_attribute_names("#exp", "expires_at")
        .expression_attribute_values(":exp", n(write.expires_at))
        .expression_attribute_names("#t", "turn")
        .expression_attribute_values(":turn", n(i64::from(write.turn)));
        Ok(TransactWriteItem::builder()
            .update(
                checkpoint
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
            .build())
    }

    /// The action of `add`'s shard item in a chunk's transaction.
    fn shard_item(&self, write: &ChunkWrite, add: &ChunkAdd) -> Result<TransactWriteItem, Error> {
        // `w` counts the writes the shard took (one per chunk here): its
        // rate drives automatic resizing, which stream mode rarely
        // needs. The recent-change buckets ride along (see
        // keys::recent_delta_attr), and the oldest are dropped.
        let mut expr = String::from("ADD #n :d, #w :one");
        let update = Update::builder().table_name(&self.counters_table).key(
            "pk",
            AttributeValue::S(keys::shard_key(&add.reel, add.shard)),
        );
        let update = add_recent_buckets(update, &mut expr, write.width_ms, &add.recent);
        expr.push_str(" SET #u = :at");
        let update = drop_old_buckets(update, &mut expr, write.width_ms, &write.prune);
        Ok(TransactWriteItem::builder()
            .update(
                update
                    .update_expression(expr)
                    // A shard a shrink retired is kept as a
                    // closed tombstone and refuses a chunk
                    // planned before it (see crate::reshard):
                    // the guard sits on the item written anyway,
                    // not on the reel's one settings item.
                    .condition_expression(super::SHARD_OPEN)
                    .expression_attribute_names("#c", keys::SHARD_CLOSED)
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_names("#w", "w")
                    .expression_attribute_names("#u", "updated_at")
                    .expression_attribute_values(":d", n(add.delta))
                    .expression_attribute_values(":one", n(1))
                    .expression_attribute_values(":at", n(write.now_ms))
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
            .build())
    }
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

/// Which of a chunk's adds a transaction conflict was on, if one was: the
/// checkpoint is action 0, `adds[i]` action i + 1.
fn conflicted_add<T, R>(result: &Result<T, SdkError<TransactWriteItemsError, R>>) -> Option<usize> {
    match result {
        Err(SdkError::ServiceError(se)) => match se.err() {
            TransactWriteItemsError::TransactionCanceledException(c) => cancellation_codes(c)
                .iter()
                .skip(1)
                .position(|c| *c == "TransactionConflict"),
            _ => None,
        },
        _ => None,
    }
}
