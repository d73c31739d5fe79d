//! The local stack behind `make serve`, and the harness of the integration
//! tests.
//!
//! # Layout
//!
//! * [`template`]: reads `template.yaml`: tables, routes, table variables.
//! * [`stack`]: starts embedded dynoxide (or uses `AWS_ENDPOINT_URL_DYNAMODB`),
//!   creates the tables, and serves the gateway.
//! * `apps`: the function instance the gateway invokes, which the
//!   playground can replace at run time (a cold start with another
//!   `CACHE_TTL_MS`).
//! * `gateway`: the local API Gateway: route matching, payload-format-2.0
//!   events, the real handlers.
//! * [`demo`]: the viral-burst demo.
//! * [`bench`](mod@bench): the viral-load benchmark (naive counter, fixed
//!   shards with and without the cache, automatic growth, stream mode, and
//!   stream mode at scale); a directory of its own, whose parts its
//!   `# Layout` lists.
//! * [`plan`]: the shard-sizing planner behind `likes-local plan`: shards for
//!   a planned peak, checked by simulation, and the cost of reading the count.
//!   `plan/mod.rs` the inputs, the report and the planning; `rule.rs` the
//!   sizing rule; `law.rs` the simulation, the Poisson sampler and the exact
//!   law of the busiest shard; `render.rs` the table; `cli.rs` the flags.
//! * [`out`]: the CLI's stdout and stderr, which a closed pipe cannot fail.
//! * `playground`: the page `make serve` serves at `/` and its local-only
//!   control routes under `/__local/` (cache TTL, lost shard); the page's
//!   files are in `local/playground/`.
//! * [`meter`]: what each function invocation costs in Lambda's terms
//!   (handler time, records, log bytes), for the bench's bill.
//! * [`streams`]: stream mode's event source: Lambda's DynamoDB event
//!   source mapping for the aggregate function, over the emulator's stream.
//! * [`kinesis`]: the views stream: the Kinesis emulator (kinesis-mock, a
//!   Node child process) and Lambda's Kinesis event source mapping for the
//!   views function.

mod apps;
pub mod bench;
pub mod demo;
mod gateway;
pub mod kinesis;
pub mod meter;
pub mod out;
pub mod plan;
mod playground;
pub mod stack;
pub mod streams;
pub mod template;

pub use stack::{Dynamo, Stack, StackOptions};
