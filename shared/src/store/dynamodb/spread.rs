//! Stream mode: a reel's writer items spread over several partition keys
//! ("parts") once they are written faster than one key should take, so
//! that no partition key of the writers table takes more than DynamoDB's
//! per-partition write rate, however many stream shards carry the reel.
//!
//! # Why
//!
//! Each stream shard that carries a reel writes the reel's writer item
//! once per chunk, a transactional write of about two write units. The
//! Likes table is keyed by user, so a viral reel's rows are on every stream
//! shard: at 10⁶ likes/s (~1,000 stream shards, each taking a few batches
//! a second) that is several thousand item writes a second on one
//! partition key, over the ~1,000 write units DynamoDB gives a partition.
//!
//! # How
//!
//! * **Readers decide.** A reader sums a reel's writer items; the writes
//!   they have taken (`w`) sampled a second or more apart in one instance
//!   give the reel's writer-item write rate, whichever instances wrote
//!   them. At `HOT_LIKES_PER_SEC` writes a second per key or more
//!   (the rate that grows a transactional reel's shards), the reel asks
//!   for `parts` = the rate over that, rounded up to a power of two, at
//!   most [`keys::MAX_WRITER_PARTS`].
//! * **The base first.** `parts` is raised on part 0's base item
//!   ([`keys::LIKES_WRITER_PARTS_ATTR`], never lowered), and only then is
//!   the reel put in the registry ([`keys::LIKES_SPREAD_KEY`]) writers read.
//!   Every reader queries part 0 and then every part its base names, so no
//!   writer writes to a part a reader would miss: a registry entry implies
//!   a base that names at least as many parts.
//! * **Writers follow the registry.** An aggregator instance reads the
//!   registry at most every `SPREAD_REFRESH_MS` and writes a spread
//!   reel's count to part [`keys::likes_writer_part`] of its own writer
//!   name. A writer item takes only `ADD`s and its chunk's checkpoint makes
//!   the chunk land once, so a writer that moves part (a stale registry, an
//!   entry that expired) merely starts another item there; readers sum
//!   both, and each part folds its own quiet items into its own base.
//! * **Entries expire** after [`REGISTRY_TTL`] unless a reader, still
//!   seeing the rate, renews them, so the registry holds the reels hot
//!   lately (a few hundred items at most), not every reel ever viral.
//!
//! # What it costs
//!
//! A cold reel: nothing (one part, no registry entry). A spread reel's
//! uncached read: one `Query` per part (0.5 read units at the least each),
//! for as long as its base names them. An aggregator instance: one
//! eventually consistent `Query` of the registry per `SPREAD_REFRESH_MS`.
//! Spreading itself: two single-item writes per decision.

use super::DynamoStore;
use super::error::translate;
use super::ext::{Item, ItemExt};
use super::writers::Partition;
use crate::error::Error;
use crate::keys::{self, ReelId};
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::AttributeValue;
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Writer partitions one read queries at once: a `GET /counts` of 100
/// reels is a query each, and their latency, not their units, is what
/// more at once saves.
const WRITER_QUERY_PARALLELISM: usize = 32;

/// How long a registry entry lasts unless renewed.
const REGISTRY_TTL: Duration = Duration::from_secs(24 * 3600);

/// The shortest span a write-rate sample covers.
const SAMPLE_MIN: Duration = Duration::from_secs(1);

/// Rate samples kept per instance (the reels it reads most lately).
const MAX_SAMPLES: usize = 10_000;

/// A reel's writer items over all its parts, summed.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Writers {
    /// The count they hold.
    pub n: i64,
    /// The latest `updated_at` among them.
    pub last_write_ms: i64,
    /// Items read, every part's base included.
    pub items: usize,
    /// Parts read.
    pub parts: u32,
    /// Every counted item's recent-change buckets: (`{pk}/{sk}`, name,
    /// what it says, value).
    pub buckets: Vec<(String, String, keys::RecentAttr, i64)>,
    /// The windowed counts they hold.
    pub windows: keys::window::WindowCounts,
    /// Their own-change tails, summed.
    pub tail: keys::tail::RecentTail,
}

impl Writers {
    fn add(&mut self, pk: &str, p: Partition) {
        self.n = self.n.saturating_add(p.n);
        self.windows.merge(&p.windows);
        self.tail.merge(&p.tail);
        self.last_write_ms = self.last_write_ms.max(p.last_write_ms);
        self.items += p.items;
        self.parts += 1;
        self.buckets.extend(
            p.buckets
                .into_iter()
                .map(|(sk, name, attr, v)| (format!("{pk}/{sk}"), name, attr, v)),
        );
    }
}

/// The parts part 0's base names (1 without a base or the attribute).
fn parts_of(p0: &Partition) -> u32 {
    p0.base
        .as_ref()
        .and_then(|b| b.int(keys::LIKES_WRITER_PARTS_ATTR))
        .map_or(1, |n| n.clamp(1, i64::from(keys::MAX_WRITER_PARTS)) as u32)
}

/// The parts a writer-item write rate asks for at `hot_per_sec` writes a
/// second per key, with `writers` writer items seen: a power of two, at
/// most [`keys::MAX_WRITER_PARTS`], and no more than the writers (a part
/// per writer already takes each one's writes alone; more parts only cost
/// readers a `Query` each).
pub(super) fn parts_for_rate(rate: f64, hot_per_sec: f64, writers: usize) -> u32 {
    if !(rate.is_finite() && hot_per_sec > 0.0) || rate < hot_per_sec {
        return 1;
    }
    let need = (rate / hot_per_sec)
        .ceil()
        .min(f64::from(keys::MAX_WRITER_PARTS)) as u32;
    let writers = u32::try_from(writers).unwrap_or(u32::MAX).max(1);
    // The largest power of two not above the writers.
    let by_writers = 1u32 << (31 - writers.leading_zeros());
    need.next_power_of_two()
        .min(keys::MAX_WRITER_PARTS)
        .min(by_writers)
}

/// One registry entry: the parts and when it expires (Unix seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    parts: u32,
    expires_at: i64,
}

/// An instance's view of the registry.
#[derive(Debug, Default)]
struct Registry {
    /// When a read of it last began (`None`: never).
    read_at: Option<Instant>,
    entries: HashMap<ReelId, Entry>,
}

impl Registry {
    /// Whether the caller should read the registry again now: it is older
    /// than `refresh` and no other caller's read began within it. Marks
    /// the read begun, so that concurrent callers go on with the view
    /// they have instead of waiting on one read.
    fn due(&mut self, refresh: Duration) -> bool {
        if self.read_at.is_some_and(|t| t.elapsed() < refresh) {
            return false;
        }
        self.read_at = Some(Instant::now());
        true
    }
}

/// What an instance keeps for spreading: the registry as last read, and
/// the last write-rate sample of each reel it read. Shared by clones.
#[derive(Clone, Debug)]
pub(super) struct Spread {
    hot_per_sec: f64,
    /// How often the registry is read again (`SPREAD_REFRESH_MS`): a reel
    /// spread now is written spread by every aggregator within this long.
    refresh: Duration,
    registry: Arc<Mutex<Registry>>,
    samples: Arc<Mutex<HashMap<ReelId, (i64, Instant)>>>,
}

impl Spread {
    pub(super) fn new(config: &crate::config::Config) -> Self {
        Spread {
            hot_per_sec: config.resize.hot_per_sec,
            refresh: config.spread_refresh,
            registry: Arc::default(),
            samples: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes `w` writes of `reel`'s writer items at `at`; the write rate
    /// since this instance's last sample of it, if that is long enough ago
    /// and no fold took writes away meanwhile.
    fn sample(&self, reel: &ReelId, w: i64, at: Instant) -> Option<f64> {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let rate = match samples.get(reel) {
            Some(&(_, t0)) if at.duration_since(t0) < SAMPLE_MIN => return None,
            Some(&(w0, t0)) => {
                (w >= w0).then(|| (w - w0) as f64 / at.duration_since(t0).as_secs_f64())
            }
            None => None,
        };
        if samples.len() >= MAX_SAMPLES && !samples.contains_key(reel) {
            samples.clear();
        }
        samples.insert(reel.clone(), (w, at));
        rate
    }
}

impl DynamoStore {
    /// Stream mode: each reel's writer items summed over its parts (quiet
    /// ones folded by the way, the write rate noted); transactional mode:
    /// nothing (no writer items).
    pub(super) async fn writer_sums(
        &self,
        reels: &[ReelId],
    ) -> Result<HashMap<ReelId, Writers>, Error> {
        if self.writers_table.is_none() {
            return Ok(HashMap::new());
        }
        futures::stream::iter(reels.iter().cloned())
            .map(|reel| async move {
                let w = self.writer_partitions(&reel).await?;
                Ok::<_, Error>((reel, w))
            })
            .buffer_unordered(WRITER_QUERY_PARALLELISM)
            .try_collect()
            .await
    }

    /// One reel's writer items: part 0, then every further part its base
    /// names, each read consistently.
    pub(super) async fn writer_partitions(&self, reel: &ReelId) -> Result<Writers, Error> {
        let pk0 = keys::likes_writers_part_key(reel, 0);
        let p0 = self.read_part(&pk0).await?;
        let parts = parts_of(&p0);
        let mut w = p0.w;
        let mut writers = p0.items - usize::from(p0.base.is_some());
        let mut sum = Writers::default();
        sum.add(&pk0, p0);
        let rest: Vec<(String, Partition)> = futures::stream::iter(1..parts)
            .map(|part| async move {
                let pk = keys::likes_writers_part_key(reel, part);
                let p = self.read_part(&pk).await?;
                Ok::<_, Error>((pk, p))
            })
            .buffer_unordered(WRITER_QUERY_PARALLELISM)
            .try_collect()
            .await?;
        for (pk, p) in rest {
            w = w.saturating_add(p.w);
            writers += p.items - usize::from(p.base.is_some());
            sum.add(&pk, p);
        }
        if let Some(rate) = self.spread.sample(reel, w, Instant::now()) {
            let want = parts_for_rate(rate, self.spread.hot_per_sec, writers);
            if want > 1 {
                self.keep_spread(reel, want, rate).await;
            }
        }
        Ok(sum)
    }

    /// The parts each of `reels` is written to now (absent: one), from
    /// the registry as this instance last read it, read again when older
    /// than `SPREAD_REFRESH_MS`. A registry that cannot be read leaves
    /// the last view in place: writing to fewer parts than asked is exact,
    /// only busier.
    pub(super) async fn spread_parts(&self, reels: &[&ReelId]) -> HashMap<ReelId, u32> {
        self.refresh_registry().await;
        let reg = self.spread.lock();
        let now_s = crate::clock::now_ms() / 1000;
        reels
            .iter()
            .filter_map(|r| {
                let e = reg.entries.get(*r)?;
                (e.expires_at > now_s).then(|| ((*r).clone(), e.parts))
            })
            .collect()
    }

    /// Reads the registry again if it is due (see [`Registry::due`]); no
    /// lock is held across the read.
    async fn refresh_registry(&self) {
        if !self.spread.lock().due(self.spread.refresh) {
            return;
        }
        match self.read_registry().await {
            Ok(entries) => self.spread.lock().entries = entries,
            Err(e) => tracing::warn!(
                error = e.code(),
                "spread registry unreadable; writing by the last one read"
            ),
        }
    }

    async fn read_registry(&self) -> Result<HashMap<ReelId, Entry>, Error> {
        let (items, _) = self.query_writers(keys::LIKES_SPREAD_KEY, false).await?;
        Ok(items.iter().filter_map(entry_of).collect())
    }

    /// A reader saw `reel`'s writer items written at `rate` a second,
    /// which asks for `want` parts: unless the registry already spreads
    /// it that wide for a while yet, raise the base's parts and then
    /// (re)register it. Failures are logged and left to the next reader.
    async fn keep_spread(&self, reel: &ReelId, want: u32, rate: f64) {
        let now_s = crate::clock::now_ms() / 1000;
        let ttl = REGISTRY_TTL.as_secs() as i64;
        self.refresh_registry().await;
        let current = self.spread.lock().entries.get(reel).copied();
        if current.is_some_and(|e| e.parts >= want && e.expires_at > now_s + ttl / 2) {
            return;
        }
        let parts = want.max(current.map_or(1, |e| e.parts));
        let entry = Entry {
            parts,
            expires_at: now_s + ttl,
        };
        match self.spread_reel(reel, entry).await {
            Ok(()) => {
                tracing::info!(reel = %reel, parts, rate, "writer items spread");
                self.stats.writer_spreads.fetch_add(1, Ordering::Relaxed);
                self.spread.lock().entries.insert(reel.clone(), entry);
            }
            Err(e) => {
                tracing::warn!(reel = %reel, parts, error = e.code(), "writer spread failed; left to the next read")
            }
        }
    }

    /// Raises part 0's base to `entry.parts` (if lower), then registers.
    async fn spread_reel(&self, reel: &ReelId, entry: Entry) -> Result<(), Error> {
        let table = self.writers_table()?;
        let parts = AttributeValue::N(entry.parts.to_string());
        let raised = self
            .client
            .update_item()
            .table_name(table)
            .key(
                "pk",
                AttributeValue::S(keys::likes_writers_part_key(reel, 0)),
            )
            .key(
                "sk",
                AttributeValue::S(keys::LIKES_WRITERS_BASE_SORT.to_owned()),
            )
            .update_expression("SET #p = :p")
            .condition_expression("attribute_not_exists(#p) OR #p < :p")
            .expression_attribute_names("#p", keys::LIKES_WRITER_PARTS_ATTR)
            .expression_attribute_values(":p", parts.clone())
            .send()
            .await;
        match raised {
            Ok(_) => {}
            // Already that wide or wider.
            Err(SdkError::ServiceError(se)) if se.err().is_conditional_check_failed_exception() => {
            }
            Err(e) => return Err(translate("UpdateItem", e)),
        }
        self.client
            .put_item()
            .table_name(table)
            .item("pk", AttributeValue::S(keys::LIKES_SPREAD_KEY.to_owned()))
            .item("sk", AttributeValue::S(reel.as_str().to_owned()))
            .item(keys::LIKES_WRITER_PARTS_ATTR, parts)
            .item(
                "expires_at",
                AttributeValue::N(entry.expires_at.to_string()),
            )
            .send()
            .await
            .map_err(|e| translate("PutItem", e))?;
        Ok(())
    }
}

/// A registry item as (reel, entry); `None` for anything else.
fn entry_of(item: &Item) -> Option<(ReelId, Entry)> {
    let reel = ReelId::parse(item.string("sk")?).ok()?;
    let parts = item.int(keys::LIKES_WRITER_PARTS_ATTR)?;
    let parts = parts.clamp(1, i64::from(keys::MAX_WRITER_PARTS)) as u32;
    Some((
        reel,
        Entry {
            parts,
            expires_at: item.int("expires_at").unwrap_or(0),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_asks_for_a_power_of_two_parts_up_to_the_most() {
        let many = 1_000;
        assert_eq!(parts_for_rate(0.0, 300.0, many), 1);
        assert_eq!(parts_for_rate(299.0, 300.0, many), 1);
        assert_eq!(parts_for_rate(300.0, 300.0, many), 1);
        assert_eq!(parts_for_rate(301.0, 300.0, many), 2);
        assert_eq!(parts_for_rate(1_000.0, 300.0, many), 4);
        assert_eq!(parts_for_rate(4_000.0, 300.0, many), 16);
        assert_eq!(parts_for_rate(1e9, 300.0, many), keys::MAX_WRITER_PARTS);
        assert_eq!(parts_for_rate(f64::NAN, 300.0, many), 1);
        assert_eq!(parts_for_rate(10.0, 0.0, many), 1);
        // No more parts than writers: 32 stream shards at 320 writes a
        // second against 9 ask for 64, and get 32; 12 get 8.
        assert_eq!(parts_for_rate(320.0, 9.0, 32), 32);
        assert_eq!(parts_for_rate(320.0, 9.0, 12), 8);
        assert_eq!(parts_for_rate(320.0, 9.0, 0), 1);
    }

    #[test]
    fn a_sample_needs_a_second_and_no_fold_between() {
        let spread = Spread {
            hot_per_sec: 1.0,
            refresh: Duration::ZERO,
            registry: Arc::default(),
            samples: Arc::default(),
        };
        let reel = ReelId::parse("r").unwrap();
        let t0 = Instant::now();
        assert_eq!(spread.sample(&reel, 100, t0), None);
        assert_eq!(
            spread.sample(&reel, 150, t0 + Duration::from_millis(500)),
            None
        );
        assert_eq!(
            spread.sample(&reel, 300, t0 + Duration::from_secs(2)),
            Some(100.0)
        );
        // A fold took items (and their writes) away: no rate this time.
        assert_eq!(spread.sample(&reel, 10, t0 + Duration::from_secs(4)), None);
        assert_eq!(
            spread.sample(&reel, 40, t0 + Duration::from_secs(7)),
            Some(10.0)
        );
    }

    #[test]
    fn parts_come_from_part_zeros_base_and_are_bounded() {
        let base = |v: Option<&str>| Partition {
            base: Some(Item::from_iter(v.map(|v| {
                (
                    keys::LIKES_WRITER_PARTS_ATTR.to_owned(),
                    AttributeValue::N(v.into()),
                )
            }))),
            ..Partition::default()
        };
        assert_eq!(parts_of(&Partition::default()), 1);
        assert_eq!(parts_of(&base(None)), 1);
        assert_eq!(parts_of(&base(Some("8"))), 8);
        assert_eq!(parts_of(&base(Some("0"))), 1);
        assert_eq!(parts_of(&base(Some("100000"))), keys::MAX_WRITER_PARTS);
    }
}
