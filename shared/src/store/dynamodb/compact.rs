//! Compaction's writes to the views table ([`crate::views::compact`]):
//! writers' seal items, and the fold of sealed writers' view items into a
//! reel's base items, one `TransactWriteItems` each. `DynamoViews` (in
//! `views`) calls these with its client and table.

use super::error::{MaintenanceTxFailure, maintenance_tx_failure, request_build_failed, translate};
use super::ext::ItemExt;
use super::windows;
use crate::error::Error;
use crate::keys;
use crate::store::{ViewFold, ViewFoldItem, ViewFoldResult};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeValue, Delete, KeysAndAttributes, TransactWriteItem, Update,
};
use std::collections::HashMap;

/// Most keys one `BatchGetItem` takes.
const BATCH_GET_MAX: usize = 100;

fn key(pk: &str, sk: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_owned(), AttributeValue::S(pk.to_owned())),
        ("sk".to_owned(), AttributeValue::S(sk.to_owned())),
    ])
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A view item as compaction reads it (an item without its sort key is no
/// view item).
pub(super) fn fold_item(i: &HashMap<String, AttributeValue>) -> Option<ViewFoldItem> {
    let num = |name: &str| i.int(name).and_then(|v| u64::try_from(v).ok());
    Some(ViewFoldItem {
        sk: i.string("sk")?.to_owned(),
        views: num("v").unwrap_or(0),
        sketch: i.bytes("hll").map(<[u8]>::to_vec).unwrap_or_default(),
        expires_at: i.int("expires_at"),
        version: num("fv").unwrap_or(0),
        windows: i.window_buckets(),
    })
}

/// Which of `writers` have a seal item. Keys left unprocessed count as
/// unsealed: compaction folds them another time.
pub(super) async fn read_seals(
    client: &Client,
    table: &str,
    writers: &[String],
) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for part in writers.chunks(BATCH_GET_MAX) {
        let mut request = KeysAndAttributes::builder()
            .consistent_read(false)
            .projection_expression("pk");
        for w in part {
            request = request.keys(key(&keys::views_seal_key(w), keys::VIEWS_SINGLE_SORT));
        }
        let request = request
            .build()
            .map_err(|e| request_build_failed("KeysAndAttributes", &e))?;
        let page = client
            .batch_get_item()
            .request_items(table, request)
            .send()
            .await
            .map_err(|e| translate("BatchGetItem", e))?;
        let found: Vec<String> = page
            .responses
            .and_then(|mut r| r.remove(table))
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i.string("pk").map(str::to_owned))
            .collect();
        out.extend(
            part.iter()
                .filter(|w| found.contains(&keys::views_seal_key(w)))
                .cloned(),
        );
    }
    Ok(out)
}

/// Writes `writer`'s seal item once. No TTL: a writer's all-time items
/// never expire, and one of them left unfolded needs its seal for as long
/// as it is there; a seal is a few dozen bytes, one per stream shard ever.
pub(super) async fn put_seal(
    client: &Client,
    table: &str,
    writer: &str,
    now_ms: i64,
) -> Result<(), Error> {
    let mut item = key(&keys::views_seal_key(writer), keys::VIEWS_SINGLE_SORT);
    item.insert("sealed_at".into(), n(now_ms));
    let result = client
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(pk)")
        .send()
        .await;
    match result {
        Ok(_) => Ok(()),
        // Sealed before: the first seal stands.
        Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
            Ok(())
        }
        Err(e) => Err(translate("PutItem", e)),
    }
}

/// A view item's update in a transaction: `update` with `expr` (its
/// `SET` clause last) and, for a day item, its day and expiry set too.
/// The writers' chunks and the folds into a base write the same fields.
pub(super) fn view_item_update(
    mut update: aws_sdk_dynamodb::types::builders::UpdateBuilder,
    mut expr: String,
    day: Option<&str>,
    expires_at: Option<i64>,
) -> Result<TransactWriteItem, Error> {
    if let Some(day) = day {
        expr.push_str(", #d = :d");
        update = update
            .expression_attribute_names("#d", "day")
            .expression_attribute_values(":d", AttributeValue::S(day.to_owned()));
    }
    if let Some(exp) = expires_at {
        expr.push_str(", #e = :e");
        update = update
            .expression_attribute_names("#e", "expires_at")
            .expression_attribute_values(":e", n(exp));
    }
    Ok(TransactWriteItem::builder()
        .update(
            update
                .update_expression(expr)
                .build()
                .map_err(|e| request_build_failed("Update", &e))?,
        )
        .build())
}

/// Applies `fold` in one transaction: per base, its update conditioned on
/// the fold version read, and each folded item's delete conditioned on the
/// views read.
pub(super) async fn fold_transaction(
    client: &Client,
    table: &str,
    fold: &ViewFold,
) -> Result<ViewFoldResult, Error> {
    let mut request = client.transact_write_items();
    for f in &fold.families {
        let mut expr = String::from("ADD #v :v, #fv :one");
        let update = windows::add(Update::builder(), &mut expr, &f.windows);
        expr.push_str(" SET #h = :h, #u = :at");
        let mut update = update
            .table_name(table)
            .set_key(Some(key(&fold.pk, &f.base_sk)))
            .expression_attribute_names("#v", "v")
            .expression_attribute_names("#fv", "fv")
            .expression_attribute_names("#h", "hll")
            .expression_attribute_names("#u", "updated_at")
            .expression_attribute_values(":v", n(f.views as i64))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":h", AttributeValue::B(Blob::new(f.sketch.clone())))
            .expression_attribute_values(":at", n(fold.now_ms));
        update = match f.base_version {
            None => update.condition_expression("attribute_not_exists(#fv)"),
            Some(v) => update
                .condition_expression("#fv = :fv")
                .expression_attribute_values(":fv", n(v as i64)),
        };
        request = request.transact_items(view_item_update(
            update,
            expr,
            f.day.as_deref(),
            f.expires_at,
        )?);
        for (sk, views) in &f.folded {
            // Every write of a writer adds at least one view, so views as
            // read mean the item (sketch included) is as read.
            let delete = Delete::builder()
                .table_name(table)
                .set_key(Some(key(&fold.pk, sk)))
                .condition_expression("#v = :v")
                .expression_attribute_names("#v", "v")
                .expression_attribute_values(":v", n(*views as i64))
                .build()
                .map_err(|e| request_build_failed("Delete", &e))?;
            request = request.transact_items(TransactWriteItem::builder().delete(delete).build());
        }
    }
    let result = request
        .client_request_token(fold.token.as_str())
        .send()
        .await;
    match result.map_err(|e| maintenance_tx_failure("views fold", e)) {
        Ok(_) => Ok(ViewFoldResult::Folded),
        Err(failure) => match failure? {
            MaintenanceTxFailure::Condition(_) | MaintenanceTxFailure::Mismatch => {
                Ok(ViewFoldResult::Changed)
            }
            MaintenanceTxFailure::Retry(_) => Ok(ViewFoldResult::Retry),
        },
    }
}
