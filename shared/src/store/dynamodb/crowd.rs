//! A reel's crowd record ([`AggregateStore::note_crowd`]): the stream
//! shards whose aggregation met on the reel's shards within a window, as a
//! string set every aggregator instance adds to. On Lambda each stream
//! shard's batches run in whichever instance is free, so no instance sees
//! a crowd by itself (issue 35: a reel at one shard, 16 stream shards, each
//! in an instance of its own, never grew).
//!
//! Three conditional updates, each one item write, made only when a chunk
//! met another's transaction, and at most once per (reel, stream shard,
//! window) per instance (the caller keeps that):
//!
//! 1. add the source to the current window's set, unless quiet or the
//!    window is over;
//! 2. otherwise start a window with the source alone, unless quiet or
//!    another instance started one meanwhile (then 1 again);
//! 3. once the set is big enough, claim the crowd: go quiet and empty the
//!    set, on the condition that it is still big enough and not quiet, so
//!    exactly one note across instances asks for the grow.

use super::DynamoStore;
use super::error::translate;
use crate::error::Error;
use crate::keys::{self, ReelId};
use crate::store::CrowdSighting;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};

/// The record's TTL past its last note: windows are seconds long.
const RECORD_TTL_SECS: i64 = 86_400;
/// Rounds of steps 1–2 when other instances keep starting windows.
const MAX_ROUNDS: usize = 3;

impl DynamoStore {
    pub(super) async fn crowd_note(
        &self,
        reel: &ReelId,
        source: &str,
        s: &CrowdSighting,
    ) -> Result<bool, Error> {
        let key = AttributeValue::S(keys::crowd_key(reel));
        let n = |v: i64| AttributeValue::N(v.to_string());
        let set = AttributeValue::Ss(vec![source.to_owned()]);
        let exp = n(s.now_ms / 1000 + RECORD_TTL_SECS);
        let mut size = None;
        for _ in 0..MAX_ROUNDS {
            let added = self
                .client
                .update_item()
                .table_name(&self.counters_table)
                .key("pk", key.clone())
                .update_expression("ADD #src :s SET #exp = :exp")
                .condition_expression("(attribute_not_exists(#qu) OR #qu < :now) AND #win >= :from")
                .expression_attribute_names("#src", "src")
                .expression_attribute_names("#exp", "expires_at")
                .expression_attribute_names("#qu", "quiet_until")
                .expression_attribute_names("#win", "window_at")
                .expression_attribute_values(":s", set.clone())
                .expression_attribute_values(":exp", exp.clone())
                .expression_attribute_values(":now", n(s.now_ms))
                .expression_attribute_values(":from", n(s.now_ms - s.window_ms))
                .return_values(ReturnValue::UpdatedNew)
                .send()
                .await;
            match added {
                Ok(out) => {
                    size = Some(set_size(out.attributes()));
                    break;
                }
                Err(SdkError::ServiceError(se))
                    if se.err().is_conditional_check_failed_exception() => {}
                Err(e) => return Err(translate("UpdateItem", e)),
            }
            let started = self
                .client
                .update_item()
                .table_name(&self.counters_table)
                .key("pk", key.clone())
                .update_expression("SET #src = :s, #win = :now, #exp = :exp")
                .condition_expression(
                    "(attribute_not_exists(#qu) OR #qu < :now) \
                     AND (attribute_not_exists(#win) OR #win < :from)",
                )
                .expression_attribute_names("#src", "src")
                .expression_attribute_names("#exp", "expires_at")
                .expression_attribute_names("#qu", "quiet_until")
                .expression_attribute_names("#win", "window_at")
                .expression_attribute_values(":s", set.clone())
                .expression_attribute_values(":exp", exp.clone())
                .expression_attribute_values(":now", n(s.now_ms))
                .expression_attribute_values(":from", n(s.now_ms - s.window_ms))
                .send()
                .await;
            match started {
                Ok(_) => {
                    size = Some(1);
                    break;
                }
                // Quiet, or another instance started a window: a last
                // look at which, through step 1.
                Err(SdkError::ServiceError(se))
                    if se.err().is_conditional_check_failed_exception() => {}
                Err(e) => return Err(translate("UpdateItem", e)),
            }
        }
        let Some(size) = size else {
            // Quiet (a crowd was claimed lately), or a window racing ours.
            return Ok(false);
        };
        if size < s.needed as usize {
            return Ok(false);
        }
        let claimed = self
            .client
            .update_item()
            .table_name(&self.counters_table)
            .key("pk", key)
            .update_expression("SET #qu = :until REMOVE #src, #win")
            .condition_expression(
                "size(#src) >= :needed AND (attribute_not_exists(#qu) OR #qu < :now)",
            )
            .expression_attribute_names("#src", "src")
            .expression_attribute_names("#qu", "quiet_until")
            .expression_attribute_names("#win", "window_at")
            .expression_attribute_values(":until", n(s.quiet_until_ms))
            .expression_attribute_values(":needed", n(i64::from(s.needed)))
            .expression_attribute_values(":now", n(s.now_ms))
            .send()
            .await;
        match claimed {
            Ok(_) => Ok(true),
            // Another instance claimed it first.
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(translate("UpdateItem", e)),
        }
    }
}

/// Sources in the set an update returned.
fn set_size(attrs: Option<&std::collections::HashMap<String, AttributeValue>>) -> usize {
    attrs
        .and_then(|a| a.get("src"))
        .and_then(|v| v.as_ss().ok())
        .map_or(0, Vec::len)
}
