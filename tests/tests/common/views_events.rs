//! Lambda's Kinesis events of the views log, built by hand for the tests
//! that feed the views aggregator directly, and a log that holds what
//! they put there.

use super::views_log::{ARN, seq};
use base64::Engine;
use likes::keys::ReelId;
use likes::store::{LogPut, LogPutResult, LogRead, LogStore, NextRecords, ReadFrom};
use likes::views::record::{KinesisEvent, ViewRecord};
use serde_json::json;
use std::collections::BTreeMap;

/// The system clock, Unix ms.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Event `id` of `viewer` watching each of `reels` `n` times.
pub fn view(id: u64, viewer: &str, reels: &[&str], n: u32, at_ms: i64) -> ViewRecord {
    ViewRecord {
        id,
        viewer: viewer.into(),
        at_ms,
        views: reels
            .iter()
            .map(|r| (ReelId::parse(r).unwrap(), n))
            .collect(),
    }
}

/// Lambda's Kinesis event of `shard`: (n, data, arrival ms) each.
pub fn event(shard: &str, records: &[(u64, Vec<u8>, i64)]) -> KinesisEvent {
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::from_value(json!({
        "Records": records.iter().map(|(n, data, at)| json!({
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": "p",
                "sequenceNumber": seq(*n),
                "data": b64.encode(data),
                "approximateArrivalTimestamp": (*at as f64) / 1000.0,
            },
            "eventSource": "aws:kinesis",
            "eventID": format!("{shard}:{}", seq(*n)),
            "eventSourceARN": ARN,
        })).collect::<Vec<_>>()
    }))
    .unwrap()
}

/// A record as a later view function might write it: format 2.
pub fn newer_format(id: u64) -> Vec<u8> {
    json!({
        "f": 2,
        "id": format!("{id:016x}"),
        "viewer": "u9",
        "at": now_ms(),
        "views": [{"reel": "n1", "count": 3, "watched_ms": 1200}],
    })
    .to_string()
    .into_bytes()
}

/// Each shard's records by sequence number, with their arrival (Unix ms);
/// no shard has parents or children.
#[derive(Default)]
pub struct Log(pub BTreeMap<String, BTreeMap<String, (i64, Vec<u8>)>>);

impl LogStore for Log {
    async fn put(&self, _: &[LogPut]) -> Result<Vec<LogPutResult>, likes::Error> {
        Err(likes::Error::Internal)
    }
    async fn parents(&self, _: &str, _: &str) -> Result<Vec<String>, likes::Error> {
        Ok(Vec::new())
    }
    async fn children(&self, _: &str, _: &str) -> Result<Vec<String>, likes::Error> {
        Ok(Vec::new())
    }
    async fn read_range(
        &self,
        _: &str,
        shard: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<LogRead>, likes::Error> {
        Ok(self
            .0
            .get(shard)
            .map(|s| {
                s.range(from.to_owned()..=to.to_owned())
                    .map(|(s, (at, data))| LogRead {
                        sequence: s.clone(),
                        arrival_ms: *at,
                        data: data.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }
    async fn next_records(
        &self,
        _: &str,
        shard: &str,
        from: ReadFrom<'_>,
        n: usize,
        _: i64,
    ) -> Result<NextRecords, likes::Error> {
        let records: Vec<LogRead> = self
            .0
            .get(shard)
            .into_iter()
            .flatten()
            .filter(|(s, _)| match from {
                ReadFrom::Oldest => true,
                ReadFrom::At(a) => s.as_str() >= a,
                ReadFrom::After(a) => s.as_str() > a,
            })
            .take(n)
            .map(|(s, (at, data))| LogRead {
                sequence: s.clone(),
                arrival_ms: *at,
                data: data.clone(),
            })
            .collect();
        let rest_after = records.len() < n;
        Ok(NextRecords {
            records,
            ended: false,
            rest_after,
        })
    }
}

/// The views settings of the tests that feed the aggregator by hand: the
/// template's table and stream names, every other setting its default.
pub fn config() -> likes::views::ViewsConfig {
    let mut config = likes::views::ViewsConfig::from_lookup(|_| None).unwrap();
    config.table = Some("ViewsTable".into());
    config.stream = Some("ViewsStream".into());
    config
}
