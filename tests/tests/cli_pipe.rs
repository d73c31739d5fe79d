//! Every `likes-local` command ends cleanly when the reader of its stdout
//! goes away (`likes-local reconcile | head`, `… | grep -q …`): no panic,
//! and the exit status the command has with a reader that reads it all (0
//! here). Each command runs as the real binary with stdout a pipe whose
//! reader closes at once (so the first write meets a closed pipe, every
//! time) or after the first line; `2>&1 | head` is covered by closing stderr
//! too. An unknown command still exits 1.
//!
//! The binary is built by this test with the cargo that runs it, into the
//! same target directory (`CARGO_BIN_EXE_*` exists only for tests of the
//! binary's own package), or taken from `LIKES_LOCAL_BIN`.
#![cfg(unix)]

mod common;

use common::{TestStack, repo_root};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `likes-local` binary, built once per test process.
fn binary() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("LIKES_LOCAL_BIN").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        // target/<profile>/deps/cli_pipe-<hash>
        let exe = std::env::current_exe().expect("test executable");
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("target/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target/");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo_root())
            .args([
                "build",
                "--quiet",
                "-p",
                "likes-local",
                "--bin",
                "likes-local",
            ])
            .arg("--target-dir")
            .arg(target_dir);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(other) => {
                cmd.args(["--profile", other]);
            }
            None => panic!("unexpected test path {}", exe.display()),
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building likes-local: {status}");
        profile_dir.join(format!("likes-local{}", std::env::consts::EXE_SUFFIX))
    })
}

/// When the reader of the command's stdout goes away.
#[derive(Clone, Copy, Debug)]
enum Reader {
    /// Before the command writes anything.
    ClosesAtOnce,
    /// After the first line.
    ReadsOneLine,
    /// Stdout and stderr are one pipe (`2>&1 | head`), closed at once.
    BothClosedAtOnce,
}

/// A command of the binary with a clean configuration: only what `env`
/// says, on top of the environment minus anything that configures the
/// product.
fn command(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.current_dir(repo_root()).args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("BENCH_")
            || k.starts_with("DEMO_")
            || k.starts_with("AWS_ENDPOINT_URL")
            || [
                "FAULTS",
                "DRY_RUN",
                "BASE_URL",
                "PORT",
                "DYNAMODB_PORT",
                "COUNTERS_TABLE",
                "LIKES_TABLE",
            ]
            .contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("TEMPLATE", repo_root().join("template.yaml"))
        .env("RUST_LOG", "info")
        .env("RUST_BACKTRACE", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

struct Outcome {
    status: ExitStatus,
    stderr: String,
}

/// Runs `cmd` with its stdout read by `reader`; `stop` is called once the
/// reader has gone (e.g. to send SIGTERM to a server). Waits at most
/// `limit`.
fn run(mut cmd: Command, reader: Reader, limit: Duration, stop: impl FnOnce(&Child)) -> Outcome {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let (pipe_r, pipe_w) = std::io::pipe().expect("pipe");
    match reader {
        Reader::BothClosedAtOnce => {
            cmd.stderr(pipe_w.try_clone().expect("dup"));
            cmd.stdout(pipe_w);
        }
        _ => {
            cmd.stderr(pipe_w);
        }
    }
    let mut child = cmd.spawn().expect("likes-local starts");
    // The parent's copies of the write end are gone with `cmd`.
    drop(cmd);
    let mut stderr_reader = Some(pipe_r);
    if let Reader::BothClosedAtOnce = reader {
        drop(stderr_reader.take());
    }
    // Drained from the start, so a full stderr pipe never blocks the child.
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = stderr_reader {
            let _ = r.read_to_string(&mut s);
        }
        s
    });
    match reader {
        Reader::ClosesAtOnce | Reader::BothClosedAtOnce => drop(child.stdout.take()),
        Reader::ReadsOneLine => {
            let mut out = BufReader::new(child.stdout.take().expect("stdout"));
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            drop(out);
        }
    }
    stop(&child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("likes-local did not end within {limit:?} ({reader:?})");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        status,
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn assert_clean(what: &str, reader: Reader, o: &Outcome) {
    assert!(
        !o.stderr.contains("panicked"),
        "{what} ({reader:?}) panicked: {}",
        o.stderr
    );
    assert!(
        o.status.success(),
        "{what} ({reader:?}) ended with {}: {}",
        o.status,
        o.stderr
    );
}

const READERS: [Reader; 3] = [
    Reader::ClosesAtOnce,
    Reader::ReadsOneLine,
    Reader::BothClosedAtOnce,
];

#[test]
fn help_and_plan_end_quietly_when_stdout_closes() {
    for args in [
        &["--help"][..],
        &["plan"],
        &["plan", "--json"],
        &["plan", "--help"],
        &[
            "plan",
            "--peak",
            "18000",
            "--shards",
            "20",
            "--seconds",
            "200",
        ],
    ] {
        for reader in READERS {
            let o = run(command(args, &[]), reader, Duration::from_secs(120), |_| {});
            assert_clean(&args.join(" "), reader, &o);
        }
    }
}

#[test]
fn a_closed_stdout_does_not_change_a_failures_status() {
    // An unknown command fails with 1 whatever the reader does: the status
    // is the command's own, never the pipe's.
    for reader in READERS {
        let o = run(
            command(&["no-such-command"], &[]),
            reader,
            Duration::from_secs(60),
            |_| {},
        );
        assert_eq!(o.status.code(), Some(1), "{reader:?}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_and_demo_end_quietly_when_stdout_closes() {
    let t = TestStack::uncached().await;
    let stack_env = |extra: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("AWS_ENDPOINT_URL_DYNAMODB", t.stack.dynamo_endpoint.clone()),
            ("COUNTERS_TABLE", t.stack.config.counters_table.clone()),
            ("LIKES_TABLE", t.stack.config.likes_table.clone()),
            ("BASE_URL", t.stack.base_url.clone()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        env
    };
    for reader in READERS {
        let env = stack_env(&[
            ("DEMO_USERS", "40"),
            ("DEMO_SHARDS", "4"),
            ("CACHE_TTL_MS", "0"),
        ]);
        let cmd = command(&["demo"], &env);
        let o =
            tokio::task::spawn_blocking(move || run(cmd, reader, Duration::from_secs(120), |_| {}))
                .await
                .unwrap();
        assert_clean("demo", reader, &o);
        for dry in ["0", "1"] {
            let cmd = command(&["reconcile"], &stack_env(&[("DRY_RUN", dry)]));
            let o = tokio::task::spawn_blocking(move || {
                run(cmd, reader, Duration::from_secs(120), |_| {})
            })
            .await
            .unwrap();
            assert_clean(&format!("reconcile DRY_RUN={dry}"), reader, &o);
        }
    }
    t.stop().await;
}

#[test]
fn bench_ends_quietly_when_stdout_closes() {
    let out =
        std::env::temp_dir().join(format!("likes-cli-pipe-bench-{}.json", std::process::id()));
    for reader in READERS {
        let env = [
            ("BENCH_VARIANTS", "naive".to_owned()),
            ("BENCH_SECONDS", "1".to_owned()),
            ("BENCH_RUNS", "1".to_owned()),
            ("BENCH_RATE", "20".to_owned()),
            ("BENCH_BACKGROUND_RATE", "5".to_owned()),
            ("BENCH_READ_RATE", "5".to_owned()),
            ("BENCH_OUT", out.display().to_string()),
        ];
        let o = run(
            command(&["bench"], &env),
            reader,
            Duration::from_secs(300),
            |_| {},
        );
        assert_clean("bench", reader, &o);
    }
    let _ = std::fs::remove_file(out);
}

/// A port that was free a moment ago (serve prints its URL on stdout, which
/// these readers do not read, so the test picks the port).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn serve_keeps_serving_and_stops_cleanly_when_stdout_closes() {
    for reader in READERS {
        let port = free_port();
        let env = [
            ("PORT", port.to_string()),
            ("DYNAMODB_PORT", "0".to_owned()),
            ("LOCAL_SCHEDULE_SECS", "0".to_owned()),
        ];
        let o = run(
            command(&["serve"], &env),
            reader,
            Duration::from_secs(120),
            |child| {
                // Serving although nobody reads its output: /healthz answers.
                let started = Instant::now();
                loop {
                    if healthz(port) {
                        break;
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "serve never answered /healthz ({reader:?})"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                // Then SIGTERM: it prints "stopping" to the closed pipe.
                let status = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status()
                    .expect("kill runs");
                assert!(status.success());
            },
        );
        assert_clean("serve", reader, &o);
    }
}

/// `GET /healthz` answers 200 (a bare HTTP/1.1 request; no client needed).
fn healthz(port: u16) -> bool {
    use std::io::Write;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}
