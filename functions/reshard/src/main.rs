//! The `reshard` Lambda function: the admin routes
//! (`GET|POST /admin/reels/{reel_id}/shards`, API Gateway HTTP API events)
//! and the scheduled run (EventBridge events) that completes resizes and
//! grows and shrinks reels automatically.
//!
//! Set-up only; both kinds of event are told apart and handled in
//! `likes::http::handle_reshard_event`.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use likes::http::{App, handle_reshard_event};
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        // The invocation's deadline (Unix ms) as an Instant, so a scheduled
        // run never sleeps past it.
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let left = Duration::from_millis(event.context.deadline.saturating_sub(now_ms));
        let deadline = Instant::now() + left;
        handle_reshard_event(app, event.payload, Some(deadline))
            .await
            .map_err(Error::from)
    }))
    .await
}
