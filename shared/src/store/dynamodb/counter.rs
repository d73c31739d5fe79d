//! [`CounterStore`] on DynamoDB: settings, shard sums, the like
//! transaction and its `Idempotency-Key` records, the health probe.

use super::DynamoStore;
use super::error::{
    cancellation_codes, commit_kind, like_tx_cancellation, request_build_failed, translate,
};
use super::ext::{Item, ItemExt, Projection, settings_item};
use super::reads::BATCH_GET_PARALLELISM;
use super::windows;
use crate::error::Error;
use crate::keys::{self, Action, ReelId, UserId, window};
use crate::store::{
    CountItem, CounterStore, KeyRecord, KeyRecordSpec, LikeRow, LikeTx, RetryReason, Settings,
    ShardSum, ShardValue, TxResult,
};
use crate::token::RequestToken;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::transact_write_items::builders::TransactWriteItemsFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, Put, ReturnConsumedCapacity, TransactWriteItem, Update,
};
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

impl CounterStore for DynamoStore {
    async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
        let mut wanted: HashMap<String, ReelId> = HashMap::with_capacity(reels.len());
        for r in reels {
            wanted.insert(keys::settings_key(r), r.clone());
        }
        let items = self
            .batch_get_counters(wanted.keys().cloned().collect(), None)
            .await?;
        let mut out: HashMap<ReelId, Settings> = reels
            .iter()
            .map(|r| (r.clone(), Settings::default()))
            .collect();
        for item in items {
            let Some(reel) = item.pk().and_then(|pk| wanted.get(pk)) else {
                continue;
            };
            out.insert(reel.clone(), Settings::try_from(&item)?);
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
        // Whole items: their windowed-count buckets have names of their
        // own (a projection costs the same read units).
        let batch = self.batch_get_counters(owner.keys().cloned().collect(), None);
        let transactional = futures::stream::iter(atomic)
            .map(|(reel, keys)| async move {
                let items = self.read_fold_group(keys).await?;
                Ok::<_, Error>((reel, items))
            })
            .buffer_unordered(BATCH_GET_PARALLELISM)
            .try_collect::<Vec<_>>();
        // Stream mode: the stream shards' writer items, read beside.
        let names: Vec<ReelId> = reels.iter().map(|(r, _)| r.clone()).collect();
        let writers = self.writer_sums(&names);
        let (batch, transactional, writers) = tokio::join!(batch, transactional, writers);
        let now_ms = crate::clock::now_ms();
        for sum in sums.values_mut() {
            sum.windows_at_ms = now_ms;
        }
        let stream = self.writers_table.is_some();
        let mut add = |reel: &ReelId, item: &Item| {
            let v = ShardValue::try_from(item)?;
            if let Some(sum) = sums.get_mut(reel) {
                sum.n = sum.n.saturating_add(v.n);
                sum.w = sum.w.saturating_add(v.w);
                let at = item.int("updated_at").unwrap_or(0);
                sum.last_write_ms = sum.last_write_ms.max(at);
                // Stream mode, a shard item transactional mode wrote lately
                // (just after a switch): its likes are in no tail.
                let tail = &self.own_tail;
                if stream && tail.enabled() && now_ms.saturating_sub(at) < tail.lives_ms() {
                    sum.tail.break_off();
                }
                for (name, _) in item.iter() {
                    if name.starts_with('c') {
                        sum.windows
                            .add_attr(name, item.int(name).unwrap_or(0), now_ms);
                    }
                }
            }
            Ok::<_, Error>(())
        };
        for item in batch? {
            if let Some(reel) = item.pk().and_then(|pk| owner.get(pk)) {
                add(reel, &item)?;
            }
        }
        for (reel, items) in transactional? {
            for item in &items {
                add(&reel, item)?;
            }
        }
        for (reel, p) in writers? {
            if let Some(sum) = sums.get_mut(&reel) {
                sum.n = sum.n.saturating_add(p.n);
                sum.last_write_ms = sum.last_write_ms.max(p.last_write_ms);
                sum.windows.merge(&p.windows);
                sum.tail.merge(&p.tail);
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
            Action::Like => {
                let mut put = Put::builder()
                    .table_name(&self.likes_table)
                    .item("user_id", AttributeValue::S(tx.user.as_str().to_owned()))
                    .item("reel_id", AttributeValue::S(tx.reel.as_str().to_owned()))
                    .item("liked_at", AttributeValue::N(tx.now_ms.to_string()))
                    .item("tok", AttributeValue::S(tx.token.as_str().to_owned()))
                    .condition_expression("attribute_not_exists(user_id)");
                if tx.shard.is_none() {
                    // Stream mode: no shard in this transaction, the
                    // aggregator counts the row (and only such rows).
                    put = put.item(
                        keys::COUNTED_BY_STREAM.0,
                        AttributeValue::S(keys::COUNTED_BY_STREAM.1.to_owned()),
                    );
                }
                TransactWriteItem::builder()
                    .put(put.build().map_err(|e| request_build_failed("Put", &e))?)
                    .build()
            }
            Action::Unlike => TransactWriteItem::builder()
                .delete(
                    Delete::builder()
                        .table_name(&self.likes_table)
                        .key("user_id", AttributeValue::S(tx.user.as_str().to_owned()))
                        .key("reel_id", AttributeValue::S(tx.reel.as_str().to_owned()))
                        .condition_expression("attribute_exists(user_id)")
                        .build()
                        .map_err(|e| request_build_failed("Delete", &e))?,
                )
                .build(),
        };
        let Some(shard) = tx.shard else {
            return self.write_like_row(tx, row_op).await;
        };
        // `w` counts every write the shard took: its rate is the reel's
        // write rate (automatic resizing), and a change of it marks the
        // shard as written (reconciliation). `updated_at` (the request's
        // own clock, fixed for its retries) marks when the shard last took
        // a write: reconciliation defers reels written during its scan.
        // The windowed counts' buckets of that clock take the change too,
        // and the expired ones are dropped: the body is a function of the
        // request alone, so every retry sends the same.
        let mut expr = String::from("ADD #n :d, #w :one");
        let update = windows::add(
            Update::builder(),
            &mut expr,
            &windows::of_change(tx.action.delta(), tx.now_ms),
        );
        expr.push_str(" SET #u = :at");
        let update = windows::remove(update, &mut expr, &window::pruned_attrs(tx.now_ms), true);
        let shard_op = TransactWriteItem::builder()
            .update(
                update
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(keys::shard_key(&tx.reel, shard)))
                    .update_expression(expr)
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
                    .map_err(|e| request_build_failed("Update", &e))?,
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
        // The row, the shard, the key's record.
        self.send_like_tx(request, tx, Some(1), 2).await
    }

    async fn user_likes(
        &self,
        user: &UserId,
        limit: u32,
    ) -> Result<Vec<(ReelId, Option<i64>)>, Error> {
        let out = self
            .client
            .query()
            .table_name(&self.likes_table)
            .key_condition_expression("user_id = :u")
            .expression_attribute_values(":u", AttributeValue::S(user.as_str().to_owned()))
            .consistent_read(true)
            .projection_expression("reel_id, liked_at")
            .limit(limit.max(1) as i32)
            .send()
            .await
            .map_err(|e| translate("Query", e))?;
        out.items
            .unwrap_or_default()
            .iter()
            .map(|i| {
                i.string("reel_id")
                    .and_then(|r| ReelId::parse(r).ok())
                    .map(|r| (r, i.int("liked_at")))
                    .ok_or_else(|| {
                        Error::internal("Query of a user's likes", "a row without a valid reel_id")
                    })
            })
            .collect()
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
        Ok(out.item.as_ref().map(LikeRow::from))
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
        out.item.as_ref().map(KeyRecord::try_from).transpose()
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
                    // Its one action, the record, is read as a row would be.
                    match like_tx_cancellation(&cancellation_codes(c), None, usize::MAX)? {
                        // A record appeared first (a concurrent request with
                        // the same key): it is the answer.
                        TxResult::AlreadyInState => self
                            .key_record(&spec.key_token)
                            .await?
                            .ok_or(Error::Contended),
                        TxResult::Retry(RetryReason::Throttled | RetryReason::OwnThrottled) => {
                            Err(Error::Throttled)
                        }
                        TxResult::Retry(_) => Err(Error::Contended),
                        other => Err(Error::internal(
                            "key record cancelled for an unexpected reason",
                            format_args!("{other:?}"),
                        )),
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
            .batch_get_counters(by_key.keys().cloned().collect(), Some(Projection::VALUE))
            .await?;
        let mut out = Vec::with_capacity(found.len());
        for item in &found {
            if let Some(which) = item.pk().and_then(|pk| by_key.get(pk)) {
                out.push((*which, ShardValue::try_from(item)?));
            }
        }
        Ok(out)
    }

    async fn add_caller_reads(
        &self,
        caller: &str,
        minute: i64,
        units: u64,
        expires_at: i64,
    ) -> Result<u64, Error> {
        let out = self
            .client
            .update_item()
            .table_name(&self.counters_table)
            .key(
                "pk",
                AttributeValue::S(keys::caller_reads_key(caller, minute)),
            )
            .update_expression("ADD #u :u SET #e = :e")
            .expression_attribute_names("#u", "u")
            .expression_attribute_names("#e", "expires_at")
            .expression_attribute_values(":u", AttributeValue::N(units.to_string()))
            .expression_attribute_values(":e", AttributeValue::N(expires_at.to_string()))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await
            .map_err(|e| translate("UpdateItem", e))?;
        Ok(out
            .attributes
            .as_ref()
            .and_then(|a| a.int("u"))
            .map_or(units, |u| u.max(0) as u64))
    }

    async fn put_sketches(&self, flush: &crate::trending::Flush, now_ms: i64) -> Result<(), Error> {
        super::top::put_instance_sketches(
            &self.client,
            self.sketch_table.as_deref(),
            crate::trending::Metric::Likes.name(),
            flush,
            now_ms,
        )
        .await
    }

    async fn warm_set(&self) -> Result<Option<crate::store::WarmSet>, Error> {
        self.warm().read_set().await
    }

    async fn warm_figures(
        &self,
        reels: &[ReelId],
    ) -> Result<HashMap<ReelId, crate::store::WarmFigures>, Error> {
        self.warm().read_figures(reels).await
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

impl DynamoStore {
    /// Sends a like transaction (the token on it), and reads its answer.
    /// `shard_at`, `record_at`: the indexes of the reel's shard (if it
    /// writes one) and of the key record among its actions.
    async fn send_like_tx(
        &self,
        request: TransactWriteItemsFluentBuilder,
        tx: &LikeTx,
        shard_at: Option<usize>,
        record_at: usize,
    ) -> Result<TxResult, Error> {
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
                    like_tx_cancellation(&cancellation_codes(c), shard_at, record_at)
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

    /// Stream mode: the like row alone (the aggregator adds it to a shard).
    ///
    /// * With a key: one transaction of the row and the key's record, so
    ///   that a retry of the key answers from the record, even after the
    ///   user changed state since.
    /// * An unkeyed like: one conditional `PutItem` (one write unit). Its
    ///   row carries the token, so a retry after a lost answer (the SDK's,
    ///   or the client's with the same request id) finds its own row and
    ///   answers as a replay.
    /// * An unkeyed unlike: a one-item transaction with the token. A
    ///   removed row keeps no trace of who removed it, so only the token's
    ///   replay tells a retry that it was this request.
    async fn write_like_row(
        &self,
        tx: &LikeTx,
        row_op: TransactWriteItem,
    ) -> Result<TxResult, Error> {
        if let Some(spec) = &tx.record {
            let request = self
                .client
                .transact_write_items()
                .transact_items(row_op)
                .transact_items(record_put(&self.counters_table, spec, tx.action, true)?);
            return self.send_like_tx(request, tx, None, 1).await;
        }
        if tx.action == Action::Unlike {
            let request = self.client.transact_write_items().transact_items(row_op);
            return self.send_like_tx(request, tx, None, 1).await;
        }
        let result = self
            .client
            .put_item()
            .table_name(&self.likes_table)
            .item("user_id", AttributeValue::S(tx.user.as_str().to_owned()))
            .item("reel_id", AttributeValue::S(tx.reel.as_str().to_owned()))
            .item("liked_at", AttributeValue::N(tx.now_ms.to_string()))
            .item("tok", AttributeValue::S(tx.token.as_str().to_owned()))
            .item(
                keys::COUNTED_BY_STREAM.0,
                AttributeValue::S(keys::COUNTED_BY_STREAM.1.to_owned()),
            )
            .condition_expression("attribute_not_exists(user_id)")
            .send()
            .await;
        match result {
            Ok(_) => Ok(TxResult::Committed { replayed: false }),
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                let row = self.like_row(&tx.user, &tx.reel).await?;
                Ok(
                    if row.and_then(|r| r.token).as_deref() == Some(tx.token.as_str()) {
                        TxResult::Committed { replayed: true }
                    } else {
                        TxResult::AlreadyInState
                    },
                )
            }
            // Throttling that outlasted the SDK's retries, or the row held
            // by a transaction in flight (a keyed unlike of it): the
            // service's backoff loop gets a go at it too.
            Err(e) => match translate("PutItem", e) {
                Error::Throttled => Ok(TxResult::Retry(RetryReason::OwnThrottled)),
                Error::Contended => Ok(TxResult::Retry(RetryReason::OwnConflict)),
                other => Err(other),
            },
        }
    }
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
                .map_err(|e| request_build_failed("Put", &e))?,
        )
        .build())
}
