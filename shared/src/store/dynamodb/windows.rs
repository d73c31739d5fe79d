//! The windowed counts' buckets ([`crate::keys::window`]) in update
//! expressions: every write that counts a change adds it to its buckets and
//! drops the expired ones, whatever item it is (a transactional shard, a
//! stream shard's writer item, a views day item, a base a fold fills).

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::types::builders::UpdateBuilder;

/// `delta` in each bucket of `at_ms` still kept at that clock: what a
/// transactional like or unlike adds (its request clock is both the
/// change's time and the write's).
pub(super) fn of_change(delta: i64, at_ms: i64) -> Vec<(String, i64)> {
    crate::keys::window::buckets_of(at_ms, at_ms)
        .map(|name| (name, delta))
        .collect()
}

/// Appends `, #cI :cI` to an `ADD` clause in `expr` for each bucket.
pub(super) fn add(
    mut update: UpdateBuilder,
    expr: &mut String,
    buckets: &[(String, i64)],
) -> UpdateBuilder {
    for (i, (name, v)) in buckets.iter().enumerate() {
        expr.push_str(&format!(", #c{i} :c{i}"));
        update = update
            .expression_attribute_names(format!("#c{i}"), name)
            .expression_attribute_values(format!(":c{i}"), AttributeValue::N(v.to_string()));
    }
    update
}

/// Appends the removal of `names` to `expr`: a `REMOVE` clause of its own
/// (`first`), or more of the one `expr` ends with. None of them may be a
/// bucket the same write adds to (see
/// [`crate::keys::window::pruned_attrs`]).
pub(super) fn remove(
    mut update: UpdateBuilder,
    expr: &mut String,
    names: &[String],
    first: bool,
) -> UpdateBuilder {
    if names.is_empty() {
        return update;
    }
    let placeholders: Vec<String> = (0..names.len()).map(|i| format!("#q{i}")).collect();
    expr.push_str(if first { " REMOVE " } else { ", " });
    expr.push_str(&placeholders.join(", "));
    for (i, name) in names.iter().enumerate() {
        update = update.expression_attribute_names(format!("#q{i}"), name);
    }
    update
}
