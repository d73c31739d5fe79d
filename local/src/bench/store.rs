//! The bench's own reads and writes of the tables, around the product
//! rather than through it: pre-sizing the viral reel, and the stored count
//! that exactness is checked against, read back with consistent scans so
//! that it is the truth, not what a cache or a shard sum believes.

use super::VIRAL;
use super::variant::Variant;
use crate::stack::Stack;
use anyhow::{Context, Result, anyhow};
use aws_sdk_dynamodb::types::AttributeValue;

/// One DynamoDB item, as the SDK hands it back.
pub(super) type Item = std::collections::HashMap<String, AttributeValue>;

/// Writes the viral reel's settings item with `shards` write and read
/// shards, as an operator would before an expected peak.
pub(super) async fn presize_viral(stack: &Stack, shards: u32) -> Result<()> {
    let viral_id = likes::keys::ReelId::parse(VIRAL).map_err(|e| anyhow!(e.0))?;
    stack
        .client
        .put_item()
        .table_name(&stack.config.counters_table)
        .item(
            "pk",
            AttributeValue::S(likes::keys::settings_key(&viral_id)),
        )
        .item("write_shards", AttributeValue::N(shards.to_string()))
        .item("read_shards", AttributeValue::N(shards.to_string()))
        .send()
        .await
        .context("pre-sizing the viral reel")?;
    Ok(())
}

/// The viral reel's stored count: the naive counter item's `n`, or for the
/// product the sum of its shards, compared with its like rows.
pub(super) async fn stored_count(stack: &Stack, variant: Variant) -> Result<i64> {
    if variant.is_naive() {
        let item = stack
            .client
            .get_item()
            .table_name(&stack.config.counters_table)
            .key("pk", AttributeValue::S(format!("naive#{VIRAL}")))
            .consistent_read(true)
            .send()
            .await?
            .item
            .unwrap_or_default();
        return Ok(item
            .get("n")
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0));
    }
    let rows = count_rows(stack, VIRAL).await?;
    let sum = shard_sum(stack, VIRAL).await? + writer_sum(stack, VIRAL).await?;
    // The shards must hold exactly the like rows; a difference shows as a
    // mismatch against the acknowledged likes.
    Ok(if sum == rows { rows } else { sum })
}

/// Like rows of `reel`, counted with a scan (the truth).
async fn count_rows(stack: &Stack, reel: &str) -> Result<i64> {
    let items = scan_all(stack, &stack.config.likes_table).await?;
    Ok(items.iter().filter(|i| text(i, "reel_id") == reel).count() as i64)
}

/// The sum of every shard item and the base item of `reel`.
async fn shard_sum(stack: &Stack, reel: &str) -> Result<i64> {
    let suffix = format!("#reel#{reel}#likes");
    let items = scan_all(stack, &stack.config.counters_table).await?;
    Ok(items
        .iter()
        .filter(|i| text(i, "pk").ends_with(&suffix))
        .filter_map(|i| {
            i.get("n")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<i64>().ok())
        })
        .sum())
}

/// Stream mode: the table of the writer items, where the aggregator adds
/// the likes (`None` in transactional mode, which writes none).
pub(super) fn stream_writers(stack: &Stack) -> Option<String> {
    (stack.config.counting == likes::Counting::Stream)
        .then(|| stack.config.writers_table.clone())
        .flatten()
}

/// Stream mode: the sum of `reel`'s writer items, in every part they are
/// spread over (0 in transactional mode, which writes none).
async fn writer_sum(stack: &Stack, reel: &str) -> Result<i64> {
    let Some(table) = stream_writers(stack) else {
        return Ok(0);
    };
    let items = scan_all(stack, &table).await?;
    Ok(items
        .iter()
        .filter(|i| {
            likes::keys::parse_likes_writers_key(text(i, "pk"))
                .is_some_and(|(r, _)| r.as_str() == reel)
        })
        .filter_map(|i| {
            i.get("n")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<i64>().ok())
        })
        .sum())
}

/// Every item of `table`, page by page, read consistently.
pub(super) async fn scan_all(stack: &Stack, table: &str) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let out = stack
            .client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await?;
        items.extend(out.items.unwrap_or_default());
        start = out.last_evaluated_key;
        if start.is_none() {
            return Ok(items);
        }
    }
}

/// A string attribute of `item`, or "" if it has none.
pub(super) fn text<'a>(item: &'a Item, attr: &str) -> &'a str {
    item.get(attr).and_then(|v| v.as_s().ok()).map_or("", |s| s)
}
