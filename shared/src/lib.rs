//! Sharded like counters on DynamoDB: the domain logic and the DynamoDB access
//! shared by every Lambda function of the `likes` workspace.
//!
//! # Layout
//!
//! * `clock`: wall-clock time (Unix ms stamps, the Lambda deadline), the
//!   one place every other module asks for it.
//! * [`config`]: the typed configuration, read once per cold start from the
//!   environment.
//! * [`keys`]: validated reel and user ids and the DynamoDB key formats (the
//!   data-model contract of `docs/guarantees.md`).
//! * [`token`]: the deterministic `ClientRequestToken` and the shard it picks.
//! * [`error`]: the one error enum of the crate and its single mapping to an
//!   HTTP status and JSON body.
//! * `retry`: bounded, jittered exponential backoff.
//! * [`store`]: the traits the domain sees, a file each: `CounterStore`
//!   (the like and read paths), `ResizeStore`, `ReconcileStore` and
//!   `AggregateStore` (stream mode); and [`store::dynamodb`], their only
//!   implementation (a room per trait impl: `counter`, `resize`,
//!   `reconcile`, `aggregate`; typed item access, SDK error translation);
//!   SDK types stay in there.
//!   Built with the `dynamodb` feature (default): without it the crate is
//!   request parsing and the domain, which is what the fuzz target builds.
//! * [`service`]: the like/unlike/count logic with its in-memory caches, and
//!   the observations (write rate, contention) that grow a hot reel; one
//!   file each for the count reads, the served-count guard, the write path
//!   and the grow observer.
//! * [`logging`]: the functions' log subscriber (JSON lines, each naming
//!   its span once), set up by every `main`.
//! * [`metrics`]: CloudWatch Embedded Metric Format records, one line per
//!   request or run, with bounded dimensions.
//! * [`reconcile`]: the scheduled recount from the like rows that repairs
//!   drift, resumable over many invocations; one file each for the run
//!   state with its lease and chunks, the likes scan, the check phase and
//!   the pacing of its calls.
//! * [`reshard`]: the resize protocol (grow, shrink by folding), its
//!   crash-safe state machine and the scheduled run with the automatic
//!   grow/shrink policy; `crowd` tells contention from a crowd (distinct
//!   users, or stream shards) from one source meeting itself.
//! * [`aggregate`]: stream mode's consumer of the Likes table's stream,
//!   exactly once with a checkpoint per stream shard; `records` parses
//!   Lambda's event, `chunk` cuts it into transactions, `tails` is what
//!   an instance knows of its writer items' own-change tails.
//! * [`views`]: views and unique viewers: `POST /views` into a Kinesis log,
//!   its consumer on [`aggregate`]'s exactly-once core, HyperLogLog
//!   sketches, the cached sums.
//! * [`known`]: the reels that have ever had a like or a view counted, as
//!   every instance holds them (segments of fingerprints, registrations by
//!   the writers, the scheduled fold and backfill), so that a read of a
//!   reel never counted reads nothing.
//! * [`trending`]: what's hot: the writers' hourly heavy-hitter sketches
//!   and the ranking of their candidates by exact windowed counts; `warm`,
//!   what the cache warmer stores and when an instance may serve it.
//! * [`warmer`]: the cache warmer's scheduled run, and the ranking of a
//!   list now (the warmer's, or an instance's when no warmer's is fresh).
//! * [`triggers`]: the entry points that are not HTTP requests: the reshard
//!   function's event (an admin request or the schedule), the reconcile
//!   function's, the aggregate function's stream batch and the warm
//!   function's schedule.
//! * [`app`]: [`App`], what a function instance builds once per cold start
//!   (configuration, service, resharder, reconciler, aggregator) and every
//!   entry point takes.
//! * [`http`]: request parsing, validation and the `like` and `read` handlers
//!   that the Lambda functions and the local stack both run, admin routes
//!   included.

#![warn(missing_docs)]

pub mod aggregate;
#[cfg(feature = "dynamodb")]
pub mod app;
pub(crate) mod clock;
pub mod config;
pub mod error;
pub mod http;
pub mod keys;
pub mod known;
pub mod logging;
pub mod metrics;
pub mod reconcile;
pub mod reshard;
pub(crate) mod retry;
pub mod service;
pub mod store;
pub mod token;
pub mod trending;
#[cfg(feature = "dynamodb")]
pub mod triggers;
pub mod views;
#[cfg(feature = "dynamodb")]
pub mod warmer;

#[cfg(feature = "dynamodb")]
pub use app::App;
pub use config::{AuthMode, Config, Counting, ReconcileConfig, ResizeConfig};
pub use error::Error;
