//! [`CounterStore`] on DynamoDB through the AWS SDK.
//!
//! This is the only module that sees SDK types. Every SDK error is
//! translated here, once, by [`translate`]; the detail is logged and never
//! leaves the module.

use super::{
    CounterStore, KeyRecord, KeyRecordSpec, LikeRow, LikeTx, RetryReason, Settings, TxResult,
};
use crate::config::Config;
use crate::error::Error;
use crate::keys::{self, Action, ReelId, UserId};
use crate::retry::Backoff;
use crate::token::RequestToken;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, KeysAndAttributes, Put, ReturnConsumedCapacity, TransactWriteItem,
    Update,
};
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::fmt::Debug;

/// BatchGetItem takes at most 100 keys per call.
const BATCH_GET_MAX_KEYS: usize = 100;
/// BatchGetItem calls in flight at once for one read.
const BATCH_GET_PARALLELISM: usize = 8;

#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    counters_table: String,
    likes_table: String,
    backoff: Backoff,
}

/// The SDK configuration for `config`: bounded retries and timeouts, so a
/// request never outlives the function. The endpoint, region and credentials
/// come from the standard chain, so `AWS_ENDPOINT_URL_DYNAMODB` points it at
/// a local server.
pub fn sdk_config_loader(config: &Config) -> aws_config::ConfigLoader {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .retry_config(RetryConfig::standard().with_max_attempts(config.ddb_max_attempts))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.ddb_connect_timeout)
                .operation_attempt_timeout(config.ddb_attempt_timeout)
                .operation_timeout(config.ddb_operation_timeout)
                .build(),
        )
}

/// The DynamoDB client for `sdk`.
///
/// An empty `AWS_ENDPOINT_URL_DYNAMODB` (or `AWS_ENDPOINT_URL`) means "not
/// set": `sam local invoke` sets every variable the template declares but
/// cannot resolve to "", and the SDK panics on an empty endpoint URL.
pub fn client(sdk: &aws_config::SdkConfig) -> Client {
    let mut builder = aws_sdk_dynamodb::config::Builder::from(sdk);
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
        Self::new(client(&sdk), config)
    }

    pub fn new(client: Client, config: &Config) -> Self {
        DynamoStore {
            client,
            counters_table: config.counters_table.clone(),
            likes_table: config.likes_table.clone(),
            backoff: Backoff::from_config(config),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Consistent BatchGetItem of `keys` (each a `pk` of the counters table),
    /// in chunks of 100, looping on UnprocessedKeys with bounded backoff.
    async fn batch_get_counters(
        &self,
        keys: Vec<String>,
        projection: &'static str,
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
        projection: &'static str,
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
                .projection_expression(projection);
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

impl CounterStore for DynamoStore {
    async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
        let mut wanted: HashMap<String, ReelId> = HashMap::with_capacity(reels.len());
        for r in reels {
            wanted.insert(keys::settings_key(r), r.clone());
        }
        let items = self
            .batch_get_counters(
                wanted.keys().cloned().collect(),
                "pk, #w, #r",
                &[("#w", "write_shards"), ("#r", "read_shards")],
            )
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
            let write_shards = shard_count(&item, "write_shards")?;
            let read_shards = shard_count(&item, "read_shards")?;
            out.insert(
                reel.clone(),
                Settings {
                    write_shards,
                    read_shards,
                },
            );
        }
        Ok(out)
    }

    async fn sum_shards(&self, reels: &[(ReelId, u32)]) -> Result<HashMap<ReelId, i64>, Error> {
        let mut owner: HashMap<String, ReelId> = HashMap::new();
        let mut sums: HashMap<ReelId, i64> = HashMap::with_capacity(reels.len());
        for (reel, shards) in reels {
            sums.insert(reel.clone(), 0);
            for s in 0..(*shards).clamp(1, keys::MAX_SHARDS) {
                owner.insert(keys::shard_key(reel, s), reel.clone());
            }
        }
        let items = self
            .batch_get_counters(owner.keys().cloned().collect(), "pk, #n", &[("#n", "n")])
            .await?;
        for item in items {
            let Some(reel) = item
                .get("pk")
                .and_then(|v| v.as_s().ok())
                .and_then(|pk| owner.get(pk))
            else {
                continue;
            };
            let n = match item.get("n") {
                None => 0,
                Some(v) => number(v).ok_or_else(|| {
                    tracing::error!(reel = %reel, "shard item has a non-integer n");
                    Error::Internal
                })?,
            };
            if let Some(sum) = sums.get_mut(reel) {
                *sum = sum.saturating_add(n);
            }
        }
        Ok(sums)
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
                    .update_expression("ADD #n :d")
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_values(
                        ":d",
                        AttributeValue::N(tx.action.delta().to_string()),
                    )
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
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match result {
            Ok(out) => {
                // A replay reports the read units of reading the items back
                // instead of the write units of writing them.
                let wrote = out
                    .consumed_capacity()
                    .iter()
                    .any(|c| c.write_capacity_units().unwrap_or(0.0) > 0.0);
                let read = out
                    .consumed_capacity()
                    .iter()
                    .any(|c| c.read_capacity_units().unwrap_or(0.0) > 0.0);
                Ok(TxResult::Committed {
                    replayed: read && !wrote,
                })
            }
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

    async fn ping(&self) -> Result<(), Error> {
        let (a, b) = tokio::join!(
            self.client
                .describe_table()
                .table_name(&self.counters_table)
                .send(),
            self.client
                .describe_table()
                .table_name(&self.likes_table)
                .send(),
        );
        a.map_err(|e| translate("DescribeTable", e))?;
        b.map_err(|e| translate("DescribeTable", e))?;
        Ok(())
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
    if codes
        .iter()
        .any(|c| matches!(*c, "ThrottlingError" | "ProvisionedThroughputExceeded"))
    {
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

fn shard_count(item: &HashMap<String, AttributeValue>, name: &str) -> Result<u32, Error> {
    match item.get(name) {
        None => Ok(1),
        Some(v) => match number(v) {
            Some(n) if (1..=keys::MAX_SHARDS as i64).contains(&n) => Ok(n as u32),
            _ => {
                tracing::error!(attribute = name, value = ?v, "settings item holds an invalid shard count");
                Err(Error::Internal)
            }
        },
    }
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
