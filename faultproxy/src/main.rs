//! `fault-proxy`: the fault-injection proxy as a standalone process, for
//! pointing any DynamoDB client (or `make serve`) at a faulty DynamoDB, or
//! any Kinesis client at a faulty Kinesis (`--upstream` a Kinesis emulator,
//! `kinesis_*` classes in the spec).
//!
//! ```text
//! fault-proxy --upstream http://127.0.0.1:8000 --listen 127.0.0.1:8001 \
//!     --faults 'seed=7,all=0.1,write_cap=1000'
//! AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:8001 <client>
//! curl -s http://127.0.0.1:8001/__proxy/stats
//! ```
//!
//! On Ctrl-C it prints its statistics as JSON to stdout.

use anyhow::{Context, Result, bail};
use faultproxy::{Faults, Proxy};

const USAGE: &str = "usage: fault-proxy --upstream URL [--listen HOST:PORT] [--faults SPEC]
  SPEC: comma-separated name=value, e.g. 'seed=7,all=0.1,TransactWriteItems.lost=0.2,write_cap=1000'
  or, in front of Kinesis, 'seed=7,kinesis_throttle=0.05,kinesis_lost=0.02,kinesis_partial=0.1'
  (see docs/hostile-input.md, \"Fault injection\"; FAULTS in the environment works too)";

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut upstream = None;
    let mut listen = "127.0.0.1:8001".to_owned();
    let mut spec = std::env::var("FAULTS").unwrap_or_default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--upstream" => upstream = Some(value()?),
            "--listen" => listen = value()?,
            "--faults" => spec = value()?,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let Some(upstream) = upstream else {
        bail!("--upstream is required\n{USAGE}");
    };
    let faults = Faults::parse(&spec).map_err(|e| anyhow::anyhow!("--faults: {e}"))?;
    let proxy = Proxy::start(&listen, &upstream, faults).await?;
    eprintln!("fault-proxy on {} -> {upstream}", proxy.url);
    tokio::signal::ctrl_c().await?;
    println!("{}", serde_json::to_string_pretty(&proxy.stats())?);
    proxy.shutdown().await;
    Ok(())
}
