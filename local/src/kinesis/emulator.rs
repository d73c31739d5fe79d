//! The Kinesis emulator of the local stack: kinesis-mock, the npm package
//! `kinesis-local` (a Scala.js bundle run by Node.js), pinned by
//! `local/kinesis/package-lock.json` and installed by
//! `scripts/kinesis-local.sh` into `target/kinesis-local` on first use.
//!
//! It runs as a child process from its package folder (it reads its TLS
//! certificate file from the working directory), on free ports of this
//! machine, in memory (persistence off), and ends with the stack:
//! killed when the handle is dropped or stopped, and, should the stack
//! die without cleaning up, when its stdin (a pipe from the stack) closes,
//! which a small wrapper around `main.js` watches. It answers about 3 s
//! after start (the bundle's start-up, measured on the CI-sized machine).

use super::event::REGION;
use anyhow::{Context, Result, anyhow, bail};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::types::{StreamMode, StreamModeDetails, StreamStatus};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long the emulator may take to answer (it takes about 3 s; a loaded
/// CI machine, several times that).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// `main.js`, run so that the emulator exits when the stack's end of its
/// stdin closes: a stack killed outright leaves no emulator behind.
const WRAPPER: &str = "process.stdin.on('end', () => process.exit(0)); \
                       process.stdin.on('error', () => process.exit(0)); \
                       process.stdin.resume(); require('./main.js');";

/// A running kinesis-mock.
pub struct KinesisEmulator {
    /// Its plain-HTTP endpoint, `http://127.0.0.1:<port>`.
    pub endpoint: String,
    child: Child,
}

/// The folder kinesis-mock is installed in: `LOCAL_KINESIS_DIR` if given,
/// else the one `scripts/kinesis-local.sh` installs (and prints), running
/// the script when it is not installed yet.
pub fn package_dir(lookup: impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    if let Some(dir) = lookup("LOCAL_KINESIS_DIR").filter(|d| !d.trim().is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let installed = root.join("target/kinesis-local/node_modules/kinesis-local");
    if installed.join("main.js").is_file() {
        return Ok(installed);
    }
    let script = root.join("scripts/kinesis-local.sh");
    let out = std::process::Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): the local Kinesis emulator needs Node.js 20+ and npm",
            script.display(),
            out.status
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Whether `node` runs here (tests skip without it).
pub fn node_available() -> bool {
    std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A free TCP port on 127.0.0.1 (free now: the emulator binds it a moment
/// later, so a start that loses the race is tried again).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// A Kinesis client for `endpoint`, with dummy credentials and the
/// emulator's region, and nothing from the environment (a developer's
/// AWS profile must not reach a local emulator, nor its endpoint settings
/// redirect the client).
pub fn kinesis_client(endpoint: &str) -> Client {
    let conf = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .credentials_provider(Credentials::new(
            "local",
            "local",
            None,
            None,
            "likes-local",
        ))
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(conf)
}

impl KinesisEmulator {
    /// Starts kinesis-mock from `dir` and returns once it answers.
    pub async fn start(dir: &Path) -> Result<KinesisEmulator> {
        if !dir.join("main.js").is_file() {
            bail!("{} holds no kinesis-mock (main.js)", dir.display());
        }
        let mut last = None;
        // A port taken between the probe and the emulator's bind: again.
        for _ in 0..3 {
            match Self::try_start(dir).await {
                Ok(e) => return Ok(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("kinesis-mock did not start")))
    }

    async fn try_start(dir: &Path) -> Result<KinesisEmulator> {
        let (plain, tls) = (free_port()?, free_port()?);
        let mut child = Command::new("node")
            .arg("-e")
            .arg(WRAPPER)
            .current_dir(dir)
            .env("KINESIS_MOCK_PLAIN_PORT", plain.to_string())
            .env("KINESIS_MOCK_TLS_PORT", tls.to_string())
            .env("SHOULD_PERSIST_DATA", "false")
            .env("LOAD_DATA_IF_EXISTS", "false")
            .env("LOG_LEVEL", "WARN")
            .env("ROOT_LOG_LEVEL", "ERROR")
            // Streams are made by the stack, after start, and waited for.
            .env_remove("INITIALIZE_STREAMS")
            .env("CREATE_STREAM_DURATION", "100ms")
            .env("SPLIT_SHARD_DURATION", "100ms")
            .env("MERGE_SHARDS_DURATION", "100ms")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context(
                "starting kinesis-mock (node): the local Kinesis emulator needs Node.js 20+",
            )?;
        // Its log goes to the stack's (at debug: RUST_LOG=debug shows it);
        // the last lines are kept for the error of a start that fails.
        let tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(forward(BufReader::new(out), tail.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(forward(BufReader::new(err), tail.clone()));
        }
        let endpoint = format!("http://127.0.0.1:{plain}");
        let client = kinesis_client(&endpoint);
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log: Vec<String> = tail
                    .lock()
                    .map(|t| t.iter().cloned().collect())
                    .unwrap_or_default();
                bail!(
                    "kinesis-mock exited at start ({status}):\n{}",
                    log.join("\n")
                );
            }
            let answer =
                tokio::time::timeout(Duration::from_secs(2), client.list_streams().send()).await;
            if matches!(answer, Ok(Ok(_))) {
                tracing::debug!(
                    endpoint,
                    ready_ms = started.elapsed().as_millis() as u64,
                    "kinesis-mock ready"
                );
                return Ok(KinesisEmulator { endpoint, child });
            }
            if started.elapsed() > READY_WITHIN {
                let _ = child.kill().await;
                bail!("kinesis-mock did not answer on {endpoint} within {READY_WITHIN:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the emulator and waits for it to exit.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Forwards a stream of the emulator's log lines to the stack's log.
async fn forward<R: tokio::io::AsyncRead + Unpin>(
    reader: BufReader<R>,
    tail: Arc<Mutex<VecDeque<String>>>,
) {
    let mut lines = reader.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(target: "kinesis_mock", "{line}");
        if let Ok(mut t) = tail.lock() {
            if t.len() >= 20 {
                t.pop_front();
            }
            t.push_back(line);
        }
    }
}

/// Creates `stream` with `shards` shards unless it exists, and waits until
/// it is `ACTIVE`. Locally every stream is provisioned: an on-demand
/// stream's shard count is AWS's business, and the local stack wants a
/// known one (`LOCAL_VIEWS_SHARDS`).
pub async fn create_stream(client: &Client, stream: &str, shards: u32) -> Result<()> {
    let made = client
        .create_stream()
        .stream_name(stream)
        .shard_count(shards as i32)
        .stream_mode_details(
            StreamModeDetails::builder()
                .stream_mode(StreamMode::Provisioned)
                .build()
                .context("StreamModeDetails")?,
        )
        .send()
        .await;
    if let Err(e) = made {
        let exists = e
            .as_service_error()
            .is_some_and(|s| s.is_resource_in_use_exception());
        if !exists {
            bail!(
                "creating the Kinesis stream {stream}: {}",
                aws_sdk_kinesis::error::DisplayErrorContext(&e)
            );
        }
    }
    let started = Instant::now();
    loop {
        let status = client
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .ok()
            .and_then(|d| d.stream_description_summary)
            .map(|s| s.stream_status);
        if status == Some(StreamStatus::Active) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the Kinesis stream {stream} is not ACTIVE after 30 s ({status:?})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
