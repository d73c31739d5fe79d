//! Minimal `lambda_runtime` hello-world: the baseline that the functions'
//! bootstrap size, cold start, memory and per-request overhead are compared
//! with. JSON in, JSON out, no AWS SDK.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    run(service_fn(|event: LambdaEvent<Value>| async move {
        let path = event
            .payload
            .get("rawPath")
            .and_then(Value::as_str)
            .unwrap_or("/");
        Ok::<_, Error>(json!({ "message": format!("hello from {path}") }))
    }))
    .await
}
