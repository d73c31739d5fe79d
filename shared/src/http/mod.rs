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
//! responses), `health` (the cached readiness probe). The scheduled
//! functions' events are not HTTP: `crate::events`.
//!
//! Without the `dynamodb` feature only `routes` and `request` are built:
//! parsing needs no store, and the fuzz target builds the crate that way.

#[cfg(feature = "dynamodb")]
mod handlers;
#[cfg(feature = "dynamodb")]
mod health;
mod request;
mod routes;

/// Re-exported for the scheduled functions' `main`s: the deadline of a Lambda
/// invocation as an `Instant`.
pub use crate::clock::lambda_deadline;
#[cfg(feature = "dynamodb")]
pub(crate) use handlers::error_response;
#[cfg(feature = "dynamodb")]
pub use handlers::handle;
#[cfg(feature = "dynamodb")]
pub use health::HEALTH_TTL;
pub use request::{Command, MAX_BATCH_REELS, MAX_BODY_BYTES, parse};
pub use routes::Function;

#[cfg(feature = "dynamodb")]
use crate::aggregate::Aggregator;
#[cfg(feature = "dynamodb")]
use crate::config::Config;
#[cfg(feature = "dynamodb")]
use crate::reconcile::Reconciler;
#[cfg(feature = "dynamodb")]
use crate::reshard::Resharder;
#[cfg(feature = "dynamodb")]
use crate::service::LikeService;
#[cfg(feature = "dynamodb")]
use crate::store::dynamodb::DynamoStore;

/// What a function instance keeps between invocations: the configuration,
/// the service (SDK client and caches) and the resharder, built once per
/// cold start.
#[cfg(feature = "dynamodb")]
pub struct App {
    /// The configuration read at cold start.
    pub config: Config,
    /// The like, unlike and count logic, with its caches.
    pub service: LikeService<DynamoStore>,
    /// Resizes: the admin routes and the scheduled resize run.
    pub reshard: Resharder<DynamoStore>,
    /// The scheduled recount that repairs drift.
    pub reconcile: Reconciler<DynamoStore>,
    /// Stream mode's consumer of the Likes table's stream.
    pub aggregate: Aggregator<DynamoStore>,
    /// The cached readiness probe of `GET /healthz`.
    pub(crate) health: health::Health,
}

#[cfg(feature = "dynamodb")]
impl App {
    /// Builds the service, resharder and reconciler over one store (the
    /// clones share the SDK client).
    pub fn new(config: Config, store: DynamoStore) -> Self {
        config.metrics.install();
        let reshard = Resharder::new(store.clone(), &config);
        let reconcile = Reconciler::new(store.clone(), &config);
        let aggregate = Aggregator::new(store.clone(), &config);
        let service = LikeService::new(store, &config);
        App {
            config,
            service,
            reshard,
            reconcile,
            aggregate,
            health: health::Health::default(),
        }
    }

    /// Reads the configuration and builds the SDK client from the
    /// environment.
    pub async fn from_env() -> Result<Self, crate::config::ConfigError> {
        let config = Config::from_env()?;
        let store = DynamoStore::from_env(&config).await;
        Ok(App::new(config, store))
    }
}
