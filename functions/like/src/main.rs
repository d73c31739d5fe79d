//! The `like` Lambda function: `PUT|DELETE /reels/{reel_id}/like`.
//!
//! Set-up only: logging, configuration and the SDK client are built once per
//! cold start; the handler lives in `likes::http`.

use lambda_http::{Error, Request, run, service_fn};
use likes::http::{App, Function, handle};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let app = App::from_env().await?;
    let app = &app;
    run(service_fn(move |req: Request| async move {
        Ok::<_, Error>(handle(app, Function::Like, req).await)
    }))
    .await
}
