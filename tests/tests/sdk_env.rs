//! The functions' SDK set-up from the environment, in a process of its own
//! (it sets variables): an empty `AWS_ENDPOINT_URL_DYNAMODB`, which
//! `sam local invoke` produces for a declared but unresolved variable, is
//! treated as unset instead of panicking the SDK, and the standard
//! `AWS_ENDPOINT_URL` still applies.

mod common;

use common::TestStack;
use likes::Config;
use likes::service::LikeService;
use likes::store::dynamo::DynamoStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_service_endpoint_variable_is_ignored() {
    let t = TestStack::uncached().await;
    // SAFETY: the only test of this binary; nothing else reads the
    // environment concurrently.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL_DYNAMODB", "");
        std::env::set_var("AWS_ENDPOINT_URL", &t.stack.dynamo_endpoint);
        std::env::set_var("AWS_ACCESS_KEY_ID", "local");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "local");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("COUNTERS_TABLE", &t.stack.config.counters_table);
        std::env::set_var("LIKES_TABLE", &t.stack.config.likes_table);
    }
    let config = Config::from_env().unwrap();
    let store = DynamoStore::from_env(&config).await;
    let service = LikeService::new(store, &config);
    service
        .ready()
        .await
        .expect("reaches the endpoint of AWS_ENDPOINT_URL");
    t.stop().await;
}
