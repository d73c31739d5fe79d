//! The local stack: embedded dynoxide (or any endpoint), the tables from
//! `template.yaml`, and the gateway serving every route on one base URL.

use crate::gateway::Gateway;
use crate::template::{ScheduleDef, TableDef, Template};
use anyhow::{Context, Result, anyhow};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, CreateGlobalSecondaryIndexAction, GlobalSecondaryIndex,
    GlobalSecondaryIndexUpdate, IndexStatus, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, StreamSpecification, StreamViewType, TableStatus, TimeToLiveSpecification,
    TimeToLiveStatus,
};
use faultproxy::{Faults, Proxy};
use likes::App;
use likes::store::dynamodb::{DynamoStore, sdk_config_loader};
use likes::{AuthMode, Config, Counting};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where DynamoDB lives.
#[derive(Clone, Debug)]
pub enum Dynamo {
    /// Start dynoxide in this process on `host:port` (port 0 = any free
    /// port), in memory or in a SQLite file.
    Embedded {
        host: String,
        port: u16,
        file: Option<PathBuf>,
    },
    /// Use this endpoint (DynamoDB Local, LocalStack, AWS itself...).
    Endpoint(String),
}

#[derive(Clone, Debug)]
pub struct StackOptions {
    pub template: PathBuf,
    pub dynamo: Dynamo,
    /// Host and port of the gateway (port 0 = any free port).
    pub host: String,
    pub port: u16,
    /// Configuration variables, looked up before the process environment.
    pub env: HashMap<String, String>,
    /// Whether the process environment is consulted at all (tests say no,
    /// so a developer's shell cannot change what they test).
    pub inherit_env: bool,
}

impl StackOptions {
    /// In-memory dynoxide and the gateway on free ports, isolated from the
    /// process environment: what the integration tests use.
    pub fn isolated(template: PathBuf) -> Self {
        StackOptions {
            template,
            dynamo: Dynamo::Embedded {
                host: "127.0.0.1".into(),
                port: 0,
                file: None,
            },
            host: "127.0.0.1".into(),
            port: 0,
            env: HashMap::new(),
            inherit_env: false,
        }
    }

    fn lookup(&self, name: &str) -> Option<String> {
        self.env.get(name).cloned().or_else(|| {
            if self.inherit_env {
                std::env::var(name).ok()
            } else {
                None
            }
        })
    }
}

/// A running stack. Dropping it does not stop it; call [`Stack::shutdown`].
pub struct Stack {
    pub base_url: String,
    pub dynamo_endpoint: String,
    pub config: Config,
    /// An SDK client on the same endpoint, for tools and tests that look at
    /// the tables directly (never through the fault proxy).
    pub client: Client,
    pub app: Arc<App>,
    /// The fault-injection proxy between the functions and DynamoDB, when
    /// `FAULTS` asked for one.
    pub proxy: Option<Arc<Proxy>>,
    /// Stream mode: the aggregate function's event sources.
    pub streams: Vec<crate::streams::StreamSource>,
    /// A Streams API client on the emulator itself (never through the
    /// proxy), for tools and tests that look at the stream.
    pub streams_client: aws_sdk_dynamodbstreams::Client,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Stack {
    pub async fn start(opts: StackOptions) -> Result<Stack> {
        let template = Template::load(&opts.template)?;
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();

        let dynamo_endpoint = match &opts.dynamo {
            Dynamo::Endpoint(url) => url.clone(),
            Dynamo::Embedded { host, port, file } => {
                let db = match file {
                    Some(path) => dynoxide::Database::new(&path.to_string_lossy())
                        .map_err(|e| anyhow!("opening {}: {e}", path.display()))?,
                    None => dynoxide::Database::memory()
                        .map_err(|e| anyhow!("starting dynoxide: {e}"))?,
                };
                let listener = TcpListener::bind((host.as_str(), *port))
                    .await
                    .with_context(|| format!("binding the DynamoDB port {port}"))?;
                let addr = listener.local_addr()?;
                let mut rx = stopped.clone();
                tasks.push(tokio::spawn(async move {
                    let shutdown = async move {
                        let _ = rx.wait_for(|s| *s).await;
                    };
                    if let Err(e) =
                        dynoxide::server::serve_with_shutdown(listener, db, shutdown).await
                    {
                        tracing::error!(error = %e, "dynoxide stopped");
                    }
                }));
                format!("http://{addr}")
            }
        };

        // Table names: the variable the template wires to each table, else
        // the table's logical id.
        let mut env = opts.env.clone();
        for (var, table) in &template.table_env {
            if opts.lookup(var).is_none() {
                env.insert(var.clone(), table.clone());
            }
        }
        let lookup_opts = StackOptions {
            env,
            ..opts.clone()
        };
        let mut config = Config::from_lookup(|k| lookup_opts.lookup(k)).context("configuration")?;
        // The local stack is the one place dev auth is switched on.
        config.auth_mode = AuthMode::Dev;

        let client = client_for(&config, &dynamo_endpoint, &lookup_opts).await;
        for table in &template.tables {
            let name = table_name(&template, &lookup_opts, &table.logical_id);
            ensure_table(&client, &name, table).await?;
        }

        // With FAULTS set, the functions reach DynamoDB through the fault
        // proxy; the tables were made, and tests look at them, directly.
        let faults = lookup_opts.lookup("FAULTS").unwrap_or_default();
        let faults = Faults::parse(&faults).map_err(|e| anyhow!("FAULTS: {e}"))?;
        let (proxy, app_client) = if faults.is_passthrough() {
            (None, client.clone())
        } else {
            let proxy = Proxy::start(&format!("{}:0", opts.host), &dynamo_endpoint, faults).await?;
            let c = client_for(&config, &proxy.url, &lookup_opts).await;
            (Some(Arc::new(proxy)), c)
        };
        let app = Arc::new(App::new(
            config.clone(),
            DynamoStore::new(app_client, &config),
        ));
        let listener = TcpListener::bind((opts.host.as_str(), opts.port))
            .await
            .with_context(|| format!("binding {}:{}", opts.host, opts.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        let gateway = Arc::new(Gateway::new(
            app.clone(),
            &template.routes,
            addr.to_string(),
        )?);
        let router = axum::Router::new().fallback(move |req| {
            let g = gateway.clone();
            async move { g.serve(req).await }
        });
        let period = seconds(&lookup_opts, "LOCAL_SCHEDULE_SECS", Duration::from_secs(10))?;
        // Reconciliation is a daily job: locally it runs on its schedule only
        // when LOCAL_RECONCILE_SECS asks for it (`make reconcile` runs it by
        // hand).
        let reconcile_period = seconds(&lookup_opts, "LOCAL_RECONCILE_SECS", Duration::ZERO)?;
        for schedule in &template.schedules {
            let period = match schedule.code_uri.rsplit('/').next() {
                Some("reconcile") => reconcile_period,
                _ => period,
            };
            if !period.is_zero() {
                tasks.push(spawn_schedule(
                    app.clone(),
                    schedule,
                    period,
                    stopped.clone(),
                )?);
            }
        }
        // Stream mode: the aggregate function's event source mapping, on the
        // Likes table's stream (through the fault proxy too, with FAULTS).
        let mut streams = Vec::new();
        if config.counting == Counting::Stream {
            let faults = crate::streams::SourceFaults::parse(
                &lookup_opts
                    .lookup("LOCAL_STREAM_FAULTS")
                    .unwrap_or_default(),
            )
            .context("LOCAL_STREAM_FAULTS")?;
            let endpoint = proxy
                .as_ref()
                .map_or(dynamo_endpoint.clone(), |p| p.url.clone());
            let streams_client = streams_client_for(&config, &endpoint, &lookup_opts).await;
            for def in &template.stream_sources {
                if def.code_uri.rsplit('/').next() != Some("aggregate") {
                    anyhow::bail!(
                        "no local handler for the stream events of {} (CodeUri {})",
                        def.function,
                        def.code_uri
                    );
                }
                let table = table_name(&template, &lookup_opts, &def.table);
                let arn = client
                    .describe_table()
                    .table_name(&table)
                    .send()
                    .await
                    .map_err(|e| sdk_error(format!("describing {table}"), &e))?
                    .table()
                    .and_then(|t| t.latest_stream_arn())
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow!("{table} has no stream (StreamSpecification)"))?;
                let timeout = def
                    .timeout_secs
                    .map_or(SCHEDULED_TIMEOUT, |s| Duration::from_secs(s.into()));
                let (source, task) = crate::streams::spawn(
                    app.clone(),
                    streams_client.clone(),
                    def.clone(),
                    arn,
                    timeout,
                    faults,
                    stopped.clone(),
                );
                streams.push(source);
                tasks.push(task);
            }
        }
        let mut rx = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "gateway stopped");
            }
        }));

        let streams_client = streams_client_for(&config, &dynamo_endpoint, &lookup_opts).await;
        Ok(Stack {
            base_url: format!("http://{addr}"),
            dynamo_endpoint,
            config,
            client,
            app,
            proxy,
            streams,
            streams_client,
            stop,
            tasks,
        })
    }

    /// Whether every event source has handed every record now in its
    /// stream to the aggregate function for good (stream mode; always true
    /// in transactional mode).
    pub async fn streams_caught_up(&self) -> Result<bool> {
        for s in &self.streams {
            if !s.caught_up(&self.streams_client).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Stops the gateway and the embedded emulator and waits for them.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Some(p) = &self.proxy {
            p.stop();
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

/// The scheduled invocations EventBridge makes in AWS, made locally every
/// `period` (`LOCAL_SCHEDULE_SECS`), through the same entry point as the
/// Lambda function, one at a time.
fn spawn_schedule(
    app: Arc<App>,
    schedule: &ScheduleDef,
    period: Duration,
    mut stopped: watch::Receiver<bool>,
) -> Result<JoinHandle<()>> {
    let name: &'static str = match schedule.code_uri.rsplit('/').next() {
        Some("reshard") => "reshard",
        Some("reconcile") => "reconcile",
        _ => "",
    };
    let reconcile = match name {
        "reshard" => false,
        "reconcile" => true,
        _ => anyhow::bail!(
            "no local handler for the schedule of {} (CodeUri {})",
            schedule.function,
            schedule.code_uri
        ),
    };
    let input: serde_json::Value = match &schedule.input {
        Some(text) => serde_json::from_str(text)
            .with_context(|| format!("the Input of a schedule of {}", schedule.function))?,
        None => serde_json::json!({
            "source": "aws.events",
            "detail-type": "Scheduled Event",
            "detail": {},
        }),
    };
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            let deadline = Instant::now() + SCHEDULED_TIMEOUT;
            let run = async {
                if reconcile {
                    likes::triggers::handle_reconcile_event(&app, &input, Some(deadline)).await
                } else {
                    likes::triggers::handle_reshard_event(&app, input.clone(), Some(deadline)).await
                }
            };
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                r = run => if let Err(e) = r {
                    tracing::warn!(error = e.code(), function = name, "scheduled run failed");
                },
            }
        }
    }))
}

/// The name of the table `logical_id`: the variable the template wires to
/// it, else the logical id itself.
fn table_name(template: &Template, opts: &StackOptions, logical_id: &str) -> String {
    template
        .table_env
        .iter()
        .find(|(_, id)| *id == logical_id)
        .and_then(|(var, _)| opts.lookup(var))
        .unwrap_or_else(|| logical_id.to_owned())
}

/// A period in (fractional) seconds from `name`, or `default`.
fn seconds(opts: &StackOptions, name: &str, default: Duration) -> Result<Duration> {
    match opts.lookup(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| anyhow!("{name}={v:?} is not a number of seconds")),
    }
}

/// The `Timeout` of the scheduled functions in `template.yaml`.
const SCHEDULED_TIMEOUT: Duration = Duration::from_secs(60);

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

/// Creates `name` from the template's definition unless it exists, and
/// waits until it is ACTIVE.
async fn ensure_table(client: &Client, name: &str, def: &TableDef) -> Result<()> {
    let exists = client
        .describe_table()
        .table_name(name)
        .send()
        .await
        .is_ok();
    if !exists {
        let mut req = client
            .create_table()
            .table_name(name)
            .billing_mode(BillingMode::PayPerRequest);
        req = req
            .set_key_schema(Some(key_schema(&def.key_schema)?))
            .set_attribute_definitions(Some(attribute_definitions(def)?));
        if let Some(view) = &def.stream_view_type {
            req = req.stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(StreamViewType::from(view.as_str()))
                    .build()?,
            );
        }
        for index in &def.indexes {
            req = req.global_secondary_indexes(
                GlobalSecondaryIndex::builder()
                    .index_name(&index.name)
                    .set_key_schema(Some(key_schema(&index.key_schema)?))
                    .projection(projection(&index.projection))
                    .build()?,
            );
        }
        match req.send().await {
            Ok(_) => tracing::info!(table = name, "created table"),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_in_use_exception()) => {}
            Err(e) => {
                return Err(sdk_error(format!("creating table {name}"), &e));
            }
        }
    }
    for _ in 0..120 {
        let out = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .map_err(|e| sdk_error(format!("describing {name}"), &e))?;
        let table = out.table();
        let indexes_active = table
            .map(|t| t.global_secondary_indexes())
            .unwrap_or_default()
            .iter()
            .all(|i| i.index_status().is_none_or(|s| *s == IndexStatus::Active));
        if table.and_then(|t| t.table_status()) == Some(&TableStatus::Active) && indexes_active {
            // A table kept from an older template (a DYNOXIDE_DB_FILE) gets
            // the indexes it lacks.
            let have: Vec<&str> = table
                .map(|t| t.global_secondary_indexes())
                .unwrap_or_default()
                .iter()
                .filter_map(|i| i.index_name())
                .collect();
            if let Some(index) = def
                .indexes
                .iter()
                .find(|i| !have.contains(&i.name.as_str()))
            {
                client
                    .update_table()
                    .table_name(name)
                    .set_attribute_definitions(Some(attribute_definitions(def)?))
                    .global_secondary_index_updates(
                        GlobalSecondaryIndexUpdate::builder()
                            .create(
                                CreateGlobalSecondaryIndexAction::builder()
                                    .index_name(&index.name)
                                    .set_key_schema(Some(key_schema(&index.key_schema)?))
                                    .projection(projection(&index.projection))
                                    .build()?,
                            )
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| sdk_error(format!("adding index {} to {name}", index.name), &e))?;
                tracing::info!(table = name, index = %index.name, "added index");
                continue;
            }
            // A table kept from an older template gets the stream it lacks.
            if let Some(view) = &def.stream_view_type
                && table
                    .and_then(|t| t.stream_specification())
                    .is_none_or(|s| !s.stream_enabled())
            {
                client
                    .update_table()
                    .table_name(name)
                    .stream_specification(
                        StreamSpecification::builder()
                            .stream_enabled(true)
                            .stream_view_type(StreamViewType::from(view.as_str()))
                            .build()?,
                    )
                    .send()
                    .await
                    .map_err(|e| sdk_error(format!("enabling the stream of {name}"), &e))?;
                tracing::info!(table = name, "enabled the stream");
                continue;
            }
            if let Some(attr) = &def.ttl_attribute {
                enable_ttl(client, name, attr).await?;
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(anyhow!(
        "table {name} did not become ACTIVE within a minute"
    ))
}

fn key_schema(keys: &[(String, String)]) -> Result<Vec<KeySchemaElement>> {
    keys.iter()
        .map(|(attr, kind)| {
            Ok(KeySchemaElement::builder()
                .attribute_name(attr)
                .key_type(KeyType::from(kind.as_str()))
                .build()?)
        })
        .collect()
}

fn attribute_definitions(def: &TableDef) -> Result<Vec<AttributeDefinition>> {
    def.attributes
        .iter()
        .map(|(attr, ty)| {
            Ok(AttributeDefinition::builder()
                .attribute_name(attr)
                .attribute_type(ScalarAttributeType::from(ty.as_str()))
                .build()?)
        })
        .collect()
}

fn projection(kind: &str) -> Projection {
    Projection::builder()
        .projection_type(ProjectionType::from(kind))
        .build()
}

/// Enables TTL on `attr` unless it already is.
async fn enable_ttl(client: &Client, name: &str, attr: &str) -> Result<()> {
    let current = client
        .describe_time_to_live()
        .table_name(name)
        .send()
        .await
        .map_err(|e| sdk_error(format!("describing TTL of {name}"), &e))?;
    let enabled = current.time_to_live_description().is_some_and(|d| {
        d.attribute_name() == Some(attr)
            && matches!(
                d.time_to_live_status(),
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
            )
    });
    if !enabled {
        let spec = TimeToLiveSpecification::builder()
            .attribute_name(attr)
            .enabled(true)
            .build()?;
        client
            .update_time_to_live()
            .table_name(name)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(|e| sdk_error(format!("enabling TTL on {name}"), &e))?;
    }
    Ok(())
}

/// An SDK error with its full context (code, message, source chain), for the
/// messages `make serve` prints when set-up fails.
fn sdk_error(what: String, e: &(dyn std::error::Error + 'static)) -> anyhow::Error {
    anyhow!(
        "{what}: {}",
        aws_sdk_dynamodb::error::DisplayErrorContext(e)
    )
}
