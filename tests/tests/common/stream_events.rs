//! Stream-mode batches handed to the aggregate function's entry point by
//! hand, as Lambda would: the tests that drive its order, fences and
//! refusals build the same event around their own records.

use super::TestStack;
use serde_json::{Value, json};

/// The Likes table's stream, as the records and the batch name it.
pub const ARN: &str =
    "arn:aws:dynamodb:us-east-1:123456789012:table/likes-LikesTable/stream/2026-12-01T00:00:00.000";

/// Lambda's event for `records` of stream shard `shard` (tumbling window).
pub fn batch_of(shard: &str, records: &[Value]) -> Value {
    json!({
        "Records": records,
        "window": {"start": "2026-12-01T00:00:00Z", "end": "2026-12-01T00:01:00Z"},
        "state": {},
        "shardId": shard,
        "eventSourceARN": ARN,
        "isFinalInvokeForWindow": false,
        "isWindowTerminatedEarly": false,
    })
}

/// Hands `event` to the aggregate function's entry point, which must take
/// the whole batch (no `batchItemFailures`).
pub async fn deliver(t: &TestStack, event: &Value) {
    let out = likes::triggers::handle_aggregate_event(&t.stack.app, event.clone(), None)
        .await
        .expect("the batch is taken");
    assert_eq!(out["batchItemFailures"], json!([]), "{out}");
}
