//! Consistent multi-item reads of the counters table: BatchGetItem looping
//! on unprocessed keys, TransactGetItems retried on conflicts, and the
//! snapshot of a draining reel's fold group that avoids the transaction.

use super::DynamoStore;
use super::error::{cancellation_codes, request_build_failed, throttled, translate};
use super::ext::{Item, ItemExt, Projection};
use crate::error::Error;
use crate::store::RetryReason;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_get_items::TransactGetItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Get, KeysAndAttributes, TransactGetItem};
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// BatchGetItem takes at most 100 keys per call.
const BATCH_GET_MAX_KEYS: usize = 100;
/// BatchGetItem calls in flight at once for one read.
pub(super) const BATCH_GET_PARALLELISM: usize = 8;

/// Snapshot attempts of a draining reel's fold group before falling back
/// to `TransactGetItems`. The counter moves only while folds run, which
/// begin a full wait after `draining` began: by then no writer with older
/// settings is left, so the transaction contends with the folds alone.
const FOLD_READ_ATTEMPTS: u32 = 2;

impl DynamoStore {
    /// Consistent BatchGetItem of `keys` (each a `pk` of the counters table),
    /// in chunks of 100, looping on UnprocessedKeys with bounded backoff.
    pub(super) async fn batch_get_counters(
        &self,
        keys: Vec<String>,
        projection: Option<Projection>,
    ) -> Result<Vec<Item>, Error> {
        let chunks: Vec<Vec<String>> = keys
            .chunks(BATCH_GET_MAX_KEYS)
            .map(<[String]>::to_vec)
            .collect();
        let results: Vec<Vec<Item>> = futures::stream::iter(chunks)
            .map(|chunk| self.batch_get_chunk(chunk, projection))
            .buffer_unordered(BATCH_GET_PARALLELISM)
            .try_collect()
            .await?;
        Ok(results.into_iter().flatten().collect())
    }

    async fn batch_get_chunk(
        &self,
        chunk: Vec<String>,
        projection: Option<Projection>,
    ) -> Result<Vec<Item>, Error> {
        let keys: Vec<Item> = chunk
            .into_iter()
            .map(|pk| HashMap::from([("pk".to_owned(), AttributeValue::S(pk))]))
            .collect();
        self.batch_get_keys(&self.counters_table, keys, projection)
            .await
    }

    /// One consistent BatchGetItem of `keys` (at most 100, whole keys) in
    /// `table`, looping on UnprocessedKeys with bounded backoff.
    pub(super) async fn batch_get_keys(
        &self,
        table: &str,
        keys: Vec<Item>,
        projection: Option<Projection>,
    ) -> Result<Vec<Item>, Error> {
        let mut items = Vec::with_capacity(keys.len());
        let mut pending = keys;
        let mut attempt = 0u32;
        while !pending.is_empty() {
            attempt += 1;
            let mut ka = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut pending)))
                .consistent_read(true)
                .set_projection_expression(projection.map(|p| p.expression.to_owned()));
            for (k, v) in projection.map_or(&[][..], |p| p.names) {
                ka = ka.expression_attribute_names(*k, *v);
            }
            let ka = ka
                .build()
                .map_err(|e| request_build_failed("BatchGetItem request", &e))?;
            let out = self
                .client
                .batch_get_item()
                .request_items(table, ka)
                .send()
                .await
                .map_err(|e| translate("BatchGetItem", e))?;
            if let Some(mut responses) = out.responses {
                items.extend(responses.remove(table).unwrap_or_default());
            }
            pending = out
                .unprocessed_keys
                .and_then(|mut u| u.remove(table))
                .map(|ka| ka.keys)
                .unwrap_or_default();
            if !pending.is_empty() {
                if !self.backoff.allows(attempt) {
                    tracing::warn!(
                        op = "BatchGetItem",
                        unprocessed = pending.len(),
                        attempts = attempt,
                        "unprocessed keys remain after bounded retries"
                    );
                    return Err(Error::Throttled);
                }
                tracing::debug!(
                    op = "BatchGetItem",
                    unprocessed = pending.len(),
                    attempt,
                    "retrying unprocessed keys"
                );
                tokio::time::sleep(self.backoff.delay(attempt)).await;
            }
        }
        Ok(items)
    }

    /// One snapshot of a draining reel's fold group: `keys[0]` is its base
    /// item, the rest the shards being folded into it
    /// ([`Settings::read_items`]). Read without a transaction, because a
    /// `TransactGetItems` is cancelled by any write in flight on its items,
    /// and writers with older settings may still like those shards for the
    /// whole wait. Instead: the base item's `folds` counter, then the
    /// shards, then the counter again (each a consistent single-item read,
    /// serializable with transactions). Unchanged, no fold committed
    /// between the two reads, so every fold is either in both the base and
    /// the shard read or in neither: the sum is what one instant held (likes
    /// only add to shards, as in any shard read). Changed, a fold moved
    /// counts meanwhile: read again, and if a fold lands again, read in one
    /// `TransactGetItems` (see [`FOLD_READ_ATTEMPTS`]).
    pub(super) async fn read_fold_group(&self, keys: Vec<String>) -> Result<Vec<Item>, Error> {
        let Some((base, shards)) = keys.split_first() else {
            return Ok(Vec::new());
        };
        for attempt in 1..=FOLD_READ_ATTEMPTS {
            // Whole items: the windowed-count buckets have names of their
            // own (a projection costs the same read units).
            let before = self.get_counter(base, None).await?;
            let mut items = self.batch_get_counters(shards.to_vec(), None).await?;
            let after = self.get_counter(base, Some(Projection::FOLDS)).await?;
            let folds = |i: &Option<Item>| i.as_ref().and_then(|i| i.int("folds")).unwrap_or(0);
            if folds(&before) == folds(&after) {
                self.stats.fold_group_reads.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .shard_reads_batch
                    .fetch_add(shards.len() as u64, Ordering::Relaxed);
                items.extend(before);
                return Ok(items);
            }
            tracing::debug!(attempt, "a fold landed during a draining read");
        }
        // Folds are landing now, one after another: a snapshot would keep
        // missing the gaps between them. A transaction is cancelled only by
        // a fold in flight on its items (no like writes them any more), and
        // retries that with backoff.
        tracing::debug!("folds landing during a draining read; reading in one transaction");
        self.transact_get_counters(keys).await
    }

    /// One item of the counters table, read consistently.
    pub(super) async fn get_counter(
        &self,
        pk: &str,
        projection: Option<Projection>,
    ) -> Result<Option<Item>, Error> {
        let mut req = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(pk.to_owned()))
            .consistent_read(true);
        if let Some(p) = projection {
            req = req.projection_expression(p.expression);
            for (k, v) in p.names {
                req = req.expression_attribute_names(*k, *v);
            }
        }
        let out = req.send().await.map_err(|e| translate("GetItem", e))?;
        Ok(out.item)
    }

    /// `TransactGetItems` of `keys` (at most 100) from the counters table:
    /// one serializable snapshot. A transaction on one of the items in
    /// flight cancels it (`TransactionConflict`); that is retried with
    /// bounded backoff.
    async fn transact_get_counters(&self, keys: Vec<String>) -> Result<Vec<Item>, Error> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut req = self.client.transact_get_items();
            for pk in &keys {
                // Whole items, as `read_fold_group` reads them.
                let get = Get::builder()
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(pk.clone()))
                    .build()
                    .map_err(|e| request_build_failed("Get", &e))?;
                req = req.transact_items(TransactGetItem::builder().get(get).build());
            }
            let reason = match req.send().await {
                Ok(out) => {
                    self.stats.transact_gets.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .shard_reads_transactional
                        .fetch_add(keys.len() as u64, Ordering::Relaxed);
                    return Ok(out
                        .responses
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|r| r.item)
                        .collect());
                }
                Err(SdkError::ServiceError(se)) => match se.err() {
                    TransactGetItemsError::TransactionCanceledException(c) => {
                        if throttled(&cancellation_codes(c)) {
                            RetryReason::Throttled
                        } else {
                            RetryReason::Conflict
                        }
                    }
                    _ => {
                        return Err(translate("TransactGetItems", SdkError::ServiceError(se)));
                    }
                },
                Err(e) => return Err(translate("TransactGetItems", e)),
            };
            if !self.backoff.allows(attempt) {
                tracing::warn!(
                    op = "TransactGetItems",
                    attempts = attempt,
                    ?reason,
                    "still cancelled after bounded retries"
                );
                return Err(match reason {
                    RetryReason::Throttled => Error::Throttled,
                    _ => Error::Contended,
                });
            }
            tracing::debug!(op = "TransactGetItems", attempt, ?reason, "retrying");
            tokio::time::sleep(self.backoff.delay(attempt)).await;
        }
    }
}
