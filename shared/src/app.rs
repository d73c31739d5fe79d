//! What a function instance keeps between invocations, built once per cold
//! start: every binary's `main` (the five Lambda functions and the local
//! stack) builds one [`App`] and hands it to the entry point it serves
//! ([`crate::http::handle`] or one of [`crate::triggers`]). It is the crate's
//! composition root, so it lives beside the modules it wires, not inside
//! any one of them.

use crate::aggregate::Aggregator;
use crate::config::Config;
use crate::reconcile::Reconciler;
use crate::reshard::Resharder;
use crate::service::LikeService;
use crate::store::dynamodb::DynamoStore;

/// What a function instance keeps between invocations: the configuration,
/// the service (SDK client and caches) and the resharder, built once per
/// cold start.
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
}

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
        }
    }

    /// The same, with likes only of the reels `check` knows (see
    /// [`LikeService::with_reel_check`]).
    pub fn with_reel_check(self, check: std::sync::Arc<dyn crate::service::ReelCheck>) -> Self {
        App {
            service: self.service.with_reel_check(check),
            ..self
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
