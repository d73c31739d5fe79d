//! What the proxy counts, as [`Proxy::stats`] and `GET /__proxy/stats`
//! report it; `state` and `kinesis` keep the counts up to date. The
//! Kinesis counts are here too, not with the Kinesis classes: the counts
//! are what the counting code depends on, never the other way round.
//!
//! [`Proxy::stats`]: crate::Proxy::stats

use crate::config::Faults;
use crate::conflicts::ModeledConflicts;
use serde::Serialize;
use std::collections::BTreeMap;

/// One partition key's load, as the capacity model saw it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KeyLoad {
    /// `table/partition-key-value`.
    pub partition: String,
    /// The most write units it took in one second.
    pub max_write_units_per_sec: f64,
    pub max_read_units_per_sec: f64,
    pub write_units: f64,
    pub read_units: f64,
    /// Items read and written (forwarded requests only): what the reads
    /// and writes cost in items, whatever their capacity units.
    pub items_read: u64,
    pub items_written: u64,
    /// Requests refused because this key was over its cap.
    pub throttled: u64,
    /// Seconds in which it took any units.
    pub active_seconds: u64,
}

/// What the proxy saw of `ClientRequestToken`s (TransactWriteItems).
#[derive(Clone, Debug, Default, Serialize)]
pub struct TokenStats {
    /// Transactions forwarded with a token.
    pub forwarded: u64,
    /// Forwarded with a token that had been forwarded before.
    pub reused: u64,
    /// ... of which with a different body (expect
    /// `IdempotentParameterMismatch` if the first one committed).
    pub reused_with_other_body: u64,
    /// Reuses of a token whose transaction had committed, answered with
    /// success by the emulator without applying it again (a replay).
    pub replayed_after_commit: u64,
    /// Reuses of a committed token answered `IdempotentParameterMismatch`.
    pub mismatch_after_commit: u64,
    /// Reuses of a committed token answered otherwise.
    pub other_after_commit: u64,
    /// Reuses of a token that had never committed (its earlier attempts
    /// were refused or cancelled): an ordinary retry.
    pub reused_before_commit: u64,
}

/// Everything the proxy did, as `GET /__proxy/stats` reports it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub faults: Option<Faults>,
    pub seconds: f64,
    /// Requests received, by operation.
    pub requests: BTreeMap<String, u64>,
    /// Requests that reached the emulator, by operation.
    pub forwarded: BTreeMap<String, u64>,
    /// Injected faults: class → operation → count. Classes: `throttle`,
    /// `server_error`, `conflict`, `lost_dropped`, `lost_stalled`,
    /// `lost_500`, `latency`, `unprocessed`, `capacity_throttle`,
    /// `unreadable`; for Kinesis requests `kinesis_throttle`,
    /// `kinesis_lost_dropped`, `kinesis_lost_stalled`, `kinesis_lost_500`
    /// and `kinesis_partial` (`PutRecords` requests with a record failed;
    /// [`Stats::kinesis`] counts the records).
    pub injected: BTreeMap<String, BTreeMap<String, u64>>,
    /// Every request the proxy failed: the sum of `injected` without
    /// `latency` (which fails nothing), and the conflict model's refusals.
    pub failures_injected: u64,
    /// What the conflict model (`conflict_hold_ms`) refused and held.
    pub modeled_conflicts: ModeledConflicts,
    /// Capacity units consumed by forwarded requests, by operation.
    pub write_units: BTreeMap<String, f64>,
    pub read_units: BTreeMap<String, f64>,
    /// The busiest partition keys, by the most write units in one second
    /// (then read units), at most 20.
    pub hot_keys: Vec<KeyLoad>,
    pub tokens: TokenStats,
    /// What the proxy did to `PutRecords` records.
    pub kinesis: KinesisStats,
}

impl Stats {
    /// Injected faults of `class`, over all operations.
    pub fn injected_of(&self, class: &str) -> u64 {
        self.injected
            .get(class)
            .map(|m| m.values().sum())
            .unwrap_or(0)
    }

    /// Total write units of every operation.
    pub fn total_write_units(&self) -> f64 {
        self.write_units.values().sum()
    }

    pub fn total_read_units(&self) -> f64 {
        self.read_units.values().sum()
    }
}

/// What the proxy did to `PutRecords` records, as [`Stats::kinesis`]
/// reports it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KinesisStats {
    /// Records in the `PutRecords` requests received.
    pub records_received: u64,
    /// Records forwarded to the emulator.
    pub records_forwarded: u64,
    /// Records failed by the proxy (`kinesis_partial`): never forwarded.
    pub records_failed_injected: u64,
    /// Records the emulator itself failed in its answers.
    pub records_failed_upstream: u64,
    /// Requests in CBOR, which the proxy cannot answer in kind and so
    /// passes through without faults: disable CBOR in such a client
    /// (`AWS_CBOR_DISABLE=true` for the Java SDK) to get them.
    pub cbor_untouched: u64,
}
