//! A writer's trending sketch in its chunk's transaction
//! ([`crate::trending`]): an item of its hour (`top#{metric}#{hour}`, sort
//! key the writer), put when the chunk writes it (and the ended hour's,
//! when the chunk opens a new one); the checkpoint names the hour. And
//! the read of a stored sketch by the writer's next instance.

use super::error::{request_build_failed, translate};
use super::ext::ItemExt;
use crate::error::Error;
use crate::keys::top;
use crate::trending::{HourSketch, SketchWrite};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

/// The sketch it writes, if the chunk writes one.
fn written(s: Option<&SketchWrite>) -> Option<&SketchWrite> {
    s.filter(|s| s.write)
}

/// The checkpoint update's extra `SET` clause when the chunk writes the
/// sketch: the hour of the sketch stored, which is how the writer's next
/// instance finds it (the sketch itself is an item of its own, so that
/// the checkpoint stays a few dozen bytes: an update is charged by the
/// whole item's size).
pub(super) fn checkpoint_sets(s: Option<&SketchWrite>) -> &'static str {
    if written(s).is_some() {
        ", #fh = :fh"
    } else {
        ""
    }
}

/// The names and values of [`checkpoint_sets`]' clause.
pub(super) fn with_sketch(update: UpdateBuilder, s: Option<&SketchWrite>) -> UpdateBuilder {
    match written(s) {
        None => update,
        Some(s) => update
            .expression_attribute_names("#fh", top::SKETCH_HOUR_ATTR)
            .expression_attribute_values(":fh", AttributeValue::N(s.step.current.hour.to_string())),
    }
}

/// The `top#` items a chunk puts into `table` (the views table) for
/// `writer` of `metric` when it writes the sketch: the ended hour's final
/// sketch, if the chunk ended one, and the current hour's.
pub(super) fn puts(
    table: &str,
    metric: &str,
    writer: &str,
    s: Option<&SketchWrite>,
    now_ms: i64,
) -> Result<Vec<TransactWriteItem>, Error> {
    let Some(s) = written(s) else {
        return Ok(Vec::new());
    };
    let expires = AttributeValue::N((now_ms / 1000 + top::TOP_TTL_SECS).to_string());
    let item = |sketch: &HourSketch| {
        Put::builder()
            .table_name(table)
            .item("pk", AttributeValue::S(top::top_key(metric, sketch.hour)))
            .item("sk", AttributeValue::S(writer.to_owned()))
            .item("expires_at", expires.clone())
            .item(
                top::SKETCH_HOUR_ATTR,
                AttributeValue::N(sketch.hour.to_string()),
            )
            .item(
                top::SKETCH_ATTR,
                AttributeValue::B(Blob::new(sketch.bytes.clone())),
            )
    };
    s.step
        .finished
        .iter()
        .chain(std::iter::once(&s.step.current))
        .map(|sketch| {
            Ok(TransactWriteItem::builder()
                .put(
                    item(sketch)
                        .build()
                        .map_err(|e| request_build_failed("Put", &e))?,
                )
                .build())
        })
        .collect()
}

/// `writer`'s stored sketch of `metric` for `hour`, from `table` (the
/// views table), read consistently: it was put by the chunk that moved
/// the checkpoint last.
pub(super) async fn stored(
    client: &Client,
    table: &str,
    metric: &str,
    writer: &str,
    hour: i64,
) -> Result<Option<HourSketch>, Error> {
    let out = client
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(top::top_key(metric, hour)))
        .key("sk", AttributeValue::S(writer.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| translate("GetItem", e))?;
    Ok(out.item.and_then(|i| i.hour_sketch()))
}
