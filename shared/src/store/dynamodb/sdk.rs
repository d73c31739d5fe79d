//! The SDK client: bounded retries and timeouts, the retry quota, and the
//! endpoint from the standard chain.

use super::tls::https_client;
use crate::config::Config;
use aws_config::environment::EnvironmentVariableCredentialsProvider;
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
/// ([`DynamoStore::from_env`](super::DynamoStore::from_env)), with what the
/// standard chains would choose, chosen without building what they would
/// not use:
///
/// * the HTTPS client of [`https_client`], whose trust store is the
///   system's CA bundle file alone, where there is a usable one;
/// * the credentials of the environment where it has them, as on Lambda
///   (the execution role's keys). They are the standard credentials chain's
///   first link and would win there too; building the chain also builds its
///   other links, an STS client for web identity among them.
pub(super) fn instance_config_loader(config: &Config) -> aws_config::ConfigLoader {
    let mut loader = sdk_config_loader(config);
    if let Some(http) = https_client() {
        loader = loader.http_client(http);
    }
    if has_env_credentials(|name| std::env::var(name).ok()) {
        loader = loader.credentials_provider(EnvironmentVariableCredentialsProvider::new());
    }
    loader
}

/// Whether the environment, read through `lookup`, has the credentials that
/// the standard chain's first link takes: a key id and a secret key, neither
/// blank. (That link also reads the secret from `SECRET_ACCESS_KEY`; where
/// only that is set, the chain itself is built.)
fn has_env_credentials(lookup: impl Fn(&str) -> Option<String>) -> bool {
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .all(|name| lookup(name).is_some_and(|v| !v.trim().is_empty()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_credentials_are_a_key_id_and_a_secret_key_neither_blank() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(has_env_credentials(env(&[
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ])));
        assert!(!has_env_credentials(env(&[("AWS_ACCESS_KEY_ID", "AKID")])));
        assert!(!has_env_credentials(env(&[(
            "AWS_SECRET_ACCESS_KEY",
            "secret"
        )])));
        assert!(!has_env_credentials(env(&[
            ("AWS_ACCESS_KEY_ID", " "),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ])));
        assert!(!has_env_credentials(env(&[])));
    }
}
