//! How the variant compresses a year into a run: AWS's rhythm, and what
//! part of it the run's records cover. Pure arithmetic, so that the
//! report states it from the settings and the run's counts, never from a
//! figure written down.
//!
//! A DynamoDB stream shard rolls over into a child about every 4 hours:
//! 6 a day, about 2,190 a year per shard lineage. The local stream rolls a
//! virtual shard after a number of records instead of hours
//! (`LOCAL_STREAM_ROLL_RECORDS`), so one *generation* of the run stands
//! for 4 hours. A Kinesis stream has no clock of its own; a platform's
//! views stream is resharded by its operator (or on-demand scaling) for the
//! daily peak: the rhythm taken here is one split and one merge a
//! simulated day (6 generations), at least one pair a run.

/// Hours between two roll-overs of a DynamoDB stream shard.
pub(super) const HOURS_PER_GENERATION: f64 = 4.0;
/// Roll-overs of one shard lineage in a year (365 × 24 ÷ 4).
pub(super) const GENERATIONS_PER_YEAR: f64 = 365.0 * 24.0 / HOURS_PER_GENERATION;
/// Generations per split-and-merge of the Kinesis stream (a day).
pub(super) const GENERATIONS_PER_RESHARD: f64 = 24.0 / HOURS_PER_GENERATION;

/// What a run covers of the year.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Age {
    /// Generations of each lineage (records per lane ÷ records per roll).
    pub generations: f64,
    /// ... as hours of AWS's rhythm.
    pub simulated_hours: f64,
    /// ... as a share of a year's roll-overs, %.
    pub year_pct: f64,
    /// Split-and-merge pairs of the Kinesis stream at that rhythm.
    pub reshards: u32,
}

impl Age {
    /// The age of `records` spread over `lanes` lineages that roll every
    /// `roll_records`.
    pub fn of(records: f64, lanes: u32, roll_records: u64) -> Age {
        let generations = records / f64::from(lanes.max(1)) / roll_records.max(1) as f64;
        Age {
            generations,
            simulated_hours: generations * HOURS_PER_GENERATION,
            year_pct: 100.0 * generations / GENERATIONS_PER_YEAR,
            reshards: ((generations / GENERATIONS_PER_RESHARD).round() as u32).max(1),
        }
    }

    /// The plan of a run: `rate` likes a second for `seconds` (every like
    /// is one record of the Likes table's stream).
    pub fn planned(rate: f64, seconds: f64, lanes: u32, roll_records: u64) -> Age {
        Age::of(rate * seconds, lanes, roll_records)
    }

    /// When (seconds into the load) each split-and-merge starts: evenly
    /// spread, none in the first or last tenth of the load.
    pub fn reshard_times(&self, seconds: f64) -> Vec<f64> {
        let n = self.reshards.max(1);
        (0..n)
            .map(|i| seconds * (0.1 + 0.8 * (f64::from(i) + 0.5) / f64::from(n)))
            .collect()
    }
}
