//! Validated ids and the DynamoDB key formats.
//!
//! These formats are a contract (see `docs/guarantees.md`, Data model): operations
//! tools, reconciliation and tests build the same keys.

use std::fmt;

pub mod known;
pub mod tail;
pub mod top;
pub mod window;

/// Longest reel id accepted.
pub const MAX_REEL_ID_LEN: usize = 64;
/// Longest user id accepted (in bytes). Identity providers' `sub` claims are
/// far shorter; the bound keeps a hostile header from making large keys.
pub const MAX_USER_ID_LEN: usize = 256;
/// Shard numbers are zero-padded to three digits, so a settings item may
/// name at most 1000 shards (000..=999). Resizes go to at most
/// [`MAX_RESIZE_SHARDS`].
pub const MAX_SHARDS: u32 = 1000;

/// The most items one `TransactGetItems` reads. While a reel shrinks,
/// readers read its base item and the shards being folded in one, so one
/// shrink retires at most 99 shards, and resizes go to at most 100.
pub const MAX_TRANSACT_ITEMS: u32 = 100;
/// The most shards a resize may go to (and the ceiling of `MAX_SHARDS` in
/// the configuration): one `TransactGetItems` must read them all.
pub const MAX_RESIZE_SHARDS: u32 = MAX_TRANSACT_ITEMS;
/// Reels one stream-mode aggregation transaction may take: a checkpoint
/// update plus a shard update per reel would fit 99 in DynamoDB's
/// [`MAX_TRANSACT_ITEMS`]; this stays at the 49 of when each reel also took
/// a settings check, so the configured bound and the chunks cut under it
/// are what they were.
pub const MAX_CHUNK_REELS: usize = ((MAX_TRANSACT_ITEMS as usize) - 1) / 2;

/// A shard item's attribute that marks it closed: a shrink retired the
/// shard (its value moved to the base item) and keeps the item as a
/// tombstone that refuses stream aggregation until a grow reopens it (see
/// [`crate::reshard`]). Holds the settings version of the retiring shrink.
pub const SHARD_CLOSED: &str = "closed";

/// A shard item's recent changes (stream mode), kept so reconciliation can
/// take out of a shard's `n` what was applied after the moment it counted
/// the rows at (see [`crate::reconcile`]): `d{width}_{index}` is the net
/// change of the records applied to the item whose time (a new row's
/// `liked_at`, a removal's stream timestamp) falls in bucket `index` of
/// `width` ms (it starts at `index × width`, Unix ms); `x{width}_{index}`
/// how many of them were removals. The width is in the name so that
/// buckets of another width (after a configuration change) are never read
/// as this one's. The aggregator writes them beside `n` and removes the
/// old ones.
pub fn recent_delta_attr(width_ms: i64, start_ms: i64) -> String {
    format!("d{width_ms}_{}", start_ms.div_euclid(width_ms.max(1)))
}

/// See [`recent_delta_attr`]: the removals of a bucket.
pub fn recent_removals_attr(width_ms: i64, start_ms: i64) -> String {
    format!("x{width_ms}_{}", start_ms.div_euclid(width_ms.max(1)))
}

/// What a shard item's attribute named `name` is, if it is one of its
/// recent-change buckets ([`recent_delta_attr`], [`recent_removals_attr`]).
pub fn parse_recent_attr(name: &str) -> Option<RecentAttr> {
    let (kind, rest) = name.split_at_checked(1)?;
    let removals = match kind {
        "d" => false,
        "x" => true,
        _ => return None,
    };
    let (width, index) = rest.split_once('_')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(width) || !digits(index) {
        return None;
    }
    let width_ms: i64 = width.parse().ok().filter(|w| *w > 0)?;
    let start_ms = index.parse::<i64>().ok()?.checked_mul(width_ms)?;
    Some(RecentAttr {
        removals,
        width_ms,
        start_ms,
    })
}

/// A recent-change bucket attribute ([`recent_delta_attr`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecentAttr {
    /// `x…`: the bucket's removals; `d…`: its net change.
    pub removals: bool,
    /// The bucket width it was written with.
    pub width_ms: i64,
    /// The bucket's start (Unix ms).
    pub start_ms: i64,
}

/// The like row's attribute that says stream mode wrote it (and so that no
/// transaction counted it): `cm = "s"`.
pub const COUNTED_BY_STREAM: (&str, &str) = ("cm", "s");

/// A reel id: 1–64 characters of `[A-Za-z0-9_-]`. The alphabet excludes `#`,
/// the key separator, so one id can never spell another reel's keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReelId(String);

/// Why an id was refused; the message is safe to show to the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidId(pub &'static str);

impl ReelId {
    /// Validates `s` as a reel id; the only way to make one.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        if s.is_empty() {
            return Err(InvalidId("reel_id must not be empty"));
        }
        if s.len() > MAX_REEL_ID_LEN {
            return Err(InvalidId("reel_id must be at most 64 characters"));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(InvalidId(
                "reel_id may contain only A-Z, a-z, 0-9, '_' and '-'",
            ));
        }
        Ok(ReelId(s.to_owned()))
    }

    /// The id as validated, safe to put in a key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A user id: the JWT `sub` claim (or, in dev mode, the `x-user-id` header).
/// It is stored as its own attribute and never concatenated into a key, so
/// its alphabet is free; control characters and empty ids are refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserId(String);

impl UserId {
    /// Validates `s` as a user id; the only way to make one.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        if s.is_empty() {
            return Err(InvalidId("user id must not be empty"));
        }
        if s.len() > MAX_USER_ID_LEN {
            return Err(InvalidId("user id must be at most 256 bytes"));
        }
        if s.chars().any(char::is_control) {
            return Err(InvalidId("user id must not contain control characters"));
        }
        Ok(UserId(s.to_owned()))
    }

    /// The id as validated (an attribute value, never part of a key).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The two mutations of a like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `PUT /reels/{reel_id}/like`: adds the caller's like, +1 if new.
    Like,
    /// `DELETE /reels/{reel_id}/like`: removes it, −1 if it was there.
    Unlike,
}

impl Action {
    /// `like` or `unlike`: in logs, the idempotency record and the request
    /// token's hash, so changing it changes every token.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Like => "like",
            Action::Unlike => "unlike",
        }
    }

    /// What the action adds to the count when it changes state.
    pub fn delta(self) -> i64 {
        match self {
            Action::Like => 1,
            Action::Unlike => -1,
        }
    }
}

/// `{shard:03}#reel#{reel_id}#likes`: the shard number comes first so that
/// the shards of one reel are spread through the key space even in a store
/// that keeps keys sorted.
pub fn shard_key(reel: &ReelId, shard: u32) -> String {
    debug_assert!(shard < MAX_SHARDS);
    format!("{shard:03}#reel#{reel}#likes")
}

/// `base#reel#{reel_id}#likes`: where shrinking folds the counts of the
/// shards it retires. No like ever writes it (likes only touch shards), so
/// a reader can read it and the shards being folded in one
/// `TransactGetItems` without conflicting with live likes. Readers add it
/// once a reel has been shrunk (the settings item's `base`).
pub fn base_key(reel: &ReelId) -> String {
    format!("base#reel#{reel}#likes")
}

/// Inverse of [`base_key`].
pub fn parse_base_key(pk: &str) -> Option<ReelId> {
    let reel = pk.strip_prefix("base#reel#")?.strip_suffix("#likes")?;
    ReelId::parse(reel).ok()
}

/// `reel#{reel_id}#reconcile`: the reel's correction ledger (how many
/// corrections reconciliation applied, by which run). A correction is
/// conditioned on it, so two runs never both apply one.
pub fn reconcile_key(reel: &ReelId) -> String {
    format!("reel#{reel}#reconcile")
}

/// `recon#run`: the state of the current (or last) reconciliation run.
pub const RECONCILE_RUN_KEY: &str = "recon#run";

/// `recon#{run_id}#{part}#{index}`: one chunk of a run's checkpointed
/// partial counts. Expires through TTL.
pub fn reconcile_chunk_key(run_id: &str, part: &str, index: u32) -> String {
    format!("recon#{run_id}#{part}#{index}")
}

/// `recon#{run_id}#reel#{reel_id}`: a run's count item for one reel: the
/// like rows each likes-scan segment counted for it, with the checkpoint
/// that added them. Expires through TTL.
pub fn reconcile_count_key(run_id: &str, reel: &ReelId) -> String {
    format!("recon#{run_id}#reel#{reel}")
}

/// Inverse of [`reconcile_count_key`]: (run id, reel). Run ids never hold
/// `#`, so the split is unambiguous.
pub fn parse_reconcile_count_key(pk: &str) -> Option<(&str, ReelId)> {
    let rest = pk.strip_prefix("recon#")?;
    let (run, reel) = rest.split_once("#reel#")?;
    if run.contains('#') {
        return None;
    }
    Some((run, ReelId::parse(reel).ok()?))
}

/// The reel a counters-table key belongs to: shard, base, settings and
/// ledger items (not key records or reconciliation bookkeeping).
pub fn reel_of_counter_key(pk: &str) -> Option<ReelId> {
    if let Some((_, reel)) = parse_shard_key(pk) {
        return Some(reel);
    }
    if let Some(reel) = parse_base_key(pk) {
        return Some(reel);
    }
    let rest = pk.strip_prefix("reel#")?;
    let reel = rest
        .strip_suffix("#settings")
        .or_else(|| rest.strip_suffix("#reconcile"))?;
    ReelId::parse(reel).ok()
}

/// The reel whose settings item, and whose like row of [`PROBE_USER`], the
/// readiness probe reads. The probe only needs the tables to answer; what
/// the items hold (normally nothing) does not matter, and a read never
/// changes them.
pub fn probe_reel() -> ReelId {
    ReelId("_healthz_probe".to_owned())
}

/// The user id of the readiness probe's like-row read.
pub const PROBE_USER: &str = "_healthz_probe";

/// `caller#{hash}#{minute}`: the read units one caller's count reads cost
/// in one UTC minute (Unix ms / 60,000), added to by every function
/// instance ([`crate::service`]'s read budget). The hash (64 bits of
/// SHA-256 of the caller's key: the user, or the source address) keeps
/// user ids and addresses out of the key. Expires through TTL.
pub fn caller_reads_key(caller: &str, minute: i64) -> String {
    format!(
        "caller#{}#{minute}",
        &digest_hex("likes/caller-reads/v1", &[caller])[..16]
    )
}

/// `reel#{reel_id}#settings`: how many shards writers use and readers sum.
pub fn settings_key(reel: &ReelId) -> String {
    format!("reel#{reel}#settings")
}

/// `idem#{token}`: the record of a request made with an `Idempotency-Key`,
/// written in the same transaction as the change it records (or alone, for
/// a request that changed nothing), so that any later retry of that key
/// answers from it instead of acting again. The token already hashes
/// (user, reel, action, key). Expires through DynamoDB TTL (`expires_at`).
pub fn idempotency_record_key(token: &str) -> String {
    format!("idem#{token}")
}

/// `agg#{hash}`: the aggregator's checkpoint of one stream shard (stream
/// mode, [`crate::aggregate`]): the last sequence number applied. The hash
/// (128 bits of SHA-256 of the stream ARN and the shard id) keeps the key
/// short whatever the ids look like; they are never parsed. Expires through
/// TTL once its shard is closed.
pub fn aggregate_checkpoint_key(stream_arn: &str, shard_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"likes/checkpoint/v1");
    for field in [stream_arn, shard_id] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field.as_bytes());
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("agg#{hex}")
}

/// Inverse of [`settings_key`].
pub fn parse_settings_key(pk: &str) -> Option<ReelId> {
    let reel = pk.strip_prefix("reel#")?.strip_suffix("#settings")?;
    ReelId::parse(reel).ok()
}

/// The sparse global secondary index of the counters table that holds only
/// the settings items of reels with more than one shard or a resize in
/// progress: the scheduled resharder and the hot-reel listing query it
/// instead of scanning the table. Defined in `template.yaml`.
pub const RESIZE_INDEX: &str = "ResizeIndex";
/// Its partition key attribute, present only on such settings items, always
/// with the value [`RESIZE_INDEX_VALUE`].
pub const RESIZE_INDEX_ATTR: &str = "rz";
/// The one value of [`RESIZE_INDEX_ATTR`]: every indexed item shares one
/// index partition, so a query of that value lists every such reel.
pub const RESIZE_INDEX_VALUE: &str = "resized";

/// Inverse of [`shard_key`], for tools that list shard items.
pub fn parse_shard_key(pk: &str) -> Option<(u32, ReelId)> {
    let (shard, rest) = pk.split_once('#')?;
    if shard.len() != 3 || !shard.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let reel = rest.strip_prefix("reel#")?.strip_suffix("#likes")?;
    Some((shard.parse().ok()?, ReelId::parse(reel).ok()?))
}

// ---- Likes' writer items (stream mode; `WRITERS_TABLE`, which the template
// points at the views table): key `pk` + sort key `sk`.

/// `l#{reel}`: the partition of a reel's like counts written by stream
/// shards, one item per stream shard that ever counted the reel
/// ([`likes_writer_sort`]) and the base item compaction folds quiet ones
/// into ([`LIKES_WRITERS_BASE_SORT`]); a reader queries it and sums.
pub fn likes_writers_key(reel: &ReelId) -> String {
    format!("l#{}", reel.as_str())
}

/// The partition key of part `part` of a reel's writer items: part 0 is
/// [`likes_writers_key`], part `p > 0` is `l#{reel}#{p}`. A reel written
/// faster than one partition key takes is spread over
/// [`LIKES_WRITER_PARTS_ATTR`] parts (see `store/dynamodb/spread.rs`).
pub fn likes_writers_part_key(reel: &ReelId, part: u32) -> String {
    if part == 0 {
        likes_writers_key(reel)
    } else {
        format!("l#{}#{part}", reel.as_str())
    }
}

/// The reel and part of a writer partition key ([`likes_writers_part_key`]).
/// Reel ids hold no `#`, so the split is unambiguous.
pub fn parse_likes_writers_key(pk: &str) -> Option<(ReelId, u32)> {
    let rest = pk.strip_prefix("l#")?;
    let (reel, part) = match rest.split_once('#') {
        None => (rest, 0),
        Some((reel, p)) => {
            if p.is_empty() || p.starts_with('0') || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (reel, p.parse().ok().filter(|p| *p < MAX_WRITER_PARTS)?)
        }
    };
    Some((ReelId::parse(reel).ok()?, part))
}

/// The most parts a reel's writer items are spread over: at DynamoDB's
/// ~1,000 write units per partition key, room for ~64,000 writer-item
/// writes a second, some 16,000 busy stream shards.
pub const MAX_WRITER_PARTS: u32 = 64;

/// `parts` on part 0's base item: how many parts readers query (raised
/// before any writer writes past it, never lowered).
pub const LIKES_WRITER_PARTS_ATTR: &str = "parts";

/// The partition of the spread registry: one item per reel whose writers
/// currently spread (sort key: the reel id; `parts`, and `expires_at` for
/// TTL). Aggregators read it whole, a few times a minute.
pub const LIKES_SPREAD_KEY: &str = "l~spread";

/// Which of `parts` parts writer `writer` ([`likes_writer`]) writes a
/// reel's count to: FNV-1a (32 bit) of its name, modulo `parts`. Pinned,
/// because readers never need it (they query every part) but a change
/// would move every spread writer at once.
pub fn likes_writer_part(writer: &str, parts: u32) -> u32 {
    if parts <= 1 {
        return 0;
    }
    let mut h: u32 = 0x811c_9dc5;
    for b in writer.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % parts
}

/// `w#{writer}`: the like count one stream shard added to a reel; the
/// writer is the hash of its checkpoint key ([`likes_writer`]). Only that
/// stream shard's transactions write it, so no two stream shards' writes
/// ever meet on an item.
pub fn likes_writer_sort(writer: &str) -> String {
    format!("w#{writer}")
}

/// The prefix of every writer item's sort key.
pub const LIKES_WRITER_PREFIX: &str = "w#";

/// `~base`: the base item of a reel's writer partition, where quiet
/// writer items are folded. It sorts after every `w#` item, so a `Query`
/// reads it last (see `store/dynamodb/writers.rs` for why that matters).
pub const LIKES_WRITERS_BASE_SORT: &str = "~base";

/// The writer name of the stream shard behind checkpoint key `key`
/// ([`aggregate_checkpoint_key`]): its hash, without the prefix.
pub fn likes_writer(checkpoint_key: &str) -> &str {
    checkpoint_key
        .strip_prefix("agg#")
        .unwrap_or(checkpoint_key)
}

// ---- Views (the `VIEWS_TABLE`, see `crate::views`): key `pk` + sort key `sk`.

/// The opaque id of one writer of view items: a Kinesis shard of the views
/// stream, named by 64 bits of SHA-256 of the stream ARN and the shard id
/// (never parsed; short whatever the ids look like).
pub fn views_writer(stream_arn: &str, shard_id: &str) -> String {
    format!(
        "w{}",
        &digest_hex("likes/views-writer/v1", &[stream_arn, shard_id])[..16]
    )
}

/// `v#{reel}`: the partition of a reel's view items, one per writer for
/// all time ([`views_all_sort`]) and one per writer per UTC day
/// ([`views_day_sort`]); a reader queries the partition and sums.
pub fn views_reel_key(reel: &ReelId) -> String {
    format!("v#{}", reel.as_str())
}

/// `all#{writer}`: a writer's all-time views and unique-viewer sketch of a
/// reel.
pub fn views_all_sort(writer: &str) -> String {
    format!("all#{writer}")
}

/// The prefix every all-time view item's sort key starts with.
pub const VIEWS_ALL_PREFIX: &str = "all#";

/// `d#{YYYY-MM-DD}#{writer}`: a writer's views and sketch of a reel on one
/// UTC day; days sort as text, so a date range is a sort-key range.
pub fn views_day_sort(day: &str, writer: &str) -> String {
    format!("d#{day}#{writer}")
}

/// The sort keys from the first day item of `first_day` to past the last
/// of `last_day` (both `YYYY-MM-DD`): a `BETWEEN` range.
pub fn views_day_range(first_day: &str, last_day: &str) -> (String, String) {
    (format!("d#{first_day}#"), format!("d#{last_day}#~"))
}

/// The writer name of a reel's **base** items (`all#base`,
/// `d#{day}#base`): where compaction folds the items of sealed writers
/// ([`crate::views::compact`]). Writers are `w` and hex digits, so no
/// writer is named `base`; the base items sort under the same prefixes,
/// so readers sum them with the writers' own.
pub const VIEWS_BASE_WRITER: &str = "base";

/// The writer of a view item's sort key and its day (`None` for an
/// all-time item): the inverse of [`views_all_sort`] and
/// [`views_day_sort`].
pub fn parse_views_sort(sk: &str) -> Option<(Option<&str>, &str)> {
    if let Some(writer) = sk.strip_prefix(VIEWS_ALL_PREFIX) {
        return Some((None, writer));
    }
    let (day, writer) = sk.strip_prefix("d#")?.split_once('#')?;
    Some((Some(day), writer))
}

/// `seal#{writer}` (sort key [`VIEWS_SINGLE_SORT`]): written once when the
/// writer will never write again (its Kinesis shard's child has applied a
/// chunk, or its repair completed), so that compaction may fold its items.
pub fn views_seal_key(writer: &str) -> String {
    format!("seal#{writer}")
}

/// `ck#{hash}` (sort key [`VIEWS_SINGLE_SORT`]): the views aggregator's
/// checkpoint of one Kinesis shard, as [`aggregate_checkpoint_key`] is
/// stream mode's.
pub fn views_checkpoint_key(stream_arn: &str, shard_id: &str) -> String {
    format!(
        "ck#{}",
        &digest_hex("likes/views-checkpoint/v1", &[stream_arn, shard_id])[..32]
    )
}

/// What a repair of shard `shard_id`'s given-up range starting at `start`
/// ([`crate::views::repair`]) writes under in place of a shard id: its
/// checkpoint, seen partition and writer are its own, so it never meets
/// the shard's aggregator on an item (a writer's sketch has one writer).
pub fn views_repair_source(shard_id: &str, start: &str) -> String {
    format!("{shard_id}#repair#{start}")
}

/// What every repair of shard `shard_id` writes its event ids under, in
/// place of a shard id (one seen partition for them all): a repair reads
/// it with the shard's own, so that two repairs never count one event.
pub fn views_repairs_seen_source(shard_id: &str) -> String {
    format!("{shard_id}#repairs")
}

/// `lease#{hash}` (sort key [`VIEWS_SINGLE_SORT`]): the lease that lets one
/// repair of the views stream `stream_arn` run at a time.
pub fn views_repair_lease_key(stream_arn: &str) -> String {
    format!(
        "lease#{}",
        &digest_hex("likes/views-repair-lease/v1", &[stream_arn])[..32]
    )
}

/// The sort key of items that are alone in their partition.
pub const VIEWS_SINGLE_SORT: &str = "-";

/// `seen#{hash}`: the partition of a Kinesis shard's recently applied event
/// ids, one item per chunk applied, sorted by [`views_seen_sort`].
pub fn views_seen_key(stream_arn: &str, shard_id: &str) -> String {
    format!(
        "seen#{}",
        &digest_hex("likes/views-seen/v1", &[stream_arn, shard_id])[..32]
    )
}

/// `{arrival ms, 13 digits}#{sequence number}`: a seen item's sort key, by
/// the latest arrival time in its chunk, so a window of time is a range.
pub fn views_seen_sort(arrival_ms: i64, seq_padded: &str) -> String {
    format!("{:013}#{seq_padded}", arrival_ms.max(0))
}

/// The lowest seen-item sort key whose chunk may hold a record that
/// arrived at or after `from_ms`.
pub fn views_seen_from(from_ms: i64) -> String {
    format!("{:013}#", from_ms.max(0))
}

/// Hex of SHA-256 over length-prefixed fields, under a domain tag.
fn digest_hex(tag: &str, fields: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(tag.as_bytes());
    for field in fields {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The UTC day (`YYYY-MM-DD`) of a Unix-ms instant: the civil date of its
/// day number (Howard Hinnant's `civil_from_days`).
pub fn utc_day(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests;
