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
use crate::store::{AggregateStore, Checkpoint, ChunkResult, ChunkWrite, RetryReason};
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
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

    async fn apply_chunk(&self, write: &ChunkWrite) -> Result<ChunkResult, Error> {
        let n = |v: i64| AttributeValue::N(v.to_string());
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
        let mut request = self.client.transact_write_items().transact_items(
            TransactWriteItem::builder()
                .update(
                    checkpoint
                        .build()
                        .map_err(|e| request_build_failed("Update", &e))?,
                )
                .build(),
        );
        for add in &write.adds {
            // `w` counts the writes the shard took (one per chunk here): its
            // rate drives automatic resizing, which stream mode rarely
            // needs. The recent-change buckets ride along (see
            // keys::recent_delta_attr), and the oldest are dropped.
            let mut expr = String::from("ADD #n :d, #w :one");
            let mut update = Update::builder().table_name(&self.counters_table).key(
                "pk",
                AttributeValue::S(keys::shard_key(&add.reel, add.shard)),
            );
            for (i, b) in add.recent.iter().enumerate() {
                if b.delta != 0 {
                    expr.push_str(&format!(", #bd{i} :bd{i}"));
                    update = update
                        .expression_attribute_names(
                            format!("#bd{i}"),
                            keys::recent_delta_attr(write.width_ms, b.start_ms),
                        )
                        .expression_attribute_values(format!(":bd{i}"), n(b.delta));
                }
                if b.removals != 0 {
                    expr.push_str(&format!(", #bx{i} :bx{i}"));
                    update = update
                        .expression_attribute_names(
                            format!("#bx{i}"),
                            keys::recent_removals_attr(write.width_ms, b.start_ms),
                        )
                        .expression_attribute_values(format!(":bx{i}"), n(b.removals));
                }
            }
            expr.push_str(" SET #u = :at");
            if !write.prune.is_empty() {
                let mut names = Vec::with_capacity(2 * write.prune.len());
                for (i, start) in write.prune.iter().enumerate() {
                    names.push(format!("#pd{i}, #px{i}"));
                    update = update
                        .expression_attribute_names(
                            format!("#pd{i}"),
                            keys::recent_delta_attr(write.width_ms, *start),
                        )
                        .expression_attribute_names(
                            format!("#px{i}"),
                            keys::recent_removals_attr(write.width_ms, *start),
                        );
                }
                expr.push_str(" REMOVE ");
                expr.push_str(&names.join(", "));
            }
            request = request.transact_items(
                TransactWriteItem::builder()
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
                    .build(),
            );
        }
        let result = request
            .client_request_token(write.token.as_str())
            .send()
            .await;
        // Which shard item a conflict was on (the checkpoint is action 0,
        // `adds[i]` action i + 1), read before the error is classified: the
        // aggregator grows a reel whose shards its chunks meet on.
        let conflicted = match &result {
            Err(SdkError::ServiceError(se)) => match se.err() {
                TransactWriteItemsError::TransactionCanceledException(c) => cancellation_codes(c)
                    .iter()
                    .skip(1)
                    .position(|c| *c == "TransactionConflict"),
                _ => None,
            },
            _ => None,
        };
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
