//! One Kinesis event source mapping at work: it follows the stream's
//! shards (`ListShards`, parents before children), and per shard reads
//! with `GetRecords`, cuts batches (`BatchSize`,
//! `MaximumBatchingWindowInSeconds`) and hands each to `deliver`, waiting
//! for it before the next: one batch per shard in flight. The rules are
//! listed in the parent module; this file is their loops.

use super::KinesisSourceStats;
use super::def::KinesisSourceDef;
use super::deliver::Delivery;
use super::event::KinesisRecord;
use crate::streams::batch::Shard;
use anyhow::{Context, Result};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often a shard is read while records keep coming, and the pause
/// before a failed batch is delivered again.
pub(super) const POLL: Duration = Duration::from_millis(200);
/// How often a shard is read once a read found nothing: Lambda's rate
/// (about once a second per shard). A `GetRecords` costs kinesis-mock
/// about 20 ms of CPU: four idle shards polled at [`POLL`] kept it at a
/// fifth of a core, at this rate at 8 % (measured over 10 s); views wait
/// for a one-second batching window anyway.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// How often the shards are listed again, for a split's children.
const LIST_EVERY: Duration = Duration::from_secs(1);
/// Records asked of one `GetRecords` call.
const PAGE: i32 = 1000;

/// The state of one running mapping, shared by its shard readers.
pub(super) struct Mapping {
    pub(super) client: Client,
    pub(super) def: KinesisSourceDef,
    pub(super) delivery: Arc<Delivery>,
    pub(super) stats: Arc<KinesisSourceStats>,
}

/// A shard as `ListShards` lists it.
#[derive(Clone, Debug)]
pub(super) struct ShardInfo {
    pub(super) id: String,
    /// A split's parent, or a merge's two.
    pub(super) parents: Vec<String>,
}

/// Every shard of `stream`, open or closed, with its parent.
pub(super) async fn list_shards(client: &Client, stream: &str) -> Result<Vec<ShardInfo>> {
    let mut out = Vec::new();
    let mut next: Option<String> = None;
    loop {
        // ListShards takes the stream's name or a token, never both.
        let req = match next.take() {
            Some(token) => client.list_shards().next_token(token),
            None => client.list_shards().stream_name(stream),
        };
        let page = req.send().await.context("ListShards")?;
        for s in page.shards() {
            out.push(ShardInfo {
                id: s.shard_id().to_owned(),
                parents: [s.parent_shard_id(), s.adjacent_parent_shard_id()]
                    .into_iter()
                    .flatten()
                    .map(str::to_owned)
                    .collect(),
            });
        }
        match page.next_token {
            Some(t) => next = Some(t),
            None => break,
        }
    }
    Ok(out)
}

impl Mapping {
    /// Follows the stream until `stopped`: a reader per shard, started as
    /// shards appear.
    pub(super) async fn run(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let mut started: HashSet<String> = HashSet::new();
        let mut readers: Vec<JoinHandle<()>> = Vec::new();
        // `StartingPosition` is for the shards open when the mapping
        // starts; a shard that appears later (a split's or a merge's
        // child) is read from its beginning, as Lambda reads it.
        let mut from_oldest = self.def.from_oldest;
        loop {
            match list_shards(&self.client, &self.def.stream).await {
                Ok(shards) => {
                    let known: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
                    for shard in &shards {
                        if !started.insert(shard.id.clone()) {
                            continue;
                        }
                        // A parent no longer listed (trimmed) holds nothing
                        // to wait for; a merge's child waits for both.
                        let parents: Vec<String> = shard
                            .parents
                            .iter()
                            .filter(|p| known.contains(p.as_str()))
                            .cloned()
                            .collect();
                        readers.push(tokio::spawn(self.clone().read_shard(
                            shard.id.clone(),
                            parents,
                            from_oldest,
                            stopped.clone(),
                        )));
                    }
                    from_oldest = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listing the views stream's shards failed; retrying")
                }
            }
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(LIST_EVERY) => {}
            }
        }
        for r in readers {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
    }

    fn finished(&self, shard: &str) -> bool {
        self.stats
            .finished
            .lock()
            .map(|f| f.iter().any(|s| s == shard))
            .unwrap_or(false)
    }

    /// Reads one shard to its end (or until `stopped`, while it is open),
    /// delivering its batches one at a time; a child first waits until
    /// its parents are finished. With nothing read yet, from its oldest
    /// record if `from_oldest`, else from its newest.
    async fn read_shard(
        self: Arc<Self>,
        shard: String,
        parents: Vec<String>,
        from_oldest: bool,
        mut stopped: watch::Receiver<bool>,
    ) {
        for p in &parents {
            while !self.finished(p) {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        }
        if let Ok(mut shards) = self.stats.shards.lock() {
            shards.push((shard.clone(), parents));
        }
        let size = self.def.batch_size.max(1) as usize;
        let window = self.def.batching_window;
        let mut reader = Reader {
            client: &self.client,
            stream: &self.def.stream,
            shard: &shard,
            from_oldest,
            iterator: None,
            last: None,
            ended: false,
        };
        let mut buffer: VecDeque<KinesisRecord> = VecDeque::new();
        // When the oldest record now waiting was read: the batching window
        // runs from there.
        let mut waiting_since: Option<Instant> = None;
        loop {
            if *stopped.borrow() {
                return;
            }
            let mut got = 0;
            if !reader.ended && buffer.len() < size {
                match reader.page().await {
                    Ok(records) => {
                        got = records.len();
                        // Counted before the read position moves, so that
                        // `drained` never sees the position without the
                        // records in flight.
                        let n = records.len() as u64;
                        self.stats.outstanding.fetch_add(n, Ordering::SeqCst);
                        self.stats.read.fetch_add(n, Ordering::SeqCst);
                        buffer.extend(records);
                        if let (Some(seq), Ok(mut read)) = (&reader.last, self.stats.read_to.lock())
                        {
                            read.insert(shard.clone(), seq.clone());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "reading the views stream failed; retrying");
                    }
                }
            }
            if !buffer.is_empty() && waiting_since.is_none() {
                waiting_since = Some(Instant::now());
            }
            let paused = self.stats.paused.load(Ordering::Relaxed);
            let due = waiting_since.is_some_and(|t| t.elapsed() >= window);
            if !paused && !buffer.is_empty() && (buffer.len() >= size || reader.ended || due) {
                let n = size.min(buffer.len());
                let batch: Vec<KinesisRecord> = buffer.drain(..n).collect();
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                let at = Shard {
                    id: &shard,
                    upcoming: None,
                };
                self.delivery.deliver(&at, batch).await;
                // What is left was read while the batch was out: its window
                // starts now.
                waiting_since = (!buffer.is_empty()).then(Instant::now);
                continue;
            }
            if buffer.is_empty() && reader.ended {
                tracing::debug!(shard, "views stream shard read to its end");
                if let Ok(mut f) = self.stats.finished.lock() {
                    f.push(shard.clone());
                }
                return;
            }
            // Nothing to hand over yet: read again at once when the page
            // was full, else after a poll (or when the window closes).
            if got < PAGE as usize || buffer.len() >= size {
                let poll = if got == 0 { IDLE_POLL } else { POLL };
                let wait = match waiting_since {
                    Some(t) => poll.min(window.saturating_sub(t.elapsed())),
                    None => poll,
                };
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(wait.max(Duration::from_millis(10))) => {}
                }
            }
        }
    }
}

/// One shard's read position.
struct Reader<'a> {
    client: &'a Client,
    stream: &'a str,
    shard: &'a str,
    from_oldest: bool,
    iterator: Option<String>,
    /// The last sequence number read: where a new iterator resumes.
    last: Option<String>,
    /// The shard is closed and every record of it was read.
    ended: bool,
}

impl Reader<'_> {
    /// The next page of records (maybe none); an expired or refused
    /// iterator is replaced by one after the last record read.
    async fn page(&mut self) -> Result<Vec<KinesisRecord>> {
        let iterator = match self.iterator.take() {
            Some(it) => it,
            None => match self.new_iterator().await? {
                Some(it) => it,
                None => {
                    self.ended = true;
                    return Ok(Vec::new());
                }
            },
        };
        let page = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(PAGE)
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "GetRecords: {}",
                    aws_sdk_kinesis::error::DisplayErrorContext(&e)
                )
            })?;
        let records: Vec<KinesisRecord> = page
            .records()
            .iter()
            .map(|r| KinesisRecord::from_sdk(self.shard, r))
            .collect();
        if let Some(r) = records.last() {
            self.last = Some(r.sequence.clone());
        }
        // No next iterator: the shard is closed and read to its end.
        match page.next_shard_iterator {
            Some(next) => self.iterator = Some(next),
            None => self.ended = true,
        }
        Ok(records)
    }

    async fn new_iterator(&self) -> Result<Option<String>> {
        let req = self
            .client
            .get_shard_iterator()
            .stream_name(self.stream)
            .shard_id(self.shard);
        let req = match &self.last {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq),
            None if self.from_oldest => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
            None => req.shard_iterator_type(ShardIteratorType::Latest),
        };
        let out = req.send().await.map_err(|e| {
            anyhow::anyhow!(
                "GetShardIterator: {}",
                aws_sdk_kinesis::error::DisplayErrorContext(&e)
            )
        })?;
        Ok(out.shard_iterator)
    }
}
