//! The trending sketches' items ([`crate::trending`]), in the views table
//! (where, in stream mode, the likes' writer items are too).

/// `top#{metric}#{hour}`: the partition of an hour's writer sketches of a
/// metric (`likes`, `views`); the hour is Unix ms / 3,600,000.
pub fn top_key(metric: &str, hour: i64) -> String {
    format!("top#{metric}#{hour}")
}

/// The attribute of a sketch: in a checkpoint item (the writer's current
/// hour's) and in a `top#` item (an ended hour's).
pub const SKETCH_ATTR: &str = "fi";

/// The attribute of the hour a checkpoint's sketch is of.
pub const SKETCH_HOUR_ATTR: &str = "fh";

/// The attribute of a `top#` item of the writer's current hour: the key
/// of its checkpoint item, which holds the hour's live sketch (the
/// counters table's `agg#…` for likes, the views table's `ck#…` for
/// views).
pub const SKETCH_AT_ATTR: &str = "ck";

/// How long a `top#` item is kept (seconds): a day's window and a day to
/// spare; readers bound what they read by the hour in the key.
pub const TOP_TTL_SECS: i64 = 2 * 86_400;
