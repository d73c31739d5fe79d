//! [`CounterStore`](super::CounterStore), [`ResizeStore`](super::ResizeStore),
//! [`ReconcileStore`](super::ReconcileStore) and
//! [`AggregateStore`](super::AggregateStore) on DynamoDB through the AWS SDK.
//!
//! This is the only module that sees SDK types. Its rooms:
//!
//! * `mod.rs` (here): [`DynamoStore`], [`StoreStats`], the two
//!   conditional writes every trait uses (`put_versioned`, `settings_at`)
//!   and the checkpoint move both aggregators' transactions open with
//!   (`checkpoint_move`).
//! * `sdk`: the SDK client: retries, timeouts, the retry quota, the
//!   endpoint ([`sdk_config_loader`], [`retry_partition`], [`client`]).
//! * `tls`: the HTTPS client of a function instance's SDK client, which
//!   trusts the system's CA bundle file alone.
//! * `ext`: typed access to stored items: the accessor extension, the
//!   projections, and the `TryFrom` conversions of the stored types.
//! * `reads`: consistent multi-item reads of the counters table
//!   (BatchGetItem with unprocessed keys, TransactGetItems, the fold-group
//!   snapshot of a draining reel).
//! * `counter`, `resize`, `reconcile`, `aggregate`: one trait impl each,
//!   beside the trait's own file in `store` (`CounterStore`, `ResizeStore`,
//!   `ReconcileStore`, `AggregateStore`).
//! * `writers`: stream mode's writer items of the likes, one partition
//!   of them as read, and the fold of quiet ones into its base;
//!   `spread`: a reel's writer items over several partition keys (all of
//!   them summed, the write rate that spreads them, the registry writers
//!   follow).
//! * `views`: [`DynamoViews`], the views table's store (`ViewStore`);
//!   `compact`: its seal items and folds (`crate::views::compact`).
//! * `warm`: the cache warmer's items (`WarmStore`, and the warm reads
//!   both stores' count reads make).
//! * `known`: the known-reels set's items (`KnownStore`) and the
//!   backfill's keys-only scans.
//! * `error`: the one translation of SDK errors into [`Error`], and the
//!   reading of cancelled transactions' reasons. The detail is logged
//!   there and never leaves this module.

mod aggregate;
mod compact;
mod counter;
mod error;
mod ext;
mod known;
mod reads;
mod reconcile;
mod resize;
mod sdk;
mod spread;
mod tls;
mod top;
mod views;
mod warm;
mod windows;
mod writers;

pub(crate) use error::translate;
pub use sdk::{client, retry_partition, sdk_config_loader};
pub use views::DynamoViews;

use crate::config::Config;
use crate::error::Error;
use crate::keys::{self, ReelId};
use crate::retry::Backoff;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::builders::UpdateBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem, Update};
use error::request_build_failed;
use ext::Item;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The DynamoDB implementation of [`CounterStore`](super::CounterStore),
/// [`ResizeStore`](super::ResizeStore),
/// [`ReconcileStore`](super::ReconcileStore) and
/// [`AggregateStore`](super::AggregateStore) over the two tables. Cheap to
/// clone: clones share the SDK client and the [`StoreStats`].
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    counters_table: String,
    likes_table: String,
    /// Stream mode: `WRITERS_TABLE` (`None` in transactional mode, where
    /// no writer items are written or read).
    writers_table: Option<String>,
    /// `WRITERS_TABLE` in either mode: where a like function instance puts
    /// its trending sketch in transactional mode
    /// ([`crate::trending::instance`]).
    sketch_table: Option<String>,
    /// How long a writer item must have been quiet before a reader folds
    /// it (see `writers.rs`).
    fold_quiet_ms: i64,
    /// Stream mode's own-change tails, as readers sum them.
    own_tail: crate::keys::tail::TailWindow,
    /// The recent-change buckets' window: a fold keeps those still in it.
    window: crate::config::RecentWindow,
    /// Reels whose writer fold this instance has in flight, shared by
    /// every clone: a second reader of the reel skips the fold, which
    /// would only meet the first's (see `writers.rs`).
    folding: writers::InFlight,
    /// The spread registry as last read and the writer-item write-rate
    /// samples, shared by every clone (see `spread.rs`).
    spread: spread::Spread,
    backoff: Backoff,
    /// Shared by every clone of this store.
    stats: Arc<StoreStats>,
}

/// Counts of the calls that matter for cost, since this store was built.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Shard items read by BatchGetItem (one read unit each).
    pub shard_reads_batch: AtomicU64,
    /// `TransactGetItems` calls (a shrinking reel's sum).
    pub transact_gets: AtomicU64,
    /// Items those calls read (two read units each).
    pub shard_reads_transactional: AtomicU64,
    /// Snapshots of a draining reel's fold group taken without a
    /// transaction (the base item's fold counter read around its shards).
    pub fold_group_reads: AtomicU64,
    /// Fold transactions that committed.
    pub folds: AtomicU64,
    /// Writer partitions queried (stream mode: one per reel read).
    pub writer_queries: AtomicU64,
    /// Writer items those queries returned.
    pub writer_items: AtomicU64,
    /// Folds of quiet writer items that committed.
    pub writer_folds: AtomicU64,
    /// Reels this instance spread (or renewed in the spread registry).
    pub writer_spreads: AtomicU64,
    /// Writer items whose own-change tail the aggregator read because it
    /// did not know it (one read unit each; `keys::tail`).
    pub tail_reads: AtomicU64,
}

impl DynamoStore {
    /// Builds the SDK client from the environment (once per cold start).
    pub async fn from_env(config: &Config) -> Self {
        Self::from_sdk(&Self::sdk_from_env(config).await, config)
    }

    /// The SDK configuration a function instance builds its clients from
    /// (see [`sdk_config_loader`]): loaded once per cold start and shared
    /// by the DynamoDB and Kinesis clients.
    pub async fn sdk_from_env(config: &Config) -> aws_config::SdkConfig {
        sdk::instance_config_loader(config).load().await
    }

    /// A store whose client is built from `sdk`.
    pub fn from_sdk(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Self::new(client(sdk, config), config)
    }

    /// A store over `client` and the tables `config` names (tests pass a
    /// client of their own).
    pub fn new(client: Client, config: &Config) -> Self {
        DynamoStore {
            client,
            counters_table: config.counters_table.clone(),
            likes_table: config.likes_table.clone(),
            writers_table: match config.counting {
                crate::config::Counting::Stream => config.writers_table.clone(),
                crate::config::Counting::Transactional => None,
            },
            sketch_table: config.writers_table.clone(),
            fold_quiet_ms: writers::fold_quiet_ms(config),
            own_tail: config.own_tail(),
            window: config.reconcile.recent_window(),
            folding: writers::InFlight::default(),
            spread: spread::Spread::new(config),
            backoff: Backoff::from_config(config),
            stats: Arc::default(),
        }
    }

    /// The SDK client it calls through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Call counts since the store was built (read by the request metrics
    /// and tests).
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// The `ConditionCheck` that a reel's settings item is still at
    /// `version` (0: there is none), for the transactions that move or
    /// remove counts only under the settings they were planned with.
    pub(super) fn settings_at(
        &self,
        reel: &ReelId,
        version: u64,
    ) -> Result<TransactWriteItem, Error> {
        let check = ConditionCheck::builder()
            .table_name(&self.counters_table)
            .key("pk", AttributeValue::S(keys::settings_key(reel)));
        let check = if version == 0 {
            check.condition_expression("attribute_not_exists(ver)")
        } else {
            check
                .condition_expression("ver = :ver")
                .expression_attribute_values(":ver", AttributeValue::N(version.to_string()))
        };
        Ok(TransactWriteItem::builder()
            .condition_check(
                check
                    .build()
                    .map_err(|e| request_build_failed("ConditionCheck", &e))?,
            )
            .build())
    }

    /// Puts `item` (which carries `ver = expected + 1`) if the stored item's
    /// `ver` is still `expected` (0: no item, or one without a version).
    /// `Ok(false)`: another writer was first.
    pub(super) async fn put_versioned(&self, item: Item, expected: u64) -> Result<bool, Error> {
        self.put_versioned_in(&self.counters_table, item, expected)
            .await
    }

    /// [`Self::put_versioned`] into `table` (the known reels' items are in
    /// the views table).
    pub(super) async fn put_versioned_in(
        &self,
        table: &str,
        item: Item,
        expected: u64,
    ) -> Result<bool, Error> {
        let mut put = self
            .client
            .put_item()
            .table_name(table)
            .set_item(Some(item));
        put = if expected == 0 {
            put.condition_expression("attribute_not_exists(ver)")
        } else {
            put.condition_expression("ver = :v")
                .expression_attribute_values(":v", AttributeValue::N(expected.to_string()))
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
                Ok(false)
            }
            Err(e) => Err(translate("PutItem", e)),
        }
    }
}

/// A source shard's checkpoint moving from `expected` (`None`: it has none
/// yet) to `next`, the last record of the chunk applied with it.
pub(super) struct CheckpointMove<'a> {
    pub key: HashMap<String, AttributeValue>,
    pub expected: Option<&'a str>,
    pub next: &'a str,
    /// The source's shard id, kept for operators.
    pub shard_id: &'a str,
    pub now_ms: i64,
    /// Records the chunk holds, added to the item's count.
    pub records: u64,
}

impl CheckpointMove<'_> {
    /// The update of the checkpoint item (in `table`) that opens a chunk's
    /// transaction; `more_sets` (`", #x = :x"` clauses) is set with it, its
    /// names and values added by the caller.
    ///
    /// Sequence numbers are stored zero-padded to one width, so they are
    /// equal as strings when equal as numbers and ordered as strings as
    /// they are as numbers. Besides holding the value read, the checkpoint
    /// must lie below the new one: the item itself refuses to move back
    /// (or stay), whatever the caller planned, since a checkpoint that went
    /// back would let the records after it be applied again (see
    /// [`crate::aggregate`]).
    pub fn checkpoint_update(&self, table: &str, more_sets: &str) -> UpdateBuilder {
        let update = Update::builder()
            .table_name(table)
            .set_key(Some(self.key.clone()))
            .update_expression(format!(
                "SET #s = :next, #id = :id, #at = :at{more_sets} ADD #r :records"
            ))
            .expression_attribute_names("#s", "seq")
            .expression_attribute_names("#id", "shard_id")
            .expression_attribute_names("#at", "updated_at")
            .expression_attribute_names("#r", "records")
            .expression_attribute_values(":next", AttributeValue::S(self.next.to_owned()))
            .expression_attribute_values(":id", AttributeValue::S(self.shard_id.to_owned()))
            .expression_attribute_values(":at", AttributeValue::N(self.now_ms.to_string()))
            .expression_attribute_values(":records", AttributeValue::N(self.records.to_string()));
        match self.expected {
            None => update.condition_expression("attribute_not_exists(#s)"),
            Some(seq) => update
                .condition_expression("#s = :expected AND #s < :next")
                .expression_attribute_values(":expected", AttributeValue::S(seq.to_owned())),
        }
    }
}
