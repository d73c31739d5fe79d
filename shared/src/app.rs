//! What a function instance keeps between invocations, built once per cold
//! start: every binary's `main` (the five Lambda functions and the local
//! stack) builds one [`App`] and hands it to the entry point it serves
//! ([`crate::http::handle`] or one of [`crate::triggers`]). It is the crate's
//! composition root, so it lives beside the modules it wires, not inside
//! any one of them.

use crate::aggregate::Aggregator;
use crate::config::Config;
use crate::known::Known;
use crate::reconcile::Reconciler;
use crate::reshard::Resharder;
use crate::service::LikeService;
use crate::store::dynamodb::{DynamoStore, DynamoViews};
use crate::store::kinesis::KinesisLog;
use crate::views::ViewsConfig;
use crate::views::accept::Producer;
use crate::views::aggregate::ViewAggregator;
use crate::views::read::ViewReader;
use std::sync::Arc;

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
    /// Views, where the instance is configured for them.
    pub views: Views,
    /// The trending lists this instance ranked lately.
    pub trending: crate::trending::Lists,
    /// The reels ever counted, as this instance holds them (`None` without
    /// `WRITERS_TABLE`): shared by the like and read paths and the views
    /// aggregator.
    pub known: Option<Arc<Known<DynamoStore>>>,
}

/// The views parts a function instance has: each needs its table or its
/// stream (`VIEWS_TABLE`, `VIEWS_STREAM`), which the template gives only
/// the functions that use them.
#[derive(Default)]
pub struct Views {
    /// `POST /views` (the stream).
    pub producer: Option<Producer<KinesisLog>>,
    /// The views log's consumer (both).
    pub aggregator: Option<ViewAggregator<DynamoViews, KinesisLog>>,
    /// `GET /reels/{reel_id}/views`, `GET /counts` (the table).
    pub reader: Option<ViewReader<DynamoViews>>,
    /// What they were built from, for another cold start of the same
    /// instance ([`App::with_views_of`]).
    setup: Option<(ViewsConfig, Option<Arc<KinesisLog>>)>,
}

impl Views {
    /// The error of a views route on an instance without views configured
    /// (the template gives each function what its routes need, so this is
    /// a deployment fault): 500, its cause logged once.
    pub(crate) fn missing() -> crate::error::Error {
        crate::error::Error::internal(
            "views route without views configured",
            "VIEWS_TABLE or VIEWS_STREAM is not set for this function",
        )
    }
}

impl App {
    /// Builds the service, resharder and reconciler over one store (the
    /// clones share the SDK client).
    pub fn new(config: Config, store: DynamoStore) -> Self {
        config.metrics.install();
        let reshard = Resharder::new(store.clone(), &config);
        let reconcile = Reconciler::new(store.clone(), &config);
        let aggregate = Aggregator::new(store.clone(), &config);
        let known = config.writers_table.as_ref().map(|_| {
            Arc::new(Known::new(
                Arc::new(store.clone()),
                config.cache_ttl,
                config.reconcile.clock_skew,
            ))
        });
        let mut service = LikeService::new(store, &config);
        let mut aggregate = aggregate;
        if let Some(k) = &known {
            service = service.with_known(k.clone());
            aggregate = aggregate.with_known(k.clone());
        }
        App {
            config,
            service,
            known,
            reshard,
            reconcile,
            aggregate,
            views: Views::default(),
            trending: crate::trending::Lists::default(),
        }
    }

    /// The same, with the views parts `views` and `log` allow (see
    /// [`Views`]); the views table is reached through the counters'
    /// client.
    pub fn with_views(self, views: ViewsConfig, log: Option<Arc<KinesisLog>>) -> Self {
        let table = views.table.as_ref().map(|t| {
            DynamoViews::new(self.service.store().client().clone(), t.clone())
                .with_warm(self.service.store())
        });
        let producer = log
            .clone()
            .map(|l| Producer::new(l, &self.config, views.viewer));
        let shared = self.known.clone().map(|k| k as crate::known::SharedKnown);
        let aggregator = match (&table, &log) {
            (Some(t), Some(l)) => {
                let a = ViewAggregator::new(t.clone(), l.clone(), &self.config, views.clone());
                Some(match &shared {
                    Some(k) => a.with_known(k.clone()),
                    None => a,
                })
            }
            _ => None,
        };
        let setup = Some((views.clone(), log.clone()));
        let reader = table.map(|t| {
            let r = ViewReader::new(
                t,
                self.config.cache_ttl,
                self.config.cache_max_reels,
                views.clock.clone(),
            );
            match &shared {
                Some(k) => r.with_known(k.clone()),
                None => r,
            }
        });
        App {
            views: Views {
                producer,
                aggregator,
                reader,
                setup,
            },
            ..self
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

    /// The same, with views as `other` has them (the local stack's new cold
    /// start of a running instance); the log's client is shared.
    pub fn with_views_of(self, other: &App) -> Self {
        match &other.views.setup {
            Some((views, log)) => self.with_views(views.clone(), log.clone()),
            None => self,
        }
    }

    /// Reads the configuration and builds the SDK client from the
    /// environment.
    pub async fn from_env() -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let config = Config::from_env()?;
        let views = ViewsConfig::from_lookup(|n| std::env::var(n).ok())?;
        let sdk = DynamoStore::sdk_from_env(&config).await;
        let store = DynamoStore::from_sdk(&sdk, &config);
        let log = views
            .stream
            .as_ref()
            .map(|s| Arc::new(KinesisLog::from_sdk(&sdk, s.clone())));
        Ok(App::new(config, store).with_views(views, log))
    }
}
