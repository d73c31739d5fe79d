//! The `read` Lambda function: `GET /reels/{reel_id}/likes`, `GET /likes`,
//! `GET /healthz`, and the JSON 404 of unknown routes.
//!
//! Set-up only: logging, configuration and the SDK client are built once per
//! cold start; the handler lives in `likes::http`.

// The handlers' futures nest deeply; rustc's default query depth is not
// always enough to lay out `main`'s future on a clean build.
#![recursion_limit = "256"]

use lambda_http::{Error, Request, run, service_fn};
use likes::App;
use likes::http::{Function, handle};

#[tokio::main]
async fn main() -> Result<(), Error> {
    likes::logging::init();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |req: Request| async move {
        Ok::<_, Error>(handle(app, Function::Read, req).await)
    }))
    .await
}
