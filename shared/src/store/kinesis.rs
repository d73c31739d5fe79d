//! [`LogStore`] on Kinesis Data Streams: the views log. The only module that
//! sees the Kinesis SDK's types; its errors go through the one translation
//! ([`super::dynamodb`]'s `translate`).

use super::dynamodb::translate;
use crate::error::Error;
use crate::store::{LogPut, LogPutResult, LogRead, LogStore, NextRecords, ReadFrom};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};
use std::collections::HashMap;
use std::sync::Mutex;

/// `GetRecords` calls one read of a shard makes at most: a given-up batch
/// is at most 10,000 records (Lambda's largest Kinesis batch), and a call
/// returns up to 10,000; the bound stops a read whose end is never met
/// from going on for ever.
const READ_RANGE_CALLS: u32 = 200;

/// `GetRecords` calls one [`LogStore::next_records`] makes at most: a
/// repair's look past a checkpoint must fit an invocation.
const NEXT_RECORDS_CALLS: u32 = 8;

/// The pause between two `GetRecords` calls of one read: a shard serves
/// five a second, shared with the event source.
const READ_PAUSE: std::time::Duration = std::time::Duration::from_millis(400);

/// The views stream, by name (`VIEWS_STREAM`), through the SDK client.
#[derive(Debug)]
pub struct KinesisLog {
    client: Client,
    stream: String,
    /// Each listed shard's parents, by stream ARN: a child shard's parents
    /// never change, so one listing per instance serves until a shard is
    /// met that it does not know (a split since).
    parents: Mutex<HashMap<String, HashMap<String, Vec<String>>>>,
}

impl KinesisLog {
    /// A log writing to `stream` (a name or an ARN) through `client`.
    pub fn new(client: Client, stream: impl Into<String>) -> Self {
        KinesisLog {
            client,
            stream: stream.into(),
            parents: Mutex::default(),
        }
    }

    /// The log of a function instance, its client built from the SDK
    /// configuration the DynamoDB client was built from (one load per cold
    /// start: the same HTTPS client, credentials, bounded retries and
    /// timeouts); `AWS_ENDPOINT_URL_KINESIS` points it at a local emulator.
    pub fn from_sdk(sdk: &aws_config::SdkConfig, stream: impl Into<String>) -> Self {
        let mut builder = aws_sdk_kinesis::config::Builder::from(sdk);
        // As for DynamoDB: an empty endpoint variable (sam local) means
        // "not set", and the SDK panics on an empty URL.
        let vars = ["AWS_ENDPOINT_URL_KINESIS", "AWS_ENDPOINT_URL"].map(|k| std::env::var(k).ok());
        if vars.iter().flatten().any(|v| v.trim().is_empty()) {
            let url = vars.into_iter().flatten().find(|v| !v.trim().is_empty());
            builder.set_endpoint_url(url);
        }
        Self::new(Client::from_conf(builder.build()), stream)
    }

    fn is_arn(&self) -> bool {
        self.stream.starts_with("arn:")
    }

    /// Every shard of the stream `arn` with its parents.
    async fn list(&self, arn: &str) -> Result<HashMap<String, Vec<String>>, Error> {
        let mut out = HashMap::new();
        let mut next: Option<String> = None;
        loop {
            // A NextToken call names no stream (the API refuses both).
            let call = match next.take() {
                Some(token) => self.client.list_shards().next_token(token),
                None => self.client.list_shards().stream_arn(arn),
            };
            let page = call
                .send()
                .await
                .map_err(|e| translate("Kinesis.ListShards", e))?;
            for shard in page.shards.unwrap_or_default() {
                let parents = [shard.parent_shard_id, shard.adjacent_parent_shard_id]
                    .into_iter()
                    .flatten()
                    .collect();
                out.insert(shard.shard_id, parents);
            }
            match page.next_token {
                Some(t) if !t.is_empty() => next = Some(t),
                _ => return Ok(out),
            }
        }
    }
}

impl LogStore for KinesisLog {
    async fn put(&self, records: &[LogPut]) -> Result<Vec<LogPutResult>, Error> {
        let mut entries = Vec::with_capacity(records.len());
        for r in records {
            entries.push(
                PutRecordsRequestEntry::builder()
                    .partition_key(&r.partition_key)
                    .data(Blob::new(r.data.clone()))
                    .build()
                    .map_err(|e| {
                        Error::internal("could not build a Kinesis record", format_args!("{e:?}"))
                    })?,
            );
        }
        let call = self.client.put_records().set_records(Some(entries));
        let call = if self.is_arn() {
            call.stream_arn(&self.stream)
        } else {
            call.stream_name(&self.stream)
        };
        let out = call
            .send()
            .await
            .map_err(|e| translate("Kinesis.PutRecords", e))?;
        let results: Vec<LogPutResult> = out
            .records
            .into_iter()
            .map(|r| match r.error_code {
                Some(code) => LogPutResult::Failed { code },
                None => LogPutResult::Stored,
            })
            .collect();
        if results.len() != records.len() {
            // The API answers one entry per record, in order; anything else
            // leaves every record's fate unknown: retried as a lost answer.
            tracing::warn!(
                sent = records.len(),
                answered = results.len(),
                "PutRecords answered another number of records"
            );
            return Err(Error::Unavailable);
        }
        Ok(results)
    }

    async fn parents(&self, stream_arn: &str, shard_id: &str) -> Result<Vec<String>, Error> {
        if let Some(p) = self
            .parents
            .lock()
            .ok()
            .and_then(|m| m.get(stream_arn).and_then(|s| s.get(shard_id).cloned()))
        {
            return Ok(p);
        }
        let listed = self.list(stream_arn).await?;
        // A shard the listing does not show (expired from it after its
        // retention): it has nothing left whose ids could repeat. Kept as
        // such, and the listing added to what is known rather than put in
        // its place: a child names its parent for as long as the child
        // lives, and once the parent has expired from the listing every
        // batch of the child would otherwise list the stream again.
        let found = listed.get(shard_id).cloned().unwrap_or_default();
        if let Ok(mut m) = self.parents.lock() {
            let known = m.entry(stream_arn.to_owned()).or_default();
            known.extend(listed);
            known.insert(shard_id.to_owned(), found.clone());
        }
        Ok(found)
    }

    async fn children(&self, stream_arn: &str, shard_id: &str) -> Result<Vec<String>, Error> {
        let mut out: Vec<String> = self
            .list(stream_arn)
            .await?
            .into_iter()
            .filter(|(_, parents)| parents.iter().any(|p| p == shard_id))
            .map(|(child, _)| child)
            .collect();
        out.sort();
        Ok(out)
    }

    async fn read_range(
        &self,
        stream_arn: &str,
        shard_id: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<LogRead>, Error> {
        if digits(to).is_none() {
            return Err(Error::bad_request(
                "invalid_sequence",
                "the range's end is no sequence number",
            ));
        }
        let mut out = Vec::new();
        let walk = Walk {
            start: Some((ShardIteratorType::AtSequenceNumber, from)),
            limit: None,
            calls: READ_RANGE_CALLS,
            rest_after: None,
        };
        let end = self
            .walk(stream_arn, shard_id, walk, |r: LogRead| {
                if after(&r.sequence, to) {
                    return true;
                }
                out.push(r);
                false
            })
            .await?;
        if end == WalkEnd::OutOfCalls {
            return Err(Error::internal(
                "reading a given-up range",
                format_args!("{shard_id}: its end {to} not met in {READ_RANGE_CALLS} reads"),
            ));
        }
        Ok(out)
    }

    async fn next_records(
        &self,
        stream_arn: &str,
        shard_id: &str,
        from: ReadFrom<'_>,
        n: usize,
        after_ms: i64,
    ) -> Result<NextRecords, Error> {
        let start = match from {
            ReadFrom::Oldest => None,
            ReadFrom::At(s) => Some((ShardIteratorType::AtSequenceNumber, s)),
            ReadFrom::After(s) => Some((ShardIteratorType::AfterSequenceNumber, s)),
        };
        let mut records = Vec::with_capacity(n);
        let walk = Walk {
            start,
            limit: Some(n),
            calls: NEXT_RECORDS_CALLS,
            rest_after: Some(after_ms),
        };
        let end = self
            .walk(stream_arn, shard_id, walk, |r| {
                records.push(r);
                records.len() >= n
            })
            .await?;
        Ok(NextRecords {
            records,
            ended: end == WalkEnd::ShardEnd,
            rest_after: matches!(end, WalkEnd::RestAfter | WalkEnd::Tip),
        })
    }
}

/// How [`KinesisLog::walk`] reads.
struct Walk<'a> {
    /// Where: a sequence number, or `None` for the shard's oldest record.
    start: Option<(ShardIteratorType, &'a str)>,
    /// Records a call returns at most (`None`: the API's 10,000).
    limit: Option<usize>,
    /// Calls at most; then [`WalkEnd::OutOfCalls`].
    calls: u32,
    /// Stop once every record not read yet arrived after this (Unix ms):
    /// `MillisBehindLatest` says how far behind the tip the page is.
    rest_after: Option<i64>,
}

/// Where [`KinesisLog::walk`] stopped.
#[derive(Debug, PartialEq, Eq)]
enum WalkEnd {
    /// Its visitor said so.
    Stopped,
    /// At the shard's newest record: an empty page, `MillisBehindLatest` 0.
    Tip,
    /// Every record after the page arrived after [`Walk::rest_after`].
    RestAfter,
    /// At the end of a closed shard.
    ShardEnd,
    /// [`Walk::calls`] made.
    OutOfCalls,
}

impl KinesisLog {
    /// Reads shard `shard_id` as `walk` says, one `GetRecords` call at a
    /// time, a pause apart (a shard serves five reads a second, shared with
    /// the event source), handing each record to `visit` until it answers
    /// `true`, or the walk ends otherwise ([`WalkEnd`]).
    async fn walk(
        &self,
        stream_arn: &str,
        shard_id: &str,
        walk: Walk<'_>,
        mut visit: impl FnMut(LogRead) -> bool + Send,
    ) -> Result<WalkEnd, Error> {
        let call = self
            .client
            .get_shard_iterator()
            .stream_arn(stream_arn)
            .shard_id(shard_id);
        let call = match walk.start {
            Some((kind, seq)) => call.shard_iterator_type(kind).starting_sequence_number(seq),
            None => call.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        let start = call
            .send()
            .await
            .map_err(|e| translate("Kinesis.GetShardIterator", e))?;
        let mut iterator = start.shard_iterator;
        for n in 0..walk.calls {
            let Some(it) = iterator.take() else {
                return Ok(WalkEnd::ShardEnd);
            };
            if n > 0 {
                tokio::time::sleep(READ_PAUSE).await;
            }
            let page = self
                .client
                .get_records()
                .stream_arn(stream_arn)
                .shard_iterator(it)
                .set_limit(walk.limit.map(|n| n.min(10_000) as i32))
                .send()
                .await
                .map_err(|e| translate("Kinesis.GetRecords", e))?;
            let empty = page.records.is_empty();
            for r in page.records {
                let read = LogRead {
                    sequence: r.sequence_number,
                    arrival_ms: r
                        .approximate_arrival_timestamp
                        .and_then(|t| t.to_millis().ok())
                        .unwrap_or(0),
                    data: r.data.into_inner(),
                };
                if visit(read) {
                    return Ok(WalkEnd::Stopped);
                }
            }
            if page.next_shard_iterator.is_none() {
                return Ok(WalkEnd::ShardEnd);
            }
            let behind = page.millis_behind_latest;
            // Only an empty page says the tip is reached: a page's figure
            // is taken at its last record, and more may share its time.
            if empty && behind == Some(0) {
                return Ok(WalkEnd::Tip);
            }
            // The records after the page arrived after its last one, which
            // is `behind` ms behind the tip.
            if let (Some(after), Some(behind)) = (walk.rest_after, behind)
                && crate::clock::now_ms() - behind > after
            {
                return Ok(WalkEnd::RestAfter);
            }
            iterator = page.next_shard_iterator;
        }
        Ok(WalkEnd::OutOfCalls)
    }
}

/// A sequence number's significant digits (`None` for anything else).
fn digits(s: &str) -> Option<&str> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.trim_start_matches('0'))
}

/// Whether sequence number `a` comes after `b`, as numbers (Kinesis's are
/// decimal strings longer than any integer type, and of differing lengths);
/// anything that is not one counts as after.
fn after(a: &str, b: &str) -> bool {
    match (digits(a), digits(b)) {
        (Some(a), Some(b)) => (a.len(), a) > (b.len(), b),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::after;

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert!(after("100", "99"));
        assert!(!after("99", "100"));
        assert!(!after("0099", "99"));
        assert!(after(
            "49601189658422359378836298522902373528957594348623495187",
            "49601189658422359378836298522902373528957594348623495186"
        ));
        assert!(after("x", "1"));
    }
}
