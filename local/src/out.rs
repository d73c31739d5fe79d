//! The CLI's standard output and standard error, which a reader that goes
//! away cannot fail.
//!
//! `likes-local reconcile | head -3` and `… | grep -q …` close the pipe while
//! the command may still be writing. Rust ignores `SIGPIPE`, so the next
//! write fails with `EPIPE` (`ErrorKind::BrokenPipe`), and `println!` panics
//! on it ("failed printing to stdout: Broken pipe", exit status 101), which
//! fails any `pipefail` script. Here a closed pipe is not an error:
//!
//! * what can no longer be written is dropped, silently, and nothing more is
//!   written to that stream;
//! * the command carries on and exits with its own status (0 on success,
//!   1 on a failure it reports); a closed stdout never changes the status.
//!   `serve` keeps serving until SIGINT or SIGTERM, then exits 0.
//!
//! The status therefore never depends on when the reader left (the race
//! that made `make test` flaky). Any other write error of stdout (a full
//! disk behind a redirection) is reported once, on stderr, when the command
//! ends ([`finish`]), and makes the status 1: the output is incomplete
//! without the reader having asked for that.
//!
//! Until [`cli`] is called (by `main`), output goes through `print!`, so
//! tests that call the library's commands (e.g. `demo::run`) keep it in the
//! test harness's capture.

use std::fmt;
use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static CLI: AtomicBool = AtomicBool::new(false);
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);
/// The first stdout error other than a closed pipe.
static FAILED: Mutex<Option<String>> = Mutex::new(None);

/// Routes [`print()`], [`line()`] and [`err_line`] to the process's real
/// streams with the handling above. Called once, by `main`.
pub fn cli() {
    CLI.store(true, Ordering::SeqCst);
}

/// Whether stdout's reader has gone (a write met a closed pipe).
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::SeqCst)
}

/// Writes `text` to stdout as it is, flushed, so that a line appears when it
/// is written.
pub fn print(text: &str) {
    if !CLI.load(Ordering::SeqCst) {
        print!("{text}");
        return;
    }
    if STDOUT_CLOSED.load(Ordering::SeqCst) {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        STDOUT_CLOSED.store(true, Ordering::SeqCst);
        if e.kind() != io::ErrorKind::BrokenPipe {
            let mut failed = FAILED.lock().unwrap_or_else(|p| p.into_inner());
            failed.get_or_insert_with(|| e.to_string());
        }
    }
}

/// Writes one line to stdout (see [`print()`]).
pub fn line(args: fmt::Arguments<'_>) {
    let mut text = args.to_string();
    text.push('\n');
    print(&text);
}

/// Writes one line to stderr; any error (a closed pipe included) drops it
/// and the lines after it. Progress and diagnostics only: never a result.
pub fn err_line(args: fmt::Arguments<'_>) {
    if !CLI.load(Ordering::SeqCst) {
        eprintln!("{args}");
        return;
    }
    if STDERR_CLOSED.load(Ordering::SeqCst) {
        return;
    }
    let mut text = args.to_string();
    text.push('\n');
    let mut err = io::stderr().lock();
    if err.write_all(text.as_bytes()).is_err() {
        STDERR_CLOSED.store(true, Ordering::SeqCst);
    }
}

/// The end of a command: an error if stdout failed for a reason other than
/// a closed pipe.
pub fn finish() -> anyhow::Result<()> {
    let failed = FAILED.lock().unwrap_or_else(|p| p.into_inner()).take();
    match failed {
        Some(e) => Err(anyhow::anyhow!("writing to stdout failed: {e}")),
        None => Ok(()),
    }
}

/// `println!` for the CLI: [`line()`] with format arguments.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(::std::format_args!($($arg)*))
    };
}

/// `eprintln!` for the CLI's progress lines: [`err_line`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::err_line(::std::format_args!($($arg)*))
    };
}
