//! [`CounterStore`] on DynamoDB through the AWS SDK.
//!
//! This is the only module that sees SDK types. Every SDK error is
//! translated here, once, by `translate`; the detail is logged and never
//! leaves the module.

use super::{
    CorrectResult, CountItem, CounterStore, FoldResult, KeyRecord, KeyRecordSpec, Ledger, LikeRow,
    LikeTx, Phase, ReconcileStore, ReelView, ResizeStore, RetryReason, RunCount, ScanPage,
    ScanTable, Settings, ShardSum, ShardValue, TxResult, WriteSample,
};
use crate::config::Config;
use crate::error::Error;
use crate::keys::{self, Action, ReelId, UserId};
use crate::retry::Backoff;
use crate::token::RequestToken;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_get_items::TransactGetItemsError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Get, KeysAndAttributes, Put, ReturnConsumedCapacity,
    TransactGetItem, TransactWriteItem, Update,
};
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// BatchGetItem takes at most 100 keys per call.
const BATCH_GET_MAX_KEYS: usize = 100;
/// BatchGetItem calls in flight at once for one read.
const BATCH_GET_PARALLELISM: usize = 8;

/// The DynamoDB implementation of [`CounterStore`], [`ResizeStore`] and
/// [`ReconcileStore`] over the two tables. Cheap to clone: clones share the
/// SDK client and the [`StoreStats`].
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    counters_table: String,
    likes_table: String,
    backoff: Backoff,
    /// Shared by every clone of this store.
    stats: Arc<StoreStats>,
}

/// Counts of the calls that matter for cost, since this store was built.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Shard items read by BatchGetItem (one read unit each).
    pub shard_reads_batch: AtomicU64,
    /// `TransactGetItems` calls (a shrinking reel's sum).
    pub transact_gets: AtomicU64,
    /// Items those calls read (two read units each).
    pub shard_reads_transactional: AtomicU64,
    /// Snapshots of a draining reel's fold group taken without a
    /// transaction (the base item's fold counter read around its shards).
    pub fold_group_reads: AtomicU64,
    /// Fold transactions that committed.
    pub folds: AtomicU64,
}

/// The SDK configuration for `config`: bounded retries and timeouts, so a
/// request never outlives the function. The endpoint, region and credentials
/// come from the standard chain, so `AWS_ENDPOINT_URL_DYNAMODB` points it at
/// a local server.
pub fn sdk_config_loader(config: &Config) -> aws_config::ConfigLoader {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        // The SDK's generic default backs off from 1 s, which alone would
        // spend a request's whole budget; DynamoDB's own SDKs start near
        // 25–50 ms. The same full-jitter bounds as the transaction retries.
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(config.ddb_max_attempts)
                .with_initial_backoff(config.retry_base)
                .with_max_backoff(config.retry_max),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.ddb_connect_timeout)
                .operation_attempt_timeout(config.ddb_attempt_timeout)
                .operation_timeout(config.ddb_operation_timeout)
                .build(),
        )
}

/// The SDK's retry partition for `config`: its own token bucket (the retry
/// quota, [`Config::ddb_retry_quota`]) instead of the SDK's default one.
pub fn retry_partition(config: &Config) -> RetryPartition {
    let bucket = if config.ddb_retry_quota == 0 {
        TokenBucket::unlimited()
    } else {
        TokenBucket::builder()
            .capacity(config.ddb_retry_quota as usize)
            .refill_rate(config.ddb_retry_quota_refill as f32)
            .build()
    };
    RetryPartition::custom("likes-dynamodb")
        .token_bucket(bucket)
        .build()
}

/// The DynamoDB client for `sdk`, with the retry quota of `config`.
///
/// An empty `AWS_ENDPOINT_URL_DYNAMODB` (or `AWS_ENDPOINT_URL`) means "not
/// set": `sam local invoke` sets every variable the template declares but
/// cannot resolve to "", and the SDK panics on an empty endpoint URL.
pub fn client(sdk: &aws_config::SdkConfig, config: &Config) -> Client {
    let mut builder =
        aws_sdk_dynamodb::config::Builder::from(sdk).retry_partition(retry_partition(config));
    let vars = ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"].map(|k| std::env::var(k).ok());
    if vars.iter().flatten().any(|v| v.trim().is_empty()) {
        // The first non-empty one, in the SDK's own order of precedence.
        let url = vars.into_iter().flatten().find(|v| !v.trim().is_empty());
        builder.set_endpoint_url(url);
    }
    Client::from_conf(builder.build())
}

impl DynamoStore {
    /// Builds the SDK client from the environment (once per cold start).
    pub async fn from_env(config: &Config) -> Self {
        let sdk = sdk_config_loader(config).load().await;
        Self::new(client(&sdk, config), config)
    }

    /// A store over `client` and the tables `config` names (tests pass a
    /// client of their own).
    pub fn new(client: Client, config: &Config) -> Self {
        DynamoStore {
            client,
            counters_table: config.counters_table.clone(),
            likes_table: config.likes_table.clone(),
            backoff: Backoff::from_config(config),
            stats: Arc::default(),
        }
    }

    /// The SDK client it calls through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Call counts since the store was built (read by the request metrics
    /// and tests).
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Consistent BatchGetItem of `keys` (each a `pk` of the counters table),
    /// in chunks of 100, looping on UnprocessedKeys with bounded backoff.
    async fn batch_get_counters(
        &self,
        keys: Vec<String>,
        projection: Option<&'static str>,
        names: &'static [(&'static str, &'static str)],
    ) -> Result<Vec<HashMap<String, AttributeValue>>, Error> {
        let chunks: Vec<Vec<String>> = keys
            .chunks(BATCH_GET_MAX_KEYS)
            .map(<[String]>::to_vec)
            .collect();
        let results: Vec<Vec<HashMap<String, AttributeValue>>> = futures::stream::iter(chunks)
            .map(|chunk| self.batch_get_chunk(chunk, projection, names))
            .buffer_unordered(BATCH_GET_PARALLELISM)
            .try_collect()
            .await?;
        Ok(results.into_iter().flatten().collect())
    }

    async fn batch_get_chunk(
        &self,
        chunk: Vec<String>,
        projection: Option<&'static str>,
        names: &'static [(&'static str, &'static str)],
    ) -> Result<Vec<HashMap<String, AttributeValue>>, Error> {
        let mut items = Vec::with_capacity(chunk.len());
        let mut pending: Vec<HashMap<String, AttributeValue>> = chunk
            .into_iter()
            .map(|pk| HashMap::from([("pk".to_owned(), AttributeValue::S(pk))]))
            .collect();
        let mut attempt = 0u32;
        while !pending.is_empty() {
            attempt += 1;
            let mut ka = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut pending)))
                .consistent_read(true)
                .set_projection_expression(projection.map(str::to_owned));
            for (k, v) in names {
                ka = ka.expression_attribute_names(*k, *v);
            }
            let ka = ka
                .build()
                .map_err(|e| internal("BatchGetItem request", &e))?;
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.counters_table, ka)
                .send()
                .await
                .map_err(|e| translate("BatchGetItem", e))?;
            if let Some(mut responses) = out.responses {
                items.extend(responses.remove(&self.counters_table).unwrap_or_default());
            }
            pending = out
                .unprocessed_keys
                .and_then(|mut u| u.remove(&self.counters_table))
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
}

/// Snapshot attempts of a draining reel's fold group before falling back
/// to `TransactGetItems`. The counter moves only while folds run, which
/// begin a full wait after `draining` began: by then no writer with older
/// settings is left, so the transaction contends with the folds alone.
const FOLD_READ_ATTEMPTS: u32 = 2;

impl DynamoStore {
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
    async fn read_fold_group(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<HashMap<String, AttributeValue>>, Error> {
        let Some((base, shards)) = keys.split_first() else {
            return Ok(Vec::new());
        };
        let names: &'static [(&'static str, &'static str)] = &[
            ("#n", "n"),
            ("#w", "w"),
            ("#u", "updated_at"),
            ("#f", "folds"),
        ];
        for attempt in 1..=FOLD_READ_ATTEMPTS {
            let before = self.get_counter(base, "pk, #n, #w, #u, #f", names).await?;
            let mut items = self
                .batch_get_counters(shards.to_vec(), Some("pk, #n, #w, #u"), &names[..3])
                .await?;
            let after = self.get_counter(base, "pk, #f", &names[3..]).await?;
            let folds = |i: &Option<HashMap<String, AttributeValue>>| {
                i.as_ref()
                    .and_then(|i| i.get("folds"))
                    .and_then(number)
                    .unwrap_or(0)
            };
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
    async fn get_counter(
        &self,
        pk: &str,
        projection: &str,
        names: &[(&str, &str)],
    ) -> Result<Option<HashMap<String, AttributeValue>>, Error> {
        let mut req = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(pk.to_owned()))
            .consistent_read(true)
            .projection_expression(projection);
        for (k, v) in names {
            req = req.expression_attribute_names(*k, *v);
        }
        let out = req.send().await.map_err(|e| translate("GetItem", e))?;
        Ok(out.item)
    }

    /// `TransactGetItems` of `keys` (at most 100) from the counters table:
    /// one serializable snapshot. A transaction on one of the items in
    /// flight cancels it (`TransactionConflict`); that is retried with
    /// bounded backoff.
    async fn transact_get_counters(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<HashMap<String, AttributeValue>>, Error> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut req = self.client.transact_get_items();
            for pk in &keys {
                req = req.transact_items(
                    TransactGetItem::builder()
                        .get(
                            Get::builder()
                                .table_name(&self.counters_table)
                                .key("pk", AttributeValue::S(pk.clone()))
                                .projection_expression("pk, #n, #w, #u")
                                .expression_attribute_names("#n", "n")
                                .expression_attribute_names("#w", "w")
                                .expression_attribute_names("#u", "updated_at")
                                .build()
                                .map_err(|e| internal("Get", &e))?,
                        )
                        .build(),
                );
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

impl DynamoStore {
    /// The `ConditionCheck` that a reel's settings item is still at
    /// `version` (0: there is none), for the transactions that move or
    /// remove counts only under the settings they were planned with.
    fn settings_at(&self, reel: &ReelId, version: u64) -> Result<TransactWriteItem, Error> {
        let check = ConditionCheck::builder()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::settings_key(reel)));
        let check = if version == 0 {
            check.condition_expression("attribute_not_exists(ver)")
        } else {
            check
                .condition_expression("ver = :ver")
                .expression_attribute_values(":ver", AttributeValue::N(version.to_string()))
        };
        Ok(TransactWriteItem::builder()
            .condition_check(check.build().map_err(|e| internal("ConditionCheck", &e))?)
            .build())
    }

    /// Puts `item` (which carries `ver = expected + 1`) if the stored item's
    /// `ver` is still `expected` (0: no item, or one without a version).
    /// `Ok(false)`: another writer was first.
    async fn put_versioned(
        &self,
        item: HashMap<String, AttributeValue>,
        expected: u64,
    ) -> Result<bool, Error> {
        let mut put = self
            .client
            .put_item()
            .table_name(&self.counters_table)
            .set_item(Some(item));
        put = if expected == 0 {
            put.condition_expression("attribute_not_exists(ver)")
        } else {
            put.condition_expression("ver = :v")
                .expression_attribute_values(":v", AttributeValue::N(expected.to_string()))
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(translate("PutItem", e)),
        }
    }
}

impl CounterStore for DynamoStore {
    async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
        let mut wanted: HashMap<String, ReelId> = HashMap::with_capacity(reels.len());
        for r in reels {
            wanted.insert(keys::settings_key(r), r.clone());
        }
        let items = self
            .batch_get_counters(wanted.keys().cloned().collect(), None, &[])
            .await?;
        let mut out: HashMap<ReelId, Settings> = reels
            .iter()
            .map(|r| (r.clone(), Settings::default()))
            .collect();
        for item in items {
            let Some(reel) = item
                .get("pk")
                .and_then(|v| v.as_s().ok())
                .and_then(|pk| wanted.get(pk))
            else {
                continue;
            };
            out.insert(reel.clone(), parse_settings(&item)?);
        }
        Ok(out)
    }

    async fn sum_shards(
        &self,
        reels: &[(ReelId, Settings)],
    ) -> Result<HashMap<ReelId, ShardSum>, Error> {
        let mut owner: HashMap<String, ReelId> = HashMap::new();
        let mut sums: HashMap<ReelId, ShardSum> = HashMap::with_capacity(reels.len());
        let mut atomic: Vec<(ReelId, Vec<String>)> = Vec::new();
        for (reel, settings) in reels {
            sums.insert(reel.clone(), ShardSum::default());
            let items = settings.read_items(reel);
            if !items.atomic.is_empty() {
                atomic.push((reel.clone(), items.atomic));
            }
            for key in items.batch {
                owner.insert(key, reel.clone());
            }
        }
        self.stats
            .shard_reads_batch
            .fetch_add(owner.len() as u64, Ordering::Relaxed);
        let batch = self.batch_get_counters(
            owner.keys().cloned().collect(),
            Some("pk, #n, #w, #u"),
            &[("#n", "n"), ("#w", "w"), ("#u", "updated_at")],
        );
        let transactional = futures::stream::iter(atomic)
            .map(|(reel, keys)| async move {
                let items = self.read_fold_group(keys).await?;
                Ok::<_, Error>((reel, items))
            })
            .buffer_unordered(BATCH_GET_PARALLELISM)
            .try_collect::<Vec<_>>();
        let (batch, transactional) = tokio::join!(batch, transactional);
        let mut add = |reel: &ReelId, item: &HashMap<String, AttributeValue>| {
            let v = shard_value(item)?;
            if let Some(sum) = sums.get_mut(reel) {
                sum.n = sum.n.saturating_add(v.n);
                sum.w = sum.w.saturating_add(v.w);
                let at = item.get("updated_at").and_then(number).unwrap_or(0);
                sum.last_write_ms = sum.last_write_ms.max(at);
            }
            Ok::<_, Error>(())
        };
        for item in batch? {
            if let Some(reel) = item
                .get("pk")
                .and_then(|v| v.as_s().ok())
                .and_then(|pk| owner.get(pk))
            {
                add(reel, &item)?;
            }
        }
        for (reel, items) in transactional? {
            for item in &items {
                add(&reel, item)?;
            }
        }
        Ok(sums)
    }

    async fn put_settings(
        &self,
        reel: &ReelId,
        expected: u64,
        next: &Settings,
    ) -> Result<bool, Error> {
        self.put_versioned(settings_item(reel, next, expected + 1), expected)
            .await
    }

    async fn write_like(&self, tx: &LikeTx) -> Result<TxResult, Error> {
        let row_op = match tx.action {
            Action::Like => TransactWriteItem::builder()
                .put(
                    Put::builder()
                        .table_name(&self.likes_table)
                        .item("user_id", AttributeValue::S(tx.user.as_str().to_owned()))
                        .item("reel_id", AttributeValue::S(tx.reel.as_str().to_owned()))
                        .item("liked_at", AttributeValue::N(tx.now_ms.to_string()))
                        .item("tok", AttributeValue::S(tx.token.as_str().to_owned()))
                        .condition_expression("attribute_not_exists(user_id)")
                        .build()
                        .map_err(|e| internal("Put", &e))?,
                )
                .build(),
            Action::Unlike => TransactWriteItem::builder()
                .delete(
                    Delete::builder()
                        .table_name(&self.likes_table)
                        .key("user_id", AttributeValue::S(tx.user.as_str().to_owned()))
                        .key("reel_id", AttributeValue::S(tx.reel.as_str().to_owned()))
                        .condition_expression("attribute_exists(user_id)")
                        .build()
                        .map_err(|e| internal("Delete", &e))?,
                )
                .build(),
        };
        let shard_op = TransactWriteItem::builder()
            .update(
                Update::builder()
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(keys::shard_key(&tx.reel, tx.shard)))
                    // `w` counts every write the shard took: its rate is the
                    // reel's write rate (automatic resizing), and a change
                    // of it marks the shard as written (reconciliation).
                    // `updated_at` (the request's own clock, fixed for its
                    // retries) marks when the shard last took a write:
                    // reconciliation defers reels written during its scan.
                    .update_expression("ADD #n :d, #w :one SET #u = :at")
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_names("#w", "w")
                    .expression_attribute_names("#u", "updated_at")
                    .expression_attribute_values(":at", AttributeValue::N(tx.now_ms.to_string()))
                    .expression_attribute_values(
                        ":d",
                        AttributeValue::N(tx.action.delta().to_string()),
                    )
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .build()
                    .map_err(|e| internal("Update", &e))?,
            )
            .build();
        let mut request = self
            .client
            .transact_write_items()
            .transact_items(row_op)
            .transact_items(shard_op);
        if let Some(spec) = &tx.record {
            request =
                request.transact_items(record_put(&self.counters_table, spec, tx.action, true)?);
        }
        let result = request
            .client_request_token(tx.token.as_str())
            // INDEXES, not TOTAL: it documents the per-table `Capacity`
            // (read and write units apart), which is what tells a replay.
            .return_consumed_capacity(ReturnConsumedCapacity::Indexes)
            .send()
            .await;
        match result {
            Ok(out) => Ok(commit_kind(out.consumed_capacity())),
            Err(SdkError::ServiceError(se)) => match se.err() {
                TransactWriteItemsError::TransactionCanceledException(c) => {
                    classify_cancellation(&cancellation_codes(c))
                }
                TransactWriteItemsError::IdempotentParameterMismatchException(_) => {
                    Ok(TxResult::ParameterMismatch)
                }
                TransactWriteItemsError::TransactionInProgressException(_) => {
                    Ok(TxResult::Retry(RetryReason::InProgress))
                }
                _ => match translate("TransactWriteItems", SdkError::ServiceError(se)) {
                    // Throttling that outlasted the SDK's retries: our own
                    // backoff loop gets a go at it too.
                    Error::Throttled => Ok(TxResult::Retry(RetryReason::Throttled)),
                    other => Err(other),
                },
            },
            Err(other) => Err(translate("TransactWriteItems", other)),
        }
    }

    async fn like_row(&self, user: &UserId, reel: &ReelId) -> Result<Option<LikeRow>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.likes_table)
            .key("user_id", AttributeValue::S(user.as_str().to_owned()))
            .key("reel_id", AttributeValue::S(reel.as_str().to_owned()))
            .consistent_read(true)
            .projection_expression("liked_at, tok")
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        Ok(out.item.map(|item| LikeRow {
            liked_at_ms: item.get("liked_at").and_then(number),
            token: item.get("tok").and_then(|v| v.as_s().ok()).cloned(),
        }))
    }

    async fn key_record(&self, key_token: &RequestToken) -> Result<Option<KeyRecord>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key(
                "pk",
                AttributeValue::S(keys::idempotency_record_key(key_token.as_str())),
            )
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        let action = match item
            .get("action")
            .and_then(|v| v.as_s().ok())
            .map(String::as_str)
        {
            Some("like") => Action::Like,
            Some("unlike") => Action::Unlike,
            other => {
                tracing::error!(action = ?other, "idempotency record with an unknown action");
                return Err(Error::Internal);
            }
        };
        let changed = item
            .get("changed")
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false);
        Ok(Some(KeyRecord { action, changed }))
    }

    async fn record_unchanged(
        &self,
        spec: &KeyRecordSpec,
        action: Action,
    ) -> Result<KeyRecord, Error> {
        // A one-item transaction: the template allows writes to the
        // counters table only inside TransactWriteItems.
        let result = self
            .client
            .transact_write_items()
            .transact_items(record_put(&self.counters_table, spec, action, false)?)
            .send()
            .await;
        match result {
            Ok(_) => Ok(KeyRecord {
                action,
                changed: false,
            }),
            Err(SdkError::ServiceError(se)) => match se.err() {
                TransactWriteItemsError::TransactionCanceledException(c) => {
                    match classify_cancellation(&cancellation_codes(c))? {
                        // A record appeared first (a concurrent request with
                        // the same key): it is the answer.
                        TxResult::AlreadyInState => self
                            .key_record(&spec.key_token)
                            .await?
                            .ok_or(Error::Contended),
                        TxResult::Retry(RetryReason::Throttled) => Err(Error::Throttled),
                        TxResult::Retry(_) => Err(Error::Contended),
                        other => {
                            tracing::error!(outcome = ?other, "key record cancelled for an unexpected reason");
                            Err(Error::Internal)
                        }
                    }
                }
                _ => Err(translate("TransactWriteItems", SdkError::ServiceError(se))),
            },
            Err(e) => Err(translate("TransactWriteItems", e)),
        }
    }

    async fn count_items(
        &self,
        reel: &ReelId,
        items: &[CountItem],
    ) -> Result<Vec<(CountItem, ShardValue)>, Error> {
        let by_key: HashMap<String, CountItem> = items.iter().map(|i| (i.key(reel), *i)).collect();
        let found = self
            .batch_get_counters(
                by_key.keys().cloned().collect(),
                Some("pk, #n, #w"),
                &[("#n", "n"), ("#w", "w")],
            )
            .await?;
        let mut out = Vec::with_capacity(found.len());
        for item in &found {
            let which = item
                .get("pk")
                .and_then(|v| v.as_s().ok())
                .and_then(|pk| by_key.get(pk));
            if let Some(which) = which {
                out.push((*which, shard_value(item)?));
            }
        }
        Ok(out)
    }

    async fn ping(&self) -> Result<(), Error> {
        // Data-plane reads, not DescribeTable: control-plane calls are
        // rate-limited per account and shared with deployments, and an
        // unauthenticated probe must not spend them. A GetItem of a key
        // that is never written (an eventually consistent read of a missing
        // item: half a read unit) proves the table exists and answers, with
        // the permissions the read function already has.
        let (a, b) = tokio::join!(
            self.client
                .get_item()
                .table_name(&self.counters_table)
                .key(
                    "pk",
                    AttributeValue::S(keys::settings_key(&keys::probe_reel()))
                )
                .projection_expression("pk")
                .send(),
            self.client
                .get_item()
                .table_name(&self.likes_table)
                .key("user_id", AttributeValue::S(keys::PROBE_USER.to_owned()))
                .key(
                    "reel_id",
                    AttributeValue::S(keys::probe_reel().as_str().to_owned())
                )
                .projection_expression("reel_id")
                .send(),
        );
        a.map_err(|e| translate("GetItem", e))?;
        b.map_err(|e| translate("GetItem", e))?;
        Ok(())
    }
}

impl ResizeStore for DynamoStore {
    async fn shard(&self, reel: &ReelId, shard: u32) -> Result<Option<ShardValue>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::shard_key(reel, shard)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        out.item.as_ref().map(shard_value).transpose()
    }

    async fn fold(
        &self,
        reel: &ReelId,
        shard: u32,
        seen: ShardValue,
        settings_version: u64,
        attempt: u32,
    ) -> Result<FoldResult, Error> {
        if seen == ShardValue::default() {
            return Ok(FoldResult::Folded);
        }
        let n = |v: i64| AttributeValue::N(v.to_string());
        let check = self.settings_at(reel, settings_version)?;
        let into = TransactWriteItem::builder()
            .update(
                Update::builder()
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(keys::base_key(reel)))
                    // `folds` counts the folds the base item took: a reader
                    // that sees it unchanged before and after reading the
                    // shards being folded saw no fold half-done.
                    .update_expression("ADD #n :seen_n, #w :seen_w, #f :one")
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_names("#w", "w")
                    .expression_attribute_names("#f", "folds")
                    .expression_attribute_values(":seen_n", n(seen.n))
                    .expression_attribute_values(":seen_w", n(seen.w))
                    .expression_attribute_values(":one", n(1))
                    .build()
                    .map_err(|e| internal("Update", &e))?,
            )
            .build();
        let (condition, values) = holds_exactly(seen);
        let from = Update::builder()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::shard_key(reel, shard)))
            .update_expression("ADD #n :neg_n, #w :neg_w")
            .condition_expression(condition)
            .expression_attribute_names("#n", "n")
            .expression_attribute_names("#w", "w")
            .set_expression_attribute_values(Some(
                values
                    .into_iter()
                    .chain([
                        (":neg_n".to_owned(), n(-seen.n)),
                        (":neg_w".to_owned(), n(-seen.w)),
                    ])
                    .collect(),
            ));
        let from = TransactWriteItem::builder()
            .update(from.build().map_err(|e| internal("Update", &e))?)
            .build();
        // The SDK's own retries of this call resend this token, so a retry
        // after a lost response is a replay. The next attempt (after reading
        // the shard again) gets a new one; the value condition makes it safe.
        let token = RequestToken::for_fields(
            "fold",
            &[
                reel.as_str(),
                &shard.to_string(),
                &seen.n.to_string(),
                &seen.w.to_string(),
                &settings_version.to_string(),
                &attempt.to_string(),
                &fastrand::u64(..).to_string(),
            ],
        );
        let result = self
            .client
            .transact_write_items()
            .transact_items(check)
            .transact_items(into)
            .transact_items(from)
            .client_request_token(token.as_str())
            .send()
            .await;
        match result.map_err(|e| internal_tx_failure("fold", e)) {
            Ok(_) => {
                self.stats.folds.fetch_add(1, Ordering::Relaxed);
                Ok(FoldResult::Folded)
            }
            Err(failure) => match failure? {
                TxFailure::Condition(0) => Ok(FoldResult::SettingsChanged),
                TxFailure::Condition(_) => Ok(FoldResult::ShardChanged),
                TxFailure::Retry(reason) => Ok(FoldResult::Retry(reason)),
                // The token is derived from everything the fold writes, so a
                // mismatch means a stale view: read again.
                TxFailure::Mismatch => Ok(FoldResult::ShardChanged),
            },
        }
    }

    async fn delete_empty_shard(&self, reel: &ReelId, shard: u32) -> Result<bool, Error> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::shard_key(reel, shard)))
            .condition_expression(
                "(attribute_not_exists(#n) OR #n = :zero) AND (attribute_not_exists(#w) OR #w = :zero)",
            )
            .expression_attribute_names("#n", "n")
            .expression_attribute_names("#w", "w")
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(translate("DeleteItem", e)),
        }
    }

    async fn clear_stray(
        &self,
        reel: &ReelId,
        item: CountItem,
        seen: ShardValue,
        settings_version: u64,
    ) -> Result<FoldResult, Error> {
        let pk = item.key(reel);
        let (condition, values) = holds_exactly(seen);
        let delete = TransactWriteItem::builder()
            .delete(
                Delete::builder()
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(pk.clone()))
                    .condition_expression(condition)
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_names("#w", "w")
                    .set_expression_attribute_values(Some(values))
                    .build()
                    .map_err(|e| internal("Delete", &e))?,
            )
            .build();
        // A fresh token per attempt: the value and settings conditions make a
        // repeat harmless, and the SDK's own retries of this call reuse it.
        let token = RequestToken::for_fields(
            "stray",
            &[
                &pk,
                &seen.n.to_string(),
                &seen.w.to_string(),
                &settings_version.to_string(),
                &fastrand::u64(..).to_string(),
            ],
        );
        let result = self
            .client
            .transact_write_items()
            .transact_items(self.settings_at(reel, settings_version)?)
            .transact_items(delete)
            .client_request_token(token.as_str())
            .send()
            .await;
        match result.map_err(|e| internal_tx_failure("stray item removal", e)) {
            Ok(_) => Ok(FoldResult::Folded),
            Err(failure) => match failure? {
                TxFailure::Condition(0) => Ok(FoldResult::SettingsChanged),
                TxFailure::Condition(_) | TxFailure::Mismatch => Ok(FoldResult::ShardChanged),
                TxFailure::Retry(reason) => Ok(FoldResult::Retry(reason)),
            },
        }
    }

    async fn indexed_reels(&self) -> Result<Vec<ReelId>, Error> {
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.counters_table)
                .index_name(keys::RESIZE_INDEX)
                .key_condition_expression("#rz = :rz")
                .expression_attribute_names("#rz", keys::RESIZE_INDEX_ATTR)
                .expression_attribute_values(
                    ":rz",
                    AttributeValue::S(keys::RESIZE_INDEX_VALUE.to_owned()),
                )
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| translate("Query", e))?;
            for item in page.items() {
                if let Some(reel) = item
                    .get("pk")
                    .and_then(|v| v.as_s().ok())
                    .and_then(|pk| keys::parse_settings_key(pk))
                {
                    out.push(reel);
                }
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

impl ReconcileStore for DynamoStore {
    async fn scan_page(
        &self,
        table: ScanTable,
        segment: u32,
        total: u32,
        start: Option<&str>,
        limit: u32,
    ) -> Result<ScanPage, Error> {
        // The counters scan reads whole items (a scan costs the same read
        // units whatever it projects): it needs the count items' counts and
        // the values of shard and base items.
        let (name, projection) = match table {
            ScanTable::Likes => (&self.likes_table, Some("reel_id")),
            ScanTable::Counters => (&self.counters_table, None),
        };
        let start_key = match start {
            None => None,
            Some(s) => Some(cursor_key(s)?),
        };
        let mut req = self
            .client
            .scan()
            .table_name(name)
            .segment(segment as i32)
            .total_segments(total as i32)
            .set_projection_expression(projection.map(str::to_owned))
            // The like rows are counted with consistent reads: an eventually
            // consistent page could miss a row committed just before.
            .consistent_read(table == ScanTable::Likes)
            .set_exclusive_start_key(start_key)
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        if limit > 0 {
            req = req.limit(limit as i32);
        }
        let out = req.send().await.map_err(|e| translate("Scan", e))?;
        let mut page = ScanPage {
            items: out.items().len() as u64,
            read_units: out
                .consumed_capacity()
                .and_then(|c| c.capacity_units())
                .unwrap_or(0.0),
            ..ScanPage::default()
        };
        for item in out.items() {
            let reel = match table {
                ScanTable::Likes => item
                    .get("reel_id")
                    .and_then(|v| v.as_s().ok())
                    .and_then(|r| ReelId::parse(r).ok()),
                ScanTable::Counters => {
                    let pk = item.get("pk").and_then(|v| v.as_s().ok());
                    if let Some((run, reel)) = pk.and_then(|pk| keys::parse_reconcile_count_key(pk))
                    {
                        page.run_counts.push(run_count(run, reel, item));
                        continue;
                    }
                    let slot = pk.and_then(|pk| match keys::parse_shard_key(pk) {
                        Some((s, reel)) => Some((reel, CountItem::Shard(s))),
                        None => keys::parse_base_key(pk).map(|reel| (reel, CountItem::Base)),
                    });
                    if let Some((reel, slot)) = slot.filter(|(_, s)| *s != CountItem::Shard(0)) {
                        let value = shard_value(item)?;
                        if value != ShardValue::default() {
                            page.count_items.push((reel, slot, value));
                        }
                    }
                    pk.and_then(|pk| keys::reel_of_counter_key(pk))
                }
            };
            match reel {
                Some(r) => page.reels.push(r),
                None if table == ScanTable::Likes => {
                    tracing::warn!("a like row without a valid reel_id; not counted");
                }
                None => {}
            }
        }
        page.next = match out.last_evaluated_key {
            Some(k) if !k.is_empty() => Some(cursor_string(&k)?),
            _ => None,
        };
        Ok(page)
    }

    async fn reel_view(&self, reel: &ReelId) -> Result<ReelView, Error> {
        // The ledger strictly before the shards: a correction that lands
        // between the two then fails its condition instead of being
        // applied on top of a sum that already includes another.
        let out = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::reconcile_key(reel)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        let ledger = match out.item {
            None => Ledger::default(),
            Some(item) => Ledger {
                corrections: item
                    .get("corrections")
                    .and_then(number)
                    .map_or(0, |n| n.max(0) as u64),
                last_run: item.get("last_run").and_then(|v| v.as_s().ok()).cloned(),
                last_drift: item.get("last_drift").and_then(number).unwrap_or(0),
            },
        };
        let settings = self
            .settings(std::slice::from_ref(reel))
            .await?
            .remove(reel)
            .unwrap_or_default();
        let sum = self
            .sum_shards(&[(reel.clone(), settings)])
            .await?
            .remove(reel)
            .unwrap_or_default();
        Ok(ReelView {
            ledger,
            settings,
            sum,
        })
    }

    async fn correct(
        &self,
        reel: &ReelId,
        drift: i64,
        expected: u64,
        run_id: &str,
    ) -> Result<CorrectResult, Error> {
        let n = |v: i64| AttributeValue::N(v.to_string());
        let shard = TransactWriteItem::builder()
            .update(
                Update::builder()
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(keys::shard_key(reel, 0)))
                    .update_expression("ADD #n :d")
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_values(":d", n(drift))
                    .build()
                    .map_err(|e| internal("Update", &e))?,
            )
            .build();
        let mut ledger = Update::builder()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::reconcile_key(reel)))
            .update_expression("SET #c = :next, #r = :run, #d = :d, #at = :at")
            .expression_attribute_names("#c", "corrections")
            .expression_attribute_names("#r", "last_run")
            .expression_attribute_names("#d", "last_drift")
            .expression_attribute_names("#at", "corrected_at")
            .expression_attribute_values(":next", n(expected as i64 + 1))
            .expression_attribute_values(":run", AttributeValue::S(run_id.to_owned()))
            .expression_attribute_values(":d", n(drift))
            .expression_attribute_values(":at", n(crate::clock::now_ms()));
        ledger = if expected == 0 {
            ledger.condition_expression("attribute_not_exists(#c)")
        } else {
            ledger
                .condition_expression("#c = :expected")
                .expression_attribute_values(":expected", n(expected as i64))
        };
        let ledger = TransactWriteItem::builder()
            .update(ledger.build().map_err(|e| internal("Update", &e))?)
            .build();
        let token = RequestToken::for_fields(
            "reconcile",
            &[
                run_id,
                reel.as_str(),
                &drift.to_string(),
                &expected.to_string(),
            ],
        );
        let result = self
            .client
            .transact_write_items()
            .transact_items(shard)
            .transact_items(ledger)
            .client_request_token(token.as_str())
            .send()
            .await;
        match result.map_err(|e| internal_tx_failure("correction", e)) {
            Ok(_) => Ok(CorrectResult::Applied),
            Err(failure) => match failure? {
                TxFailure::Condition(_) => Ok(CorrectResult::LedgerChanged),
                TxFailure::Retry(reason) => Ok(CorrectResult::Retry(reason)),
                // Same token, other body: this correction's parameters were
                // used before, so the ledger has moved on.
                TxFailure::Mismatch => Ok(CorrectResult::LedgerChanged),
            },
        }
    }

    async fn add_run_count(
        &self,
        run_id: &str,
        reel: &ReelId,
        segment: u32,
        seq: u64,
        rows: u64,
        expires_at: i64,
    ) -> Result<(), Error> {
        let (count, check) = segment_attrs(segment);
        let result = self
            .client
            .update_item()
            .table_name(&self.counters_table)
            .key(
                "pk",
                AttributeValue::S(keys::reconcile_count_key(run_id, reel)),
            )
            .update_expression("SET #c = if_not_exists(#c, :zero) + :rows, #q = :seq, #exp = :exp")
            .condition_expression("attribute_not_exists(#q) OR #q < :seq")
            .expression_attribute_names("#c", count)
            .expression_attribute_names("#q", check)
            .expression_attribute_names("#exp", "expires_at")
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .expression_attribute_values(":rows", AttributeValue::N(rows.to_string()))
            .expression_attribute_values(":seq", AttributeValue::N(seq.to_string()))
            .expression_attribute_values(":exp", AttributeValue::N(expires_at.to_string()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // This checkpoint (or a later one) of the segment is in already.
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(())
            }
            Err(e) => Err(translate("UpdateItem", e)),
        }
    }

    async fn run_counts(
        &self,
        run_id: &str,
        reels: &[ReelId],
    ) -> Result<HashMap<ReelId, RunCount>, Error> {
        let keys: Vec<String> = reels
            .iter()
            .map(|r| keys::reconcile_count_key(run_id, r))
            .collect();
        let items = self.batch_get_counters(keys, None, &[]).await?;
        Ok(items
            .iter()
            .filter_map(|item| {
                let pk = item.get("pk")?.as_s().ok()?;
                let (run, reel) = keys::parse_reconcile_count_key(pk)?;
                Some((reel.clone(), run_count(run, reel, item)))
            })
            .collect())
    }

    async fn claim_rowless(
        &self,
        run_id: &str,
        reel: &ReelId,
        claimer: &str,
        expires_at: i64,
    ) -> Result<bool, Error> {
        let pk = keys::reconcile_count_key(run_id, reel);
        let result = self
            .client
            .put_item()
            .table_name(&self.counters_table)
            .item("pk", AttributeValue::S(pk.clone()))
            .item("claimed", AttributeValue::Bool(true))
            .item("claimed_by", AttributeValue::S(claimer.to_owned()))
            .item("expires_at", AttributeValue::N(expires_at.to_string()))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            // Someone's item is there; it may be this caller's own, if the
            // SDK resent the put after a lost answer.
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                let item = self.get_counter(&pk, "claimed_by", &[]).await?;
                Ok(item
                    .as_ref()
                    .and_then(|i| i.get("claimed_by"))
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|c| c == claimer))
            }
            Err(e) => Err(translate("PutItem", e)),
        }
    }

    async fn load_run(&self) -> Result<Option<(String, u64)>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::RECONCILE_RUN_KEY.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        Ok(out.item.and_then(|item| {
            let state = item.get("state").and_then(|v| v.as_s().ok()).cloned()?;
            let ver = item
                .get("ver")
                .and_then(number)
                .map_or(0, |v| v.max(0) as u64);
            Some((state, ver))
        }))
    }

    async fn save_run(&self, state: &str, expected: u64) -> Result<bool, Error> {
        let item = HashMap::from([
            (
                "pk".to_owned(),
                AttributeValue::S(keys::RECONCILE_RUN_KEY.to_owned()),
            ),
            ("state".to_owned(), AttributeValue::S(state.to_owned())),
            (
                "ver".to_owned(),
                AttributeValue::N((expected + 1).to_string()),
            ),
        ]);
        self.put_versioned(item, expected).await
    }

    async fn put_chunk(&self, key: &str, data: &[u8], expires_at: i64) -> Result<(), Error> {
        self.client
            .put_item()
            .table_name(&self.counters_table)
            .item("pk", AttributeValue::S(key.to_owned()))
            .item("data", AttributeValue::B(data.to_vec().into()))
            .item("expires_at", AttributeValue::N(expires_at.to_string()))
            .send()
            .await
            .map_err(|e| translate("PutItem", e))?;
        Ok(())
    }

    async fn get_chunk(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        Ok(out.item.and_then(|i| {
            i.get("data")
                .and_then(|v| v.as_b().ok())
                .map(|b| b.as_ref().to_vec())
        }))
    }
}

/// A scan's `LastEvaluatedKey` (string attributes only: both tables' keys
/// are strings) as a JSON object, for the run state.
fn cursor_string(key: &HashMap<String, AttributeValue>) -> Result<String, Error> {
    let mut map = serde_json::Map::new();
    for (k, v) in key {
        let s = v.as_s().map_err(|_| {
            tracing::error!(attribute = %k, "non-string key attribute in a scan cursor");
            Error::Internal
        })?;
        map.insert(k.clone(), serde_json::Value::String(s.clone()));
    }
    Ok(serde_json::Value::Object(map).to_string())
}

fn cursor_key(s: &str) -> Result<HashMap<String, AttributeValue>, Error> {
    let v: serde_json::Value = serde_json::from_str(s).map_err(|_| {
        tracing::error!("unreadable scan cursor in the run state");
        Error::Internal
    })?;
    let obj = v.as_object().ok_or(Error::Internal)?;
    obj.iter()
        .map(|(k, v)| {
            v.as_str()
                .map(|s| (k.clone(), AttributeValue::S(s.to_owned())))
                .ok_or(Error::Internal)
        })
        .collect()
}

/// Parses a settings item; a malformed one is a fault of ours (500), never
/// silently read as one shard, which could hide shards from readers.
fn parse_settings(item: &HashMap<String, AttributeValue>) -> Result<Settings, Error> {
    let count = |name: &str| -> Result<Option<u32>, Error> {
        match item.get(name) {
            None => Ok(None),
            Some(v) => match number(v) {
                Some(n) if (1..=keys::MAX_SHARDS as i64).contains(&n) => Ok(Some(n as u32)),
                _ => {
                    tracing::error!(attribute = name, value = ?v, "settings item holds an invalid shard count");
                    Err(Error::Internal)
                }
            },
        }
    };
    let int = |name: &str| item.get(name).and_then(number);
    let write_shards = count("write_shards")?.unwrap_or(1);
    let read_shards = count("read_shards")?.unwrap_or(1);
    let phase = match item.get("phase").and_then(|v| v.as_s().ok()) {
        None => Phase::Stable,
        Some(p) => Phase::parse(p).ok_or_else(|| {
            tracing::error!(phase = %p, "settings item holds an unknown phase");
            Error::Internal
        })?,
    };
    Ok(Settings {
        write_shards,
        read_shards,
        phase,
        target: count("target")?.unwrap_or(write_shards),
        fold_from: count("fold_from")?.unwrap_or(read_shards),
        phase_at_ms: int("phase_at").unwrap_or(0),
        version: match item.get("ver") {
            None => 0,
            Some(v) => match number(v) {
                Some(n) if n > 0 => n as u64,
                _ => {
                    tracing::error!(value = ?v, "settings item holds an invalid version");
                    return Err(Error::Internal);
                }
            },
        },
        sample: match (int("sample_w"), int("sample_at")) {
            (Some(writes), Some(at_ms)) => Some(WriteSample { writes, at_ms }),
            _ => None,
        },
        cool_since_ms: int("cool_since"),
        has_base: item
            .get("base")
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false),
    })
}

/// The settings item for `s` at `version`; carries the sparse index's key
/// only while the reel is [`Settings::indexed`].
fn settings_item(reel: &ReelId, s: &Settings, version: u64) -> HashMap<String, AttributeValue> {
    let n = |v: i64| AttributeValue::N(v.to_string());
    let mut item = HashMap::from([
        ("pk".to_owned(), AttributeValue::S(keys::settings_key(reel))),
        ("write_shards".to_owned(), n(s.write_shards.into())),
        ("read_shards".to_owned(), n(s.read_shards.into())),
        (
            "phase".to_owned(),
            AttributeValue::S(s.phase.as_str().to_owned()),
        ),
        ("target".to_owned(), n(s.target.into())),
        ("fold_from".to_owned(), n(s.fold_from.into())),
        ("phase_at".to_owned(), n(s.phase_at_ms)),
        ("ver".to_owned(), n(version as i64)),
    ]);
    if let Some(sample) = s.sample {
        item.insert("sample_w".to_owned(), n(sample.writes));
        item.insert("sample_at".to_owned(), n(sample.at_ms));
    }
    if let Some(c) = s.cool_since_ms {
        item.insert("cool_since".to_owned(), n(c));
    }
    if s.has_base {
        item.insert("base".to_owned(), AttributeValue::Bool(true));
    }
    if s.indexed() {
        item.insert(
            keys::RESIZE_INDEX_ATTR.to_owned(),
            AttributeValue::S(keys::RESIZE_INDEX_VALUE.to_owned()),
        );
    }
    item
}

/// The condition "the item still holds exactly `seen`" (a missing
/// attribute counts 0, so does a missing item) on `#n` and `#w`, with its
/// values.
fn holds_exactly(seen: ShardValue) -> (String, HashMap<String, AttributeValue>) {
    let mut conditions = Vec::new();
    let mut values = HashMap::new();
    for (attr, placeholder, v) in [("#n", ":seen_n", seen.n), ("#w", ":seen_w", seen.w)] {
        if v == 0 {
            conditions.push(format!("(attribute_not_exists({attr}) OR {attr} = :zero)"));
            values.insert(":zero".to_owned(), AttributeValue::N("0".into()));
        } else {
            conditions.push(format!("{attr} = {placeholder}"));
            values.insert(placeholder.to_owned(), AttributeValue::N(v.to_string()));
        }
    }
    (conditions.join(" AND "), values)
}

/// The count attribute of likes-scan segment `segment` in a run's count
/// item, and the checkpoint that last added to it.
fn segment_attrs(segment: u32) -> (String, String) {
    (format!("c{segment}"), format!("q{segment}"))
}

/// A run's count item: the rows of every segment summed.
fn run_count(run_id: &str, reel: ReelId, item: &HashMap<String, AttributeValue>) -> RunCount {
    let rows = item
        .iter()
        .filter(|(k, _)| {
            k.strip_prefix('c')
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|(_, v)| number(v))
        .map(|n| n.max(0) as u64)
        .sum();
    RunCount {
        run_id: run_id.to_owned(),
        reel,
        rows,
        claimed: item
            .get("claimed")
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false),
    }
}

/// A shard item's `n` and `w` (missing attributes count 0).
fn shard_value(item: &HashMap<String, AttributeValue>) -> Result<ShardValue, Error> {
    let get = |name: &str| match item.get(name) {
        None => Ok(0),
        Some(v) => number(v).ok_or_else(|| {
            tracing::error!(attribute = name, "shard item holds a non-integer counter");
            Error::Internal
        }),
    };
    Ok(ShardValue {
        n: get("n")?,
        w: get("w")?,
    })
}

/// What a committed like transaction's `ConsumedCapacity` says about it.
///
/// DynamoDB documents, for `ClientRequestToken` ("TransactWriteItems", API
/// reference): "If the ReturnConsumedCapacity parameter is set, then the
/// initial TransactWriteItems call returns the amount of write capacity
/// units consumed in making the changes. Subsequent TransactWriteItems calls
/// with the same client token return the number of read capacity units
/// consumed in reading the item." With `INDEXES` the answer holds a
/// `Capacity` per table, whose `ReadCapacityUnits` and `WriteCapacityUnits`
/// are documented ("the total number of read/write capacity units consumed
/// on a table"); the aggregate's fields of the same names are read too.
/// Write units anywhere: applied by this call. Read units and no write
/// units: a replay. Neither (only `CapacityUnits`, or nothing): the two
/// cannot be told apart, and the answer says so.
fn commit_kind(capacities: &[aws_sdk_dynamodb::types::ConsumedCapacity]) -> TxResult {
    let (mut read, mut wrote) = (false, false);
    for c in capacities {
        let table = c.table();
        let units = [
            (c.read_capacity_units(), c.write_capacity_units()),
            (
                table.and_then(|t| t.read_capacity_units()),
                table.and_then(|t| t.write_capacity_units()),
            ),
        ];
        for (r, w) in units {
            read |= r.unwrap_or(0.0) > 0.0;
            wrote |= w.unwrap_or(0.0) > 0.0;
        }
    }
    match (wrote, read) {
        (true, _) => TxResult::Committed { replayed: false },
        (false, true) => TxResult::Committed { replayed: true },
        (false, false) => TxResult::CommittedUnsure,
    }
}

/// Why one of the resharder's or reconciler's transactions did not commit.
enum TxFailure {
    /// The condition of the item at this index failed.
    Condition(usize),
    Retry(RetryReason),
    /// The token was used before with another body.
    Mismatch,
}

/// Reads a failed `TransactWriteItems` (`what` names it in the logs):
/// failures worth acting on, or an [`Error`] for the rest.
fn internal_tx_failure<R: Debug>(
    what: &'static str,
    err: SdkError<TransactWriteItemsError, R>,
) -> Result<TxFailure, Error> {
    let se = match err {
        SdkError::ServiceError(se) => se,
        other => return Err(translate("TransactWriteItems", other)),
    };
    match se.err() {
        TransactWriteItemsError::TransactionCanceledException(c) => {
            let codes = cancellation_codes(c);
            if let Some(i) = codes.iter().position(|c| *c == "ConditionalCheckFailed") {
                Ok(TxFailure::Condition(i))
            } else if codes.contains(&"TransactionConflict") {
                Ok(TxFailure::Retry(RetryReason::Conflict))
            } else if throttled(&codes) {
                Ok(TxFailure::Retry(RetryReason::Throttled))
            } else {
                tracing::error!(what, reasons = ?codes, "transaction cancelled for an unexpected reason");
                Err(Error::Internal)
            }
        }
        TransactWriteItemsError::TransactionInProgressException(_) => {
            Ok(TxFailure::Retry(RetryReason::InProgress))
        }
        TransactWriteItemsError::IdempotentParameterMismatchException(_) => Ok(TxFailure::Mismatch),
        _ => match translate("TransactWriteItems", SdkError::ServiceError(se)) {
            Error::Throttled => Ok(TxFailure::Retry(RetryReason::Throttled)),
            other => Err(other),
        },
    }
}

/// The reason codes of a cancelled transaction, one per item in order.
fn cancellation_codes(
    c: &aws_sdk_dynamodb::types::error::TransactionCanceledException,
) -> Vec<&str> {
    c.cancellation_reasons()
        .iter()
        .map(|r| r.code().unwrap_or("None"))
        .collect()
}

/// Whether a cancelled transaction's reasons include throttling.
fn throttled(codes: &[&str]) -> bool {
    codes
        .iter()
        .any(|c| matches!(*c, "ThrottlingError" | "ProvisionedThroughputExceeded"))
}

/// The `Put` of an `Idempotency-Key` record, conditioned on its absence.
fn record_put(
    table: &str,
    spec: &KeyRecordSpec,
    action: Action,
    changed: bool,
) -> Result<TransactWriteItem, Error> {
    Ok(TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .item(
                    "pk",
                    AttributeValue::S(keys::idempotency_record_key(spec.key_token.as_str())),
                )
                .item("action", AttributeValue::S(action.as_str().to_owned()))
                .item("changed", AttributeValue::Bool(changed))
                .item("expires_at", AttributeValue::N(spec.expires_at.to_string()))
                .condition_expression("attribute_not_exists(pk)")
                .build()
                .map_err(|e| internal("Put", &e))?,
        )
        .build())
}

/// Reads the cancellation reasons, one per action: like row, shard, and
/// (for keyed requests) the idempotency record.
pub(crate) fn classify_cancellation(codes: &[&str]) -> Result<TxResult, Error> {
    if codes.get(2) == Some(&"ConditionalCheckFailed") {
        return Ok(TxResult::KeyUsed);
    }
    if codes.first() == Some(&"ConditionalCheckFailed") {
        return Ok(TxResult::AlreadyInState);
    }
    if codes.contains(&"TransactionConflict") {
        return Ok(TxResult::Retry(RetryReason::Conflict));
    }
    if throttled(codes) {
        return Ok(TxResult::Retry(RetryReason::Throttled));
    }
    // ValidationError, ItemCollectionSizeLimitExceeded or a reason we do not
    // know: retrying would not help.
    tracing::error!(reasons = ?codes, "transaction cancelled for an unexpected reason");
    Err(Error::Internal)
}

fn number(v: &AttributeValue) -> Option<i64> {
    v.as_n().ok().and_then(|n| n.parse::<i64>().ok())
}

fn internal(what: &str, e: &dyn Debug) -> Error {
    tracing::error!(what, error = ?e, "could not build a DynamoDB request");
    Error::Internal
}

/// The one translation of SDK errors into [`Error`]. The SDK has already
/// retried what it retries (throttling, 5xx, timeouts) by the time an error
/// reaches here.
pub(crate) fn translate<E, R>(op: &'static str, err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: Debug,
{
    let mapped = match &err {
        SdkError::ServiceError(se) => match se.err().code() {
            Some(
                "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "RequestLimitExceeded",
            ) => Error::Throttled,
            Some("InternalServerError" | "ServiceUnavailable" | "ServiceUnavailableException") => {
                Error::Unavailable
            }
            // A missing table is an outage of this service, not a bug in
            // the request: readiness checks and clients should see 503.
            Some("ResourceNotFoundException") => Error::Unavailable,
            _ => Error::Internal,
        },
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            Error::Unavailable
        }
        _ => Error::Internal,
    };
    match mapped {
        Error::Internal => tracing::error!(op, error = ?err, "DynamoDB call failed"),
        _ => {
            tracing::warn!(op, outcome = mapped.code(), error = %aws_sdk_dynamodb::error::DisplayErrorContext(&err), "DynamoDB call failed")
        }
    }
    mapped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_told_by_the_documented_capacity_fields() {
        use aws_sdk_dynamodb::types::{Capacity, ConsumedCapacity};
        let table = |r: Option<f64>, w: Option<f64>| {
            ConsumedCapacity::builder()
                .table_name("t")
                .capacity_units(2.0)
                .table(
                    Capacity::builder()
                        .capacity_units(2.0)
                        .set_read_capacity_units(r)
                        .set_write_capacity_units(w)
                        .build(),
                )
                .build()
        };
        assert_eq!(
            commit_kind(&[table(None, Some(2.0))]),
            TxResult::Committed { replayed: false }
        );
        assert_eq!(
            commit_kind(&[table(Some(2.0), None)]),
            TxResult::Committed { replayed: true }
        );
        // The aggregate's own split counts too.
        let aggregate = ConsumedCapacity::builder()
            .capacity_units(2.0)
            .read_capacity_units(2.0)
            .build();
        assert_eq!(
            commit_kind(&[aggregate]),
            TxResult::Committed { replayed: true }
        );
        // Only the total: cannot tell, and says so.
        let total = ConsumedCapacity::builder().capacity_units(2.0).build();
        assert_eq!(commit_kind(&[total]), TxResult::CommittedUnsure);
        assert_eq!(commit_kind(&[]), TxResult::CommittedUnsure);
    }

    #[test]
    fn cancellation_reasons_are_classified() {
        let ok = |codes: &[&str]| classify_cancellation(codes).unwrap();
        assert_eq!(
            ok(&["ConditionalCheckFailed", "None"]),
            TxResult::AlreadyInState
        );
        assert_eq!(
            ok(&["None", "TransactionConflict"]),
            TxResult::Retry(RetryReason::Conflict)
        );
        assert_eq!(
            ok(&["TransactionConflict", "None"]),
            TxResult::Retry(RetryReason::Conflict)
        );
        assert_eq!(
            ok(&["None", "ThrottlingError"]),
            TxResult::Retry(RetryReason::Throttled)
        );
        assert_eq!(
            ok(&["ProvisionedThroughputExceeded", "None"]),
            TxResult::Retry(RetryReason::Throttled)
        );
        assert_eq!(
            classify_cancellation(&["ValidationError", "None"]),
            Err(Error::Internal)
        );
    }
}
