//! The `reconcile` Lambda function: the scheduled recount from the like rows
//! that repairs drifted shards. Its event is `{"mode": "start" | "resume",
//! "dry_run": bool}` (the schedules pass the mode); its result is the
//! invocation's summary.
//!
//! Set-up only; the job lives in `likes::reconcile`.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use likes::http::{App, handle_reconcile_event};
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        // The invocation's deadline (Unix ms) as an Instant: the run
        // checkpoints and stops before it.
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let left = Duration::from_millis(event.context.deadline.saturating_sub(now_ms));
        handle_reconcile_event(app, &event.payload, Some(Instant::now() + left))
            .await
            .map_err(Error::from)
    }))
    .await
}
