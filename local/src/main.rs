//! `likes-local`: the local stack (`serve`, the default), the viral-burst
//! demo (`demo`), one reconciliation pass (`reconcile`), the shard-sizing
//! planner (`plan`) and the benchmark (`bench`). Configuration is by
//! environment variable; see `docs/local.md` and `docs/operations.md`.
//!
//! A closed stdout (`likes-local reconcile | head -3`) is not an error:
//! output that cannot be written is dropped and the command finishes with
//! its own exit status (see `likes_local::out`).

use anyhow::{Context, Result, bail};
use likes_local::demo::{self, DemoOptions};
use likes_local::stack::client_for;
use likes_local::template::Template;
use likes_local::{Dynamo, Stack, StackOptions, out, outln};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a valid number")),
    }
}

const USAGE: &str = "\
usage: likes-local [serve|demo|reconcile|plan|bench [ratio]]

see docs/local.md and docs/operations.md for the environment variables; likes-local plan --help for the
shard-sizing planner.

A closed standard output (`likes-local reconcile | head`) is not an error:
what cannot be written is dropped, the command finishes, and its exit status
is its own: 0 on success, 1 on a failure (reported on stderr). serve keeps
serving until SIGINT or SIGTERM. Any other error writing stdout makes the
status 1.";

#[tokio::main]
async fn main() -> Result<()> {
    out::cli();
    // Log lines go to stderr. A write error there (a closed pipe, as in
    // `likes-local reconcile 2>&1 | head`) drops the line: tracing-subscriber
    // reports its own write errors only with `log_internal_errors`, with an
    // `eprintln!` that would panic on the same closed pipe.
    use tracing_subscriber::prelude::*;
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file (`make serve 2>log`, the
        // scripts' serve.log) reads and greps as plain text.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .log_internal_errors(false)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,aws_config=warn,aws_smithy_runtime=warn".into()),
        );
    // Beside the lines on stderr, and whatever RUST_LOG says: the bytes
    // the functions would log on Lambda, which the bench's bill counts
    // (off unless a bench switches it on; likes_local::meter).
    tracing_subscriber::registry()
        .with(lines)
        .with(likes_local::meter::layer())
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None | Some("serve") => serve().await,
        Some("demo") => demo().await,
        Some("reconcile") => reconcile().await,
        Some("plan") => likes_local::plan::run_cli(&args[1..])
            .map(|text| out::print(&text))
            .map_err(Into::into),
        Some("bench") => match args.get(1).map(String::as_str) {
            None => bench().await,
            Some("ratio") => bench_ratio().await,
            Some(other) => Err(anyhow::anyhow!(
                "unknown benchmark {other:?}; expected `bench` or `bench ratio`"
            )),
        },
        Some("-h" | "--help" | "help") => {
            outln!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!(
            "unknown command {other:?}; expected serve, demo, reconcile, plan or bench"
        )),
    };
    // A command's own failure first; else one of writing its output.
    result.and_then(|()| out::finish())
}

/// The like endpoint against the bare SDK call under it (`bench ratio`).
async fn bench_ratio() -> Result<()> {
    let opts = likes_local::bench::ratio::RatioOptions::from_env(PathBuf::from(env_or(
        "TEMPLATE",
        "template.yaml",
    )))?;
    out::print(&likes_local::bench::ratio::run(opts).await?);
    Ok(())
}

async fn bench() -> Result<()> {
    let opts = likes_local::bench::BenchOptions::from_env(PathBuf::from(env_or(
        "TEMPLATE",
        "template.yaml",
    )))?;
    out::print(&likes_local::bench::run(opts).await?);
    Ok(())
}

async fn serve() -> Result<()> {
    let template = PathBuf::from(env_or("TEMPLATE", "template.yaml"));
    let dynamo = match std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(url) => Dynamo::Endpoint(url),
        None => Dynamo::Embedded {
            host: env_or("DYNAMODB_HOST", "127.0.0.1"),
            port: env_num("DYNAMODB_PORT", 8000u16)?,
            file: std::env::var("DYNOXIDE_DB_FILE")
                .ok()
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        },
    };
    let embedded = matches!(dynamo, Dynamo::Embedded { .. });
    let opts = StackOptions {
        template,
        dynamo,
        host: env_or("HOST", "127.0.0.1"),
        port: env_num("PORT", 3000u16)?,
        env: Default::default(),
        inherit_env: true,
        playground: true,
        views: true,
    };
    let stack = Stack::start(opts)
        .await
        .context("starting the local stack")?;
    outln!("likes local stack");
    outln!(
        "  API:      {}  (try: curl -X PUT -H 'x-user-id: u1' {}/reels/r1/like)",
        stack.base_url,
        stack.base_url
    );
    outln!(
        "  DynamoDB: {} ({})",
        stack.dynamo_endpoint,
        if embedded {
            "embedded dynoxide"
        } else {
            "AWS_ENDPOINT_URL_DYNAMODB"
        }
    );
    outln!("  tables:   {}", stack.tables.join(", "));
    // The first line labelled, the others under it.
    for (i, line) in stack.fault_lines().iter().enumerate() {
        let label = if i == 0 {
            "  faults:   "
        } else {
            "            "
        };
        outln!("{label}{line}");
    }
    outln!(
        "  playground: {}/  (a heart, a viral burst, resize, lose a shard, drop the cache; docs/local.md)",
        stack.base_url
    );
    outln!(
        "  counting: {}",
        match stack.config.counting {
            likes::Counting::Transactional =>
                "transactional (COUNTING=stream: aggregated from the stream)",
            likes::Counting::Stream =>
                "stream (the aggregate function reads the Likes table's stream; counts follow within about a second)",
        }
    );
    if let Some(v) = &stack.views {
        outln!(
            "  views:    Kinesis stream {} ({} shards) on {} (kinesis-mock; LOCAL_VIEWS=off: none); docs/local.md",
            v.def.stream,
            v.shards,
            v.kinesis_endpoint
        );
    }
    outln!("  auth:     dev (x-user-id header accepted; admin routes open)");
    outln!(
        "  resize:   curl -X POST -d '{{\"shards\": 20}}' {}/admin/reels/r1/shards  (completed by the schedule)",
        stack.base_url
    );
    outln!(
        "  schedule: reshard run every {} s (LOCAL_SCHEDULE_SECS; 0 = off)",
        std::env::var("LOCAL_SCHEDULE_SECS")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "10".into())
    );
    outln!("ready: {}/healthz", stack.base_url);
    shutdown_signal().await;
    outln!("stopping");
    if let Some(p) = &stack.proxy {
        outln!(
            "fault proxy: {}",
            serde_json::to_string_pretty(&p.stats()).unwrap_or_default()
        );
    }
    stack.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn demo() -> Result<()> {
    let template = Template::load(&PathBuf::from(env_or("TEMPLATE", "template.yaml")))?;
    let port: u16 = env_num("PORT", 3000u16)?;
    let base_url = env_or("BASE_URL", &format!("http://127.0.0.1:{port}"));
    let endpoint = env_or(
        "AWS_ENDPOINT_URL_DYNAMODB",
        &format!("http://127.0.0.1:{}", env_num("DYNAMODB_PORT", 8000u16)?),
    );
    let counters = demo::counters_table(&template);
    let mut opts = StackOptions::isolated(PathBuf::new());
    opts.inherit_env = true;
    if std::env::var("AWS_ENDPOINT_URL_DYNAMODB").is_ok_and(|v| !v.is_empty()) {
        opts.dynamo = Dynamo::Endpoint(endpoint.clone());
    }
    let config = likes::Config::from_lookup(|k| match k {
        "COUNTERS_TABLE" => Some(counters.clone()),
        "LIKES_TABLE" => Some("unused".into()),
        other => std::env::var(other).ok(),
    })?;
    let client = client_for(&config, &endpoint, &opts).await;
    let demo_opts = DemoOptions {
        base_url,
        users: env_num("DEMO_USERS", 3000usize)?,
        shards: env_num("DEMO_SHARDS", 20u32)?.clamp(1, 1000),
        concurrency: env_num("DEMO_CONCURRENCY", 64usize)?,
        cache_ttl: Duration::from_millis(env_num("CACHE_TTL_MS", 2000u64)?),
    };
    demo::run(&demo_opts, &client, &counters).await.map(|_| ())
}

/// One full reconciliation pass against the tables `make serve` uses (or
/// `AWS_ENDPOINT_URL_DYNAMODB`'s), printing the JSON summary. `DRY_RUN=1`
/// only reports.
async fn reconcile() -> Result<()> {
    let template = Template::load(&PathBuf::from(env_or("TEMPLATE", "template.yaml")))?;
    let endpoint = env_or(
        "AWS_ENDPOINT_URL_DYNAMODB",
        &format!(
            "http://{}:{}",
            env_or("DYNAMODB_HOST", "127.0.0.1"),
            env_num("DYNAMODB_PORT", 8000u16)?
        ),
    );
    let table = |var: &str| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| template.table_env.get(var).cloned())
            .unwrap_or_default()
    };
    let (counters, likes_table) = (table("COUNTERS_TABLE"), table("LIKES_TABLE"));
    let config = likes::Config::from_lookup(|k| match k {
        "COUNTERS_TABLE" => Some(counters.clone()),
        "LIKES_TABLE" => Some(likes_table.clone()),
        other => std::env::var(other).ok(),
    })?;
    let mut opts = StackOptions::isolated(PathBuf::new());
    opts.inherit_env = true;
    if std::env::var("AWS_ENDPOINT_URL_DYNAMODB").is_ok_and(|v| !v.is_empty()) {
        opts.dynamo = Dynamo::Endpoint(endpoint.clone());
    }
    let client = client_for(&config, &endpoint, &opts).await;
    let reconciler = likes::reconcile::Reconciler::new(
        likes::store::dynamodb::DynamoStore::new(client, &config),
        &config,
    );
    let dry_run = matches!(
        std::env::var("DRY_RUN").ok().as_deref().map(str::trim),
        Some("1" | "true" | "yes")
    );
    let run_opts = likes::reconcile::Options {
        dry_run,
        ..Default::default()
    };
    // No deadline: one invocation finishes the run (or the one in progress).
    let summary = reconciler
        .run(&run_opts)
        .await
        .map_err(|e| anyhow::anyhow!("reconcile failed: {e} ({})", e.code()))?;
    outln!("{}", serde_json::to_string_pretty(&summary)?);
    if summary.invocation == "busy" {
        bail!("another reconciliation run holds the lease; try again later");
    }
    Ok(())
}
