//! [`ReconcileStore`] on DynamoDB: parallel scans, a reel's view, the
//! correction transaction, the run's count items, claims, the run state and
//! its chunks.

use super::DynamoStore;
use super::error::{MaintenanceTxFailure, maintenance_tx_failure, request_build_failed, translate};
use super::ext::{Item, ItemExt, Projection};
use crate::error::Error;
use crate::keys::{self, ReelId, window};
use crate::store::{
    CorrectResult, CountItem, CounterStore, Ledger, Phase, RecentBucket, ReconcileStore, ReelView,
    RetryReason, RunCount, ScanPage, ScanTable, ShardSum, ShardValue, StoredRun,
};
use crate::token::RequestToken;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity, TransactWriteItem, Update};
use std::collections::HashMap;

/// Who holds a rowless reel's claim.
const CLAIMED_BY: Projection = Projection {
    expression: "claimed_by",
    names: &[],
};

impl ReconcileStore for DynamoStore {
    async fn scan_page(
        &self,
        table: ScanTable,
        segment: u32,
        total: u32,
        start: Option<&str>,
        limit: u32,
        rows_before_ms: Option<i64>,
    ) -> Result<ScanPage, Error> {
        // The counters scan reads whole items (a scan costs the same read
        // units whatever it projects): it needs the count items' counts and
        // the values of shard and base items.
        // Stream mode: the odd segments of the counters scan read the
        // writer items' table (see ScanTable::Counters); only its `l#`
        // items' keys matter there.
        let writers = match &self.writers_table {
            Some(t)
                if table == ScanTable::Counters && total.is_multiple_of(2) && segment % 2 == 1 =>
            {
                Some(t)
            }
            _ => None,
        };
        let (segment, total) = match (&self.writers_table, table) {
            (Some(_), ScanTable::Counters) if total.is_multiple_of(2) => (segment / 2, total / 2),
            _ => (segment, total),
        };
        let (name, projection) = match (table, writers) {
            (ScanTable::Likes, _) => (&self.likes_table, Some("reel_id, liked_at")),
            (ScanTable::Counters, Some(t)) => (t, Some("pk")),
            (ScanTable::Counters, None) => (&self.counters_table, None),
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
        let now_ms = crate::clock::now_ms();
        for item in out.items() {
            let reel = match table {
                ScanTable::Likes
                    if rows_before_ms
                        .is_some_and(|cut| item.int("liked_at").is_some_and(|at| at >= cut)) =>
                {
                    page.young += 1;
                    continue;
                }
                ScanTable::Likes => item.string("reel_id").and_then(|r| ReelId::parse(r).ok()),
                ScanTable::Counters if writers.is_some() => item
                    .pk()
                    .and_then(keys::parse_likes_writers_key)
                    .map(|(reel, _)| reel),
                ScanTable::Counters => {
                    let pk = item.pk();
                    if let Some((run, reel)) = pk.and_then(keys::parse_reconcile_count_key) {
                        page.run_counts.push(run_count(run, reel, item));
                        continue;
                    }
                    let slot = pk.and_then(|pk| match keys::parse_shard_key(pk) {
                        Some((s, reel)) => Some((reel, CountItem::Shard(s))),
                        None => keys::parse_base_key(pk).map(|reel| (reel, CountItem::Base)),
                    });
                    if slot.is_some()
                        && let Some(pk) = pk
                    {
                        let stale = stale_windows(item, now_ms);
                        if !stale.is_empty() {
                            page.stale_windows.push((pk.to_owned(), stale));
                        }
                    }
                    if let Some((reel, slot)) = slot.filter(|(_, s)| *s != CountItem::Shard(0)) {
                        let value = ShardValue::try_from(item)?;
                        if value != ShardValue::default() {
                            page.count_items.push((reel, slot, value));
                        }
                    }
                    pk.and_then(keys::reel_of_counter_key)
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
        let ledger = out.item.as_ref().map(Ledger::from).unwrap_or_default();
        let settings = self
            .settings(std::slice::from_ref(reel))
            .await?
            .remove(reel)
            .unwrap_or_default();
        if settings.phase != Phase::Stable {
            // Left to the resize: read as readers read it, nothing more.
            let sum = self
                .sum_shards(&[(reel.clone(), settings)])
                .await?
                .remove(reel)
                .unwrap_or_default();
            return Ok(ReelView {
                ledger,
                settings,
                sum,
                recent: Vec::new(),
            });
        }
        // A stable reel's items, whole: their recent-change buckets have
        // names of their own, which no projection can list.
        let items = self
            .batch_get_counters(settings.read_items(reel).batch, None)
            .await?;
        let mut sum = ShardSum::default();
        let mut recent = Vec::new();
        for item in &items {
            let v = ShardValue::try_from(item)?;
            sum.n = sum.n.saturating_add(v.n);
            sum.w = sum.w.saturating_add(v.w);
            sum.last_write_ms = sum.last_write_ms.max(item.int("updated_at").unwrap_or(0));
            for name in item.keys() {
                let Some(attr) = keys::parse_recent_attr(name) else {
                    continue;
                };
                recent.push(RecentBucket {
                    item: item.pk().unwrap_or_default().to_owned(),
                    name: name.clone(),
                    attr,
                    value: item.int(name).unwrap_or(0),
                });
            }
        }
        // Stream mode: the writer items, with their buckets (the base's
        // included: a fold carries the buckets still kept).
        if self.writers_table.is_some() {
            let p = self.writer_partitions(reel).await?;
            sum.n = sum.n.saturating_add(p.n);
            sum.last_write_ms = sum.last_write_ms.max(p.last_write_ms);
            for (item, name, attr, value) in p.buckets {
                recent.push(RecentBucket {
                    item,
                    name,
                    attr,
                    value,
                });
            }
        }
        Ok(ReelView {
            ledger,
            settings,
            sum,
            recent,
        })
    }

    async fn correct(
        &self,
        reel: &ReelId,
        drift: i64,
        expected: u64,
        run_id: &str,
        at_ms: i64,
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
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
            .build();
        let mut ledger = Update::builder()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::reconcile_key(reel)))
            // (Also drops the settling marks an older release kept.)
            .update_expression(
                "SET #c = :next, #r = :run, #d = :d, #at = :at REMOVE s_rows, s_n, s_w, s_at",
            )
            .expression_attribute_names("#c", "corrections")
            .expression_attribute_names("#r", "last_run")
            .expression_attribute_names("#d", "last_drift")
            .expression_attribute_names("#at", "corrected_at")
            .expression_attribute_values(":next", n(expected as i64 + 1))
            .expression_attribute_values(":run", AttributeValue::S(run_id.to_owned()))
            .expression_attribute_values(":d", n(drift))
            .expression_attribute_values(":at", n(at_ms));
        ledger = if expected == 0 {
            ledger.condition_expression("attribute_not_exists(#c)")
        } else {
            ledger
                .condition_expression("#c = :expected")
                .expression_attribute_values(":expected", n(expected as i64))
        };
        let ledger = TransactWriteItem::builder()
            .update(
                ledger
                    .build()
                    .map_err(|e| request_build_failed("Update", &e))?,
            )
            .build();
        let token = RequestToken::for_fields(
            "reconcile",
            &[
                run_id,
                reel.as_str(),
                &drift.to_string(),
                &expected.to_string(),
                &at_ms.to_string(),
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
        match result.map_err(|e| maintenance_tx_failure("correction", e)) {
            Ok(_) => Ok(CorrectResult::Applied),
            Err(failure) => match failure? {
                MaintenanceTxFailure::Condition(_) => Ok(CorrectResult::LedgerChanged),
                MaintenanceTxFailure::Retry(reason) => Ok(CorrectResult::Retry(reason)),
                // Same token, other body: this correction's parameters were
                // used before, so the ledger has moved on.
                MaintenanceTxFailure::Mismatch => Ok(CorrectResult::LedgerChanged),
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
        let items = self.batch_get_counters(keys, None).await?;
        Ok(items
            .iter()
            .filter_map(|item| {
                let pk = item.pk()?;
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
                let item = self.get_counter(&pk, Some(CLAIMED_BY)).await?;
                Ok(item
                    .as_ref()
                    .and_then(|i| i.string("claimed_by"))
                    .is_some_and(|c| c == claimer))
            }
            Err(e) => Err(translate("PutItem", e)),
        }
    }

    async fn drop_attributes(&self, key: &str, names: &[String]) -> Result<(), Error> {
        // A writer item ("l#…/w#…") drops its old buckets itself, on its
        // stream shard's next write; a fold drops the base's.
        if names.is_empty() || key.starts_with("l#") {
            return Ok(());
        }
        let mut update = Update::builder()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(key.to_owned()))
            // Never creates an item that is gone.
            .condition_expression("attribute_exists(pk)");
        let mut listed = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            listed.push(format!("#a{i}"));
            update = update.expression_attribute_names(format!("#a{i}"), name);
        }
        let update = update
            .update_expression(format!("REMOVE {}", listed.join(", ")))
            .build()
            .map_err(|e| request_build_failed("Update", &e))?;
        // A transaction of one: the template lets functions change shard
        // and base items only inside TransactWriteItems, and nothing here
        // needs more (a plain UpdateItem would be refused by IAM).
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build())
            .send()
            .await;
        match result.map_err(|e| maintenance_tx_failure("stale buckets", e)) {
            Ok(_) => Ok(()),
            Err(failure) => match failure? {
                // The item is gone: nothing to drop.
                MaintenanceTxFailure::Condition(_) => Ok(()),
                MaintenanceTxFailure::Retry(RetryReason::Throttled) => Err(Error::Throttled),
                MaintenanceTxFailure::Retry(_) | MaintenanceTxFailure::Mismatch => {
                    Err(Error::Contended)
                }
            },
        }
    }

    async fn load_run(&self) -> Result<Option<StoredRun>, Error> {
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
            Some(StoredRun {
                state: item.string("state")?.to_owned(),
                version: item.int("ver").map_or(0, |v| v.max(0) as u64),
            })
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
        Ok(out.item.and_then(|i| i.bytes("data").map(<[u8]>::to_vec)))
    }
}

/// A scan's `LastEvaluatedKey` (string attributes only: both tables' keys
/// are strings) as a JSON object, for the run state.
fn cursor_string(key: &Item) -> Result<String, Error> {
    let mut map = serde_json::Map::new();
    for (k, v) in key {
        let s = v
            .as_s()
            .map_err(|_| Error::internal("non-string key attribute in a scan cursor", k))?;
        map.insert(k.clone(), serde_json::Value::String(s.clone()));
    }
    Ok(serde_json::Value::Object(map).to_string())
}

fn cursor_key(s: &str) -> Result<Item, Error> {
    let unreadable = |cause: &dyn std::fmt::Display| {
        Error::internal("unreadable scan cursor in the run state", cause)
    };
    let v: serde_json::Value = serde_json::from_str(s).map_err(|e| unreadable(&e))?;
    let obj = v.as_object().ok_or_else(|| unreadable(&"not an object"))?;
    obj.iter()
        .map(|(k, v)| {
            v.as_str()
                .map(|s| (k.clone(), AttributeValue::S(s.to_owned())))
                .ok_or_else(|| unreadable(&format_args!("{k} is not a string")))
        })
        .collect()
}

/// The count attribute of likes-scan segment `segment` in a run's count
/// item, and the checkpoint that last added to it.
fn segment_attrs(segment: u32) -> (String, String) {
    (format!("c{segment}"), format!("q{segment}"))
}

/// A run's count item: the rows of every segment summed.
fn run_count(run_id: &str, reel: ReelId, item: &Item) -> RunCount {
    let rows = item
        .iter()
        .filter(|(k, _)| {
            k.strip_prefix('c')
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|(k, _)| item.int(k))
        .map(|n| n.max(0) as u64)
        .sum();
    RunCount {
        run_id: run_id.to_owned(),
        reel,
        rows,
        claimed: item.flag("claimed").unwrap_or(false),
    }
}

/// The windowed-count buckets of a count item past every window, with a
/// bucket to spare (a writer whose clock is behind may still add to the
/// oldest kept one).
fn stale_windows(item: &Item, now_ms: i64) -> Vec<String> {
    item.window_buckets()
        .into_iter()
        .filter(|(name, _)| {
            window::parse_attr(name)
                .is_some_and(|(g, start)| start < g.kept_from(now_ms - g.width_ms()))
        })
        .map(|(name, _)| name)
        .collect()
}
