//! The `reshard` Lambda function: the admin routes
//! (`GET|POST /admin/reels/{reel_id}/shards`, API Gateway HTTP API events)
//! and the scheduled run (EventBridge events) that completes resizes and
//! grows and shrinks reels automatically.
//!
//! Set-up only; both kinds of event are told apart and handled in
//! `likes::triggers::handle_reshard_event`.

// The handlers' futures nest deeply; rustc's default query depth is not
// always enough to lay out `main`'s future on a clean build.
#![recursion_limit = "256"]

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use likes::App;
use likes::http::lambda_deadline;
use likes::triggers::handle_reshard_event;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    likes::logging::init();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        // The run stops (checkpointing what it has) before the deadline.
        let deadline = lambda_deadline(event.context.deadline);
        handle_reshard_event(app, event.payload, deadline)
            .await
            .map_err(Error::from)
    }))
    .await
}
