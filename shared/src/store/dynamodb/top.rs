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
    s.step
        .finished
        .iter()
        .chain(std::iter::once(&s.step.current))
        .map(|sketch| {
            Ok(TransactWriteItem::builder()
                .put(
                    sketch_put(table, metric, writer, sketch, now_ms)
                        .build()
                        .map_err(|e| request_build_failed("Put", &e))?,
                )
                .build())
        })
        .collect()
}

/// The put of `writer`'s `sketch` of `metric` into `table`, in a
/// transaction.
fn sketch_put(
    table: &str,
    metric: &str,
    writer: &str,
    sketch: &HourSketch,
    now_ms: i64,
) -> aws_sdk_dynamodb::types::builders::PutBuilder {
    Put::builder()
        .table_name(table)
        .set_item(Some(sketch_item(metric, writer, sketch, now_ms)))
}

/// `writer`'s `sketch` of `metric` as an item, kept [`top::TOP_TTL_SECS`]
/// from `now_ms`.
fn sketch_item(
    metric: &str,
    writer: &str,
    sketch: &HourSketch,
    now_ms: i64,
) -> std::collections::HashMap<String, AttributeValue> {
    std::collections::HashMap::from([
        (
            "pk".to_owned(),
            AttributeValue::S(top::top_key(metric, sketch.hour)),
        ),
        ("sk".to_owned(), AttributeValue::S(writer.to_owned())),
        (
            "expires_at".to_owned(),
            AttributeValue::N((now_ms / 1000 + top::TOP_TTL_SECS).to_string()),
        ),
        (
            top::SKETCH_HOUR_ATTR.to_owned(),
            AttributeValue::N(sketch.hour.to_string()),
        ),
        (
            top::SKETCH_ATTR.to_owned(),
            AttributeValue::B(Blob::new(sketch.bytes.clone())),
        ),
    ])
}

/// A like function instance's sketches of `metric` (transactional mode,
/// [`crate::trending::instance`]), each one `PutItem` into `table` (the
/// views table; none: nothing is put) of its own: no transaction, since
/// nothing else is written with them, and no batch write (a batch's
/// unprocessed items would need their own retry loop for one or two
/// items).
pub(super) async fn put_instance_sketches(
    client: &Client,
    table: Option<&str>,
    metric: &str,
    flush: &crate::trending::Flush,
    now_ms: i64,
) -> Result<(), Error> {
    let Some(table) = table else {
        return Ok(());
    };
    // At once: an ended hour's and the current one's (the caller bounds
    // how long it waits for both).
    futures::future::try_join_all(flush.sketches.iter().map(|sketch| {
        let item = sketch_item(metric, &flush.writer, sketch, now_ms);
        async move {
            client
                .put_item()
                .table_name(table)
                .set_item(Some(item))
                .send()
                .await
                .map_err(|e| translate("PutItem", e))
        }
    }))
    .await?;
    Ok(())
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
