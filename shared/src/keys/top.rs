//! The trending sketches' items ([`crate::trending`]), in the views table
//! (where, in stream mode, the likes' writer items are too).

/// `top#{metric}#{hour}`: the partition of an hour's writer sketches of a
/// metric (`likes`, `views`); the hour is Unix ms / 3,600,000.
pub fn top_key(metric: &str, hour: i64) -> String {
    format!("top#{metric}#{hour}")
}

/// The attribute of a sketch, in a `top#` item.
pub const SKETCH_ATTR: &str = "fi";

/// The attribute of the hour a sketch is of: in a `top#` item, and in the
/// writer's checkpoint (the hour of the sketch it stored last).
pub const SKETCH_HOUR_ATTR: &str = "fh";

/// The writer a `top#` item's sort key names: the hash of its checkpoint
/// key (`agg#{hash}` for likes, `ck#{hash}` for views).
pub fn sketch_writer(checkpoint_key: &str) -> &str {
    checkpoint_key
        .strip_prefix("agg#")
        .or_else(|| checkpoint_key.strip_prefix("ck#"))
        .unwrap_or(checkpoint_key)
}

/// The writer a like function instance's `top#likes#` items name
/// (transactional mode, [`crate::trending::instance`]): `fn#` and a
/// random number drawn at its cold start.
pub fn instance_writer(id: u64) -> String {
    format!("fn#{id:016x}")
}

/// How long a `top#` item is kept (seconds): a day's window and a day to
/// spare; readers bound what they read by the hour in the key.
pub const TOP_TTL_SECS: i64 = 2 * 86_400;

/// `warm#{reel_id}` (counters table): a trending reel's totals as the
/// cache warmer last summed them ([`crate::store::WarmStore`]).
pub fn warm_key(reel: &crate::keys::ReelId) -> String {
    format!("warm#{}", reel.as_str())
}

/// `trending#{metric}#{window}` (counters table): a list as the cache
/// warmer last ranked it, for every instance to serve.
pub fn trending_list_key(metric: &str, window: &str) -> String {
    format!("trending#{metric}#{window}")
}

/// `trending#warm` (counters table): the reels the cache warmer keeps
/// `warm#` items of, and when it last wrote them.
pub const WARM_SET_KEY: &str = "trending#warm";

/// The attribute of a warm item, a list or the warm set: its content
/// (JSON).
pub const WARM_DATA_ATTR: &str = "data";

/// How long a warm item, a list or the warm set is kept (seconds):
/// readers judge them by the clock inside, never by the TTL; this only
/// clears the ones of reels that stopped trending.
pub const WARM_TTL_SECS: i64 = 3_600;
