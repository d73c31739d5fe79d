//! [`ViewStore`] on DynamoDB: the views table (key `pk` + sort key `sk`),
//! which holds the views aggregator's checkpoints and seen event ids and
//! the reels' view items.

use super::CheckpointMove;
use super::compact;
use super::error::{MaintenanceTxFailure, maintenance_tx_failure, request_build_failed, translate};
use super::ext::ItemExt;
use super::top;
use super::windows;
use crate::error::Error;
use crate::keys;
use crate::store::views::ViewItemsRound;
use crate::store::{
    Checkpoint, ChunkResult, SeenItem, ViewChunkWrite, ViewFold, ViewFoldItem, ViewFoldResult,
    ViewItem, ViewStore,
};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, Put, TransactWriteItem, Update};
use std::collections::HashMap;

/// Most keys one `BatchGetItem` takes.
const BATCH_GET_MAX: usize = 100;

/// The DynamoDB implementation of [`ViewStore`]. Cheap to clone: clones
/// share the SDK client.
#[derive(Clone, Debug)]
pub struct DynamoViews {
    client: Client,
    views_table: String,
    /// The counters table and the retries, where the cache warmer's items
    /// are (`None`: no warm figures are read).
    warm: Option<(String, crate::retry::Backoff)>,
}

impl DynamoViews {
    /// A store of the views table `table` over `client` (the same client
    /// as the counters': one connection pool per instance).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoViews {
            client,
            views_table: table.into(),
            warm: None,
        }
    }

    /// The same, reading the cache warmer's items from `store`'s counters
    /// table ([`crate::store::WarmStore`]).
    pub fn with_warm(self, store: &super::DynamoStore) -> Self {
        DynamoViews {
            warm: Some((store.counters_table.clone(), store.backoff)),
            ..self
        }
    }

    fn warm(&self) -> Option<super::warm::Warm<'_>> {
        self.warm
            .as_ref()
            .map(|(counters_table, backoff)| super::warm::Warm {
                client: &self.client,
                counters_table,
                backoff,
            })
    }

    fn key(pk: &str, sk: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([
            ("pk".to_owned(), AttributeValue::S(pk.to_owned())),
            ("sk".to_owned(), AttributeValue::S(sk.to_owned())),
        ])
    }

    /// Every item a `Query` of `pk` with `condition` finds, page by page.
    async fn query_all(
        &self,
        pk: &str,
        condition: &str,
        values: &[(&str, &str)],
        consistent: bool,
    ) -> Result<Vec<HashMap<String, AttributeValue>>, Error> {
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let mut q = self
                .client
                .query()
                .table_name(&self.views_table)
                .key_condition_expression(format!("pk = :pk AND {condition}"))
                .expression_attribute_values(":pk", AttributeValue::S(pk.to_owned()))
                .consistent_read(consistent)
                .set_exclusive_start_key(start.take());
            for (name, value) in values {
                q = q.expression_attribute_values(*name, AttributeValue::S((*value).to_owned()));
            }
            let page = q.send().await.map_err(|e| translate("Query", e))?;
            out.extend(page.items.unwrap_or_default());
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }
}

fn view_item(i: &HashMap<String, AttributeValue>) -> Option<ViewItem> {
    Some(ViewItem {
        sk: i.string("sk")?.to_owned(),
        views: i.int("v").and_then(|v| u64::try_from(v).ok()).unwrap_or(0),
        sketch: i.bytes("hll").map(<[u8]>::to_vec).unwrap_or_default(),
        windows: i.window_buckets(),
    })
}

/// Event ids packed as 8-byte big-endian values in one binary attribute:
/// a seen item costs 8 bytes per record, not a set element's overhead.
fn pack_ids(ids: &[u64]) -> Vec<u8> {
    ids.iter().flat_map(|i| i.to_be_bytes()).collect()
}

/// Seen items as stored: sort key and ids (an item without its sort key
/// is no seen item).
fn seen_items(items: &[HashMap<String, AttributeValue>]) -> Vec<SeenItem> {
    items
        .iter()
        .filter_map(|i| {
            Some(SeenItem {
                sort: i.string("sk")?.to_owned(),
                ids: unpack_ids(i.bytes("ids").unwrap_or_default()),
                usage: i.bytes("use").map(<[u8]>::to_vec).unwrap_or_default(),
            })
        })
        .collect()
}

fn unpack_ids(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

impl ViewStore for DynamoViews {
    async fn warm_set(&self) -> Result<Option<crate::store::WarmSet>, Error> {
        match self.warm() {
            Some(w) => w.read_set().await,
            None => Ok(None),
        }
    }

    async fn warm_figures(
        &self,
        reel: &crate::keys::ReelId,
    ) -> Result<Option<crate::store::WarmFigures>, Error> {
        match self.warm() {
            Some(w) => Ok(w
                .read_figures(std::slice::from_ref(reel))
                .await?
                .remove(reel)),
            None => Ok(None),
        }
    }

    async fn view_checkpoint(&self, key: &str) -> Result<Checkpoint, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.views_table)
            .set_key(Some(Self::key(key, keys::VIEWS_SINGLE_SORT)))
            .consistent_read(true)
            .projection_expression("seq, #fh")
            .expression_attribute_names("#fh", keys::top::SKETCH_HOUR_ATTR)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        Ok(out.item.map_or_else(Checkpoint::default, |i| Checkpoint {
            seq: i.string("seq").map(str::to_owned),
            sketch_hour: i.int(keys::top::SKETCH_HOUR_ATTR),
        }))
    }

    async fn stored_sketch(
        &self,
        key: &str,
        hour: i64,
    ) -> Result<Option<crate::trending::HourSketch>, Error> {
        let metric = crate::trending::Metric::Views.name();
        let writer = keys::top::sketch_writer(key);
        top::stored(&self.client, &self.views_table, metric, writer, hour).await
    }

    async fn seen_after(&self, key: &str, after: &str) -> Result<Vec<SeenItem>, Error> {
        let items = self
            .query_all(key, "sk > :after", &[(":after", after)], true)
            .await?;
        Ok(seen_items(&items))
    }

    async fn take_lease(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<bool, Error> {
        let result = self
            .client
            .update_item()
            .table_name(&self.views_table)
            .set_key(Some(Self::key(key, keys::VIEWS_SINGLE_SORT)))
            .update_expression("SET #h = :h, #u = :u, #exp = :exp")
            .condition_expression("attribute_not_exists(#h) OR #u < :now OR #h = :h")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#u", "until_ms")
            .expression_attribute_names("#exp", "expires_at")
            .expression_attribute_values(":h", AttributeValue::S(holder.to_owned()))
            .expression_attribute_values(":u", AttributeValue::N(until_ms.to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
            // Gone a day after it lapsed (TTL), if never given back.
            .expression_attribute_values(
                ":exp",
                AttributeValue::N((until_ms / 1000 + 86_400).to_string()),
            )
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(translate("UpdateItem", e)),
        }
    }

    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), Error> {
        let result = self
            .client
            .update_item()
            .table_name(&self.views_table)
            .set_key(Some(Self::key(key, keys::VIEWS_SINGLE_SORT)))
            .update_expression("REMOVE #h, #u")
            .condition_expression("#h = :h")
            .expression_attribute_names("#h", "holder")
            .expression_attribute_names("#u", "until_ms")
            .expression_attribute_values(":h", AttributeValue::S(holder.to_owned()))
            .send()
            .await;
        match result {
            // Given back, or lapsed and taken by another since.
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(())
            }
            Err(e) => Err(translate("UpdateItem", e)),
        }
    }

    async fn seen_between(&self, key: &str, from: &str, to: &str) -> Result<Vec<SeenItem>, Error> {
        let items = self
            .query_all(
                key,
                "sk BETWEEN :from AND :to",
                &[(":from", from), (":to", to)],
                true,
            )
            .await?;
        Ok(seen_items(&items))
    }

    async fn view_items(&self, wanted: &[(String, String)]) -> Result<ViewItemsRound, Error> {
        // One round: the caller pauses between rounds, within its deadline.
        let mut found = Vec::with_capacity(wanted.len());
        let mut unprocessed = Vec::new();
        let mut throttled = 0usize;
        for part in wanted.chunks(BATCH_GET_MAX) {
            let mut request = KeysAndAttributes::builder().consistent_read(true);
            for (pk, sk) in part {
                request = request.keys(Self::key(pk, sk));
            }
            let request = request
                .build()
                .map_err(|e| request_build_failed("KeysAndAttributes", &e))?;
            let page = match self
                .client
                .batch_get_item()
                .request_items(&self.views_table, request)
                .send()
                .await
                .map_err(|e| translate("BatchGetItem", e))
            {
                Ok(page) => page,
                // Every key of the part throttled: asked for again, with
                // the other parts' unprocessed keys.
                Err(Error::Throttled) => {
                    throttled += 1;
                    unprocessed.extend_from_slice(part);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for i in page
                .responses
                .and_then(|mut r| r.remove(&self.views_table))
                .unwrap_or_default()
            {
                if let (Some(pk), Some(item)) = (i.string("pk"), view_item(&i)) {
                    found.push((pk.to_owned(), item));
                }
            }
            let left = page
                .unprocessed_keys
                .and_then(|mut u| u.remove(&self.views_table))
                .map(|k| k.keys)
                .unwrap_or_default();
            for key in left {
                match (key.string("pk"), key.string("sk")) {
                    (Some(pk), Some(sk)) => unprocessed.push((pk.to_owned(), sk.to_owned())),
                    _ => {
                        return Err(Error::internal(
                            "BatchGetItem",
                            "an unprocessed key without pk and sk",
                        ));
                    }
                }
            }
        }
        if throttled > 0 && throttled == wanted.chunks(BATCH_GET_MAX).count() {
            return Err(Error::Throttled);
        }
        Ok((found, unprocessed))
    }

    async fn apply_views(&self, write: &ViewChunkWrite) -> Result<ChunkResult, Error> {
        let n = |v: i64| AttributeValue::N(v.to_string());
        let checkpoint = CheckpointMove {
            key: Self::key(&write.checkpoint_key, keys::VIEWS_SINGLE_SORT),
            expected: write.expected.as_deref(),
            next: &write.next,
            shard_id: &write.shard_id,
            now_ms: write.now_ms,
            records: write.records,
        }
        .checkpoint_update(
            &self.views_table,
            &format!(
                ", #exp = :exp{}",
                top::checkpoint_sets(write.sketch.as_ref())
            ),
        )
        // Refreshed by every chunk (see `ViewChunkWrite::checkpoint_expires_at`).
        .expression_attribute_names("#exp", "expires_at")
        .expression_attribute_values(":exp", n(write.checkpoint_expires_at));
        let checkpoint = top::with_sketch(checkpoint, write.sketch.as_ref());
        let mut request = self.client.transact_write_items().transact_items(
            TransactWriteItem::builder()
                .update(
                    checkpoint
                        .build()
                        .map_err(|e| request_build_failed("Update", &e))?,
                )
                .build(),
        );
        let mut seen = Self::key(&write.seen_key, &write.seen_sort);
        seen.insert(
            "ids".into(),
            AttributeValue::B(Blob::new(pack_ids(&write.seen_ids))),
        );
        if !write.seen_usage.is_empty() {
            seen.insert(
                "use".into(),
                AttributeValue::B(Blob::new(write.seen_usage.clone())),
            );
        }
        seen.insert("expires_at".into(), n(write.seen_expires_at));
        request = request.transact_items(
            TransactWriteItem::builder()
                .put(
                    Put::builder()
                        .table_name(&self.views_table)
                        .set_item(Some(seen))
                        .build()
                        .map_err(|e| request_build_failed("Put", &e))?,
                )
                .build(),
        );
        for item in &write.items {
            // The sketch is replaced, not merged here: only this writer
            // (this Kinesis shard, under its checkpoint's condition) ever
            // writes this item, so the value it read is the value stored.
            let mut expr = String::from("ADD #v :v");
            let mut update = Update::builder()
                .table_name(&self.views_table)
                .set_key(Some(Self::key(&item.pk, &item.sk)))
                .expression_attribute_names("#v", "v")
                .expression_attribute_names("#h", "hll")
                .expression_attribute_names("#u", "updated_at")
                .expression_attribute_values(":v", n(item.views as i64))
                .expression_attribute_values(
                    ":h",
                    AttributeValue::B(Blob::new(item.sketch.clone())),
                )
                .expression_attribute_values(":at", n(write.now_ms));
            // A day item's windowed-count buckets: added, and the expired
            // ones dropped.
            update = windows::add(update, &mut expr, &item.windows);
            if item.day.is_some() {
                update = windows::remove(update, &mut expr, &write.window_prune, true);
            }
            expr.push_str(" SET #h = :h, #u = :at");
            request = request.transact_items(compact::view_item_update(
                update,
                expr,
                item.day.as_deref(),
                item.expires_at,
            )?);
        }
        for put in top::puts(
            &self.views_table,
            crate::trending::Metric::Views.name(),
            keys::top::sketch_writer(&write.checkpoint_key),
            write.sketch.as_ref(),
            write.now_ms,
        )? {
            request = request.transact_items(put);
        }
        let result = request
            .client_request_token(write.token.as_str())
            .send()
            .await;
        match result.map_err(|e| maintenance_tx_failure("views aggregation", e)) {
            Ok(_) => Ok(ChunkResult::Applied),
            Err(failure) => match failure? {
                // Only the checkpoint (action 0) carries a condition.
                MaintenanceTxFailure::Condition(_) | MaintenanceTxFailure::Mismatch => {
                    Ok(ChunkResult::CheckpointMoved)
                }
                MaintenanceTxFailure::Retry(reason) => Ok(ChunkResult::Retry(reason)),
            },
        }
    }

    async fn reel_views(
        &self,
        pk: &str,
        days: (&str, &str),
    ) -> Result<(Vec<ViewItem>, Vec<ViewItem>), Error> {
        let all_values = [(":p", keys::VIEWS_ALL_PREFIX)];
        let day_values = [(":a", days.0), (":b", days.1)];
        let (all, day) = tokio::join!(
            self.query_all(pk, "begins_with(sk, :p)", &all_values, false),
            self.query_all(pk, "sk BETWEEN :a AND :b", &day_values, false),
        );
        let items = |v: Vec<HashMap<String, AttributeValue>>| -> Vec<ViewItem> {
            v.iter().filter_map(view_item).collect()
        };
        Ok((items(all?), items(day?)))
    }

    async fn fold_items(&self, pk: &str, days: (&str, &str)) -> Result<Vec<ViewFoldItem>, Error> {
        let all_values = [(":p", keys::VIEWS_ALL_PREFIX)];
        let day_values = [(":a", days.0), (":b", days.1)];
        let (all, day) = tokio::join!(
            self.query_all(pk, "begins_with(sk, :p)", &all_values, true),
            self.query_all(pk, "sk BETWEEN :a AND :b", &day_values, true),
        );
        Ok(all?
            .iter()
            .chain(day?.iter())
            .filter_map(compact::fold_item)
            .collect())
    }

    async fn sealed(&self, writers: &[String]) -> Result<Vec<String>, Error> {
        compact::read_seals(&self.client, &self.views_table, writers).await
    }

    async fn seal(&self, writer: &str, now_ms: i64) -> Result<(), Error> {
        compact::put_seal(&self.client, &self.views_table, writer, now_ms).await
    }

    async fn hour_sketches(
        &self,
        metric: &str,
        hour: i64,
    ) -> Result<crate::store::HourSketches, Error> {
        // Writers are hex digests or `fn#…` (a like function instance's):
        // every sort key is at or after "0".
        let items = self
            .query_all(
                &keys::top::top_key(metric, hour),
                "sk >= :a",
                &[(":a", "0")],
                false,
            )
            .await?;
        Ok(items
            .iter()
            .filter_map(|i| i.bytes(keys::top::SKETCH_ATTR).map(<[u8]>::to_vec))
            .collect())
    }

    async fn fold_views(&self, fold: &ViewFold) -> Result<ViewFoldResult, Error> {
        compact::fold_transaction(&self.client, &self.views_table, fold).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_pack_and_unpack() {
        let ids = vec![0, 1, u64::MAX, 0x0102_0304_0506_0708];
        assert_eq!(unpack_ids(&pack_ids(&ids)), ids);
        assert_eq!(pack_ids(&ids).len(), 32);
    }
}
