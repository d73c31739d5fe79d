//! What one caller's count reads may cost, across function instances
//! (issue 36): a read of reels no cache holds costs read units (settings,
//! shards, writer items, views), and a caller asking for 100 never-seen
//! ids at a time, from as many instances as the route reaches, would spend
//! the tables' throughput for everyone.
//!
//! # The bound
//!
//! At most `CALLER_READ_UNITS_PER_MIN` estimated read units per caller
//! (the token's user, else the source address) per UTC minute, shared by
//! every instance through one item per (caller, minute) in the counters
//! table ([`crate::keys::caller_reads_key`]). An instance adds what its
//! requests of the caller cost to that item in steps of at least
//! [`FLUSH_UNITS`] (one `UpdateItem`, which answers the minute's total),
//! so a caller who reads little costs no write at all, and a heavy one one
//! write unit per 100 read units. Once the total is past the bound, the
//! instance refuses the caller (429 `rate_limited`, until the minute ends)
//! without reading anything; other instances learn it at their next step.
//!
//! So in one minute a caller is served at most the bound, plus up to
//! [`FLUSH_UNITS`] and one request (100 reels × 4 units) per instance the
//! caller reaches: with the read function's reserved concurrency of 200,
//! 6,000 + 200 × 500 = 106,000 units in the worst case of a caller
//! spreading over every instance at once, against no bound at all before.

use crate::error::Error;
use moka::future::Cache;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Units an instance gathers for a caller before it adds them to the
/// shared item (or fewer, once they would cross the bound).
pub const FLUSH_UNITS: u64 = 100;

/// Callers one instance keeps tallies of (a few dozen bytes each).
const MAX_CALLERS: u64 = 10_000;

/// The per-caller read budget of one instance.
pub(super) struct ReadBudget {
    /// Units a minute (0: no bound).
    limit: u64,
    callers: Cache<String, Arc<Mutex<Tally>>>,
}

/// One caller's current minute, as this instance knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    /// The UTC minute (Unix ms / 60,000) counted.
    minute: i64,
    /// Units served here not yet added to the shared item.
    pending: u64,
    /// The shared item's total as last answered.
    known: u64,
}

/// A step to add to the shared item: the caller's units in `minute`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flush {
    /// The caller's key (as given to [`ReadBudget::charge`]).
    pub caller: String,
    /// The UTC minute.
    pub minute: i64,
    /// Units to add.
    pub units: u64,
}

impl ReadBudget {
    pub(super) fn new(limit: u32) -> Self {
        ReadBudget {
            limit: u64::from(limit),
            callers: Cache::builder()
                .max_capacity(MAX_CALLERS)
                .time_to_idle(Duration::from_secs(120))
                .build(),
        }
    }

    /// Refuses `caller` while the minute's shared total, as last answered
    /// here, is past the bound.
    pub(super) async fn admit(&self, caller: &str, now_ms: i64) -> Result<(), Error> {
        if self.limit == 0 {
            return Ok(());
        }
        let minute = now_ms.div_euclid(60_000);
        if let Some(t) = self.callers.get(caller).await {
            let t = *t.lock().unwrap_or_else(|p| p.into_inner());
            if t.minute == minute && t.known > self.limit {
                let left_ms = (minute + 1) * 60_000 - now_ms;
                return Err(Error::RateLimited {
                    retry_after: ((left_ms + 999) / 1000).max(1) as u32,
                });
            }
        }
        Ok(())
    }

    /// Counts `units` served to `caller`; the step to add to the shared
    /// item, once there is one.
    pub(super) async fn charge(&self, caller: &str, units: u64, now_ms: i64) -> Option<Flush> {
        if self.limit == 0 || units == 0 {
            return None;
        }
        let minute = now_ms.div_euclid(60_000);
        let entry = self
            .callers
            .get_with(caller.to_owned(), async { Arc::default() })
            .await;
        let mut t = entry.lock().unwrap_or_else(|p| p.into_inner());
        if t.minute != minute {
            *t = Tally {
                minute,
                ..Tally::default()
            };
        }
        t.pending += units;
        // Flush in steps, and at once when this instance alone would
        // take the caller past the bound (so that the others learn it).
        if t.pending >= FLUSH_UNITS || t.known + t.pending > self.limit {
            let units = std::mem::take(&mut t.pending);
            return Some(Flush {
                caller: caller.to_owned(),
                minute,
                units,
            });
        }
        None
    }

    /// The shared item's total after `flush` landed.
    pub(super) async fn flushed(&self, flush: &Flush, total: u64) {
        if let Some(entry) = self.callers.get(&flush.caller).await {
            let mut t = entry.lock().unwrap_or_else(|p| p.into_inner());
            if t.minute == flush.minute {
                t.known = t.known.max(total);
            }
        }
    }

    /// A flush that failed: its units are served anyway, and counted again
    /// with the next step.
    pub(super) async fn unflushed(&self, flush: &Flush) {
        if let Some(entry) = self.callers.get(&flush.caller).await {
            let mut t = entry.lock().unwrap_or_else(|p| p.into_inner());
            if t.minute == flush.minute {
                t.pending += flush.units;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_light_caller_costs_no_write_and_a_heavy_one_is_refused_once_past() {
        let b = ReadBudget::new(250);
        let t0 = 60_000 * 1_000;
        // 30 units: nothing to add yet.
        assert_eq!(b.charge("c", 30, t0).await, None);
        b.admit("c", t0).await.unwrap();
        // 100 in all: a step of 100.
        let f = b.charge("c", 70, t0 + 1).await.unwrap();
        assert_eq!((f.minute, f.units), (1_000, 100));
        // Another instance had added 200 meanwhile: the total is 300.
        b.flushed(&f, 300).await;
        let err = b.admit("c", t0 + 30_000).await.unwrap_err();
        assert_eq!(err, Error::RateLimited { retry_after: 30 });
        // Other callers, and the next minute, are not refused.
        b.admit("d", t0 + 30_000).await.unwrap();
        b.admit("c", t0 + 60_000).await.unwrap();
        assert_eq!(b.charge("c", 10, t0 + 60_000).await, None);
    }

    #[tokio::test]
    async fn a_step_comes_early_when_it_would_cross_the_bound() {
        let b = ReadBudget::new(250);
        let f = b.charge("c", 100, 0).await.unwrap();
        b.flushed(&f, 220).await;
        // 220 known + 40 pending > 250: added at once, not at 100.
        let f = b.charge("c", 40, 1).await.unwrap();
        assert_eq!(f.units, 40);
        // A failed step is carried to the next one.
        b.unflushed(&f).await;
        assert_eq!(b.charge("c", 10, 2).await.unwrap().units, 50);
    }

    #[tokio::test]
    async fn no_bound_no_tally() {
        let b = ReadBudget::new(0);
        assert_eq!(b.charge("c", 10_000, 0).await, None);
        b.admit("c", 0).await.unwrap();
    }
}
