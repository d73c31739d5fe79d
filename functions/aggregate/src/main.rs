//! The `aggregate` Lambda function (stream mode, `COUNTING=stream`): the
//! Likes table's stream consumer. Its event is a batch of one stream shard's
//! records (with the tumbling-window fields that name the shard); its result
//! is Lambda's `TimeWindowEventResponse`, whose `batchItemFailures` hands
//! back what it did not apply.
//!
//! Set-up only; the aggregation lives in `likes::aggregate`.

// The handlers' futures nest deeply; rustc's default query depth is not
// always enough to lay out `main`'s future on a clean build.
#![recursion_limit = "256"]

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use likes::App;
use likes::http::lambda_deadline;
use likes::triggers::handle_aggregate_event;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    likes::logging::init();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        // Chunks not started before the deadline are handed back.
        let deadline = lambda_deadline(event.context.deadline);
        handle_aggregate_event(app, event.payload, deadline)
            .await
            .map_err(Error::from)
    }))
    .await
}
