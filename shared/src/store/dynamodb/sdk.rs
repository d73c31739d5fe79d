//! The SDK client: bounded retries and timeouts, the retry quota, and the
//! endpoint from the standard chain.

use super::tls::https_client;
use crate::config::Config;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;

/// The SDK configuration for `config`: bounded retries and timeouts, so a
/// request never outlives the function. The endpoint, region and credentials
/// come from the standard chain, so `AWS_ENDPOINT_URL_DYNAMODB` points it at
/// a local server.
pub fn sdk_config_loader(config: &Config) -> aws_config::ConfigLoader {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        // The SDK's generic default backs off from 1 s, which alone would
        // spend a request's whole budget; DynamoDB's own SDKs start near
        // 25–50 ms. The same full-jitter bounds as the transaction retries.
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(config.ddb_max_attempts)
                .with_initial_backoff(config.retry_base)
                .with_max_backoff(config.retry_max),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.ddb_connect_timeout)
                .operation_attempt_timeout(config.ddb_attempt_timeout)
                .operation_timeout(config.ddb_operation_timeout)
                .build(),
        )
}

/// [`sdk_config_loader`] as a function instance uses it at cold start
/// ([`DynamoStore::from_env`](super::DynamoStore::from_env)): with the HTTPS
/// client of [`https_client`], whose trust store is the system's CA bundle
/// file alone, where there is a usable one.
pub(super) fn instance_config_loader(config: &Config) -> aws_config::ConfigLoader {
    let loader = sdk_config_loader(config);
    match https_client() {
        Some(http) => loader.http_client(http),
        None => loader,
    }
}

/// The SDK's retry partition for `config`: its own token bucket (the retry
/// quota, [`Config::ddb_retry_quota`]) instead of the SDK's default one.
pub fn retry_partition(config: &Config) -> RetryPartition {
    let bucket = if config.ddb_retry_quota == 0 {
        TokenBucket::unlimited()
    } else {
        TokenBucket::builder()
            .capacity(config.ddb_retry_quota as usize)
            .refill_rate(config.ddb_retry_quota_refill as f32)
            .build()
    };
    RetryPartition::custom("likes-dynamodb")
        .token_bucket(bucket)
        .build()
}

/// The DynamoDB client for `sdk`, with the retry quota of `config`.
///
/// An empty `AWS_ENDPOINT_URL_DYNAMODB` (or `AWS_ENDPOINT_URL`) means "not
/// set": `sam local invoke` sets every variable the template declares but
/// cannot resolve to "", and the SDK panics on an empty endpoint URL.
pub fn client(sdk: &aws_config::SdkConfig, config: &Config) -> Client {
    let mut builder =
        aws_sdk_dynamodb::config::Builder::from(sdk).retry_partition(retry_partition(config));
    let vars = ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"].map(|k| std::env::var(k).ok());
    if vars.iter().flatten().any(|v| v.trim().is_empty()) {
        // The first non-empty one, in the SDK's own order of precedence.
        let url = vars.into_iter().flatten().find(|v| !v.trim().is_empty());
        builder.set_endpoint_url(url);
    }
    Client::from_conf(builder.build())
}
