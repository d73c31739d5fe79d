//! One event source mapping at work: it follows the stream's real shards
//! (parents before children), reads each with `GetRecords`, routes its
//! records to the shard's lanes (virtual shards, `lanes`), and runs one
//! worker per lane that cuts batches (`BatchSize`,
//! `MaximumBatchingWindowInSeconds`) and hands them to `deliver`, lanes
//! side by side. The rules are listed in the parent module; this file is
//! their loops.

use super::StreamSourceStats;
use super::batch::Shard;
use super::deliver::Delivery;
use super::event::sequence;
use super::lanes::{Lane, Layout, POLL, Router};
use anyhow::{Context, Result};
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the stream is described again, for new shards.
const DESCRIBE_EVERY: Duration = Duration::from_secs(5);
/// Records asked of one `GetRecords` call (its limit).
const PAGE: i32 = 1000;

/// The state of one running mapping, shared by its shard readers; built
/// by [`super::spawn`].
pub(super) struct Mapping {
    pub(super) client: Client,
    pub(super) stream_arn: String,
    /// `StartingPosition` is `TRIM_HORIZON` (else `LATEST`), for the shards
    /// open when it starts.
    pub(super) from_oldest: bool,
    pub(super) layout: Layout,
    pub(super) delivery: Arc<Delivery>,
    pub(super) stats: Arc<StreamSourceStats>,
}

/// A shard as `DescribeStream` lists it.
#[derive(Clone, Debug)]
struct ShardInfo {
    id: String,
    parent: Option<String>,
}

impl Mapping {
    /// Follows the stream until `stopped`: a poller per shard, started as
    /// shards appear.
    pub(super) async fn run(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        let mut started: HashSet<String> = HashSet::new();
        let finished: Arc<Mutex<HashSet<String>>> = Arc::default();
        let mut pollers: Vec<JoinHandle<()>> = Vec::new();
        // `StartingPosition` is for the shards open when the mapping
        // starts; a shard that appears later (a child) is read from its
        // beginning, as Lambda reads it.
        let mut from_oldest = self.from_oldest;
        loop {
            match self.shards().await {
                Ok(shards) => {
                    let known: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
                    for shard in &shards {
                        if started.contains(&shard.id) {
                            continue;
                        }
                        // Children wait for a parent still listed (Lambda
                        // reads a parent to its end first).
                        let parent = shard.parent.clone().filter(|p| known.contains(p.as_str()));
                        started.insert(shard.id.clone());
                        pollers.push(tokio::spawn(self.clone().poll_shard(
                            shard.clone(),
                            parent,
                            from_oldest,
                            finished.clone(),
                            stopped.clone(),
                        )));
                    }
                    from_oldest = true;
                }
                Err(e) => tracing::warn!(error = %e, "describing the stream failed; retrying"),
            }
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(DESCRIBE_EVERY) => {}
            }
        }
        for p in pollers {
            let _ = tokio::time::timeout(Duration::from_secs(5), p).await;
        }
    }

    async fn shards(&self) -> Result<Vec<ShardInfo>> {
        let mut out = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let d = self
                .client
                .describe_stream()
                .stream_arn(&self.stream_arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await
                .context("DescribeStream")?;
            let Some(desc) = d.stream_description else {
                break;
            };
            for s in desc.shards() {
                if let Some(id) = s.shard_id() {
                    out.push(ShardInfo {
                        id: id.to_owned(),
                        parent: s.parent_shard_id().map(str::to_owned),
                    });
                }
            }
            match desc.last_evaluated_shard_id {
                Some(id) => start = Some(id),
                None => break,
            }
        }
        Ok(out)
    }

    /// Reads one real shard to its end (or forever, while it is open),
    /// routing its records to its lanes, whose workers hand them to the
    /// function; done when every lane delivered all it was given.
    async fn poll_shard(
        self: Arc<Self>,
        shard: ShardInfo,
        parent: Option<String>,
        from_oldest: bool,
        finished: Arc<Mutex<HashSet<String>>>,
        mut stopped: watch::Receiver<bool>,
    ) {
        if let Some(p) = &parent {
            while !finished.lock().map(|f| f.contains(p)).unwrap_or(true) {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        }
        let mut router = Router::new(self.layout.clone(), &shard.id);
        let workers: Vec<JoinHandle<()>> = router
            .lanes()
            .iter()
            .map(|lane| {
                tokio::spawn(run_lane(
                    self.delivery.clone(),
                    self.layout.clone(),
                    shard.id.clone(),
                    lane.clone(),
                    stopped.clone(),
                ))
            })
            .collect();
        let ended = self
            .read_shard(&shard.id, from_oldest, &mut router, &mut stopped)
            .await;
        router.close();
        for w in workers {
            let _ = w.await;
        }
        if ended && let Ok(mut f) = finished.lock() {
            f.insert(shard.id.clone());
        }
    }

    /// Reads `shard` into `router` until it ends (`true`) or `stopped`.
    async fn read_shard(
        &self,
        shard: &str,
        from_oldest: bool,
        router: &mut Router,
        stopped: &mut watch::Receiver<bool>,
    ) -> bool {
        let mut iterator = None;
        let mut last: Option<String> = None;
        loop {
            if *stopped.borrow() {
                return false;
            }
            if iterator.is_none() {
                match self.iterator(shard, last.as_deref(), from_oldest).await {
                    Ok(None) => return true,
                    Ok(it) => iterator = it,
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "GetShardIterator failed; retrying");
                        tokio::time::sleep(POLL).await;
                        continue;
                    }
                }
            }
            let page = self
                .client
                .get_records()
                .shard_iterator(iterator.clone().unwrap_or_default())
                .limit(PAGE)
                .send()
                .await;
            let full = match page {
                Ok(page) => {
                    iterator = page.next_shard_iterator.clone();
                    let got = page.records.unwrap_or_default();
                    let n = got.len();
                    if let Some(seq) = got.last().and_then(sequence) {
                        last = Some(seq.to_owned());
                    }
                    // Counted before they are routed and before the read
                    // position moves, so that `caught_up` never sees the
                    // position without the records in flight.
                    self.stats.outstanding.fetch_add(n as u64, Ordering::SeqCst);
                    for record in got {
                        if let Some(opened) = router.route(record)
                            && let Ok(mut shards) = self.stats.shards.lock()
                        {
                            shards.push(opened);
                        }
                    }
                    if let (Some(seq), Ok(mut read)) = (&last, self.stats.read.lock()) {
                        match read.iter_mut().find(|(s, _)| s == shard) {
                            Some(entry) => entry.1 = seq.clone(),
                            None => read.push((shard.to_owned(), seq.clone())),
                        }
                    }
                    if iterator.is_none() {
                        return true;
                    }
                    n >= PAGE as usize
                }
                Err(e) => {
                    // An expired or refused iterator: start again after the
                    // last record read.
                    tracing::warn!(shard, error = %aws_sdk_dynamodbstreams::error::DisplayErrorContext(&e), "GetRecords failed; retrying");
                    iterator = None;
                    false
                }
            };
            if !full {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return false,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        }
    }

    /// With nothing read yet (`after` none), from the shard's oldest record
    /// if `from_oldest`, else from its newest.
    async fn iterator(
        &self,
        shard: &str,
        after: Option<&str>,
        from_oldest: bool,
    ) -> Result<Option<String>> {
        let mut req = self
            .client
            .get_shard_iterator()
            .stream_arn(&self.stream_arn)
            .shard_id(shard);
        req = match after {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
            None if from_oldest => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
            None => req.shard_iterator_type(ShardIteratorType::Latest),
        };
        Ok(req.send().await.context("GetShardIterator")?.shard_iterator)
    }
}

/// One lane's worker: its batches, one virtual shard after another, each
/// delivered to its end before the next is cut, until the lane ends or
/// the mapping stops.
pub(super) async fn run_lane(
    delivery: Arc<Delivery>,
    layout: Layout,
    real: String,
    lane: Arc<Lane>,
    mut stopped: watch::Receiver<bool>,
) {
    let size = delivery.source.def.batch_size.max(1) as usize;
    let window = Duration::from_secs(delivery.source.def.batching_window_secs.into());
    let stats = delivery.stats.clone();
    let index = lane.index;
    let paused = move || stats.paused.load(Ordering::Relaxed) || stats.lane_held(index);
    while let Some(batch) = lane.next_batch(size, window, &paused, &mut stopped).await {
        let id = layout.shard_id(&real, lane.index, batch.generation);
        let generation = batch.generation;
        let upcoming = |n| lane.upcoming(generation, n);
        let shard = Shard {
            id: &id,
            upcoming: Some(&upcoming),
        };
        delivery.deliver(&shard, batch.records).await;
    }
}
