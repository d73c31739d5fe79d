//! The `warm` Lambda function: the cache warmer, run by the EventBridge
//! schedule once a minute. Each invocation ranks the trending lists once
//! for every instance and keeps the listed reels' totals summed until its
//! deadline nears; its result is the run's summary.
//!
//! Set-up only; the run lives in `likes::warmer`.

// The handlers' futures nest deeply; rustc's default query depth is not
// always enough to lay out `main`'s future on a clean build.
#![recursion_limit = "256"]

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use likes::App;
use likes::http::lambda_deadline;
use likes::triggers::handle_warm_event;
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    likes::logging::init();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        // The run stops before the deadline.
        let deadline = lambda_deadline(event.context.deadline);
        handle_warm_event(app, &event.payload, deadline)
            .await
            .map_err(Error::from)
    }))
    .await
}
