//! Minimal `lambda_http` hello-world: API Gateway HTTP API event in, JSON
//! response out, no AWS SDK.

use lambda_http::{Body, Error, Request, Response, run, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    run(service_fn(|req: Request| async move {
        let body = format!("{{\"message\":\"hello from {}\"}}", req.uri().path());
        Ok::<_, Error>(
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from(body))?,
        )
    }))
    .await
}
