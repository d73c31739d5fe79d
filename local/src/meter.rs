//! What each function invocation of the local stack costs in Lambda's
//! terms: the time spent in its handler, the records its event carried,
//! and the bytes it logged, per function. Off (one atomic load per
//! invocation) unless a bench switches it on ([`enable`]); the `costs`
//! variant reads it per cell, for the bill (issue 38).
//!
//! The log bytes are counted by a `tracing` layer ([`layer`], installed by
//! `likes-local`'s `main` beside its own) that formats every event of an
//! invocation as the functions' subscriber does on Lambda
//! (`likes::logging`'s layer with `LogFormat: JSON`, the level the
//! template sets) and counts what it would write. Which invocation an event belongs to is a task-local
//! set around the handler's future, so the stack's own lines (the
//! gateway, the event sources, the emulator) are never counted. Each
//! invocation also runs inside the span `lambda_runtime` opens around it
//! on Lambda ("Lambda runtime invoke", with a request id and an X-Ray
//! trace id, active tracing being on), since the JSON format names the
//! innermost span on every line. The EMF metric records are not `tracing` events:
//! the `costs` variant counts them from the metrics' memory sink.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tracing::Instrument;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::dynamic_filter_fn;
use tracing_subscriber::fmt::MakeWriter;

/// What one function's invocations cost since the last [`reset`].
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct FunctionStats {
    /// Invocations.
    pub invocations: u64,
    /// Seconds in the handler, summed.
    pub seconds: f64,
    /// Milliseconds Lambda would bill: each invocation rounded up to the
    /// next millisecond, summed.
    pub billed_ms: f64,
    /// Records the invocations' events carried (stream batches; 0 for
    /// requests).
    pub records: u64,
    /// Bytes of those records' data and partition keys (Kinesis only).
    pub record_bytes: u64,
    /// Bytes the handlers logged through `tracing`, newlines included.
    pub log_bytes: u64,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Set once [`layer`] is built: without it log bytes are not measured.
static LAYER: AtomicBool = AtomicBool::new(false);
/// The most verbose level counted: 0 error … 4 trace (INFO by default).
static LEVEL: AtomicUsize = AtomicUsize::new(2);
static STATS: Mutex<BTreeMap<&'static str, FunctionStats>> = Mutex::new(BTreeMap::new());
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

tokio::task_local! {
    /// The log bytes of the invocation the current task runs.
    static INVOCATION: Arc<AtomicU64>;
}

/// Switches the meter on (or off), counting log lines up to `level`
/// (`ERROR`, `WARN`, `INFO`, `DEBUG` or `TRACE`, as the template's
/// `LogLevel` names it).
pub fn enable(on: bool, level: &str) {
    let rank = match level.to_ascii_uppercase().as_str() {
        "ERROR" => 0,
        "WARN" => 1,
        "DEBUG" => 3,
        "TRACE" => 4,
        _ => 2,
    };
    LEVEL.store(rank, Ordering::Relaxed);
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether log bytes are measured in this process (the layer installed).
pub fn counts_logs() -> bool {
    LAYER.load(Ordering::Relaxed)
}

/// Forgets everything counted so far.
pub fn reset() {
    lock().clear();
}

/// Every function's figures since the last [`reset`], by function name.
pub fn snapshot() -> BTreeMap<String, FunctionStats> {
    lock().iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<&'static str, FunctionStats>> {
    STATS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `handler`, one invocation of `function` whose event carried
/// `records` records of `record_bytes` bytes, and counts it if the meter
/// is on.
pub async fn invoke<F: Future>(
    function: &'static str,
    records: u64,
    record_bytes: u64,
    handler: F,
) -> F::Output {
    if !ENABLED.load(Ordering::Relaxed) {
        return handler.await;
    }
    let bytes = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let out = INVOCATION
        .scope(bytes.clone(), async move {
            let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
            // The shapes of Lambda's ids, for the lengths of the lines.
            let span = tracing::info_span!(
                "Lambda runtime invoke",
                requestId = %format!("{:08x}-0000-4000-8000-{n:012x}", n as u32),
                xrayTraceId = %format!("Root=1-00000000-{n:024x};Parent={n:016x};Sampled=0;Lineage=1:00000000:0"),
            );
            handler.instrument(span).await
        })
        .await;
    let elapsed = started.elapsed();
    let mut all = lock();
    let s = all.entry(function).or_default();
    s.invocations += 1;
    s.seconds += elapsed.as_secs_f64();
    s.billed_ms += billed_ms(elapsed.as_secs_f64() * 1000.0);
    s.records += records;
    s.record_bytes += record_bytes;
    s.log_bytes += bytes.load(Ordering::Relaxed);
    out
}

/// Lambda's billed duration of an invocation of `ms`: rounded up to the
/// next whole millisecond, and at least 1.
pub fn billed_ms(ms: f64) -> f64 {
    ms.ceil().max(1.0)
}

/// The layer that counts the bytes of every event of an invocation, as
/// the functions' JSON subscriber would write them (see the module's
/// comment); nothing outside an invocation, nothing while the meter is
/// off.
pub fn layer<S>() -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    LAYER.store(true, Ordering::Relaxed);
    // A dynamic filter, asked at every line: a `filter_fn` is taken as
    // cacheable per callsite, so a line first met with the meter off (the
    // bench's other variants run first) was never counted again.
    likes::logging::json_layer(Counter).with_filter(dynamic_filter_fn(|meta, _| {
        ENABLED.load(Ordering::Relaxed)
            && INVOCATION.try_with(|_| ()).is_ok()
            && rank(meta.level()) <= LEVEL.load(Ordering::Relaxed)
    }))
}

fn rank(level: &tracing::Level) -> usize {
    match *level {
        tracing::Level::ERROR => 0,
        tracing::Level::WARN => 1,
        tracing::Level::INFO => 2,
        tracing::Level::DEBUG => 3,
        tracing::Level::TRACE => 4,
    }
}

/// Writes nowhere; adds what it is given to the current invocation.
struct Counter;

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = INVOCATION.try_with(|b| b.fetch_add(buf.len() as u64, Ordering::Relaxed));
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Counter {
    type Writer = Counter;
    fn make_writer(&'a self) -> Counter {
        Counter
    }
}

/// The records of a stream event (Lambda's `Records`) and the bytes of
/// their Kinesis data and partition keys (0 for DynamoDB records).
pub fn records_of(event: &serde_json::Value) -> (u64, u64) {
    use base64::Engine;
    let Some(records) = event.get("Records").and_then(|r| r.as_array()) else {
        return (0, 0);
    };
    let bytes = records
        .iter()
        .filter_map(|r| r.get("kinesis"))
        .map(|k| {
            let data = k.get("data").and_then(|d| d.as_str()).unwrap_or_default();
            let key = k.get("partitionKey").and_then(|p| p.as_str());
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_or(0, |d| d.len())
                + key.map_or(0, str::len)
        })
        .sum::<usize>();
    (records.len() as u64, bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn billing_rounds_each_invocation_up_to_a_whole_millisecond() {
        assert_eq!(billed_ms(0.2), 1.0);
        assert_eq!(billed_ms(1.0), 1.0);
        assert_eq!(billed_ms(1.0001), 2.0);
        assert_eq!(billed_ms(0.0), 1.0);
    }

    async fn log_two_lines() {
        tracing::info!(reel = "z", "request");
        tracing::debug!("not at INFO");
    }

    #[test]
    fn an_invocation_counts_the_bytes_of_its_lines_at_the_level() {
        use tracing_subscriber::Layer;
        use tracing_subscriber::layer::SubscriberExt;
        // Beside likes-local's own lines, turned off as the benchmarks
        // turn them off (RUST_LOG=off).
        let lines = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(tracing_subscriber::EnvFilter::new("off"));
        let subscriber = tracing_subscriber::registry().with(lines).with(layer());
        tracing::subscriber::with_default(subscriber, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            // The lines are met first with the meter off, as the bench's
            // other variants meet them before the costs variant turns it
            // on: what the meter decides then must not stick.
            enable(false, "INFO");
            rt.block_on(log_two_lines());
            enable(true, "INFO");
            rt.block_on(invoke("meter-test", 0, 0, log_two_lines()));
            enable(false, "INFO");
        });
        let s = snapshot()["meter-test"];
        assert_eq!(s.invocations, 1);
        // One JSON line: the message, its field, the level and the span.
        assert!(
            (100..400).contains(&s.log_bytes),
            "{} bytes counted",
            s.log_bytes
        );
    }

    #[test]
    fn kinesis_records_count_their_data_and_key() {
        let e = serde_json::json!({"Records": [
            {"kinesis": {"data": "aGVsbG8=", "partitionKey": "pk"}},
            {"kinesis": {"data": "", "partitionKey": "abc"}},
        ]});
        assert_eq!(records_of(&e), (2, 5 + 2 + 3));
        assert_eq!(records_of(&serde_json::json!({"Records": [{}]})), (1, 0));
        assert_eq!(records_of(&serde_json::json!({})), (0, 0));
    }
}
