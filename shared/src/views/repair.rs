//! Repairs: a range of a views-log shard that Lambda gave up on, counted
//! once, from the invocation record Lambda sent to the OnFailure queue
//! ([`GivenUp`], read in `given_up`).
//!
//! # Why a repair is needed
//!
//! Lambda goes on past a batch that ran out of retries or grew older than
//! `MaximumRecordAgeInSeconds`, and sends an invocation record naming it
//! (`KinesisBatchInfo`: stream, shard, first and last sequence numbers) to
//! the OnFailure destination. The shard's later batches move its
//! checkpoint past the range, so handing the range to the aggregator again
//! counts nothing; and views have no truth table to recount from.
//!
//! # Why it is exact
//!
//! Part of the range may have been counted after all: the records below
//! the point where a batch was handed back, or all of it (an invocation
//! that did its work and lost its answer before Lambda gave up), and
//! copies of a record (one event id) on the shard, its parents or its
//! children, or in another given-up range. Each was counted by a
//! transaction that also wrote its event id into a seen partition (the
//! shard's, or the one all repairs of the shard share), and seen items are
//! kept a day past the stream's 24 hours. So a repair:
//!
//! 1. waits until no invocation of the batch can still be running
//!    ([`super::ViewsConfig::repair_after`] after the record's
//!    `timestamp`): a late transaction of one could count a part after
//!    the repair looked;
//! 2. reads the range back from the log (`GetShardIterator` at its first
//!    sequence number, `GetRecords` to its last);
//! 3. waits until every record that may be a copy of one of the range's
//!    (arrived up to the dedup window, and the arrival skew, after its
//!    last) is done with: applied by the aggregator of the shard or of
//!    its children, as their checkpoints show (a few records read past
//!    each), or past the event source's `MaximumRecordAgeInSeconds`
//!    ([`super::ViewsConfig::max_record_age`]) and an invocation's time,
//!    so given up to ranges of their own. A copy applied after the repair
//!    looked would not see the repair's ids;
//! 4. reads the event ids counted on the shard, its parents and
//!    grandparents, children and grandchildren, and by the repairs of
//!    their other ranges, by chunks whose newest record arrived from the
//!    dedup window before the range's first record to [`LATE_CHUNK_MS`]
//!    past the window after its last;
//! 5. applies the parts whose ids are not among them, each id once,
//!    through the same core as the aggregator, under a checkpoint and a
//!    writer of its own
//!    ([`keys::views_repair_source`]) and the shard's repairs' seen
//!    partition ([`keys::views_repairs_seen_source`]): a repair invoked
//!    again (a lost answer, its deadline, an operator unsure) goes on from
//!    its checkpoint and counts nothing twice.
//!
//! A wait is an error, `repair_too_early`, that writes nothing: invoke
//! the repair again later (the OnFailure queue, an event source of the
//! function, delivers its message again: `crate::triggers`). Malformed
//! records count nothing, as in the aggregator; a record of a newer
//! format than this version reads stops
//! the repair below it (`failed_from`, not `complete`): invoke it again
//! once an aggregator that reads it is deployed. Its views are in
//! `ViewsApplied`, as the aggregator's are.
//!
//! # Limits
//!
//! * Records past the stream's retention (24 hours after they arrived) are
//!   gone: the outcome says how many the record named and how many were
//!   found.
//! * Repairs of one stream run one at a time (a lease; another answers
//!   `repair_in_progress`): two at once would not see each other's ids.
//! * A chunk's seen item is sorted by its newest record's arrival, so a
//!   copy counted in a chunk spanning more than [`LATE_CHUNK_MS`] of
//!   arrivals is not found (a backlog an hour deep on a quiet shard).
//! * Each repair's checkpoint item stays, and its writer's items on the
//!   reels it counted, which readers sum with the others until compaction
//!   folds them (its writer is sealed once it completes).

use super::aggregate::{ViewAggregator, ViewPlanning};
use super::chunk::{Part, parts, record_seq};
pub use super::given_up::{GivenUp, QueuedRanges, batch_item_failures};
use super::record::{self, Decoded, ViewRecord};
use super::seen::ARRIVAL_SKEW_MS;
use super::throttle::read_retrying;
use crate::aggregate::core::{self, Planner};
use crate::aggregate::records::SequenceNumber;
use crate::error::Error;
use crate::keys;
use crate::store::{LogRead, LogStore, ReadFrom, ViewStore};
use serde::Serialize;
use std::collections::HashSet;
use std::time::Instant;

/// How far past the dedup window after a range's last record a chunk that
/// counted a copy of one of its records may have its newest record.
pub const LATE_CHUNK_MS: i64 = 3_600_000;

/// What one invocation of a repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepairOutcome {
    /// Records the invocation record named (`batchSize`).
    pub named: Option<u64>,
    /// Records of the range the log still holds.
    pub found: usize,
    /// Parts (a record's up to 40 reels each) left out: counted before this
    /// invocation (by the aggregators of the shard and of the shards around
    /// it, by a repair of another range, or by an earlier invocation of
    /// this one), or copies of another part of the range.
    pub counted_before: usize,
    /// Parts this invocation counted.
    pub applied_now: usize,
    /// Views in those parts.
    pub views_now: u64,
    /// Every part of the range found is counted; otherwise invoke the
    /// repair again with the same record (see `failed_from`).
    pub complete: bool,
    /// Where this invocation stopped (its deadline, its retries).
    pub failed_from: Option<String>,
}

impl<S: ViewStore, L: LogStore> ViewAggregator<S, L> {
    /// Counts once what of `range` was not counted (see the module notes).
    pub async fn repair(
        &self,
        range: &GivenUp,
        deadline: Option<Instant>,
    ) -> Result<RepairOutcome, Error> {
        let stream_arn = &range.stream_arn;
        // An invocation of the batch may still be running (up to the
        // function's timeout after the give-up, plus a request in flight):
        // a transaction of it landing after the seen items were read
        // would count a part the repair counts too.
        let not_before = range.given_up_ms + self.config.repair_after.as_millis() as i64;
        let now = crate::clock::now_ms();
        if now < not_before {
            return Err(too_early(format!(
                "a repair starts VIEWS_REPAIR_AFTER_SECS ({} s) after the give-up, when no invocation of the batch can still run: invoke it again in {} s",
                self.config.repair_after.as_secs(),
                (not_before - now + 999) / 1000
            )));
        }
        // Keys are derived from the stream's ARN: another stream's (or a
        // mistyped) ARN would find nothing counted, and count it all.
        if let Some(ours) = &self.config.stream
            && !same_stream(ours, stream_arn)
        {
            return Err(Error::bad_request(
                "invalid_invocation_record",
                format!("streamArn {stream_arn} is not this aggregator's stream ({ours})"),
            ));
        }
        // One repair at a time: two would not see each other's ids. The
        // lease lapses a minute past this invocation's deadline (its last
        // transaction landed by then), should it not be given back.
        let lease = keys::views_repair_lease_key(stream_arn);
        let holder = lease_holder();
        let runs_for = deadline.map_or(LEASE_WITHOUT_DEADLINE, |d| {
            d.saturating_duration_since(Instant::now())
        });
        let until = now + runs_for.as_millis() as i64 + LEASE_MARGIN_MS;
        if !self.store.take_lease(&lease, &holder, now, until).await? {
            return Err(Error::bad_request(
                "repair_in_progress",
                "another repair of this stream is running (one at a time): invoke this one again once it is done",
            ));
        }
        let result = self.repair_held(range, deadline, now).await;
        if let Err(e) = self.store.release_lease(&lease, &holder).await {
            // It lapses by itself.
            tracing::warn!(error = %e, "could not give the repair lease back");
        }
        result
    }

    /// [`Self::repair`] once its lease is held.
    async fn repair_held(
        &self,
        range: &GivenUp,
        deadline: Option<Instant>,
        now: i64,
    ) -> Result<RepairOutcome, Error> {
        let GivenUp {
            stream_arn,
            shard_id,
            ..
        } = range;
        let reads = self
            .log
            .read_range(stream_arn, shard_id, &range.start, &range.end)
            .await?;
        let batch = record::batch_of(stream_arn, shard_id, &reads);
        if let Some(newer) = &batch.newer {
            crate::metrics::Record::of("aggregate-views")
                .count("ViewRecordsNewerFormat", batch.newer_format as u64);
            tracing::error!(shard = %shard_id, from = %newer, records = batch.newer_format, "a given-up views range holds records of a newer format than this aggregator reads: counted up to the first, the rest left for a repair by an aggregator that reads them");
        }
        let mut out = RepairOutcome {
            named: range.batch_size,
            found: reads.len(),
            ..RepairOutcome::default()
        };
        let arrivals = batch.records.iter().map(|r| r.arrival_ms);
        let (Some(first), Some(last)) = (arrivals.clone().min(), arrivals.max()) else {
            // Nothing this version reads below a record of a newer format:
            // left whole for a repair by an aggregator that reads it.
            out.failed_from = batch.newer.clone();
            out.complete = out.failed_from.is_none();
            return Ok(out);
        };
        // Every record that may be a copy of one of the range's (arrived
        // within the window after it) must have been applied by the
        // shard's aggregator, or its children's, before the repair looks:
        // one applied later would not see the repair's ids.
        let window = self.config.dedup_window.as_millis() as i64;
        let bound = last + window + ARRIVAL_SKEW_MS;
        if now < bound {
            return Err(too_early(format!(
                "copies of the range's records may still arrive: invoke it again in {} s",
                (bound - now + 999) / 1000
            )));
        }
        if let Some(why) = self.live_behind(range, bound, deadline).await? {
            return Err(too_early(why));
        }
        let all = parts(&batch.records);
        let ids: HashSet<u64> = all.iter().filter_map(|p| p.id).collect();
        let counted = self
            .counted_around(range, first, last, &ids, deadline)
            .await?;
        // Unreadable records (no id) count nothing, as in the aggregator;
        // a copy within the range counts once.
        let mut fresh: Vec<Part> = Vec::new();
        let mut taken = HashSet::new();
        for p in all {
            match p.id {
                Some(id) if !counted.contains(&id) && taken.insert(id) => fresh.push(p),
                Some(_) => out.counted_before += 1,
                None => {}
            }
        }
        self.register_viewed(&fresh).await?;
        let name = keys::views_repair_source(shard_id, &range.start);
        let mut planning = ViewPlanning::new(
            self,
            shard_id,
            keys::views_writer(stream_arn, &name),
            keys::views_seen_key(stream_arn, &keys::views_repairs_seen_source(shard_id)),
            deadline,
        );
        // Its views go to `ViewsApplied` below, not through the instance's
        // total (which the batches' entry point reads around each batch).
        planning.instance_views = false;
        let key = keys::views_checkpoint_key(stream_arn, &name);
        let before = planning.checkpoint(&key).await?;
        let run = core::run(&planning, &self.backoff, &key, &fresh, deadline).await;
        // Views counted are counted views, repaired or not: what
        // `ViewsAccepted` adds up to (flushed by the entry point).
        crate::metrics::Record::of("aggregate-views").count(
            "ViewsApplied",
            planning.views.load(std::sync::atomic::Ordering::Relaxed),
        );
        let (run, after) = run?;
        let within =
            |p: &&Part, k: &Option<SequenceNumber>| k.as_ref().is_some_and(|k| p.seq <= *k);
        out.views_now = fresh
            .iter()
            .filter(|p| within(p, &after) && !within(p, &before))
            .flat_map(|p| p.views.iter().map(|(_, n)| u64::from(*n)))
            .sum();
        out.applied_now = run.applied;
        out.failed_from = run.failed_from.map(|s| record_seq(&s));
        if out.failed_from.is_none() {
            // Left for a repair by an aggregator that reads its format:
            // what lies below it is counted, and that repair goes on from
            // this one's checkpoint.
            out.failed_from = batch.newer.clone();
        }
        out.complete = out.failed_from.is_none() && fresh.iter().all(|p| within(&p, &after));
        if out.complete {
            // Invoked again it counts nothing: its writer is done, and
            // compaction may fold its items ([`super::compact`]). Not
            // sealed now, it stays a live writer until the repair is
            // invoked again: only the reads are longer.
            let writer = keys::views_writer(stream_arn, &name);
            if let Err(e) = self.store.seal(&writer, now).await {
                tracing::warn!(error = %e, "could not seal a completed repair's writer");
            }
        }
        Ok(out)
    }

    /// Why the aggregators of `range`'s shard and of its children have not
    /// yet applied every record that arrived by `bound` (Unix ms) after the
    /// range; `None` once they have, or once such records are past the
    /// event source's record age (applied, or given up to ranges of their
    /// own).
    async fn live_behind(
        &self,
        range: &GivenUp,
        bound: i64,
        deadline: Option<Instant>,
    ) -> Result<Option<String>, Error> {
        let now = crate::clock::now_ms();
        let done_by =
            bound + (self.config.max_record_age + self.config.repair_after).as_millis() as i64;
        if now >= done_by {
            return Ok(None);
        }
        let wait = |why: String| {
            Ok(Some(format!(
                "{why}: invoke the repair again once it has caught up, or after {} s",
                (done_by - now + 999) / 1000
            )))
        };
        let arn = &range.stream_arn;
        let end = SequenceNumber::parse_kinesis(&range.end);
        let mut shards = vec![(range.shard_id.clone(), end)];
        let mut looked: HashSet<String> = HashSet::new();
        while let Some((shard, floor)) = shards.pop() {
            // A merged child is met from both its parents.
            if !looked.insert(shard.clone()) {
                continue;
            }
            if looked.len() > MAX_SHARDS_LOOKED {
                return Err(Error::internal(
                    "repairing a views range",
                    format_args!(
                        "more than {MAX_SHARDS_LOOKED} shards followed {}",
                        range.shard_id
                    ),
                ));
            }
            if deadline.is_some_and(|d| Instant::now() + core::DEADLINE_SAFETY >= d) {
                return wait("the look at the aggregators' progress ran out of time".into());
            }
            let checkpoint_key = keys::views_checkpoint_key(arn, &shard);
            let applied = read_retrying(&self.read_backoff, deadline, "GetItem", || {
                self.store.view_checkpoint(&checkpoint_key)
            })
            .await?
            .seq
            .and_then(|c| SequenceNumber::parse_kinesis(&c));
            // The first record that may not be applied whole: the
            // checkpoint's own (a record's later parts may be pending),
            // else the one after the range, else the shard's first.
            let at = applied
                .as_ref()
                .and_then(|a| SequenceNumber::parse_kinesis(&record_seq(a.padded())));
            let text;
            let from = match (&at, &floor) {
                (Some(a), Some(f)) if a <= f => {
                    text = f.as_reported().to_owned();
                    ReadFrom::After(&text)
                }
                (Some(a), _) => {
                    text = a.as_reported().to_owned();
                    ReadFrom::At(&text)
                }
                (None, Some(f)) => {
                    text = f.as_reported().to_owned();
                    ReadFrom::After(&text)
                }
                (None, None) => ReadFrom::Oldest,
            };
            let next = self
                .log
                .next_records(arn, &shard, from, PENDING_LOOKAHEAD, bound)
                .await?;
            // A record of a newer format cannot be told applied or not by
            // its parts: taken as pending (a copy of one of the range's
            // records may be in it, to be counted by a newer aggregator).
            let pending = next.records.iter().find(|r| {
                matches!(ViewRecord::read(&r.data), Decoded::Newer(_))
                    || last_part(arn, &shard, r)
                        .is_some_and(|p| applied.as_ref().is_none_or(|a| *a < p))
            });
            if pending.is_some_and(|r| r.arrival_ms <= bound) {
                return wait(format!(
                    "the aggregator of shard {shard} has not applied the records that arrived within the dedup window after the range (those that may be copies of its records)"
                ));
            }
            // Nothing pending among the records read: past them, every
            // record arrived after the bound, or the shard ended; else
            // (records without parts only, or the calls ran out) unknown.
            let known = pending.is_some()
                || next.ended
                || next.rest_after
                || next.records.last().is_some_and(|r| r.arrival_ms > bound);
            if !known {
                return wait(format!(
                    "shard {shard}'s records past its checkpoint could not be told apart"
                ));
            }
            for child in self.log.children(arn, &shard).await? {
                shards.push((child, None));
            }
        }
        Ok(None)
    }

    /// The event ids counted on `range`'s shard, its parents and
    /// grandparents, and its children and grandchildren (by their
    /// aggregators, and by repairs of other ranges), by chunks whose newest
    /// record arrived from the dedup window before `first` to
    /// [`LATE_CHUNK_MS`] past the window after `last` (arrival times, Unix
    /// ms).
    async fn counted_around(
        &self,
        range: &GivenUp,
        first: i64,
        last: i64,
        ids: &HashSet<u64>,
        deadline: Option<Instant>,
    ) -> Result<HashSet<u64>, Error> {
        let (arn, shard_id) = (&range.stream_arn, &range.shard_id);
        let mut shards = vec![shard_id.to_owned()];
        shards.extend(self.ancestors(arn, shard_id).await?);
        for child in self.log.children(arn, shard_id).await? {
            shards.extend(self.log.children(arn, &child).await?);
            shards.push(child);
        }
        let window = self.config.dedup_window.as_millis() as i64;
        let from = keys::views_seen_from(first - window - ARRIVAL_SKEW_MS);
        let to = keys::views_seen_from(last + window + LATE_CHUNK_MS + 1);
        // Only the range's ids are kept: an hour of a busy shard's ids
        // would not fit a function's memory.
        let mut counted = HashSet::new();
        for shard in &shards {
            for source in [shard.clone(), keys::views_repairs_seen_source(shard)] {
                let key = keys::views_seen_key(arn, &source);
                let items = read_retrying(&self.read_backoff, deadline, "Query", || {
                    self.store.seen_between(&key, &from, &to)
                })
                .await?;
                for item in items {
                    counted.extend(item.ids.into_iter().filter(|id| ids.contains(id)));
                }
            }
        }
        Ok(counted)
    }
}

/// The sequence number of `read`'s last part (of shard `shard` of `arn`):
/// where the checkpoint stands once the record is applied whole; `None`
/// for a record without parts (no views), which counts nothing.
fn last_part(arn: &str, shard: &str, read: &LogRead) -> Option<SequenceNumber> {
    let batch = record::batch_of(arn, shard, std::slice::from_ref(read));
    parts(&batch.records).last().map(|p| p.seq.clone())
}

/// Records of a shard the gate reads past its checkpoint or the range:
/// records without parts (never written by the view function) are passed
/// over, up to this many.
const PENDING_LOOKAHEAD: usize = 4;

/// How long past its invocation's deadline a repair's lease lapses.
const LEASE_MARGIN_MS: i64 = 60_000;

/// How long a repair without a deadline (not in Lambda) holds its lease:
/// Lambda's longest function timeout.
const LEASE_WITHOUT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(900);

/// A lease holder's name, unique among every instance's: the standard
/// library's per-process random keys (from the OS) and a counter.
fn lease_holder() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(fastrand::u64(..));
    format!("{:016x}", h.finish())
}

/// Shards a repair follows from its range's, children of children
/// included, before it gives up (a stream resharded over and over).
const MAX_SHARDS_LOOKED: usize = 64;

/// The `repair_too_early` error: nothing was written; invoke it again.
fn too_early(why: String) -> Error {
    Error::bad_request("repair_too_early", why)
}

/// Whether `arn` is the stream configured as `ours` (`VIEWS_STREAM`: an
/// ARN, or a name).
fn same_stream(ours: &str, arn: &str) -> bool {
    if ours.starts_with("arn:") {
        ours == arn
    } else {
        arn.rsplit_once(":stream/")
            .is_some_and(|(_, name)| name == ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_named_by_its_arn_or_its_name() {
        let arn = "arn:aws:kinesis:us-east-2:123456789012:stream/views";
        assert!(same_stream(arn, arn));
        assert!(same_stream("views", arn));
        assert!(!same_stream("other", arn));
        assert!(!same_stream(
            "arn:aws:kinesis:us-east-2:123456789012:stream/other",
            arn
        ));
    }
}
