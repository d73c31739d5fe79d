//! The SDK clients of the local stack: which credentials, region and
//! endpoint they use, and how their errors read. Kept apart from the stack's
//! start-up because tools and tests build clients for an endpoint of their
//! own with the same rules ([`client_for`]).

use super::{Dynamo, StackOptions};
use anyhow::anyhow;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{Credentials, Region};
use likes::Config;
use likes::store::dynamodb::sdk_config_loader;
use std::path::PathBuf;

/// An SDK client for `endpoint`, with dummy credentials and region when the
/// environment has none (a local emulator accepts any).
///
/// The embedded emulator always gets dummy credentials. For an endpoint of
/// the user's, the standard chain is used when the environment configures
/// any credentials (variables, a profile, `~/.aws`, web identity, a
/// container); otherwise dummy ones, without probing further (no instance
/// metadata lookups from a developer's machine or CI).
pub async fn client_for(config: &Config, endpoint: &str, opts: &StackOptions) -> Client {
    let sdk = sdk_for(config, opts).await;
    // Set on the client, so it wins over any endpoint in the environment.
    let conf = aws_sdk_dynamodb::config::Builder::from(&sdk)
        .endpoint_url(endpoint)
        .retry_partition(likes::store::dynamodb::retry_partition(config))
        .build();
    Client::from_conf(conf)
}

/// A DynamoDB Streams client for `endpoint` (the emulator serves both APIs
/// on one endpoint), with the credentials and region of [`client_for`].
pub async fn streams_client_for(
    config: &Config,
    endpoint: &str,
    opts: &StackOptions,
) -> aws_sdk_dynamodbstreams::Client {
    let sdk = sdk_for(config, opts).await;
    aws_sdk_dynamodbstreams::Client::from_conf(
        aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
            .endpoint_url(endpoint)
            .build(),
    )
}

/// The SDK configuration of the local clients.
/// A Kinesis client on `endpoint` with the functions' SDK settings (the
/// views log's; `KinesisLog::from_sdk` is its Lambda twin).
pub async fn kinesis_client_for(
    config: &Config,
    endpoint: &str,
    opts: &StackOptions,
) -> aws_sdk_kinesis::Client {
    let sdk = sdk_for(config, opts).await;
    aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(&sdk)
            .endpoint_url(endpoint)
            .build(),
    )
}

async fn sdk_for(config: &Config, opts: &StackOptions) -> aws_config::SdkConfig {
    let mut loader = sdk_config_loader(config);
    if !uses_real_credentials(opts) {
        loader = loader.credentials_provider(Credentials::new(
            "local",
            "local",
            None,
            None,
            "likes-local",
        ));
    }
    if opts
        .lookup("AWS_REGION")
        .or_else(|| opts.lookup("AWS_DEFAULT_REGION"))
        .is_none()
    {
        loader = loader.region(Region::new("us-east-1"));
    }
    loader.load().await
}

/// Whether the standard credential chain is worth asking: only for an
/// endpoint of the user's, and only when the environment configures
/// credentials somewhere (see [`client_for`]).
fn uses_real_credentials(opts: &StackOptions) -> bool {
    if matches!(opts.dynamo, Dynamo::Embedded { .. }) {
        return false;
    }
    let vars = [
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ];
    if vars.iter().any(|v| opts.lookup(v).is_some()) {
        return true;
    }
    let home = opts.lookup("HOME").map(PathBuf::from);
    let files = [
        opts.lookup("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from),
        opts.lookup("AWS_CONFIG_FILE").map(PathBuf::from),
        home.as_ref().map(|h| h.join(".aws/credentials")),
        home.as_ref().map(|h| h.join(".aws/config")),
    ];
    files.into_iter().flatten().any(|f| f.is_file())
}

/// An SDK error with its full context (code, message, source chain), for the
/// messages `make serve` prints when set-up fails.
pub(super) fn sdk_error(what: String, e: &(dyn std::error::Error + 'static)) -> anyhow::Error {
    anyhow!(
        "{what}: {}",
        aws_sdk_dynamodb::error::DisplayErrorContext(e)
    )
}
