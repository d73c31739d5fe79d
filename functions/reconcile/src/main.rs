//! The `reconcile` Lambda function: the scheduled recount from the like rows
//! that repairs drifted shards. Its event is `{"mode": "start" | "resume",
//! "dry_run": bool}` (the schedules pass the mode); its result is the
//! invocation's summary.
//!
//! Set-up only; the job lives in `likes::reconcile`.

// The handlers' futures nest deeply; rustc's default query depth is not
// always enough to lay out `main`'s future on a clean build.
#![recursion_limit = "256"]

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use likes::App;
use likes::http::lambda_deadline;
use likes::triggers::handle_reconcile_event;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    likes::logging::init();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        // The run stops (checkpointing what it has) before the deadline.
        let deadline = lambda_deadline(event.context.deadline);
        handle_reconcile_event(app, &event.payload, deadline)
            .await
            .map_err(Error::from)
    }))
    .await
}
