//! Views and unique viewers: every view counted through a log (a Kinesis
//! stream), unique viewers estimated by HyperLogLog, all time and per UTC
//! day.
//!
//! A viral reel takes ten to a hundred times more views than likes, and a
//! view has no row to be the truth of it: so a view is never a DynamoDB
//! write of its own. `POST /views` appends the viewer's batch to the log as
//! one record ([`accept`]); the views aggregator applies the log's records
//! to per-writer view items in micro-batches, exactly once by the same core
//! as stream mode's ([`aggregate`]); readers sum the items and merge the
//! sketches ([`read`]).
//!
//! # What is guaranteed
//!
//! A `202` means the batch is durably in the log, and every record in the
//! log is applied once: a redelivery, a reordering, a producer's retry of a
//! lost answer and a client's retry with its `Idempotency-Key` (within
//! [`ViewsConfig::dedup_window`]) change nothing twice. There is no truth
//! table to recount from, so a record not applied while it is in the log
//! is lost: a batch that exhausts its retries goes to the OnFailure queue
//! (an alarm), whose messages say which records (shard, sequence range)
//! were given up, and records expire unread if the aggregator is stopped
//! past the stream's retention. Handing a given-up range to the aggregator
//! again counts nothing (the checkpoint has passed it): the `aggregate-views`
//! function invoked with the OnFailure message counts what of the range
//! was not counted, once ([`repair`]), while the log still holds it.
//!
//! A record written by a newer view function than the aggregator (the two
//! are deployed in no set order) is not passed over: the batch is handed
//! back from it until an aggregator that reads its format counts it
//! (`ViewRecordsNewerFormat` meanwhile; [`record::FORMAT`] says which
//! records are skipped instead, and why).
//!
//! # Layout
//!
//! * `accept`: the request body's checks, event ids, the producer's put
//!   with its bounded retries.
//! * `record`: the log record's format and Lambda's Kinesis event, ordered.
//! * `aggregate`: the consumer: its plans, the records it cannot read.
//! * `seen`: the event ids applied, as an aggregator instance knows them.
//! * `throttle`: throttled reads of the aggregator and of repairs, retried
//!   within bounds and the invocation's deadline.
//! * `lineage`: the shards a shard's copies may have come through (its
//!   ancestors, a few generations back).
//! * `window`: what a batch's cut knows of its viewers (those whose minute
//!   is spent take no item).
//! * `repair`: a range Lambda gave up on, counted once.
//! * `compact`: the items of writers that will never write again, folded
//!   into a reel's base items, so a read stays bounded.
//! * `given_up`: the OnFailure invocation record that names such a range.
//! * `chunk`: records cut into parts and chunks.
//! * `limits`: what one viewer may make the view function put.
//! * `bound`: what one viewer's records may count within a minute, however
//!   many instances put them.
//! * `sketch`: the HLL sketches and why `lg_k = 12`.
//! * `read`: the sums, cached.

pub mod accept;
#[cfg(feature = "dynamodb")]
pub mod aggregate;
#[cfg(feature = "dynamodb")]
pub mod bound;
#[cfg(feature = "dynamodb")]
pub mod chunk;
#[cfg(feature = "dynamodb")]
pub mod compact;
#[cfg(feature = "dynamodb")]
mod given_up;
pub mod limits;
#[cfg(feature = "dynamodb")]
mod lineage;
#[cfg(feature = "dynamodb")]
pub mod read;
pub mod record;
#[cfg(feature = "dynamodb")]
pub mod repair;
#[cfg(feature = "dynamodb")]
mod seen;
pub mod sketch;
#[cfg(feature = "dynamodb")]
pub mod throttle;
#[cfg(feature = "dynamodb")]
mod window;

use std::sync::Arc;
use std::time::Duration;

/// The clock views count days by (Unix ms): the system's, or a test's.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(crate::clock::now_ms)
}

/// The views configuration, read from the environment apart from
/// [`crate::Config`] (which views need nothing of but the SDK and cache
/// settings).
#[derive(Clone)]
pub struct ViewsConfig {
    /// `VIEWS_TABLE`: the table of view items, checkpoints and seen ids.
    pub table: Option<String>,
    /// `VIEWS_STREAM`: the log (a Kinesis stream's name or ARN).
    pub stream: Option<String>,
    /// `VIEWS_DEDUP_SECS` (default 300): how long after a record a copy of
    /// it (same event id) is still recognised. Covers the producer's own
    /// retries (seconds) and a client's retry with its key.
    pub dedup_window: Duration,
    /// `VIEWS_DAY_TTL_DAYS` (default 35): how long a day item is kept.
    pub day_ttl: Duration,
    /// `VIEWS_REPAIR_AFTER_SECS` (default 900, Lambda's longest function
    /// timeout): how long after Lambda gave a batch up a repair of it may
    /// start, so that no invocation of the batch is still running
    /// ([`repair`]).
    pub repair_after: Duration,
    /// `VIEWS_MAX_RECORD_AGE_SECS` (default 3600, at most
    /// [`crate::config::VIEWS_MAX_RECORD_AGE_MAX_SECS`]; the template sets it
    /// to the event source's `MaximumRecordAgeInSeconds`): how long after a
    /// record arrived Lambda is done with it, applied or given up.
    pub max_record_age: Duration,
    /// What one viewer may put (`VIEWER_*`, see [`limits`]).
    pub viewer: limits::ViewerBounds,
    /// What one viewer's records may count within a minute, across
    /// instances (`VIEWS_PER_VIEWER_MINUTE`, default 600;
    /// `VIEW_REELS_PER_VIEWER_MINUTE`, default 300; see `bound`).
    pub per_viewer: (u32, u32),
    /// What days are counted by.
    pub clock: Clock,
}

impl std::fmt::Debug for ViewsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewsConfig")
            .field("table", &self.table)
            .field("stream", &self.stream)
            .field("dedup_window", &self.dedup_window)
            .field("day_ttl", &self.day_ttl)
            .field("repair_after", &self.repair_after)
            .field("max_record_age", &self.max_record_age)
            .field("viewer", &self.viewer)
            .field("per_viewer", &self.per_viewer)
            .finish_non_exhaustive()
    }
}

impl ViewsConfig {
    /// Reads it through `get`; `Err` names a malformed variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let text = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let num = |name: &str, default: u64, max: u64| -> Result<u64, String> {
            match text(name) {
                None => Ok(default),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| format!("{name}={v:?} is not a whole number in 1..={max}")),
            }
        };
        Ok(ViewsConfig {
            table: text("VIEWS_TABLE"),
            stream: text("VIEWS_STREAM"),
            dedup_window: Duration::from_secs(num("VIEWS_DEDUP_SECS", 300, 3_600)?),
            per_viewer: (
                num("VIEWS_PER_VIEWER_MINUTE", 600, 1_000_000)? as u32,
                num("VIEW_REELS_PER_VIEWER_MINUTE", 300, 1_000_000)? as u32,
            ),
            day_ttl: Duration::from_secs(86_400 * num("VIEWS_DAY_TTL_DAYS", 35, 3_650)?),
            repair_after: Duration::from_secs(num("VIEWS_REPAIR_AFTER_SECS", 900, 86_400)?),
            max_record_age: Duration::from_secs(num(
                "VIEWS_MAX_RECORD_AGE_SECS",
                3_600,
                crate::config::VIEWS_MAX_RECORD_AGE_MAX_SECS,
            )?),
            viewer: limits::ViewerBounds {
                batches_per_sec: num("VIEWER_BATCHES_PER_SEC", 1, 1_000)? as f64,
                batch_burst: num("VIEWER_BATCH_BURST", 10, 10_000)? as f64,
                views_per_min: num("VIEWER_VIEWS_PER_MIN", 6_000, 10_000_000)? as f64,
            },
            clock: system_clock(),
        })
    }
}
