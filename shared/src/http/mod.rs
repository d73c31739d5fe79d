//! The HTTP face of the service: routing, request validation, identity and
//! JSON responses, shared by the Lambda functions and the local stack.
//!
//! The handlers take a `lambda_http::Request` (API Gateway HTTP API, payload
//! format 2.0) and always return a response: every failure becomes a JSON
//! error with the status [`crate::Error::status`] gives. Nothing here panics on
//! any input. All validation is [`parse`], a pure function from a request
//! to a [`Command`] or an error, which the handlers run before any I/O and
//! the fuzz target (`fuzz/`) and property tests (`tests/tests/hostile.rs`)
//! call directly.
//!
//! Rooms: `routes` (the routes and which function serves each: the one
//! module both others depend on), `request` (parsing into a [`Command`]),
//! `handlers` (executing a command, and the one mapping of errors to
//! responses; readiness asks [`crate::service::LikeService::ready`]),
//! `charge` (what a count read is charged to its caller), `cache_control`
//! (which count answers a CDN may keep, and how long), `stats` (the
//! windowed counts' route), `trending` (the top reels' route). The scheduled
//! functions' events are not HTTP: `crate::triggers`.
//!
//! Without the `dynamodb` feature only `routes` and `request` are built:
//! parsing needs no store, and the fuzz target builds the crate that way.

mod access;
#[cfg(feature = "dynamodb")]
mod cache_control;
#[cfg(feature = "dynamodb")]
mod charge;
#[cfg(feature = "dynamodb")]
mod handlers;
mod request;
mod routes;
#[cfg(feature = "dynamodb")]
mod stats;
#[cfg(feature = "dynamodb")]
mod trending;

/// Re-exported for the scheduled functions' `main`s: the deadline of a Lambda
/// invocation as an `Instant`.
pub use crate::clock::lambda_deadline;
pub use crate::config::Access;
#[cfg(feature = "dynamodb")]
pub(crate) use handlers::error_response;
#[cfg(feature = "dynamodb")]
pub use handlers::handle;
pub use request::{
    Command, MAX_BATCH_REELS, MAX_BODY_BYTES, MAX_TRENDING, MAX_VIEWS_BODY_BYTES, parse, parse_with,
};
pub use routes::Function;
