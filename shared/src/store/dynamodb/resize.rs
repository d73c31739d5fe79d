//! [`ResizeStore`] on DynamoDB: single shards, the fold of a shard into the
//! base item that closes it, reopening, emptying stray items, the resizing
//! index.

use super::DynamoStore;
use super::error::{MaintenanceTxFailure, maintenance_tx_failure, request_build_failed, translate};
use super::ext::{Item, ItemExt};
use super::windows;
use crate::error::Error;
use crate::keys::{self, ReelId, window};
use crate::store::{CountItem, FoldResult, ResizeStore, RetryReason, ShardValue};
use crate::token::RequestToken;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;

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
        out.item.as_ref().map(ShardValue::try_from).transpose()
    }

    async fn fold(
        &self,
        reel: &ReelId,
        shard: u32,
        seen: ShardValue,
        settings_version: u64,
        attempt: u32,
    ) -> Result<FoldResult, Error> {
        let n = |v: i64| AttributeValue::N(v.to_string());
        let check = self.settings_at(reel, settings_version)?;
        // The shard's windowed-count buckets move with its value: read
        // here, with the value they go with (the transaction's condition on
        // `n` and `w`, which every write changes, holds them as read).
        let pk = keys::shard_key(reel, shard);
        let now_ms = crate::clock::now_ms();
        let buckets = match self.get_counter(&pk, None).await? {
            Some(item) if ShardValue::try_from(&item)? == seen => item.window_buckets(),
            Some(_) => return Ok(FoldResult::ShardChanged),
            None if seen == ShardValue::default() => Vec::new(),
            None => return Ok(FoldResult::ShardChanged),
        };
        let moved: Vec<(String, i64)> = buckets
            .iter()
            .filter(|(name, _)| {
                window::parse_attr(name).is_some_and(|(g, s)| window::is_kept(g, s, now_ms))
            })
            .cloned()
            .collect();
        // `folds` counts the folds the base item took: a reader that sees
        // it unchanged before and after reading the shards being folded saw
        // no fold half-done.
        let mut into_expr = String::from("ADD #n :seen_n, #w :seen_w, #f :one");
        let into_update = windows::add(Update::builder(), &mut into_expr, &moved);
        let pruned: Vec<String> = window::pruned_attrs(now_ms)
            .into_iter()
            .filter(|p| !moved.iter().any(|(m, _)| m == p))
            .collect();
        let into_update = windows::remove(into_update, &mut into_expr, &pruned, true);
        let into = TransactWriteItem::builder()
            .update(
                into_update
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(keys::base_key(reel)))
                    .update_expression(into_expr)
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_names("#w", "w")
                    .expression_attribute_names("#f", "folds")
                    .expression_attribute_values(":seen_n", n(seen.n))
                    .expression_attribute_values(":seen_w", n(seen.w))
                    .expression_attribute_values(":one", n(1))
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
            .build();
        let (condition, values) = holds_exactly(seen);
        // Closed in the same transaction that empties it: from then on it
        // refuses stream aggregation planned with older settings.
        let mut from_expr = String::from("ADD #n :neg_n, #w :neg_w SET #c = :ver");
        let names: Vec<String> = buckets.into_iter().map(|(name, _)| name).collect();
        let from = windows::remove(Update::builder(), &mut from_expr, &names, true)
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(pk.clone()))
            .update_expression(from_expr)
            .condition_expression(condition)
            .expression_attribute_names("#n", "n")
            .expression_attribute_names("#w", "w")
            .expression_attribute_names("#c", keys::SHARD_CLOSED)
            .set_expression_attribute_values(Some(
                values
                    .into_iter()
                    .chain([
                        (":neg_n".to_owned(), n(-seen.n)),
                        (":neg_w".to_owned(), n(-seen.w)),
                        (":ver".to_owned(), n(settings_version as i64)),
                    ])
                    .collect(),
            ));
        let from = TransactWriteItem::builder()
            .update(
                from.build()
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
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
        let mut request = self.client.transact_write_items().transact_items(check);
        // An empty shard is only closed: nothing moves into the base item.
        if seen != ShardValue::default() {
            request = request.transact_items(into);
        }
        let result = request
            .transact_items(from)
            .client_request_token(token.as_str())
            .send()
            .await;
        match result.map_err(|e| maintenance_tx_failure("fold", e)) {
            Ok(_) => {
                self.stats.folds.fetch_add(1, Ordering::Relaxed);
                Ok(FoldResult::Folded)
            }
            Err(failure) => match failure? {
                MaintenanceTxFailure::Condition(0) => Ok(FoldResult::SettingsChanged),
                MaintenanceTxFailure::Condition(_) => Ok(FoldResult::ShardChanged),
                MaintenanceTxFailure::Retry(reason) => Ok(FoldResult::Retry(reason)),
                // The token is derived from everything the fold writes, so a
                // mismatch means a stale view: read again.
                MaintenanceTxFailure::Mismatch => Ok(FoldResult::ShardChanged),
            },
        }
    }

    async fn reopen(
        &self,
        reel: &ReelId,
        shards: Range<u32>,
        settings_version: u64,
    ) -> Result<bool, Error> {
        let wanted: Vec<String> = shards.map(|s| keys::shard_key(reel, s)).collect();
        if wanted.is_empty() {
            return Ok(true);
        }
        let closed: Vec<String> = self
            .batch_get_counters(wanted, None)
            .await?
            .iter()
            .filter(|i| i.contains_key(keys::SHARD_CLOSED))
            .filter_map(|i| i.pk().map(str::to_owned))
            .collect();
        for pk in closed {
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                // `attribute_exists`: an Update on a missing item would
                // make one; a shard reopened meanwhile needs nothing.
                let open = Update::builder()
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(pk.clone()))
                    .update_expression("REMOVE #c")
                    .condition_expression("attribute_exists(#c)")
                    .expression_attribute_names("#c", keys::SHARD_CLOSED)
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?;
                let token = RequestToken::for_fields(
                    "reopen",
                    &[
                        &pk,
                        &settings_version.to_string(),
                        &fastrand::u64(..).to_string(),
                    ],
                );
                let result = self
                    .client
                    .transact_write_items()
                    .transact_items(self.settings_at(reel, settings_version)?)
                    .transact_items(TransactWriteItem::builder().update(open).build())
                    .client_request_token(token.as_str())
                    .send()
                    .await;
                let reason = match result.map_err(|e| maintenance_tx_failure("reopen", e)) {
                    Ok(_) => break,
                    Err(failure) => match failure? {
                        MaintenanceTxFailure::Condition(0) => return Ok(false),
                        MaintenanceTxFailure::Condition(_) => break,
                        MaintenanceTxFailure::Retry(reason) => reason,
                        MaintenanceTxFailure::Mismatch => RetryReason::Conflict,
                    },
                };
                if !self.backoff.allows(attempt) {
                    return Err(match reason {
                        RetryReason::Throttled => Error::Throttled,
                        _ => Error::Contended,
                    });
                }
                tokio::time::sleep(self.backoff.delay(attempt)).await;
            }
        }
        Ok(true)
    }

    async fn clear_stray(
        &self,
        reel: &ReelId,
        item: CountItem,
        seen: ShardValue,
        settings_version: u64,
    ) -> Result<FoldResult, Error> {
        let pk = item.key(reel);
        let (condition, mut values) = holds_exactly(seen);
        values.insert(
            ":neg_n".to_owned(),
            AttributeValue::N((-seen.n).to_string()),
        );
        values.insert(
            ":neg_w".to_owned(),
            AttributeValue::N((-seen.w).to_string()),
        );
        // Emptied, not deleted: a closed shard's tombstone must stay (see
        // crate::reshard), and an empty item is counted by no one.
        let empty = TransactWriteItem::builder()
            .update(
                Update::builder()
                    .table_name(&self.counters_table)
                    .key("pk", AttributeValue::S(pk.clone()))
                    .update_expression("ADD #n :neg_n, #w :neg_w")
                    .condition_expression(condition)
                    .expression_attribute_names("#n", "n")
                    .expression_attribute_names("#w", "w")
                    .set_expression_attribute_values(Some(values))
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?,
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
            .transact_items(empty)
            .client_request_token(token.as_str())
            .send()
            .await;
        match result.map_err(|e| maintenance_tx_failure("stray item removal", e)) {
            Ok(_) => Ok(FoldResult::Folded),
            Err(failure) => match failure? {
                MaintenanceTxFailure::Condition(0) => Ok(FoldResult::SettingsChanged),
                MaintenanceTxFailure::Condition(_) | MaintenanceTxFailure::Mismatch => {
                    Ok(FoldResult::ShardChanged)
                }
                MaintenanceTxFailure::Retry(reason) => Ok(FoldResult::Retry(reason)),
            },
        }
    }

    async fn indexed_reels(&self) -> Result<Vec<ReelId>, Error> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
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
                if let Some(reel) = item.pk().and_then(keys::parse_settings_key) {
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

/// The condition "the item still holds exactly `seen`" (a missing
/// attribute counts 0, so does a missing item) on `#n` and `#w`, with its
/// values.
fn holds_exactly(seen: ShardValue) -> (String, Item) {
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
