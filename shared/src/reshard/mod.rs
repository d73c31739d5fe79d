//! Resizing a reel's shards without losing or double counting a like, and
//! without readers ever seeing the total drop.
//!
//! # The rule
//!
//! Readers must never sum fewer shards than any writer may write to. Every
//! function instance caches a reel's settings for `SETTINGS_TTL_MS`, and a
//! request that read them may go on writing for up to `REQUEST_TIMEOUT_MS`,
//! so a change of the settings is only known everywhere after
//! [`Config::resize_wait`]. Each step below waits that long after the one
//! before.
//!
//! * Grow N → M: `Growing` raises `read_shards` to M; after the wait,
//!   `Stable` raises `write_shards` to M.
//! * Shrink M → N: `Draining` lowers `write_shards` to N; after the wait no
//!   writer touches shards ≥ N, and each is folded into the reel's base item
//!   ([`crate::keys::base_key`]) by one transaction (add its `n` and `w` to
//!   the base, subtract them from the shard and close it, conditioned on
//!   the shard still holding exactly what was read and on the settings
//!   version); then `Cleanup` lowers `read_shards` to N and checks each
//!   retired shard is still empty (a late write is folded too); then
//!   `Stable`. A grow reopens closed shards of its new write range when
//!   `Growing` ends, before `write_shards` is raised to them.
//!
//! # Closed shards
//!
//! A fold closes its shard ([`crate::keys::SHARD_CLOSED`], an empty or
//! missing one too) before `read_shards` is lowered, and a closed item is
//! never deleted (an `Update` would make a missing one live). Closing and
//! reopening are conditioned on the settings version, so no stale run
//! closes a written shard or reopens an unread one. (Earlier releases'
//! stream aggregation added to shard items and needed that fence against
//! a chunk landing late; it now writes items of its own, see
//! [`crate::aggregate`].)
//!
//! While draining, readers read the base item and the shards being folded
//! as one snapshot ([`Settings::read_items`]), so no reader sees a fold
//! half applied: the base item's `folds` counter, the shards, the counter
//! again, read again if a fold landed in between, and one
//! `TransactGetItems` only if folds keep landing. Not a transaction first:
//! writers with older settings still like the shards being folded for the
//! whole wait, and a transactional read is cancelled by any transaction in
//! flight on its items. The base item takes no likes (folding into shard
//! 0 would put live likes on it too). The other shards only ever change by
//! single like transactions, so BatchGetItem is exact for them.
//!
//! # Crash-safe and resumable
//!
//! The whole state lives in the settings item (phase, target, `fold_from`,
//! when the phase was first seen in place, a version). Every write of it is conditioned on the
//! version it read, every fold on the settings version and the shard's value,
//! and every step is idempotent, so any later invocation (the next scheduled
//! run, a retried request, a concurrent run) finishes a resize from wherever
//! the last one stopped, and two runs on one reel cannot both act on one
//! state.
//!
//! # Waits are measured from a phase seen in place
//!
//! A write of the settings item may land long after it was computed: the
//! automatic grow is started by a background task, which Lambda freezes
//! with the sandbox after the response, so its `PutItem` may be sent
//! seconds or minutes late. A phase that must wait (`Growing`, `Draining`)
//! is therefore written with `phase_at_ms` = [`UNOBSERVED`], and stamped
//! only by whoever next knows it to be in place: the writer once its put
//! has returned, or any advancer (the scheduled run) that reads it
//! unstamped, with a clock reading taken after that read. Either way the
//! stamp is no earlier than the moment the phase became visible, and the
//! stamp's own write is conditioned on the version it saw; if it is delayed
//! too, it only makes the wait longer. So no delay of any write can shorten
//! a wait.

//! # Rooms
//!
//! This file holds the state machine ([`Resharder::advance`]), the admin
//! entry points ([`begin`], [`request_grow`]) and the stray-item clearing a
//! grow needs first. `plan` computes a resize's first step, `schedule` is
//! the scheduled run with the automatic grow and shrink, and `policy` the
//! sizing rule both the run and the like path apply
//! ([`ResizeConfig::grow_target`]).

pub mod crowd;
mod plan;
mod policy;
mod schedule;

pub use policy::{request_grow, request_grow_to};
pub use schedule::RunSummary;

use crate::clock::now_ms;
use crate::config::{Config, ResizeConfig};
use crate::error::Error;
use crate::keys::ReelId;
use crate::retry::Backoff;
use crate::store::{
    CountItem, CounterStore, FoldResult, Phase, ResizeStore, RetryReason, Settings, ShardValue,
};
use plan::{Plan, entering, plan, waits};
use serde::Serialize;
use std::time::Duration;

/// A run stops starting work this long before its deadline.
const DEADLINE_SAFETY: Duration = Duration::from_secs(5);
/// Attempts of one fold before the run gives up on the reel until the next
/// run (conflicts, throttling and late writes all count).
const FOLD_MAX_ATTEMPTS: u32 = 50;
/// Settings writes one advance makes at most: a resize takes three, the
/// rest absorbs lost races with concurrent runs; past it the reel is left
/// for the next run rather than spinning.
const ADVANCE_MAX_ROUNDS: u32 = 32;

/// `phase_at_ms` of a phase that must wait but that nobody has yet seen in
/// place (see the module docs): its wait has not started.
pub const UNOBSERVED: i64 = 0;

/// What a request to resize did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Begin {
    /// The resize was started.
    Started,
    /// A resize to the same target was already in progress.
    Joined,
    /// The reel already has that many shards.
    Unchanged,
}

/// The items `next` would start summing that are not empty. No like writes
/// outside a stable reel's read range, so such an item is an outside edit,
/// a restore or a bug's: adopting it would change the count shown by what
/// it holds. Resizes never do: the reshard function clears it first
/// ([`clear_strays`]); a grow started on the like or read path, which may
/// not delete items, is not started ([`request_grow`]).
async fn strays<S: CounterStore>(
    store: &S,
    reel: &ReelId,
    cur: &Settings,
    next: &Settings,
) -> Result<Vec<(CountItem, ShardValue)>, Error> {
    let items = entering(cur, next);
    if items.is_empty() {
        return Ok(Vec::new());
    }
    Ok(store
        .count_items(reel, &items)
        .await?
        .into_iter()
        .filter(|(_, v)| *v != ShardValue::default())
        .collect())
}

/// Deletes the non-empty items `next` would start summing, each in one
/// transaction conditioned on the settings still being at `cur.version`
/// and on the item still holding what was read (the exactness rules of a
/// fold): no reader sums them under `cur`, so no count changes. `Ok(false)`:
/// something moved meanwhile; read the settings again.
async fn clear_strays<S: ResizeStore>(
    store: &S,
    reel: &ReelId,
    cur: &Settings,
    next: &Settings,
) -> Result<bool, Error> {
    for (item, seen) in strays(store, reel, cur, next).await? {
        match store.clear_stray(reel, item, seen, cur.version).await? {
            FoldResult::Folded => {
                tracing::warn!(reel = %reel, ?item, n = seen.n, w = seen.w, "cleared a non-empty item outside the read range before resizing");
            }
            other => {
                tracing::info!(reel = %reel, ?item, result = ?other, "a stray item changed while being cleared; reading again");
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The reel's settings, read consistently (bypassing every cache).
async fn read_settings<S: CounterStore>(store: &S, reel: &ReelId) -> Result<Settings, Error> {
    let mut m = store.settings(std::slice::from_ref(reel)).await?;
    Ok(m.remove(reel).unwrap_or_default())
}

/// Stamps `seen` (a phase that waits, unstamped, at version `seen.version`,
/// known to be in place: just read, or just written) with the time now,
/// which is no earlier than when it became visible. Best effort: on a lost
/// race (someone else stamped or moved it) or an error, the next advancer
/// stamps it. Returns the settings now in place if this call stamped them.
async fn stamp<S: CounterStore>(store: &S, reel: &ReelId, seen: &Settings) -> Option<Settings> {
    if !waits(seen.phase) || seen.phase_at_ms != UNOBSERVED {
        return None;
    }
    // Read after the phase was known to be in place.
    let next = Settings {
        phase_at_ms: now_ms().max(UNOBSERVED + 1),
        ..*seen
    };
    match store.put_settings(reel, seen.version, &next).await {
        Ok(true) => Some(Settings {
            version: seen.version + 1,
            ..next
        }),
        Ok(false) => None,
        Err(e) => {
            tracing::warn!(reel = %reel, error = e.code(), "could not stamp a resize phase; the next run will");
            None
        }
    }
}

/// Starts resizing `reel` to `target` shards (the admin route). Returns what
/// happened and the settings now in place.
pub async fn begin<S: ResizeStore>(
    store: &S,
    reel: &ReelId,
    target: u32,
) -> Result<(Begin, Settings), Error> {
    // Only lost races with other writers of the item loop; each re-reads.
    for _ in 0..5 {
        let cur = read_settings(store, reel).await?;
        match plan(&cur, target, now_ms())? {
            // Joining a step nobody has stamped yet (our own earlier attempt
            // whose answer was lost, say): it is in place, so stamp it.
            Plan::Keep(b) => {
                let now = stamp(store, reel, &cur).await;
                return Ok((b, now.unwrap_or(cur)));
            }
            Plan::Put(next) => {
                if !clear_strays(store, reel, &cur, &next).await? {
                    continue;
                }
                if store.put_settings(reel, cur.version, &next).await? {
                    // A stable put only registers a hand-written item.
                    let outcome = if next.phase == Phase::Stable {
                        Begin::Unchanged
                    } else {
                        tracing::info!(reel = %reel, target, phase = next.phase.as_str(), "resize started");
                        Begin::Started
                    };
                    let written = Settings {
                        version: cur.version + 1,
                        ..next
                    };
                    let now = stamp(store, reel, &written).await;
                    return Ok((outcome, now.unwrap_or(written)));
                }
            }
        }
    }
    Err(Error::Contended)
}

/// Where a reel's resize stands after [`Resharder::advance`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// No resize in progress.
    Stable(Settings),
    /// The next step is due at `due_ms` (Unix ms).
    Waiting {
        /// The reel's settings as this advance left them.
        settings: Settings,
        /// When the next step may run, in Unix milliseconds.
        due_ms: i64,
    },
    /// Stopped by the write limit (a simulated crash, for tests).
    Interrupted,
}

/// Why an advance stopped early.
enum Stop {
    Interrupted,
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e)
    }
}

enum FoldStep {
    Done,
    SettingsChanged,
}

#[derive(Default)]
struct Tally {
    steps: usize,
    completed: usize,
    folds: usize,
    deletes: usize,
}

/// Drives resizes: the state machine ([`Resharder::advance`]) and the
/// scheduled run with its automatic grow and shrink.
pub struct Resharder<S> {
    store: S,
    resize: ResizeConfig,
    wait: Duration,
    backoff: Backoff,
}

impl<S: ResizeStore> Resharder<S> {
    /// A resharder over `store`, with the resize settings of `config`.
    pub fn new(store: S, config: &Config) -> Self {
        Resharder {
            store,
            resize: config.resize.clone(),
            wait: config.resize_wait(),
            backoff: Backoff::from_config(config),
        }
    }

    /// The store it drives, for tests that inspect it.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// How long each resize step waits for the one before to be known by
    /// every function instance.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Starts a resize (see [`begin`]), refusing targets outside
    /// `1..=MAX_SHARDS`.
    pub async fn begin(&self, reel: &ReelId, target: u32) -> Result<(Begin, Settings), Error> {
        if target == 0 || target > self.resize.max_shards {
            return Err(Error::bad_request(
                "invalid_shards",
                format!(
                    "shards must be a whole number from 1 to {}",
                    self.resize.max_shards
                ),
            ));
        }
        begin(&self.store, reel, target).await
    }

    /// The reels with more than one shard or a resize in progress, most
    /// shards first: the resize index (a `Query`, never a table scan) and
    /// their settings, read consistently.
    pub async fn list(&self) -> Result<Vec<(ReelId, Settings)>, Error> {
        let reels = self.store.indexed_reels().await?;
        let settings = self.store.settings(&reels).await?;
        let mut out: Vec<(ReelId, Settings)> =
            settings.into_iter().filter(|(_, s)| s.indexed()).collect();
        out.sort_by(|a, b| {
            b.1.shards_to_sum()
                .cmp(&a.1.shards_to_sum())
                .then_with(|| a.0.cmp(&b.0))
        });
        Ok(out)
    }

    /// The reel's settings, read consistently.
    pub async fn state(&self, reel: &ReelId) -> Result<Settings, Error> {
        read_settings(&self.store, reel).await
    }

    /// Takes every step of the reel's resize that is due now.
    pub async fn advance(&self, reel: &ReelId) -> Result<Progress, Error> {
        self.advance_limited(reel, None).await
    }

    /// [`Self::advance`], stopping before the `(max_writes + 1)`-th DynamoDB
    /// write: the crash of a run at any point, for the resume tests.
    #[doc(hidden)]
    pub async fn advance_limited(
        &self,
        reel: &ReelId,
        max_writes: Option<u32>,
    ) -> Result<Progress, Error> {
        let mut limit = max_writes;
        let mut tally = Tally::default();
        match self.advance_inner(reel, &mut limit, &mut tally).await {
            Ok(p) => Ok(p),
            Err(Stop::Interrupted) => Ok(Progress::Interrupted),
            Err(Stop::Failed(e)) => Err(e),
        }
    }

    async fn advance_inner(
        &self,
        reel: &ReelId,
        limit: &mut Option<u32>,
        tally: &mut Tally,
    ) -> Result<Progress, Stop> {
        let wait_ms = self.wait.as_millis() as i64;
        let mut rounds = 0u32;
        'outer: loop {
            rounds += 1;
            if rounds > ADVANCE_MAX_ROUNDS {
                tracing::warn!(reel = %reel, "settings keep changing under the run; left for the next run");
                return Err(Stop::Failed(Error::Contended));
            }
            let cur = read_settings(&self.store, reel).await?;
            // Read after the settings were: see the module docs.
            let now = now_ms();
            if waits(cur.phase) && cur.phase_at_ms == UNOBSERVED {
                // Nobody has seen this phase in place yet (its writer's put
                // came late, or it stopped before stamping): its wait starts
                // now. Stamped or not (someone else was first), read again.
                spend(limit)?;
                let next = Settings {
                    phase_at_ms: now.max(UNOBSERVED + 1),
                    ..cur
                };
                if self.store.put_settings(reel, cur.version, &next).await? {
                    tracing::info!(reel = %reel, phase = cur.phase.as_str(), "resize phase seen in place; its wait starts");
                }
                continue;
            }
            let due_ms = cur.phase_at_ms.saturating_add(wait_ms);
            let next = match cur.phase {
                Phase::Stable => return Ok(Progress::Stable(cur)),
                _ if cur.phase != Phase::Cleanup && now < due_ms => {
                    return Ok(Progress::Waiting {
                        settings: cur,
                        due_ms,
                    });
                }
                Phase::Growing => {
                    // Read already; written only after the put below.
                    let range = cur.write_shards..cur.target;
                    if !self.store.reopen(reel, range, cur.version).await? {
                        continue 'outer;
                    }
                    Settings {
                        phase: Phase::Stable,
                        write_shards: cur.target,
                        read_shards: cur.read_shards.max(cur.target),
                        fold_from: cur.read_shards.max(cur.target),
                        phase_at_ms: now,
                        ..cur
                    }
                }
                Phase::Draining => {
                    for s in cur.write_shards..cur.fold_from {
                        if let FoldStep::SettingsChanged =
                            self.fold_shard(reel, s, cur.version, limit, tally).await?
                        {
                            continue 'outer;
                        }
                    }
                    Settings {
                        phase: Phase::Cleanup,
                        read_shards: cur.write_shards,
                        phase_at_ms: now,
                        ..cur
                    }
                }
                Phase::Cleanup => {
                    // A late write (a like that outlived the wait) is
                    // folded too; each shard is left empty and closed.
                    for s in cur.read_shards..cur.fold_from {
                        if let FoldStep::SettingsChanged =
                            self.fold_shard(reel, s, cur.version, limit, tally).await?
                        {
                            continue 'outer;
                        }
                        tally.deletes += 1;
                    }
                    Settings {
                        phase: Phase::Stable,
                        fold_from: cur.read_shards,
                        phase_at_ms: now,
                        ..cur
                    }
                }
            };
            spend(limit)?;
            if self.store.put_settings(reel, cur.version, &next).await? {
                tally.steps += 1;
                if next.phase == Phase::Stable {
                    tally.completed += 1;
                }
                tracing::info!(
                    reel = %reel,
                    from = cur.phase.as_str(),
                    to = next.phase.as_str(),
                    write_shards = next.write_shards,
                    read_shards = next.read_shards,
                    "resize step"
                );
            }
            // Applied or not (another run was first), read the new state.
        }
    }

    /// Folds shard `shard` into the base item and closes it (an empty one
    /// is only closed).
    async fn fold_shard(
        &self,
        reel: &ReelId,
        shard: u32,
        version: u64,
        limit: &mut Option<u32>,
        tally: &mut Tally,
    ) -> Result<FoldStep, Stop> {
        let mut attempts = 0u32;
        let mut backoffs = 0u32;
        loop {
            // No item: its tombstone is made (a stale chunk's ADD must not).
            let seen = self.store.shard(reel, shard).await?.unwrap_or_default();
            attempts += 1;
            if attempts > FOLD_MAX_ATTEMPTS {
                tracing::warn!(reel = %reel, shard, "fold still failing; left for the next run");
                return Err(Stop::Failed(Error::Contended));
            }
            spend(limit)?;
            match self
                .store
                .fold(reel, shard, seen, version, attempts)
                .await?
            {
                FoldResult::Folded => {
                    if seen != ShardValue::default() {
                        tally.folds += 1;
                    }
                    tracing::debug!(reel = %reel, shard, n = seen.n, w = seen.w, "folded and closed");
                    return Ok(FoldStep::Done);
                }
                FoldResult::ShardChanged => {
                    tracing::debug!(reel = %reel, shard, "shard changed under the fold; reading it again");
                }
                FoldResult::SettingsChanged => return Ok(FoldStep::SettingsChanged),
                FoldResult::Retry(reason) => {
                    backoffs += 1;
                    if !self.backoff.allows(backoffs) {
                        return Err(Stop::Failed(match reason {
                            RetryReason::Throttled => Error::Throttled,
                            _ => Error::Contended,
                        }));
                    }
                    tokio::time::sleep(self.backoff.delay(backoffs)).await;
                }
            }
        }
    }
}

fn spend(limit: &mut Option<u32>) -> Result<(), Stop> {
    match limit {
        Some(0) => Err(Stop::Interrupted),
        Some(n) => {
            *n -= 1;
            Ok(())
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_limit_simulates_a_crash() {
        let mut l = Some(1);
        assert!(spend(&mut l).is_ok());
        assert!(matches!(spend(&mut l), Err(Stop::Interrupted)));
        assert!(spend(&mut None).is_ok());
    }
}
