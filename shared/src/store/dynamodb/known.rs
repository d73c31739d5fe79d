//! [`KnownStore`] for [`DynamoStore`]: the known-reels set's items in
//! `WRITERS_TABLE` (the views table, `crate::keys::known`), and the
//! backfill's keys-only scan of the counters and views tables.

use super::DynamoStore;
use super::error::translate;
use super::ext::{Item, ItemExt};
use crate::error::Error;
use crate::keys::known::{
    META_SORT, REGISTRATION_TTL_SECS, SEGMENT_FPS_ATTR, SET_KEY, decode_fps, encode_fps,
    parse_registration_sort, parse_segment_sort, reel_of_views_key, registration_sort,
    registrations_from, registrations_key, segment_sort,
};
use crate::store::{KnownMeta, KnownScan, KnownScanPage, KnownSegment, KnownStore, ScanCursor};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;

/// Registrations put at once.
const PUTS_IN_FLIGHT: usize = 16;

/// Items one backfill scan page reads at most.
const SCAN_PAGE: i32 = 1000;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn key(pk: &str, sk: &str) -> Item {
    HashMap::from([("pk".to_owned(), s(pk)), ("sk".to_owned(), s(sk))])
}

impl TryFrom<&Item> for KnownMeta {
    type Error = Error;

    fn try_from(i: &Item) -> Result<Self, Error> {
        let bad = || Error::internal("reading the known reels' meta item", "a field is missing");
        let cursor = match i.string("ct") {
            None => None,
            Some(t) => Some(ScanCursor {
                table: KnownScan::parse(t).ok_or_else(bad)?,
                last: i
                    .string("cpk")
                    .map(|pk| (pk.to_owned(), i.string("csk").map(str::to_owned))),
            }),
        };
        Ok(KnownMeta {
            to_ms: i.int("to").ok_or_else(bad)?,
            first_ms: i.int("first").ok_or_else(bad)?,
            // None before the heartbeat was written: read as a gap (a
            // backfill again, the safe side).
            seen_ms: i.int("seen").unwrap_or(0),
            complete: i.flag("complete").unwrap_or(false),
            full: i.flag("full").unwrap_or(false),
            cursor,
            version: i.int("ver").ok_or_else(bad)? as u64,
        })
    }
}

fn meta_item(m: &KnownMeta) -> Item {
    let mut i = key(SET_KEY, META_SORT);
    i.insert("to".into(), n(m.to_ms));
    i.insert("first".into(), n(m.first_ms));
    i.insert("seen".into(), n(m.seen_ms));
    i.insert("complete".into(), AttributeValue::Bool(m.complete));
    i.insert("full".into(), AttributeValue::Bool(m.full));
    i.insert("ver".into(), n(m.version + 1));
    if let Some(c) = &m.cursor {
        i.insert("ct".into(), s(c.table.as_str()));
        if let Some((pk, sk)) = &c.last {
            i.insert("cpk".into(), s(pk));
            if let Some(sk) = sk {
                i.insert("csk".into(), s(sk));
            }
        }
    }
    i
}

impl DynamoStore {
    /// `WRITERS_TABLE` in either mode (set in every function): where the
    /// set lives.
    fn sketch_table(&self) -> Result<&str, Error> {
        self.sketch_table.as_deref().ok_or_else(|| {
            Error::internal(
                "the known reels without WRITERS_TABLE",
                "set WRITERS_TABLE (the template points it at the views table)",
            )
        })
    }

    /// Every item of `pk` with a sort key from `from` (and below `below`),
    /// read strongly consistent, page by page.
    async fn query_known(
        &self,
        pk: &str,
        from: &str,
        below: Option<&str>,
    ) -> Result<Vec<Item>, Error> {
        let table = self.sketch_table()?;
        let mut items = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let q = self
                .client
                .query()
                .table_name(table)
                .expression_attribute_values(":pk", s(pk))
                .expression_attribute_values(":from", s(from))
                .consistent_read(true)
                .set_exclusive_start_key(start);
            let q = match below {
                Some(b) => q
                    .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :below")
                    .expression_attribute_values(":below", s(b)),
                None => q.key_condition_expression("pk = :pk AND sk >= :from"),
            };
            let out = q.send().await.map_err(|e| translate("Query", e))?;
            items.extend(out.items.unwrap_or_default());
            start = out.last_evaluated_key.filter(|k| !k.is_empty());
            if start.is_none() {
                return Ok(items);
            }
        }
    }
}

impl KnownStore for DynamoStore {
    async fn known_meta(&self) -> Result<Option<KnownMeta>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(self.sketch_table()?)
            .set_key(Some(key(SET_KEY, META_SORT)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| translate("GetItem", e))?;
        out.item.as_ref().map(KnownMeta::try_from).transpose()
    }

    async fn known_segments(&self) -> Result<Vec<KnownSegment>, Error> {
        // "s000" to "s255": every segment, not the meta item.
        let items = self.query_known(SET_KEY, "s", Some("s~")).await?;
        let mut out = Vec::with_capacity(items.len());
        for i in &items {
            let Some(index) = i.string("sk").and_then(parse_segment_sort) else {
                continue;
            };
            let fps = i
                .bytes(SEGMENT_FPS_ATTR)
                .and_then(decode_fps)
                .ok_or_else(|| {
                    Error::internal("reading a known-reels segment", "bad fingerprints")
                })?;
            let version = i.int("ver").unwrap_or(0) as u64;
            out.push(KnownSegment {
                index,
                fps,
                version,
            });
        }
        Ok(out)
    }

    async fn registrations(&self, minute: i64, from_ms: i64) -> Result<Vec<(i64, String)>, Error> {
        let items = self
            .query_known(
                &registrations_key(minute),
                &registrations_from(from_ms),
                None,
            )
            .await?;
        Ok(items
            .iter()
            .filter_map(|i| i.string("sk").and_then(parse_registration_sort))
            .map(|(at, reel)| (at, reel.to_owned()))
            .collect())
    }

    async fn register(&self, at_ms: i64, reels: &[String]) -> Result<(), Error> {
        let table = self.sketch_table()?;
        let expires = at_ms / 1000 + REGISTRATION_TTL_SECS;
        let pk = registrations_key(at_ms.div_euclid(60_000));
        // One PutItem each (no function may BatchWriteItem: it could
        // delete), a few at a time; a put repeated is the same item.
        let puts: Vec<_> = reels
            .iter()
            .map(|reel| {
                let mut item = key(&pk, &registration_sort(at_ms, reel));
                item.insert("expires_at".into(), n(expires));
                let put = self
                    .client
                    .put_item()
                    .table_name(table)
                    .set_item(Some(item));
                async move {
                    put.send()
                        .await
                        .map(|_| ())
                        .map_err(|e| translate("PutItem", e))
                }
            })
            .collect();
        futures::stream::iter(puts)
            .buffer_unordered(PUTS_IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn put_segment(&self, segment: &KnownSegment) -> Result<bool, Error> {
        let mut item = key(SET_KEY, &segment_sort(segment.index));
        item.insert(
            SEGMENT_FPS_ATTR.into(),
            AttributeValue::B(Blob::new(encode_fps(&segment.fps))),
        );
        item.insert("n".into(), n(segment.fps.len()));
        item.insert("ver".into(), n(segment.version + 1));
        self.put_versioned_in(self.sketch_table()?, item, segment.version)
            .await
    }

    async fn put_meta(&self, meta: &KnownMeta) -> Result<bool, Error> {
        self.put_versioned_in(self.sketch_table()?, meta_item(meta), meta.version)
            .await
    }

    async fn scan_known(
        &self,
        table: KnownScan,
        last: Option<&(String, Option<String>)>,
    ) -> Result<KnownScanPage, Error> {
        let name = match table {
            KnownScan::Counters => self.counters_table.as_str(),
            KnownScan::Views => self.sketch_table()?,
        };
        let start = last.map(|(pk, sk)| {
            let mut k = HashMap::from([("pk".to_owned(), s(pk))]);
            if let Some(sk) = sk {
                k.insert("sk".to_owned(), s(sk));
            }
            k
        });
        let out = self
            .client
            .scan()
            .table_name(name)
            .projection_expression(match table {
                KnownScan::Counters => "pk",
                KnownScan::Views => "pk, sk",
            })
            .limit(SCAN_PAGE)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| translate("Scan", e))?;
        let reels = out
            .items()
            .iter()
            .filter_map(|i| i.string("pk"))
            .filter_map(|pk| match table {
                KnownScan::Counters => crate::keys::reel_of_counter_key(pk),
                KnownScan::Views => reel_of_views_key(pk),
            })
            .map(|r| r.as_str().to_owned())
            .collect();
        let next = out
            .last_evaluated_key
            .filter(|k| !k.is_empty())
            .and_then(|k| {
                let pk = k.string("pk")?.to_owned();
                Some((pk, k.string("sk").map(str::to_owned)))
            });
        Ok(KnownScanPage { reels, next })
    }
}
