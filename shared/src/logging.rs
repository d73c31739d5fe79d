//! How every function logs: set up once per cold start by its `main`.
//!
//! As `lambda_runtime`'s default subscriber does, the level comes from
//! `AWS_LAMBDA_LOG_LEVEL` (the template's `LogLevel`), else `RUST_LOG`, else
//! INFO, and the lines are JSON when Lambda's advanced logging controls say
//! so (`AWS_LAMBDA_LOG_FORMAT=JSON`, which the template sets), text
//! otherwise. One difference, for what CloudWatch Logs charges per byte:
//! a JSON line names its innermost span once (`span`: the request's id and
//! route, or the invocation's) and its fields at the top level, instead of
//! repeating every enclosing span in a `spans` list on every line. That list
//! held the same request id, route and Lambda request id again: about half
//! of what a like logged (docs/deploying.md, "The whole bill").

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter::LevelFilter};

/// Installs the process's subscriber (see the module notes). A second
/// call leaves the first in place.
pub fn init() {
    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL").or_else(|_| std::env::var("RUST_LOG"));
    let level = level
        .ok()
        .and_then(|l| l.trim().parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::INFO);
    let filter = EnvFilter::builder()
        .with_default_directive(level.into())
        .from_env_lossy();
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = if json {
        registry.with(json_layer(std::io::stdout)).try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    .without_time()
                    .with_writer(std::io::stdout),
            )
            .try_init()
    };
}

/// The JSON lines the functions write, to `writer`: also what the local
/// stack's meter counts (`likes-local`'s `meter.rs`), so that the bill's
/// log bytes are the deployed format's.
pub fn json_layer<S, W>(writer: W) -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .json()
        .with_target(false)
        .without_time()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_writer(writer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    #[test]
    fn a_line_names_its_span_once_and_its_fields_at_the_top() {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(json_layer(lines.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("Lambda runtime invoke", requestId = "abc");
            let _o = outer.enter();
            let inner = tracing::error_span!("request", request_id = "r1", route = "like");
            let _i = inner.enter();
            tracing::info!(reel = "z", "write");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["message"], "write");
        assert_eq!(line["reel"], "z");
        assert_eq!(line["span"]["request_id"], "r1");
        assert!(line.get("spans").is_none(), "{text}");
        assert!(line.get("fields").is_none(), "{text}");
        assert_eq!(text.matches("r1").count(), 1, "{text}");
    }
}
