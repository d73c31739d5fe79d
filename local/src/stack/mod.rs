//! The local stack: embedded dynoxide (or any endpoint), the tables from
//! `template.yaml`, and the gateway serving every route on one base URL.
//!
//! This file holds what a stack is and the order it starts in; the steps
//! that have a concern of their own live next to it:
//!
//! * `tables`: creating the tables the template defines;
//! * `sdk`: the SDK clients' credentials, region and endpoint
//!   ([`client_for`], [`streams_client_for`]);
//! * `schedule`: the scheduled functions, run on a local timer;
//! * `views`: the views stream: the Kinesis emulator, the stream, and the
//!   views function's event source;
//! * `banner`: what `serve`'s banner says about faults
//!   ([`Stack::fault_lines`]).

mod banner;
mod emulator;
mod schedule;
mod sdk;
mod tables;
mod views;

pub use banner::FaultSettings;
pub use sdk::{client_for, kinesis_client_for, streams_client_for};
pub use views::Views;

use crate::gateway::Gateway;
use crate::template::Template;
use anyhow::{Context, Result, anyhow};
use aws_sdk_dynamodb::Client;
use faultproxy::{Faults, Proxy};
use likes::App;
use likes::store::dynamodb::DynamoStore;
use likes::store::kinesis::KinesisLog;
use likes::{AuthMode, Config, Counting};
use schedule::{SCHEDULED_TIMEOUT, seconds, spawn_schedule};
use sdk::sdk_error;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tables::{ensure_table, existing_tables, table_name};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where DynamoDB lives.
#[derive(Clone, Debug)]
pub enum Dynamo {
    /// Start dynoxide in this process on `host:port` (port 0 = any free
    /// port), in memory or in a SQLite file.
    Embedded {
        /// The address to listen on.
        host: String,
        /// The port (0: any free one, as tests want).
        port: u16,
        /// The SQLite file that keeps the tables across runs; none: memory.
        file: Option<PathBuf>,
    },
    /// Use this endpoint (DynamoDB Local, LocalStack, AWS itself...).
    Endpoint(String),
}

/// What [`Stack::start`] starts, and where.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// The `template.yaml` the tables, routes and schedules come from.
    pub template: PathBuf,
    /// Where DynamoDB lives.
    pub dynamo: Dynamo,
    /// Host and port of the gateway (port 0 = any free port).
    pub host: String,
    /// See [`StackOptions::host`].
    pub port: u16,
    /// Configuration variables, looked up before the process environment.
    pub env: HashMap<String, String>,
    /// Whether the process environment is consulted at all (tests say no,
    /// so a developer's shell cannot change what they test).
    pub inherit_env: bool,
    /// Serve the playground page at `/` and its control routes under
    /// `/__local/` (`make serve`), with the fault proxy always between the
    /// functions and DynamoDB so that its faults can be set at run time.
    pub playground: bool,
    /// Start the views stream (the Kinesis emulator, a Node.js child
    /// process) unless `LOCAL_VIEWS` says otherwise: `make serve` does,
    /// the isolated test stacks do not.
    pub views: bool,
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
            playground: false,
            views: false,
        }
    }

    /// A configuration variable: [`StackOptions::env`] first, then the
    /// process environment if inherited.
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

/// The value of the variable `name`, trimmed, unless unset or empty.
fn given(opts: &StackOptions, name: &str) -> Option<String> {
    opts.lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A running stack. Dropping it does not stop it; call [`Stack::shutdown`].
pub struct Stack {
    /// The gateway's URL: every route of the template under one base.
    pub base_url: String,
    /// The URL of DynamoDB (the embedded emulator's, or the one given).
    pub dynamo_endpoint: String,
    /// The names of the template's tables, in its order.
    pub tables: Vec<String>,
    /// The configuration the functions run with.
    pub config: Config,
    /// The faults asked for at the start ([`Stack::fault_lines`] says
    /// which act where).
    pub faults: FaultSettings,
    /// An SDK client on the same endpoint, for tools and tests that look at
    /// the tables directly (never through the fault proxy).
    pub client: Client,
    /// The one function instance the gateway, the schedules and the event
    /// sources all invoke (locally, every function shares a cold start).
    /// With [`StackOptions::playground`], the page can restart the
    /// gateway's with another `CACHE_TTL_MS`; this stays the first one.
    pub app: Arc<App>,
    /// The fault-injection proxy between the functions and DynamoDB, when
    /// `FAULTS` asked for faults, or always with
    /// [`StackOptions::playground`] (passing everything through until
    /// asked).
    pub proxy: Option<Arc<Proxy>>,
    /// Stream mode: the aggregate function's event sources.
    pub streams: Vec<crate::streams::StreamSource>,
    /// A Streams API client on the emulator itself (never through the
    /// proxy), for tools and tests that look at the stream.
    pub streams_client: aws_sdk_dynamodbstreams::Client,
    /// The views stream, when started ([`StackOptions::views`]).
    pub views: Option<Views>,
    /// The fault proxy between the functions and Kinesis (with `FAULTS`
    /// and a views stream).
    pub kinesis_proxy: Option<Arc<Proxy>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Stack {
    /// Starts DynamoDB (unless given), makes the tables, and starts the
    /// gateway, the schedules and (stream mode) the event sources; returns
    /// once the tables are ACTIVE and every listener is bound.
    pub async fn start(opts: StackOptions) -> Result<Stack> {
        let template = Template::load(&opts.template)?;
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();

        let dynamo_endpoint = match &opts.dynamo {
            Dynamo::Endpoint(url) => url.clone(),
            Dynamo::Embedded { host, port, file } => {
                let (db, _) = emulator::open(file.as_deref())?;
                let listener = std::net::TcpListener::bind((host.as_str(), *port))
                    .with_context(|| format!("binding the DynamoDB port {port}"))?;
                let addr = listener.local_addr()?;
                tasks.push(emulator::serve(listener, db, stopped.clone())?);
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
        // Every local writer registers its reels from the first: the known
        // reels' backfill need not wait for older writers to stop.
        if lookup_opts.lookup("KNOWN_BACKFILL_DELAY_MS").is_none() {
            config.known_backfill_delay = Duration::ZERO;
        }

        let client = client_for(&config, &dynamo_endpoint, &lookup_opts).await;
        let existing = existing_tables(&client).await;
        let mut tables = Vec::new();
        for table in &template.tables {
            let name = table_name(&template, &lookup_opts, &table.logical_id);
            ensure_table(&client, &name, table, existing.as_ref()).await?;
            tables.push(name);
        }

        // With FAULTS set, the functions reach DynamoDB through the fault
        // proxy; the tables were made, and tests look at them, directly.
        let faults_spec = lookup_opts.lookup("FAULTS").unwrap_or_default();
        let faults = Faults::parse(&faults_spec).map_err(|e| anyhow!("FAULTS: {e}"))?;
        let asked = (!faults.is_passthrough()).then(|| faults_spec.trim().to_owned());
        // Its Kinesis classes act in a proxy of their own in front of the
        // views stream; its DynamoDB classes leave Kinesis alone.
        let kinesis_faults = faults.clone();
        let (proxy, app_client) = if faults.is_passthrough() && !opts.playground {
            (None, client.clone())
        } else {
            let proxy = Proxy::start(&format!("{}:0", opts.host), &dynamo_endpoint, faults).await?;
            let c = client_for(&config, &proxy.url, &lookup_opts).await;
            (Some(Arc::new(proxy)), c)
        };
        // Views: the table's reads always; the stream, where one runs, with
        // the fault proxy in front of it too under FAULTS.
        let views_config = likes::views::ViewsConfig::from_lookup(|k| lookup_opts.lookup(k))
            .map_err(|e| anyhow!("{e}"))?;
        let mut views = if views::enabled(&lookup_opts, opts.views)? {
            Some(views::start(&lookup_opts).await?)
        } else {
            None
        };
        let kinesis_proxy = match &views {
            Some(v) if !kinesis_faults.is_passthrough() => Some(Arc::new(
                Proxy::start(
                    &format!("{}:0", opts.host),
                    &v.kinesis_endpoint,
                    kinesis_faults,
                )
                .await?,
            )),
            _ => None,
        };
        let log = match &views {
            Some(v) => {
                let endpoint = kinesis_proxy
                    .as_ref()
                    .map_or(v.kinesis_endpoint.clone(), |p| p.url.clone());
                let client = kinesis_client_for(&config, &endpoint, &lookup_opts).await;
                Some(Arc::new(KinesisLog::new(client, v.def.stream.clone())))
            }
            None => None,
        };
        let app = Arc::new(
            App::new(
                config.clone(),
                DynamoStore::new(app_client.clone(), &config),
            )
            .with_views(views_config, log),
        );
        let apps = Arc::new(crate::apps::Apps::new(app.clone(), app_client));
        if let Some(v) = &mut views {
            let handler = views::views_handler(&app, v.def.timeout);
            v.spawn_source(
                handler,
                kinesis_proxy.as_ref().map(|p| p.url.clone()),
                stopped.clone(),
            );
        }
        let listener = TcpListener::bind((opts.host.as_str(), opts.port))
            .await
            .with_context(|| format!("binding {}:{}", opts.host, opts.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        let gateway = Arc::new(Gateway::new(
            apps.clone(),
            &template.routes,
            addr.to_string(),
        )?);
        let router = if opts.playground {
            crate::playground::router(crate::playground::Controls {
                apps: apps.clone(),
                proxy: proxy.clone(),
                counting: config.counting,
                counters_table: config.counters_table.clone(),
            })
        } else {
            axum::Router::new()
        };
        let router = router.fallback(move |req| {
            let g = gateway.clone();
            async move { g.serve(req).await }
        });
        let period = seconds(&lookup_opts, "LOCAL_SCHEDULE_SECS", Duration::from_secs(10))?;
        // Reconciliation is a daily job: locally it runs on its schedule only
        // when LOCAL_RECONCILE_SECS asks for it (`make reconcile` runs it by
        // hand).
        let reconcile_period = seconds(&lookup_opts, "LOCAL_RECONCILE_SECS", Duration::ZERO)?;
        // The cache warmer runs on `make serve` (each run lasts until its
        // deadline nears, as in Lambda), and in a test stack only when
        // LOCAL_WARM_SECS asks: its reads and writes would blur what the
        // other tests and the benchmarks count.
        let warm_default = if opts.playground { 60.0 } else { 0.0 };
        let warm_period = seconds(
            &lookup_opts,
            "LOCAL_WARM_SECS",
            Duration::from_secs_f64(warm_default),
        )?;
        for schedule in &template.schedules {
            let period = match schedule.code_uri.rsplit('/').next() {
                Some("reconcile") => reconcile_period,
                Some("warm") => warm_period,
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
            let settings = crate::streams::SourceSettings::from_lookup(|k| lookup_opts.lookup(k))?;
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
                // Virtual shards split the stream by the table's partition
                // key, as DynamoDB's partitions do.
                let partition_key = template
                    .tables
                    .iter()
                    .find(|t| t.logical_id == def.table)
                    .and_then(|t| t.key_schema.iter().find(|(_, kind)| kind == "HASH"))
                    .map(|(name, _)| name.clone())
                    .ok_or_else(|| anyhow!("{} has no HASH key in the template", def.table))?;
                let timeout = def
                    .timeout_secs
                    .map_or(SCHEDULED_TIMEOUT, |s| Duration::from_secs(s.into()));
                let (source, task) = crate::streams::spawn(
                    app.clone(),
                    streams_client.clone(),
                    def.clone(),
                    arn,
                    partition_key,
                    timeout,
                    settings.clone(),
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
        let faults = FaultSettings {
            proxy: asked,
            stream_source: given(&lookup_opts, "LOCAL_STREAM_FAULTS"),
            views_source: given(&lookup_opts, "LOCAL_VIEWS_FAULTS"),
        };
        Ok(Stack {
            base_url: format!("http://{addr}"),
            dynamo_endpoint,
            tables,
            config,
            faults,
            client,
            app,
            proxy,
            streams,
            streams_client,
            views,
            kinesis_proxy,
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

    /// Whether the views event source has handed every record now in the
    /// views stream to the function for good (true without one).
    pub async fn views_drained(&self) -> Result<bool> {
        match &self.views {
            Some(Views {
                source: Some(source),
                client,
                ..
            }) => source.drained(client).await,
            _ => Ok(true),
        }
    }

    /// Stops the gateway and the embedded emulator and waits for them.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Some(p) = &self.proxy {
            p.stop();
        }
        if let Some(p) = &self.kinesis_proxy {
            p.stop();
        }
        if let Some(v) = self.views {
            v.stop().await;
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}
