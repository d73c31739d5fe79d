//! The cache warmer's items in the counters table
//! ([`crate::store::WarmStore`]): [`WarmStore`] for [`DynamoStore`], and the
//! reads of warm figures and the warm set that the count reads of both
//! stores make ([`Warm`]). Each item holds its content as one JSON
//! attribute (`data`): at most a few KB, written whole, read whole.

use super::DynamoStore;
use super::error::{request_build_failed, translate};
use super::ext::{Item, ItemExt};
use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::top::{WARM_DATA_ATTR, WARM_SET_KEY, WARM_TTL_SECS, trending_list_key, warm_key};
use crate::retry::Backoff;
use crate::store::WarmStore;
use crate::store::{StoredList, WarmFigures, WarmSet};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;

/// Keys one BatchGetItem takes at most.
const BATCH_GET_MAX: usize = 100;

/// Warm items put at once.
const PUTS_IN_FLIGHT: usize = 16;

/// Where the warmer's items are, and how to ask again for what a batch
/// left unprocessed.
#[derive(Clone, Debug)]
pub(super) struct Warm<'a> {
    pub client: &'a Client,
    pub counters_table: &'a str,
    pub backoff: &'a Backoff,
}

fn key(pk: String) -> Item {
    HashMap::from([("pk".to_owned(), AttributeValue::S(pk))])
}

fn item(pk: String, data: &impl Serialize) -> Result<Item, Error> {
    let json =
        serde_json::to_string(data).map_err(|e| Error::internal("encoding a warm item", e))?;
    let mut i = key(pk);
    i.insert(WARM_DATA_ATTR.to_owned(), AttributeValue::S(json));
    let expires = crate::clock::now_ms() / 1000 + WARM_TTL_SECS;
    i.insert(
        "expires_at".to_owned(),
        AttributeValue::N(expires.to_string()),
    );
    Ok(i)
}

/// An item's content; one that does not decode (written by another
/// release) is taken as absent: it only ever saves reads.
fn data<T: DeserializeOwned>(i: &Item) -> Option<T> {
    let json = i.string(WARM_DATA_ATTR)?;
    serde_json::from_str(json)
        .inspect_err(|e| tracing::warn!(error = %e, "a warm item that does not decode"))
        .ok()
}

impl Warm<'_> {
    /// One item's content, eventually consistent (half a read unit per
    /// 4 KB: each item says how old it is).
    async fn read_data<T: DeserializeOwned>(&self, pk: String) -> Result<Option<T>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(self.counters_table)
            .set_key(Some(key(pk)))
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        Ok(out.item.as_ref().and_then(data))
    }

    pub async fn read_set(&self) -> Result<Option<WarmSet>, Error> {
        self.read_data(WARM_SET_KEY.to_owned()).await
    }

    pub async fn read_list(&self, metric: &str, window: &str) -> Result<Option<StoredList>, Error> {
        self.read_data(trending_list_key(metric, window)).await
    }

    /// The figures of those of `reels` that have a warm item.
    pub async fn read_figures(
        &self,
        reels: &[ReelId],
    ) -> Result<HashMap<ReelId, WarmFigures>, Error> {
        let mut out = HashMap::with_capacity(reels.len());
        for chunk in reels.chunks(BATCH_GET_MAX) {
            let by_key: HashMap<String, &ReelId> = chunk.iter().map(|r| (warm_key(r), r)).collect();
            let mut pending: Vec<Item> = by_key.keys().cloned().map(key).collect();
            let mut attempt = 0u32;
            while !pending.is_empty() {
                attempt += 1;
                let ka = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .build()
                    .map_err(|e| request_build_failed("BatchGetItem request", &e))?;
                let got = self
                    .client
                    .batch_get_item()
                    .request_items(self.counters_table, ka)
                    .send()
                    .await
                    .map_err(|e| translate("BatchGetItem", e))?;
                for i in got.responses.into_iter().flatten().flat_map(|(_, v)| v) {
                    let reel = i.string("pk").and_then(|pk| by_key.get(pk));
                    if let (Some(reel), Some(f)) = (reel, data::<WarmFigures>(&i)) {
                        out.insert((*reel).clone(), f);
                    }
                }
                pending = got
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(self.counters_table))
                    .map(|ka| ka.keys)
                    .unwrap_or_default();
                if !pending.is_empty() {
                    if !self.backoff.allows(attempt) {
                        // The reels left are summed as if not warm.
                        tracing::info!(left = pending.len(), "warm figures left unread");
                        break;
                    }
                    tokio::time::sleep(self.backoff.delay(attempt)).await;
                }
            }
        }
        Ok(out)
    }

    async fn write_data(&self, pk: String, data: &impl Serialize) -> Result<(), Error> {
        self.client
            .put_item()
            .table_name(self.counters_table)
            .set_item(Some(item(pk, data)?))
            .send()
            .await
            .map_err(|e| translate("PutItem", e))?;
        Ok(())
    }

    /// Each reel's figures, a PutItem each, a few at once: the same write
    /// units as a batch, and every function's writes stay single-item or
    /// transactional (none may BatchWriteItem).
    async fn write_figures(&self, figures: &[(ReelId, WarmFigures)]) -> Result<(), Error> {
        let puts: Vec<_> = figures
            .iter()
            .map(|(reel, f)| self.write_data(warm_key(reel), f))
            .collect();
        futures::stream::iter(puts)
            .buffer_unordered(PUTS_IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

impl DynamoStore {
    pub(super) fn warm(&self) -> Warm<'_> {
        Warm {
            client: &self.client,
            counters_table: &self.counters_table,
            backoff: &self.backoff,
        }
    }
}

impl WarmStore for DynamoStore {
    async fn put_warm(&self, figures: &[(ReelId, WarmFigures)]) -> Result<(), Error> {
        self.warm().write_figures(figures).await
    }

    async fn put_warm_set(&self, set: &WarmSet) -> Result<(), Error> {
        self.warm().write_data(WARM_SET_KEY.to_owned(), set).await
    }

    async fn put_list(&self, metric: &str, window: &str, list: &StoredList) -> Result<(), Error> {
        self.warm()
            .write_data(trending_list_key(metric, window), list)
            .await
    }

    async fn trending_list(&self, metric: &str, window: &str) -> Result<Option<StoredList>, Error> {
        self.warm().read_list(metric, window).await
    }
}
