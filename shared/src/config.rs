//! Typed configuration, read once per cold start.
//!
//! Every knob has a default (a function deployed with only the table
//! names works); the template sets them explicitly.

use std::time::Duration;

/// How the caller's identity is established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Only the `sub` claim that the API Gateway JWT authorizer verified.
    Jwt,
    /// Local development: `x-user-id` accepted without a JWT claim (set by
    /// the local stack, never by the template).
    Dev,
}

/// How likes are counted (`COUNTING`), chosen per deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counting {
    /// `transactional` (default): a like is one transaction, row and shard.
    Transactional,
    /// `stream`: a like writes only its row; the aggregate function counts
    /// the Likes table's stream in writer items ([`crate::aggregate`]).
    Stream,
}

impl Counting {
    /// The value of `COUNTING` that selects it.
    pub fn as_str(self) -> &'static str {
        match self {
            Counting::Transactional => "transactional",
            Counting::Stream => "stream",
        }
    }
}

/// Everything a function reads from its environment, once per cold start
/// (see [`Config::from_env`]); each field names its variable and default.
#[derive(Clone, Debug)]
pub struct Config {
    /// `COUNTERS_TABLE`: shard items and per-reel settings items.
    pub counters_table: String,
    /// `LIKES_TABLE`: one item per (user, reel) like: the source of truth.
    pub likes_table: String,
    /// `WRITERS_TABLE`: the views table, where stream mode's writer items
    /// and the known reels (`crate::known`) are.
    pub writers_table: Option<String>,
    /// `KNOWN_BACKFILL_DELAY_MS` (default 1800000): the known reels'
    /// backfill starts this long after their first fold (`crate::known`).
    pub known_backfill_delay: Duration,
    /// `CACHE_TTL_MS` (default 2000): how long a summed count is served from
    /// memory before the shards are read again.
    pub cache_ttl: Duration,
    /// `SETTINGS_TTL_MS` (default 5000): how long a reel's shard counts are
    /// cached. Resizing waits this long (plus a margin) between its steps.
    pub settings_ttl: Duration,
    /// `SPREAD_REFRESH_MS` (default 60000): how often the spread registry is read.
    pub spread_refresh: Duration,
    /// `CACHE_MAX_REELS` (default 100000): entries per cache, least recently
    /// used evicted past it (a feed of millions of reels fits in memory).
    pub cache_max_reels: u64,
    /// `TX_MAX_ATTEMPTS` (default 6): attempts of one like/unlike transaction
    /// when DynamoDB cancels it for a conflict or throttling. The SDK's own
    /// retries (throttled calls, 5xx, timeouts) come on top, per attempt.
    pub tx_max_attempts: u32,
    /// `RETRY_BASE_MS` (default 25): the first delay of the full-jitter
    /// backoff between those attempts and between the SDK's own retries.
    pub retry_base: Duration,
    /// `RETRY_MAX_MS` (default 1000, at least `RETRY_BASE_MS`): the cap on
    /// one delay of that backoff.
    pub retry_max: Duration,
    /// `DDB_CONNECT_TIMEOUT_MS` (default 1000): bounds opening a connection.
    pub ddb_connect_timeout: Duration,
    /// `DDB_ATTEMPT_TIMEOUT_MS` (default 1500): the bound on one SDK attempt.
    pub ddb_attempt_timeout: Duration,
    /// `DDB_OPERATION_TIMEOUT_MS` (default 3000): bounds one SDK call, retries in.
    pub ddb_operation_timeout: Duration,
    /// `DDB_MAX_ATTEMPTS` (default 3): the SDK's attempts per call, 1st included.
    pub ddb_max_attempts: u32,
    /// `DDB_RETRY_QUOTA` (default 500, the SDK's own): the SDK's retry quota
    /// per client (so per instance; docs/reference.md): empty, a failing
    /// call fails at once, so a long outage fails fast. 0: no quota.
    pub ddb_retry_quota: u32,
    /// `DDB_RETRY_QUOTA_REFILL_PER_SEC` (default 0, the SDK's own: only
    /// successes refill): tokens the quota regains each second besides.
    pub ddb_retry_quota_refill: f64,
    /// `REQUEST_BUDGET_MS` (default 8000): no new transaction attempt starts
    /// unless it can finish (at the SDK's operation timeout) within this
    /// budget from the start of the request.
    pub request_budget: Duration,
    /// `REQUEST_TIMEOUT_MS` (default 12000): the hard bound on one request,
    /// reads and retries included; past it the answer is 503. Below the
    /// template's 15 s function timeout, so the client always gets our JSON.
    pub request_timeout: Duration,
    /// `IDEMPOTENCY_TTL_SECS` (default 86400): how long the record of a
    /// request with an `Idempotency-Key` is kept (DynamoDB TTL), so that a
    /// retry of that key within it has no further effect.
    pub idempotency_ttl: Duration,
    /// `AUTH_MODE`: `dev` enables the `x-user-id` header; anything else (or
    /// unset) means JWT only.
    pub auth_mode: AuthMode,
    /// `ADMIN_PRINCIPALS`, `ERASURE_PRINCIPALS` (default empty: nobody),
    /// `JWT_SCOPE`: who may call the admin routes and erase, and the scope
    /// a user's token must carry ([`crate::config::access`]).
    pub access: Access,
    /// Resizing (see [`crate::reshard`]).
    pub resize: ResizeConfig,
    /// Reconciliation (see [`crate::reconcile`]).
    pub reconcile: ReconcileConfig,
    /// Where metrics go: `METRICS`, `METRICS_NAMESPACE` (see
    /// [`crate::metrics::Metrics::from_lookup`]).
    pub metrics: crate::metrics::Metrics,
    /// `COUNTING` (default `transactional`): how likes are counted.
    pub counting: Counting,
    /// `SHARD_KEY`: the deployment's secret (at least 32 bytes) under which
    /// a like's shard is picked from its client-chosen token (see
    /// [`crate::token`]). The template provisions it; without it (the local
    /// stack) a fixed local key, refused inside Lambda.
    pub shard_key: crate::token::ShardKey,
    /// `STREAM_VISIBLE_MS` (default 10000, stream mode): how long this
    /// instance adds its own likes and unlikes to the counts it serves,
    /// while the stream carries them to the shards. Longer than the
    /// stream's usual lag (the `AggregationLag` metric), so the tapper sees
    /// their own like land and never fall back.
    pub stream_visible: Duration,
    /// `FEED_READ_ITEMS` (default 1000): the most shard items one batch
    /// count read (`GET /likes?reel_ids=`) reads for the reels not in the
    /// cache; the reels past it are answered `unavailable` (the first one
    /// is always read). With the settings of up to 100 reels, what one
    /// feed request can spend, in read units.
    pub feed_read_items: u32,
    /// What one caller may make an instance write (see
    /// `service::limits`).
    pub write_limits: WriteLimits,
    /// What the cache warmer keeps warm.
    pub warm: WarmConfig,
    /// `STREAM_SINCE_MS` (default 0, stream mode): when the deployment
    /// switched to stream mode (Unix ms, taken as the whole second at or
    /// after it; 0: it always counted by stream).
    /// Removals the stream recorded before it were counted by their own
    /// transactions (see `docs/counting.md` for the switch).
    pub stream_since_ms: i64,
    /// `AGGREGATE_CHUNK_REELS` (default and most 49, stream mode): reels one
    /// aggregation transaction adds to (a checkpoint and a shard update per
    /// reel; the bound is `keys::MAX_CHUNK_REELS`, which says why 49).
    pub aggregate_chunk_reels: usize,
}

/// How the reconciliation job scans and how hard it may push.
#[derive(Clone, Debug)]
pub struct ReconcileConfig {
    /// `RECONCILE_SEGMENTS` (default 8): `TotalSegments` of the parallel
    /// scans, each segment its own task and checkpoint.
    pub segments: u32,
    /// `RECONCILE_PAGE_ITEMS` (default 0 = DynamoDB's 1 MB pages): `Limit`
    /// of each scan page.
    pub page_items: u32,
    /// `RECONCILE_CHECKPOINT_PAGES` (default 1000): a segment checkpoints
    /// its cursor and partial counts every this many pages (and when it
    /// ends, or its invocation's deadline nears). Each checkpoint costs a
    /// write unit per reel it counted, so rare checkpoints are what keep a
    /// long tail of reels from making the run write-bound.
    pub checkpoint_pages: u32,
    /// `RECONCILE_CHECKPOINT_REELS` (default 100000): a segment also
    /// checkpoints once it holds the counts of this many reels: its memory
    /// (about 100 bytes a reel) stays bounded however many reels a page
    /// range meets.
    pub checkpoint_reels: u32,
    /// `RECONCILE_MAX_READ_UNITS` (default 500): read capacity units a second
    /// the job may consume, so a run never throttles live traffic.
    pub max_read_units: f64,
    /// `RECONCILE_MAX_WRITE_UNITS` (default 500): write capacity units a
    /// second the job may consume, for the same reason; a run's count items
    /// need about as many as its scan (docs/reconciliation.md).
    pub max_write_units: f64,
    /// `RECONCILE_CLOCK_SKEW_MS` (default 5000): allowed clock difference
    /// between the functions that stamp shards and the job. A reel whose
    /// shards were stamped after `run start − REQUEST_TIMEOUT_MS − skew` is
    /// deferred.
    pub clock_skew: Duration,
    /// How long a stream record can be on its way (stream mode): after it,
    /// every record made before was applied, sent to the failure queue, or
    /// trimmed. Reconciliation compares a reel's rows with its shards only
    /// this long after it counted them. `RECONCILE_STREAM_SETTLE_SECS` if
    /// set; otherwise `STREAM_MAX_RECORD_AGE_SECS` (the event source's
    /// `MaximumRecordAgeInSeconds`: Lambda hands no older record over) plus
    /// [`STREAM_DELIVERY_MARGIN`], or without it the stream's 24-hour
    /// retention plus that margin (25 hours).
    pub stream_settle: Duration,
}

/// Added to a stream record's longest age to bound how long it can be on
/// its way: an invocation that took it just before that age may run for
/// Lambda's longest timeout (15 minutes), and clocks differ a little. An
/// hour's margin over both.
pub const STREAM_DELIVERY_MARGIN: Duration = Duration::from_secs(3_600);

/// How long DynamoDB keeps a stream record (24 hours).
const STREAM_RETENTION_SECS: u64 = 86_400;

/// The most `VIEWS_MAX_RECORD_AGE_SECS` (the views event source's
/// `MaximumRecordAgeInSeconds`, the template's `ViewsMaxRecordAgeSecs`)
/// may be: half of ViewsStream's 24-hour retention. A range Lambda gives
/// up on is repaired from the stream, and its first record is gone 24
/// hours after it arrived; the give-up comes up to this age after that
/// arrival, and a repair may start only `VIEWS_REPAIR_AFTER_SECS` (900 s)
/// later, or, when copies of its records were given up too, once those are
/// this age and 900 s old (they arrived up to `VIEWS_DEDUP_SECS`, 300 s,
/// after it). At 12 hours that still leaves about 11 h 30 min to fix the
/// cause and run the repairs; at 24 hours (the bound before) it left none.
pub const VIEWS_MAX_RECORD_AGE_MAX_SECS: u64 = 43_200;

/// How many batches of one stream shard an aggregator may be handed at
/// once: the `ParallelizationFactor` of both event sources (the Likes
/// table's stream, ViewsStream), `BATCHES_PER_STREAM_SHARD` in the
/// functions' environment. One: each aggregator's checkpoint of a stream
/// shard is a high-water mark (the highest sequence number applied, every
/// record at or below it taken as applied), so of two batches of one shard
/// in flight at once, the one applied second would skip each of its
/// records below the other's last, silently.
pub const MAX_BATCHES_PER_STREAM_SHARD: u64 = 1;

/// The buckets of recent changes the aggregator keeps on shard items
/// ([`crate::keys::recent_delta_attr`]), derived from
/// [`ReconcileConfig::stream_settle`] and the clock skew, so that every
/// function computes the same from the same settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecentWindow {
    /// A bucket's width (ms): bucket starts are its multiples.
    pub width_ms: i64,
    /// How long a bucket is kept (ms): the aggregator writes none that
    /// starts earlier than this before its clock, and removes those.
    pub keep_ms: i64,
}

/// Buckets a shard item keeps at most (besides a few being removed): with
/// their removal counts, the attributes they add (under 20 bytes each)
/// keep a shard item within one write unit.
pub const RECENT_BUCKETS: i64 = 16;

impl ReconcileConfig {
    /// See [`RecentWindow`]: kept for four settle times (a run compares a
    /// reel a settle time after its likes scan; a reel whose items were
    /// last written within this of the cut can be compared however long
    /// the scans take), in [`RECENT_BUCKETS`] buckets.
    pub fn recent_window(&self) -> RecentWindow {
        let keep_ms =
            4 * self.stream_settle.as_millis() as i64 + 2 * self.clock_skew.as_millis() as i64;
        let width_ms = (keep_ms / RECENT_BUCKETS).max(50);
        RecentWindow {
            width_ms,
            keep_ms: width_ms * RECENT_BUCKETS,
        }
    }
}

/// How reels are resized, by hand and automatically.
#[derive(Clone, Debug)]
pub struct ResizeConfig {
    /// `MAX_SHARDS` (default 100, at most 100): the most shards a reel may
    /// get. 100 is DynamoDB's limit on one `TransactGetItems`, which readers
    /// of a shrinking reel use.
    pub max_shards: u32,
    /// `RESIZE_MARGIN_MS` (default 2000): added to every wait between resize
    /// steps, for clock skew between function instances.
    pub margin: Duration,
    /// `AUTO_RESHARD` (default `on`): `off` turns off the automatic grow and
    /// shrink; resizes started by hand still complete.
    pub auto: bool,
    /// `HOT_LIKES_PER_SEC` (default 300): a reel writing at least this many
    /// likes and unlikes a second is grown.
    pub hot_per_sec: f64,
    /// `SHARD_WRITES_PER_SEC` (default 400): writes one shard takes safely.
    /// A DynamoDB partition takes 1,000 write units a second and a like's
    /// transactional shard update costs 2, so 500 is the ceiling; 400 leaves
    /// room for the unevenness of random shard choice.
    pub shard_writes_per_sec: f64,
    /// `SHARD_HEADROOM` (default 2.0): the sizing rule's factor on the
    /// observed rate, room for the rate to grow before the next resize.
    pub headroom: f64,
    /// `COOL_LIKES_PER_SEC` (default 50, below `HOT_LIKES_PER_SEC`): a reel
    /// writing below this rate for `cool_down` is folded back to one shard by
    /// the scheduled run.
    pub cool_per_sec: f64,
    /// `COOL_DOWN_SECS` (default 3600): how long a reel must stay below
    /// `cool_per_sec` before it is folded back.
    pub cool_down: Duration,
    /// `CONTENTION_GROW_EVENTS` (default 5; 0 turns it off): this many
    /// like transactions that conflicted on one reel's shard within 10 s
    /// (never throttles), seen by one function instance, grow the reel as
    /// a saturated one (`SATURATED_GROWTH`); stream shards, by any.
    pub contention_events: u32,
    /// `SATURATED_GROWTH` (default 4, at least 2): the least factor a
    /// saturated reel's shards grow by. See [`ResizeConfig::grow_target`].
    pub saturated_growth: u32,
    /// `RESHARD_MAX_WAIT_MS` (default 0): the longest a scheduled run
    /// sleeps for a resize step that is about to become due, instead of
    /// leaving it to the next run. 0: it never sleeps; a step not yet due is
    /// always left for the next run.
    pub max_wait: Duration,
}

impl Config {
    /// How long after a settings change is seen in place (the phase's
    /// stamp, see [`crate::reshard`]) no function instance can still act on
    /// the settings before it: a cached copy lives `SETTINGS_TTL_MS`
    /// (counted from when it was read), and a request that read it may keep
    /// writing for up to `REQUEST_TIMEOUT_MS`; plus the margin (clock skew
    /// between instances).
    pub fn resize_wait(&self) -> Duration {
        // Stamps are taken only after the phase is known to be in place, so
        // no delayed write can shorten this; the operation timeout is kept
        // as a margin for the stamp's own conditional write.
        self.settings_ttl + self.request_timeout + self.ddb_operation_timeout + self.resize.margin
    }

    /// Stream mode's own-change tails ([`crate::keys::tail`]).
    pub fn own_tail(&self) -> crate::keys::tail::TailWindow {
        let ms = |d: Duration| d.as_millis() as i64;
        let skew = ms(self.reconcile.clock_skew);
        crate::keys::tail::TailWindow::new(ms(self.cache_ttl), ms(self.stream_visible), skew)
    }
}

/// A configuration value that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `get`, so tests need not touch the
    /// process environment.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let table = |name: &str| -> Result<String, ConfigError> {
            match get(name) {
                Some(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
                _ => Err(ConfigError(format!("{name} must name a DynamoDB table"))),
            }
        };
        let num = |name: &str, default: u64, min: u64, max: u64| -> Result<u64, ConfigError> {
            match get(name) {
                None => Ok(default),
                Some(v) if v.trim().is_empty() => Ok(default),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if (min..=max).contains(&n) => Ok(n),
                    _ => Err(ConfigError(format!(
                        "{name}={v:?} is not a whole number in {min}..={max}"
                    ))),
                },
            }
        };
        let ms = |name: &str, default: u64, min: u64, max: u64| {
            num(name, default, min, max).map(Duration::from_millis)
        };
        let in_lambda = get("AWS_LAMBDA_FUNCTION_NAME").is_some();
        let auth_mode = match get("AUTH_MODE").as_deref().map(str::trim) {
            // Lambda sets AWS_LAMBDA_FUNCTION_NAME in every function: there
            // the caller is who the authorizer says, never a header the
            // caller writes, whatever a stray variable says.
            Some("dev") if in_lambda => {
                return Err(ConfigError(
                    "AUTH_MODE=dev (identity from the x-user-id header) is for the local \
                     stack only; refused inside Lambda"
                        .into(),
                ));
            }
            Some("dev") => AuthMode::Dev,
            None | Some("") | Some("jwt") => AuthMode::Jwt,
            Some(other) => {
                return Err(ConfigError(format!(
                    "AUTH_MODE={other:?}: expected \"jwt\" or \"dev\""
                )));
            }
        };
        let shard_key = match get("SHARD_KEY") {
            Some(k) if k.len() >= crate::token::ShardKey::MIN_LEN => {
                crate::token::ShardKey::new(&k)
            }
            Some(_) => {
                return Err(ConfigError(format!(
                    "SHARD_KEY must be at least {} bytes",
                    crate::token::ShardKey::MIN_LEN
                )));
            }
            None if in_lambda => {
                return Err(ConfigError(
                    "SHARD_KEY must be set inside Lambda (the template provisions it)".into(),
                ));
            }
            None => crate::token::ShardKey::new(crate::token::LOCAL_SHARD_KEY),
        };
        let rate = |name: &str, default: f64| -> Result<f64, ConfigError> {
            match get(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(x) if x.is_finite() && x > 0.0 && x <= 1e9 => Ok(x),
                    _ => Err(ConfigError(format!(
                        "{name}={v:?} is not a positive number"
                    ))),
                },
            }
        };
        let auto = match get("AUTO_RESHARD").as_deref().map(str::trim) {
            None | Some("") | Some("on") => true,
            Some("off") => false,
            Some(other) => {
                return Err(ConfigError(format!(
                    "AUTO_RESHARD={other:?}: expected \"on\" or \"off\""
                )));
            }
        };
        let resize = ResizeConfig {
            max_shards: num("MAX_SHARDS", 100, 1, crate::keys::MAX_RESIZE_SHARDS.into())? as u32,
            margin: ms("RESIZE_MARGIN_MS", 2_000, 0, 600_000)?,
            auto,
            hot_per_sec: rate("HOT_LIKES_PER_SEC", 300.0)?,
            shard_writes_per_sec: rate("SHARD_WRITES_PER_SEC", 400.0)?,
            headroom: rate("SHARD_HEADROOM", 2.0)?,
            cool_per_sec: rate("COOL_LIKES_PER_SEC", 50.0)?,
            cool_down: Duration::from_secs(num("COOL_DOWN_SECS", 3_600, 0, 30 * 86_400)?),
            contention_events: num("CONTENTION_GROW_EVENTS", 5, 0, 1_000)? as u32,
            saturated_growth: num("SATURATED_GROWTH", 4, 2, 100)? as u32,
            max_wait: ms("RESHARD_MAX_WAIT_MS", 0, 0, 600_000)?,
        };
        let stream_settle = || -> Result<Duration, ConfigError> {
            // Lambda's range for MaximumRecordAgeInSeconds, or -1 (records
            // are handed over until the stream trims them, after 24 hours).
            let age = match get("STREAM_MAX_RECORD_AGE_SECS").as_deref().map(str::trim) {
                None | Some("" | "-1") => None,
                Some(_) => Some(
                    num("STREAM_MAX_RECORD_AGE_SECS", 0, 60, 604_800)?.min(STREAM_RETENTION_SECS),
                ),
            };
            let bound =
                Duration::from_secs(age.unwrap_or(STREAM_RETENTION_SECS)) + STREAM_DELIVERY_MARGIN;
            let explicit = "RECONCILE_STREAM_SETTLE_SECS";
            if get(explicit).is_none_or(|v| v.trim().is_empty()) {
                return Ok(bound);
            }
            let settle = Duration::from_secs(num(explicit, 0, 0, 30 * 86_400)?);
            // Shorter than records can be in flight, reconciliation would
            // "correct" them, and they would count twice once applied.
            // (Tests scale it down on a stack whose records land at once,
            // with no record age set.)
            if age.is_some() && settle < bound {
                return Err(ConfigError(format!(
                    "{explicit} must be at least STREAM_MAX_RECORD_AGE_SECS + {} s",
                    STREAM_DELIVERY_MARGIN.as_secs()
                )));
            }
            Ok(settle)
        };
        let reconcile = ReconcileConfig {
            segments: num("RECONCILE_SEGMENTS", 8, 1, 200)? as u32,
            page_items: num("RECONCILE_PAGE_ITEMS", 0, 0, 100_000)? as u32,
            checkpoint_pages: num("RECONCILE_CHECKPOINT_PAGES", 1_000, 1, 100_000)? as u32,
            checkpoint_reels: num("RECONCILE_CHECKPOINT_REELS", 100_000, 1, 10_000_000)? as u32,
            max_read_units: rate("RECONCILE_MAX_READ_UNITS", 500.0)?,
            max_write_units: rate("RECONCILE_MAX_WRITE_UNITS", 500.0)?,
            clock_skew: ms("RECONCILE_CLOCK_SKEW_MS", 5_000, 0, 3_600_000)?,
            stream_settle: stream_settle()?,
        };
        if resize.cool_per_sec >= resize.hot_per_sec {
            return Err(ConfigError(
                "COOL_LIKES_PER_SEC must be below HOT_LIKES_PER_SEC".into(),
            ));
        }
        // Refused at every cold start, so that an event source mapping
        // edited by hand (and this variable with it) stops the functions
        // instead of losing records.
        num(
            "BATCHES_PER_STREAM_SHARD",
            1,
            1,
            MAX_BATCHES_PER_STREAM_SHARD,
        )
        .map_err(|e| {
            ConfigError(format!(
                "{} (the event sources' ParallelizationFactor): only 1 is accepted. The \
                 aggregators' checkpoint of a stream shard is a high-water mark (the highest \
                 sequence number applied): with two batches of one shard at once, the one \
                 applied second would skip its records below the other's last, silently",
                e.0
            ))
        })?;
        // Read again (and used) by the views aggregator; bounded here too, so
        // that every function refuses an age that leaves no time to repair.
        num(
            "VIEWS_MAX_RECORD_AGE_SECS",
            3_600,
            1,
            VIEWS_MAX_RECORD_AGE_MAX_SECS,
        )
        .map_err(|e| {
            ConfigError(format!(
                "{} (12 hours at most): a range given up at that age must still be in \
                 ViewsStream (24 hours) when its repair may start",
                e.0
            ))
        })?;
        let retry_base = ms("RETRY_BASE_MS", 25, 1, 10_000)?;
        let retry_max = ms("RETRY_MAX_MS", 1_000, 1, 60_000)?;
        if retry_max < retry_base {
            return Err(ConfigError("RETRY_MAX_MS is below RETRY_BASE_MS".into()));
        }
        Ok(Config {
            counters_table: table("COUNTERS_TABLE")?,
            likes_table: table("LIKES_TABLE")?,
            writers_table: get("WRITERS_TABLE")
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty()),
            known_backfill_delay: ms("KNOWN_BACKFILL_DELAY_MS", 1_800_000, 0, 86_400_000)?,
            cache_ttl: ms("CACHE_TTL_MS", 2_000, 0, 3_600_000)?,
            settings_ttl: ms("SETTINGS_TTL_MS", 5_000, 0, 3_600_000)?,
            spread_refresh: ms("SPREAD_REFRESH_MS", 60_000, 0, 3_600_000)?,
            cache_max_reels: num("CACHE_MAX_REELS", 100_000, 1, 100_000_000)?,
            tx_max_attempts: num("TX_MAX_ATTEMPTS", 6, 1, 50)? as u32,
            retry_base,
            retry_max,
            ddb_connect_timeout: ms("DDB_CONNECT_TIMEOUT_MS", 1_000, 1, 60_000)?,
            ddb_attempt_timeout: ms("DDB_ATTEMPT_TIMEOUT_MS", 1_500, 1, 60_000)?,
            ddb_operation_timeout: ms("DDB_OPERATION_TIMEOUT_MS", 3_000, 1, 300_000)?,
            request_budget: ms("REQUEST_BUDGET_MS", 8_000, 1, 900_000)?,
            request_timeout: ms("REQUEST_TIMEOUT_MS", 12_000, 1, 900_000)?,
            idempotency_ttl: Duration::from_secs(num(
                "IDEMPOTENCY_TTL_SECS",
                86_400,
                600,
                31_536_000,
            )?),
            ddb_max_attempts: num("DDB_MAX_ATTEMPTS", 3, 1, 10)? as u32,
            ddb_retry_quota: num("DDB_RETRY_QUOTA", 500, 0, 500_000_000)? as u32,
            ddb_retry_quota_refill: match get("DDB_RETRY_QUOTA_REFILL_PER_SEC")
                .filter(|v| !v.trim().is_empty())
            {
                None => 0.0,
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(r) if r.is_finite() && r >= 0.0 => r,
                    _ => {
                        return Err(ConfigError(format!(
                            "DDB_RETRY_QUOTA_REFILL_PER_SEC must be a number >= 0, not {v:?}"
                        )));
                    }
                },
            },
            auth_mode,
            access: Access::from_lookup(&get, in_lambda).map_err(ConfigError)?,
            resize,
            reconcile,
            metrics: crate::metrics::Metrics::from_lookup(&get),
            counting: match get("COUNTING").as_deref().map(str::trim) {
                None | Some("") | Some("transactional") => Counting::Transactional,
                Some("stream") => Counting::Stream,
                Some(other) => {
                    return Err(ConfigError(format!(
                        "COUNTING={other:?}: expected \"transactional\" or \"stream\""
                    )));
                }
            },
            shard_key,
            stream_visible: ms("STREAM_VISIBLE_MS", 10_000, 0, 600_000)?,
            feed_read_items: num("FEED_READ_ITEMS", 1_000, 1, 100_000)? as u32,
            write_limits: WriteLimits {
                per_sec: rate("USER_WRITES_PER_SEC", 5.0)?,
                burst: num("USER_WRITE_BURST", 20, 1, 10_000)? as u32,
                toggles_per_min: num("REEL_TOGGLES_PER_MIN", 10, 1, 10_000)? as u32,
                reels_per_hour: num("USER_REELS_PER_HOUR", 300, 1, 100_000)? as u32,
                keys_per_min: num("USER_KEYS_PER_MIN", 120, 1, 100_000)? as u32,
            },
            warm: WarmConfig {
                reels: num("WARM_REELS", 100, 0, 100)? as usize,
                period: ms("WARM_PERIOD_MS", 1_000, 100, 60_000)?,
            },
            stream_since_ms: num("STREAM_SINCE_MS", 0, 0, 32_503_680_000_000)? as i64,
            aggregate_chunk_reels: num(
                "AGGREGATE_CHUNK_REELS",
                crate::keys::MAX_CHUNK_REELS as u64,
                1,
                crate::keys::MAX_CHUNK_REELS as u64,
            )? as usize,
        })
    }
}

pub mod access;
mod limits;

pub use access::Access;
pub use limits::{WarmConfig, WriteLimits};

#[cfg(test)]
mod tests;
