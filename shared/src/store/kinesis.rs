//! [`LogStore`] on Kinesis Data Streams: the views log. The only module that
//! sees the Kinesis SDK's types; its errors go through the one translation
//! ([`super::dynamodb`]'s `translate`).

use super::dynamodb::translate;
use crate::error::Error;
use crate::store::{LogPut, LogPutResult, LogStore};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use std::collections::HashMap;
use std::sync::Mutex;

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
}
