//! The function instance the gateway invokes, replaceable at run time: the
//! playground's "drop the cache" is a new cold start with `CACHE_TTL_MS`
//! changed, what changing the variable does on Lambda. The handlers are
//! untouched; only which [`App`] the local gateway hands requests to moves.

use aws_sdk_dynamodb::Client;
use likes::App;
use likes::store::dynamodb::DynamoStore;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The gateway's current [`App`], and what a new one is built from.
pub(crate) struct Apps {
    current: RwLock<Arc<App>>,
    /// The SDK client the functions use (through the fault proxy, if any).
    client: Client,
}

impl Apps {
    pub(crate) fn new(app: Arc<App>, client: Client) -> Self {
        Apps {
            current: RwLock::new(app),
            client,
        }
    }

    /// The instance requests go to now.
    pub(crate) fn current(&self) -> Arc<App> {
        // A poisoned lock still holds a whole Arc: nothing is left half
        // written by a swap.
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Replaces the instance with a cold start whose count cache keeps sums
    /// `ttl` (zero: no cache); its caches start empty. Returns the new one.
    pub(crate) fn restart_with_cache_ttl(&self, ttl: Duration) -> Arc<App> {
        let mut config = self.current().config.clone();
        config.cache_ttl = ttl;
        let store = DynamoStore::new(self.client.clone(), &config);
        let app = Arc::new(App::new(config, store).with_views_of(&self.current()));
        match self.current.write() {
            Ok(mut g) => *g = app.clone(),
            Err(p) => *p.into_inner() = app.clone(),
        }
        app
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use likes::Config;

    #[tokio::test]
    async fn a_restart_changes_the_cache_ttl_of_the_current_instance_only() {
        let config = Config::from_lookup(|k| match k {
            "COUNTERS_TABLE" => Some("C".into()),
            "LIKES_TABLE" => Some("L".into()),
            _ => None,
        })
        .unwrap();
        let sdk = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .build();
        let client = Client::from_conf(sdk);
        let first = Arc::new(App::new(
            config.clone(),
            DynamoStore::new(client.clone(), &config),
        ));
        let apps = Apps::new(first.clone(), client);
        assert!(Arc::ptr_eq(&apps.current(), &first));
        let second = apps.restart_with_cache_ttl(Duration::ZERO);
        assert!(Arc::ptr_eq(&apps.current(), &second));
        assert_eq!(apps.current().config.cache_ttl, Duration::ZERO);
        assert_eq!(first.config.cache_ttl, config.cache_ttl);
        assert_eq!(second.config.counters_table, "C");
    }
}
