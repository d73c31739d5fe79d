//! The exactly-once core both aggregators share: the Likes table's stream
//! ([`super::Aggregator`]) and the views log ([`crate::views`]). Sources
//! differ in what a record says and what a chunk writes; the core does not:
//!
//! * a batch arrives ordered by sequence number, each record once
//!   (`Sequenced`; the sources' parsers sort and de-duplicate);
//! * the stream shard's checkpoint is read; records at or below it are
//!   skipped;
//! * the rest is cut into chunks of consecutive records, each applied by one
//!   transaction that also moves the checkpoint from the value read to the
//!   chunk's last record (the `Planner`'s write, conditioned so);
//! * a chunk refused because the checkpoint moved meanwhile is planned
//!   again from the checkpoint now; a conflict or a throttle is retried
//!   with bounded, jittered backoff, counted in
//!   [`BatchOutcome::retries`]; what cannot be applied before the deadline or
//!   within the retries is handed back to Lambda from the first record not
//!   applied (`batchItemFailures`).

use super::records::SequenceNumber;
use crate::error::Error;
use crate::retry::Backoff;
use crate::store::{ChunkResult, RetryReason};
use std::future::Future;
use std::time::{Duration, Instant};

/// An invocation stops starting chunks this long before its deadline and
/// reports the rest as failed, so Lambda sends them again.
pub const DEADLINE_SAFETY: Duration = Duration::from_secs(3);

/// What one invocation did with its batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchOutcome {
    /// Records applied now.
    pub applied: usize,
    /// Records at or below the checkpoint (applied before), and copies of
    /// a record in the batch.
    pub skipped: usize,
    /// Transactions committed.
    pub chunks: usize,
    /// Transactions retried (conflicts, throttling).
    pub retries: u32,
    /// The sequence number from which Lambda must deliver again (Lambda's
    /// `batchItemFailures`), if the batch was not applied to its end.
    pub failed_from: Option<String>,
    /// Age of the newest record applied (now minus its creation time).
    pub lag_ms: Option<i64>,
    /// Lambda delivered the records in another order than their sequence
    /// numbers', or one twice.
    pub out_of_order: bool,
}

/// A record with its place in its shard.
pub(crate) trait Sequenced {
    /// Its sequence number.
    fn seq(&self) -> &SequenceNumber;
}

/// Consecutive records applied by one transaction.
pub(crate) trait CutChunk {
    /// Its first record.
    fn first(&self) -> &SequenceNumber;
    /// Its last record: the checkpoint once it is applied.
    fn last(&self) -> &SequenceNumber;
    /// Records in it.
    fn records(&self) -> usize;
    /// When its newest record was written to the source (Unix ms).
    fn newest_ms(&self) -> Option<i64>;
}

/// What a source's aggregator tells the core: how to cut, plan and apply.
pub(crate) trait Planner: Sync {
    /// A record of the source, parsed.
    type Record: Sequenced + Clone + Send + Sync;
    /// A run of records applied together.
    type Chunk: CutChunk + Send + Sync;
    /// One chunk's transaction.
    type Write: Send + Sync;

    /// Cuts `pending` (in sequence order, none at or below the checkpoint)
    /// into chunks; `now_ms` is the aggregator's clock.
    fn cut(&self, pending: &[Self::Record], now_ms: i64) -> Vec<Self::Chunk>;

    /// The checkpoint behind `key`.
    fn checkpoint(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<SequenceNumber>, Error>> + Send;

    /// The transaction applying `chunk` on top of `checkpoint`, stamped
    /// `now`.
    fn plan(
        &self,
        key: &str,
        checkpoint: Option<&SequenceNumber>,
        chunk: &Self::Chunk,
        now: Duration,
    ) -> impl Future<Output = Result<Self::Write, Error>> + Send;

    /// Applies `write` in one transaction.
    fn apply(&self, write: &Self::Write)
    -> impl Future<Output = Result<ChunkResult, Error>> + Send;

    /// `write` was applied (its records count from now on).
    fn applied(&self, _key: &str, _write: &Self::Write) {}
}

/// Applies `records` (ordered, each once) of the shard whose checkpoint is
/// `key`, as the module notes say.
pub(crate) async fn run<P: Planner>(
    planner: &P,
    backoff: &Backoff,
    key: &str,
    records: &[P::Record],
    deadline: Option<Instant>,
) -> Result<(BatchOutcome, Option<SequenceNumber>), Error> {
    let mut out = BatchOutcome::default();
    let mut checkpoint = planner.checkpoint(key).await?;
    'batch: loop {
        let pending: Vec<P::Record> = records
            .iter()
            .filter(|r| checkpoint.as_ref().is_none_or(|k| r.seq() > k))
            .cloned()
            .collect();
        for chunk in planner.cut(&pending, crate::clock::now_ms()) {
            // Fixed for the chunk's attempts: planned again from the same
            // state, the chunk is the same transaction under the same token
            // (a replay if an attempt landed unanswered).
            let now = crate::clock::since_epoch();
            let mut attempt = 0u32;
            loop {
                if deadline.is_some_and(|d| Instant::now() + DEADLINE_SAFETY >= d) {
                    out.failed_from = Some(chunk.first().to_string());
                    return Ok((out, checkpoint));
                }
                attempt += 1;
                let write = planner.plan(key, checkpoint.as_ref(), &chunk, now).await?;
                let reason = match planner.apply(&write).await? {
                    ChunkResult::Applied => {
                        planner.applied(key, &write);
                        out.applied += chunk.records();
                        out.chunks += 1;
                        if let Some(at) = chunk.newest_ms() {
                            out.lag_ms = Some((crate::clock::now_ms() - at).max(0));
                        }
                        checkpoint = Some(chunk.last().clone());
                        break;
                    }
                    ChunkResult::CheckpointMoved => {
                        // Another invocation holds these records too (a
                        // retry that overlapped this one), or this chunk
                        // committed under an answer lost past the token's
                        // lifetime: go on from where it is now.
                        let now = planner.checkpoint(key).await?;
                        tracing::info!(checkpoint = key, from = ?checkpoint, to = ?now, "checkpoint moved under the aggregator");
                        if now == checkpoint {
                            return Err(Error::Contended);
                        }
                        checkpoint = now;
                        out.retries += 1;
                        continue 'batch;
                    }
                    // Another transaction held one of its items: its own
                    // shard's overlapping invocation, or a fold.
                    ChunkResult::Conflict => RetryReason::Conflict,
                    ChunkResult::Retry(reason) => reason,
                };
                out.retries += 1;
                if !backoff.allows(attempt) {
                    tracing::warn!(
                        checkpoint = key,
                        ?reason,
                        attempts = attempt,
                        "aggregation retries exhausted; Lambda delivers the rest again"
                    );
                    out.failed_from = Some(chunk.first().to_string());
                    return Ok((out, checkpoint));
                }
                tokio::time::sleep(backoff.delay(attempt)).await;
            }
        }
        break;
    }
    Ok((out, checkpoint))
}
