//! A writer's trending sketch in its chunk's transaction
//! ([`crate::trending`]): set on the checkpoint item, and, when the chunk
//! opens a new hour for the writer, the ended hour's sketch stored as an
//! item of that hour and the new hour's item pointing at the checkpoint.

use super::error::request_build_failed;
use crate::error::Error;
use crate::keys::top;
use crate::trending::SketchWrite;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

/// The sketch it writes, if the chunk writes one.
fn written(s: Option<&SketchWrite>) -> Option<&SketchWrite> {
    s.filter(|s| s.write)
}

/// The checkpoint update's extra `SET` clauses for the sketch (empty when
/// the chunk does not write it).
pub(super) fn checkpoint_sets(s: Option<&SketchWrite>) -> &'static str {
    if written(s).is_some() {
        ", #fh = :fh, #fi = :fi"
    } else {
        ""
    }
}

/// The names and values of [`checkpoint_sets`]' clauses.
pub(super) fn with_sketch(update: UpdateBuilder, s: Option<&SketchWrite>) -> UpdateBuilder {
    match written(s) {
        None => update,
        Some(s) => update
            .expression_attribute_names("#fh", top::SKETCH_HOUR_ATTR)
            .expression_attribute_names("#fi", top::SKETCH_ATTR)
            .expression_attribute_values(":fh", AttributeValue::N(s.step.current.hour.to_string()))
            .expression_attribute_values(
                ":fi",
                AttributeValue::B(Blob::new(s.step.current.bytes.clone())),
            ),
    }
}

/// The `top#` items a chunk puts into `table` (the views table) for
/// `writer` of `metric`: the ended hour's sketch, and the new hour's
/// pointer at the writer's `checkpoint` key (of the metric's checkpoint
/// items: the counters table's for likes, the views table's for views).
pub(super) fn puts(
    table: &str,
    metric: &str,
    writer: &str,
    checkpoint: &str,
    s: Option<&SketchWrite>,
    now_ms: i64,
) -> Result<Vec<TransactWriteItem>, Error> {
    let Some(s) = written(s) else {
        return Ok(Vec::new());
    };
    let expires = AttributeValue::N((now_ms / 1000 + top::TOP_TTL_SECS).to_string());
    let item = |hour: i64| {
        Put::builder()
            .table_name(table)
            .item("pk", AttributeValue::S(top::top_key(metric, hour)))
            .item("sk", AttributeValue::S(writer.to_owned()))
            .item("expires_at", expires.clone())
    };
    let mut out = Vec::new();
    if let Some(f) = &s.step.finished {
        let put = item(f.hour)
            .item(top::SKETCH_HOUR_ATTR, AttributeValue::N(f.hour.to_string()))
            .item(
                top::SKETCH_ATTR,
                AttributeValue::B(Blob::new(f.bytes.clone())),
            );
        out.push(put);
    }
    if s.step.opened {
        out.push(item(s.step.current.hour).item(
            top::SKETCH_AT_ATTR,
            AttributeValue::S(checkpoint.to_owned()),
        ));
    }
    out.into_iter()
        .map(|p| {
            Ok(TransactWriteItem::builder()
                .put(p.build().map_err(|e| request_build_failed("Put", &e))?)
                .build())
        })
        .collect()
}
