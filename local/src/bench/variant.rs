//! The benchmark's variants: what each one runs and how its stack is set
//! up. One enum instead of names compared as strings, so that a variant
//! the code does not handle is a compile error, not a silent fall-through.

use super::BenchOptions;
use serde::{Serialize, Serializer};
use std::fmt;

/// One way of counting the viral reel's likes, measured side by side with
/// the others. Shown and parsed (`BENCH_VARIANTS`) by [`Variant::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// One counter item, `UpdateItem ADD n :1` per like: what one would
    /// write without this project, through the same SDK settings.
    Naive,
    /// This project with the viral reel pre-sized to `BENCH_SHARDS`, cache
    /// on.
    Fixed,
    /// The same with the read cache off (`CACHE_TTL_MS=0`), to show what
    /// the cache saves.
    FixedNocache,
    /// This project from 1 shard, growing automatically.
    Auto,
    /// Stream-aggregated counting (`COUNTING=stream`): likes write their
    /// row only, the aggregate function adds them to one shard; offered at
    /// `BENCH_STREAM_RATE`.
    Stream,
    /// Stream mode at scale, as issue 21 sets it: one viral reel, the
    /// stream read as 32 shards side by side, the proxy's conflict model
    /// on (a 10 ms hold), the reel grown 32 → 64 halfway through (the
    /// constants below); offered at `BENCH_STREAM_SCALE_RATE`, and no
    /// background likes. What shows whether the aggregator's transactions
    /// get in each other's way on one reel (each stream shard writes items
    /// of its own: only its own invocations can).
    StreamScale,
    /// The same with the background reels' likes (`BENCH_BACKGROUND_RATE`)
    /// on top: a few likes a second on each of a few reels of one shard,
    /// which every stream shard carries (docs/counting.md, "Writer
    /// items").
    StreamScaleMixed,
    /// Views, not likes: one viral reel's views through the views pipeline
    /// (`POST /views` → Kinesis → the views aggregator), closed-loop at the
    /// rate the machine sustains (`views/`, which runs and reports it on
    /// its own: none of the likes' figures apply).
    Views,
    /// Not a load but a bill: what each operation costs in DynamoDB
    /// units, all in, in both counting modes, at breadth and on one reel
    /// (`costs/`, which runs and reports it on its own).
    Costs,
    /// A platform's year, compressed: likes and views of a Zipf-drawn
    /// universe of reels with a viral one on top, through many stream
    /// shards that roll over and a Kinesis stream split and merged while
    /// it runs; what ageing does to reads, cost, exactness and conflicts
    /// (`platform/`, which runs and reports it on its own).
    Platform,
    /// What's hot: the trending lists against a known truth (precision and
    /// recall of the top 100, freshness), what trending and windowing add
    /// to the writes, and the reads the cache warmer saves (`trending/`,
    /// which runs and reports it on its own).
    Trending,
}

/// `stream-scale`'s stream shards (`LOCAL_STREAM_SHARDS`): a viral reel's
/// likes come from many users, so DynamoDB spreads its rows' records over
/// many stream shards, each aggregated by its own invocations.
pub(super) const STREAM_SHARDS: u32 = 32;
/// `stream-scale`'s conflict hold (`FAULTS=conflict_hold_ms`): how long a
/// transaction holds its items past the emulator's answer, which comes in
/// well under a millisecond; a `TransactWriteItems` in DynamoDB takes
/// about this long, so two aggregations overlap about as often as there.
pub(super) const CONFLICT_HOLD_MS: u32 = 10;
/// `stream-scale`'s viral reel before the resize. Stream mode's aggregator
/// writes items of its own per stream shard (docs/counting.md, "Writer
/// items"), so the reel's shards hold only what earlier versions counted;
/// the resize under load checks that reads stay exact while it runs.
pub(super) const SCALE_FROM: u32 = 32;
/// ... and after it: the aggregator's chunks must follow the settings
/// while the stream shards keep writing.
pub(super) const SCALE_TO: u32 = 64;
/// `trending`'s stream shards (`LOCAL_STREAM_SHARDS`) and Kinesis shards
/// (`LOCAL_VIEWS_SHARDS`): each keeps a sketch of its own, merged for a
/// list.
pub(super) const TRENDING_STREAM_SHARDS: u32 = 8;
pub(super) const TRENDING_KINESIS_SHARDS: u32 = 2;
/// `views`' stream shards (`LOCAL_VIEWS_SHARDS`).
pub(super) const VIEWS_SHARDS: u32 = 4;
/// `platform`'s virtual stream shards (`LOCAL_STREAM_SHARDS`): a table
/// of a busy platform has many partitions, so its stream many shards.
pub(super) const PLATFORM_STREAM_SHARDS: u32 = 128;
/// `platform`'s views stream shards (`LOCAL_VIEWS_SHARDS`) before and
/// after each split-and-merge.
pub(super) const PLATFORM_KINESIS_SHARDS: u32 = 8;

impl Variant {
    /// Every variant, in the order `BENCH_VARIANTS` runs them by default.
    pub const ALL: [Variant; 11] = [
        Variant::Naive,
        Variant::Fixed,
        Variant::FixedNocache,
        Variant::Auto,
        Variant::Stream,
        Variant::StreamScale,
        Variant::StreamScaleMixed,
        Variant::Views,
        Variant::Costs,
        Variant::Platform,
        Variant::Trending,
    ];

    /// The name in `BENCH_VARIANTS`, the table's columns and the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Naive => "naive",
            Variant::Fixed => "fixed",
            Variant::FixedNocache => "fixed-nocache",
            Variant::Auto => "auto",
            Variant::Stream => "stream",
            Variant::StreamScale => "stream-scale",
            Variant::StreamScaleMixed => "stream-scale-mixed",
            Variant::Views => "views",
            Variant::Costs => "costs",
            Variant::Platform => "platform",
            Variant::Trending => "trending",
        }
    }

    /// The variant named `name` (exactly, as [`Variant::as_str`] spells it).
    pub fn parse(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.as_str() == name)
    }

    /// The naive counter: no product code on the write path.
    pub(super) fn is_naive(self) -> bool {
        self == Variant::Naive
    }

    /// The views variant, run by `views.rs` rather than `measure.rs`.
    pub(super) fn is_views(self) -> bool {
        self == Variant::Views
    }

    /// The costs variant, run by `costs/` rather than `measure.rs`.
    pub(super) fn is_costs(self) -> bool {
        self == Variant::Costs
    }

    /// The platform variant, run by `platform/` rather than `measure.rs`.
    pub(super) fn is_platform(self) -> bool {
        self == Variant::Platform
    }

    /// The trending variant, run by `trending/` rather than `measure.rs`.
    pub(super) fn is_trending(self) -> bool {
        self == Variant::Trending
    }

    /// Stream mode: likes write their row only; the counts catch up later.
    pub(super) fn is_stream(self) -> bool {
        matches!(
            self,
            Variant::Stream | Variant::StreamScale | Variant::StreamScaleMixed
        )
    }

    /// Stream mode at scale (`scale.rs`): 32 stream shards, the conflict
    /// model, the resize halfway, and their own figures.
    pub(super) fn is_scale(self) -> bool {
        matches!(self, Variant::StreamScale | Variant::StreamScaleMixed)
    }

    /// Likes a second on the background reels: none in `stream-scale`,
    /// which is one viral reel as issue 21 sets it.
    pub(super) fn background_rate(self, opts: &BenchOptions) -> f64 {
        if self == Variant::StreamScale {
            0.0
        } else {
            opts.background_rate
        }
    }

    /// The viral reel's shards set before the load, if any: the `fixed`
    /// variants' size, and `stream-scale`'s size before its resize.
    pub(super) fn presized_shards(self, opts: &BenchOptions) -> Option<u32> {
        match self {
            Variant::Fixed | Variant::FixedNocache => Some(opts.fixed_shards),
            Variant::StreamScale | Variant::StreamScaleMixed => Some(SCALE_FROM),
            Variant::Naive
            | Variant::Auto
            | Variant::Stream
            | Variant::Views
            | Variant::Costs
            | Variant::Platform
            | Variant::Trending => None,
        }
    }

    /// The viral reel's shards whose sum the watcher polls for freshness
    /// (0: none, the transactional variants write before they answer): all
    /// that the aggregator may write, before and after a resize.
    pub(super) fn watched_shards(self) -> u32 {
        match self {
            Variant::Stream => 1,
            Variant::StreamScale | Variant::StreamScaleMixed => SCALE_TO,
            Variant::Naive
            | Variant::Fixed
            | Variant::FixedNocache
            | Variant::Auto
            | Variant::Views
            | Variant::Costs
            | Variant::Platform
            | Variant::Trending => 0,
        }
    }

    /// Likes a second offered on the viral reel: stream mode is offered far
    /// more, since no like writes a counter item.
    pub(super) fn offered_rate(self, opts: &BenchOptions) -> f64 {
        match self {
            Variant::Stream => opts.stream_rate,
            Variant::StreamScale | Variant::StreamScaleMixed => opts.stream_scale_rate,
            // Closed loop: no rate is offered.
            Variant::Views | Variant::Costs => f64::NAN,
            Variant::Platform => opts.platform_rate,
            Variant::Trending => opts.trending_rate,
            Variant::Naive | Variant::Fixed | Variant::FixedNocache | Variant::Auto => {
                opts.viral_rate
            }
        }
    }

    /// Write units a like takes on the reel's hottest key: the naive
    /// counter's bare increment is 1, the product's transactional shard
    /// update 2.
    pub(super) fn units_per_like_on_hot_key(self) -> f64 {
        if self.is_naive() { 1.0 } else { 2.0 }
    }

    /// The stack's environment for this variant: the capacity cap and
    /// everything scaled with it, then the variant's own switches.
    pub(super) fn stack_env(self, opts: &BenchOptions) -> Vec<(String, String)> {
        if self.is_views() {
            return views_env();
        }
        if self.is_costs() {
            return costs_env(false, true);
        }
        if self.is_platform() {
            return platform_env(opts);
        }
        if self.is_trending() {
            return trending_env();
        }
        let cap = opts.write_cap;
        let mut faults = format!("seed=1,write_cap={cap}");
        if self.is_scale() {
            faults.push_str(&format!(",conflict_hold_ms={CONFLICT_HOLD_MS}"));
        }
        let mut env = vec![
            ("FAULTS".into(), faults),
            // The local reshard schedule, every second.
            ("LOCAL_SCHEDULE_SECS".into(), "1".into()),
            // The sizing rule scaled with the cap: production runs 400
            // likes a second per shard against 1,000 units (2 units a like).
            ("SHARD_WRITES_PER_SEC".into(), format!("{}", cap * 0.4)),
            ("HOT_LIKES_PER_SEC".into(), format!("{}", cap * 0.3)),
            ("COOL_LIKES_PER_SEC".into(), "0.1".into()),
            // Resize waits scaled down with the bounds they cover.
            ("SETTINGS_TTL_MS".into(), "500".into()),
            // A reel spread in a run is written spread within it (the hot
            // rate above is scaled with the cap: it spreads per key).
            ("SPREAD_REFRESH_MS".into(), "500".into()),
            ("REQUEST_TIMEOUT_MS".into(), "3000".into()),
            ("REQUEST_BUDGET_MS".into(), "2500".into()),
            ("DDB_OPERATION_TIMEOUT_MS".into(), "1000".into()),
            ("DDB_ATTEMPT_TIMEOUT_MS".into(), "800".into()),
            ("RESIZE_MARGIN_MS".into(), "200".into()),
            ("RESHARD_MAX_WAIT_MS".into(), "0".into()),
        ];
        let (auto, cache) = match self {
            Variant::Auto => ("on", "2000"),
            Variant::FixedNocache => ("off", "0"),
            // stream-scale's one resize is the bench's, not the policy's.
            Variant::Naive
            | Variant::Fixed
            | Variant::Stream
            | Variant::StreamScale
            | Variant::StreamScaleMixed
            | Variant::Views
            | Variant::Costs
            | Variant::Platform
            | Variant::Trending => ("off", "2000"),
        };
        if self.is_stream() {
            env.push(("COUNTING".into(), "stream".into()));
        }
        if self.is_scale() {
            env.push(("LOCAL_STREAM_SHARDS".into(), STREAM_SHARDS.to_string()));
        }
        env.push(("AUTO_RESHARD".into(), auto.into()));
        env.push(("CACHE_TTL_MS".into(), cache.into()));
        env
    }
}

/// The `views` variant's stack environment, here with every other
/// variant's so that the run in `views/` takes its settings from this
/// room rather than this room from it: the views stream on with
/// [`VIEWS_SHARDS`] shards, the fault proxy in front of DynamoDB (and
/// Kinesis) with DynamoDB's own cap of 1,000 write units per key a second
/// (views write per chunk, not per view, so no scaled-down cap is
/// reached), the read cache off so that the figures read back are the
/// table's, and no scheduled functions (the likes' resharder has nothing
/// to do here).
fn views_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("FAULTS".into(), "seed=1,write_cap=1000".into()),
        ("LOCAL_VIEWS".into(), "on".into()),
        ("LOCAL_VIEWS_SHARDS".into(), VIEWS_SHARDS.to_string()),
        ("CACHE_TTL_MS".into(), "0".into()),
        ("LOCAL_SCHEDULE_SECS".into(), "0".into()),
    ];
    // Where kinesis-mock is (an isolated stack does not read the process
    // environment): installed elsewhere, or already running.
    for k in ["LOCAL_KINESIS_DIR", "LOCAL_KINESIS_ENDPOINT"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.into(), v));
        }
    }
    env
}

/// The `trending` variant's stack environment: stream mode with
/// [`TRENDING_STREAM_SHARDS`] stream shards (an instance each: each keeps
/// its own writer's sketch), the views with [`TRENDING_KINESIS_SHARDS`],
/// the fault proxy counting (no faults; DynamoDB's own cap of 1,000 write
/// units per key a second), the default count cache,
/// and the warmer left to the run (which runs it as its schedule would,
/// and alone when it measures the reads).
fn trending_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("FAULTS", "seed=1,write_cap=1000".to_owned()),
        ("COUNTING", "stream".to_owned()),
        ("LOCAL_STREAM_SHARDS", TRENDING_STREAM_SHARDS.to_string()),
        ("LOCAL_STREAM_INSTANCES", "per-shard".to_owned()),
        ("LOCAL_VIEWS", "on".to_owned()),
        ("LOCAL_VIEWS_SHARDS", TRENDING_KINESIS_SHARDS.to_string()),
        ("LOCAL_SCHEDULE_SECS", "1".to_owned()),
        ("LOCAL_WARM_SECS", "0".to_owned()),
        ("AUTO_RESHARD", "off".to_owned()),
        ("CALLER_READ_UNITS_PER_MIN", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for k in ["LOCAL_KINESIS_DIR", "LOCAL_KINESIS_ENDPOINT"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.into(), v));
        }
    }
    env
}

/// The `platform` variant's stack environment: stream mode with
/// [`PLATFORM_STREAM_SHARDS`] virtual stream shards, each rolling over
/// into a child every `BENCH_PLATFORM_ROLL_RECORDS` records and aggregated
/// by an instance of its own; the views stream on, with
/// [`PLATFORM_KINESIS_SHARDS`] shards; the fault proxy with DynamoDB's own
/// cap (1,000 write units per key a second) and its conflict model on
/// ([`CONFLICT_HOLD_MS`]); the count cache off, so that every read the
/// bench makes through the API is an uncached one, and the settings cache
/// short (500 ms), so that a read after a pause reads them too. The
/// schedule runs every second, as the stream-at-scale variants' does (a
/// grow the aggregator asks for is finished by it); automatic growth from
/// the read path is off.
pub(super) fn platform_env(opts: &BenchOptions) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        (
            "FAULTS".into(),
            format!("seed=1,write_cap=1000,conflict_hold_ms={CONFLICT_HOLD_MS}"),
        ),
        ("COUNTING".into(), "stream".into()),
        (
            "LOCAL_STREAM_SHARDS".into(),
            PLATFORM_STREAM_SHARDS.to_string(),
        ),
        (
            "LOCAL_STREAM_ROLL_RECORDS".into(),
            opts.platform_roll_records.to_string(),
        ),
        ("LOCAL_STREAM_INSTANCES".into(), "per-shard".into()),
        ("CACHE_TTL_MS".into(), "0".into()),
        ("SETTINGS_TTL_MS".into(), "500".into()),
        ("LOCAL_SCHEDULE_SECS".into(), "1".into()),
        ("AUTO_RESHARD".into(), "off".into()),
        // Time compressed: readers fold writer items quiet for the settle
        // time (at most 10 minutes, 1/24 of a 4-hour generation); a
        // generation here lasts about a second, so the setting's least, 1 s,
        // keeps more items live than AWS's rhythm would. Nothing here
        // reconciles, the other user of the setting.
        ("RECONCILE_STREAM_SETTLE_SECS".into(), "1".into()),
        // The bench's own reads (the probes, every reel compared) come from
        // one caller, and measure; they are no user's to bound.
        ("CALLER_READ_UNITS_PER_MIN".into(), "0".into()),
    ];
    env.extend(views_env().into_iter().filter(|(k, _)| {
        !matches!(
            k.as_str(),
            "FAULTS" | "CACHE_TTL_MS" | "LOCAL_SCHEDULE_SECS" | "LOCAL_VIEWS_SHARDS"
        )
    }));
    env.push((
        "LOCAL_VIEWS_SHARDS".into(),
        PLATFORM_KINESIS_SHARDS.to_string(),
    ));
    env
}

/// How long a `costs` cell waits before it starts: longer than the
/// caches of [`costs_env`] live (the settings' 5 s, the counts' 2 s), so
/// that a cell on the reels of the one before it (an unlike after its
/// likes) reads what a cold reel reads, not what the cell before it left
/// cached, and its read units are its own.
pub(super) const COSTS_CACHES_COLD: std::time::Duration = std::time::Duration::from_millis(5_500);

/// The `costs` variant's stack environment (stream mode if `stream`, the
/// views stream too if `views`): the fault proxy in front of DynamoDB to
/// count every unit, with a cap no cell comes near (a throttled request's
/// retry would be counted as the operation's cost), and nothing running
/// that is not a cell's: no scheduled functions, no automatic growth (a
/// viral reel's resize would bill its cells for the settings it writes).
/// The read caches at the product's defaults, pinned: the reads a like
/// makes are part of what it costs, and each cell waits
/// [`COSTS_CACHES_COLD`] for the caches of the cell before it to expire.
pub(super) fn costs_env(stream: bool, views: bool) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("FAULTS".into(), "seed=1,write_cap=1000000".into()),
        ("CACHE_TTL_MS".into(), "2000".into()),
        ("SETTINGS_TTL_MS".into(), "5000".into()),
        ("LOCAL_SCHEDULE_SECS".into(), "0".into()),
        ("AUTO_RESHARD".into(), "off".into()),
    ];
    if stream {
        env.push(("COUNTING".into(), "stream".into()));
    }
    if views {
        env.extend(views_env().into_iter().filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "FAULTS" | "CACHE_TTL_MS" | "LOCAL_SCHEDULE_SECS"
            )
        }));
    } else {
        env.push(("LOCAL_VIEWS".into(), "off".into()));
    }
    env
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// As its name, so that the JSON results read as before the enum.
impl Serialize for Variant {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::test_options;

    #[test]
    fn names_round_trip_and_are_distinct() {
        for v in Variant::ALL {
            assert_eq!(Variant::parse(v.as_str()), Some(v));
            assert_eq!(v.to_string(), v.as_str());
        }
        assert_eq!(Variant::parse("Fixed"), None);
        assert_eq!(Variant::parse(" fixed"), None);
        assert_eq!(
            serde_json::to_string(&Variant::FixedNocache).unwrap(),
            "\"fixed-nocache\""
        );
    }

    #[test]
    fn each_variant_switches_its_own_settings_on_the_scaled_cap() {
        for (v, auto, cache, counting) in [
            (Variant::Naive, "off", "2000", None),
            (Variant::Fixed, "off", "2000", None),
            (Variant::FixedNocache, "off", "0", None),
            (Variant::Auto, "on", "2000", None),
            (Variant::Stream, "off", "2000", Some("stream")),
            (Variant::StreamScale, "off", "2000", Some("stream")),
            (Variant::StreamScaleMixed, "off", "2000", Some("stream")),
        ] {
            let env: std::collections::HashMap<String, String> =
                v.stack_env(&test_options()).into_iter().collect();
            let get = |k: &str| env.get(k).map(String::as_str);
            assert_eq!(get("AUTO_RESHARD"), Some(auto), "{v}");
            assert_eq!(get("CACHE_TTL_MS"), Some(cache), "{v}");
            assert_eq!(get("COUNTING"), counting, "{v}");
            let faults = if v.is_scale() {
                "seed=1,write_cap=30,conflict_hold_ms=10"
            } else {
                "seed=1,write_cap=30"
            };
            assert_eq!(get("FAULTS"), Some(faults), "{v}");
            let lanes = v.is_scale().then_some("32");
            assert_eq!(get("LOCAL_STREAM_SHARDS"), lanes, "{v}");
            assert_eq!(get("SHARD_WRITES_PER_SEC"), Some("12"), "{v}");
            assert_eq!(get("HOT_LIKES_PER_SEC"), Some("9"), "{v}");
        }
        assert_eq!(Variant::Stream.offered_rate(&test_options()), 750.0);
        assert_eq!(Variant::Auto.offered_rate(&test_options()), 75.0);
        assert_eq!(Variant::StreamScale.offered_rate(&test_options()), 2000.0);
        assert_eq!(
            Variant::StreamScaleMixed.offered_rate(&test_options()),
            2000.0
        );
        assert_eq!(
            Variant::StreamScale.presized_shards(&test_options()),
            Some(32)
        );
        assert_eq!(Variant::Fixed.presized_shards(&test_options()), Some(10));
        assert_eq!(Variant::Stream.presized_shards(&test_options()), None);
        // Issue 21's variant is one viral reel; the mixed one adds the
        // background reels' likes, as every other likes variant has.
        assert_eq!(Variant::StreamScale.background_rate(&test_options()), 0.0);
        for v in [Variant::StreamScaleMixed, Variant::Stream, Variant::Auto] {
            assert_eq!(v.background_rate(&test_options()), 20.0, "{v}");
        }
        assert_eq!(
            Variant::StreamScaleMixed.presized_shards(&test_options()),
            Some(32)
        );
        // The views variant: its own stack, the views stream on.
        let env: std::collections::HashMap<String, String> = Variant::Views
            .stack_env(&test_options())
            .into_iter()
            .collect();
        assert_eq!(env.get("LOCAL_VIEWS").map(String::as_str), Some("on"));
        assert_eq!(env.get("LOCAL_VIEWS_SHARDS").map(String::as_str), Some("4"));
        assert_eq!(env.get("CACHE_TTL_MS").map(String::as_str), Some("0"));
        assert!(!env.contains_key("COUNTING"));
    }

    #[test]
    fn the_default_list_is_every_variant_in_order() {
        let names: Vec<&str> = Variant::ALL.iter().map(|v| v.as_str()).collect();
        assert_eq!(
            names,
            [
                "naive",
                "fixed",
                "fixed-nocache",
                "auto",
                "stream",
                "stream-scale",
                "stream-scale-mixed",
                "views",
                "costs",
                "platform",
                "trending",
            ]
        );
    }
}
