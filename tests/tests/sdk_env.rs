//! The functions' SDK set-up from the environment, in a process of its own
//! (it sets variables, before any other thread exists): an empty
//! `AWS_ENDPOINT_URL_DYNAMODB`, which `sam local invoke` produces for a
//! declared but unresolved variable, is treated as unset instead of
//! panicking the SDK, and the standard `AWS_ENDPOINT_URL` still applies.

mod common;

use common::repo_root;
use likes::Config;
use likes::service::LikeService;
use likes::store::dynamodb::DynamoStore;
use likes_local::{Dynamo, Stack, StackOptions};

#[test]
fn an_empty_service_endpoint_variable_is_ignored() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // SAFETY: no other thread runs yet: the runtime is built below.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL_DYNAMODB", "");
        std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
        std::env::set_var("AWS_ACCESS_KEY_ID", "local");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "local");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("COUNTERS_TABLE", "env-counters");
        std::env::set_var("LIKES_TABLE", "env-likes");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut opts = StackOptions::isolated(repo_root().join("template.yaml"));
        opts.dynamo = Dynamo::Embedded {
            host: "127.0.0.1".into(),
            port,
            file: None,
        };
        opts.env
            .insert("COUNTERS_TABLE".into(), "env-counters".into());
        opts.env.insert("LIKES_TABLE".into(), "env-likes".into());
        let stack = Stack::start(opts).await.expect("stack");
        let config = Config::from_env().unwrap();
        let store = DynamoStore::from_env(&config).await;
        let service = LikeService::new(store, &config);
        service
            .ready()
            .await
            .expect("reaches the endpoint of AWS_ENDPOINT_URL");
        stack.shutdown().await;
    });
}
