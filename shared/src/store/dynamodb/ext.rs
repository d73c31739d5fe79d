//! Typed access to stored items: the accessor extension every read goes
//! through, the projections the reads share, and the conversions between
//! items and the store's types (`TryFrom<&Item>` one way, `*_item` the
//! other).
//!
//! A malformed attribute where a count or a shard number belongs is a fault
//! of ours (500), never read as a default: a settings item read as "one
//! shard" could hide shards from readers.

use crate::error::Error;
use crate::keys::{self, Action, ReelId};
use crate::store::{KeyRecord, Ledger, LikeRow, Phase, Settings, ShardValue, WriteSample};
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::{BTreeMap, HashMap};

/// A stored item, as the SDK hands it over.
pub(super) type Item = HashMap<String, AttributeValue>;

/// Reading one attribute of an [`Item`] as the type it should hold: `None`
/// when it is missing or of another type.
pub(super) trait ItemExt {
    /// A string attribute (`S`).
    fn string(&self, name: &str) -> Option<&str>;
    /// A number attribute (`N`) that is an integer.
    fn int(&self, name: &str) -> Option<i64>;
    /// A boolean attribute (`BOOL`).
    fn flag(&self, name: &str) -> Option<bool>;
    /// A binary attribute (`B`).
    fn bytes(&self, name: &str) -> Option<&[u8]>;

    /// The counters table's key, `pk`.
    fn pk(&self) -> Option<&str> {
        self.string("pk")
    }

    /// A counter attribute: missing counts 0 (`ADD` creates it on first
    /// use); anything but an integer is a fault.
    fn counter(&self, name: &str) -> Result<i64, Error>;

    /// Its windowed-count buckets ([`crate::keys::window`]): attribute and
    /// value, in name order.
    fn window_buckets(&self) -> Vec<(String, i64)>;

    /// A writer item's own-change tail ([`crate::keys::tail`]) in
    /// `window`'s width: bucket start, net change. Empty if it has none.
    fn own_tail(&self, window: &crate::keys::tail::TailWindow) -> BTreeMap<i64, i64> {
        let written = self.int("updated_at").unwrap_or(0);
        let Some(AttributeValue::M(map)) = self.attr(&window.attr()) else {
            return BTreeMap::new();
        };
        map.iter()
            .filter_map(|(k, v)| {
                let start = window.entry_start(k, written)?;
                Some((start, v.as_n().ok()?.parse::<i64>().ok()?))
            })
            .collect()
    }

    /// An attribute as stored.
    fn attr(&self, name: &str) -> Option<&AttributeValue>;

    /// A checkpoint's trending sketch ([`crate::keys::top`]).
    fn hour_sketch(&self) -> Option<crate::trending::HourSketch> {
        Some(crate::trending::HourSketch {
            hour: self.int(crate::keys::top::SKETCH_HOUR_ATTR)?,
            bytes: self.bytes(crate::keys::top::SKETCH_ATTR)?.to_vec(),
        })
    }
}

impl ItemExt for Item {
    fn attr(&self, name: &str) -> Option<&AttributeValue> {
        self.get(name)
    }

    fn string(&self, name: &str) -> Option<&str> {
        self.get(name)?.as_s().ok().map(String::as_str)
    }

    fn int(&self, name: &str) -> Option<i64> {
        self.get(name)?.as_n().ok()?.parse().ok()
    }

    fn flag(&self, name: &str) -> Option<bool> {
        self.get(name)?.as_bool().ok().copied()
    }

    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.get(name)?.as_b().ok().map(|b| b.as_ref())
    }

    fn window_buckets(&self) -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = self
            .keys()
            .filter(|name| crate::keys::window::parse_attr(name).is_some())
            .filter_map(|name| Some((name.clone(), self.int(name)?)))
            .collect();
        out.sort();
        out
    }

    fn counter(&self, name: &str) -> Result<i64, Error> {
        match self.get(name) {
            None => Ok(0),
            Some(_) => self
                .int(name)
                .ok_or_else(|| Error::internal("item holds a non-integer counter", name)),
        }
    }
}

/// A projection expression with the attribute names it uses (`n`, `w` and
/// the rest are DynamoDB reserved words, so they go through placeholders).
#[derive(Clone, Copy, Debug)]
pub(super) struct Projection {
    /// The `ProjectionExpression`.
    pub(super) expression: &'static str,
    /// Its `ExpressionAttributeNames`.
    pub(super) names: &'static [(&'static str, &'static str)],
}

impl Projection {
    /// A count item's value alone.
    pub(super) const VALUE: Projection = Projection {
        expression: "pk, #n, #w",
        names: &[("#n", "n"), ("#w", "w")],
    };
    /// The base item's fold counter alone.
    pub(super) const FOLDS: Projection = Projection {
        expression: "pk, #f",
        names: &[("#f", "folds")],
    };
}

impl TryFrom<&Item> for ShardValue {
    type Error = Error;

    /// A count item's `n` and `w` (missing attributes count 0).
    fn try_from(item: &Item) -> Result<Self, Error> {
        Ok(ShardValue {
            n: item.counter("n")?,
            w: item.counter("w")?,
        })
    }
}

impl TryFrom<&Item> for Settings {
    type Error = Error;

    /// A settings item; a malformed one is refused (see the module docs).
    fn try_from(item: &Item) -> Result<Self, Error> {
        let count = |name: &str| -> Result<Option<u32>, Error> {
            match item.get(name) {
                None => Ok(None),
                Some(v) => match item.int(name) {
                    Some(n) if (1..=keys::MAX_SHARDS as i64).contains(&n) => Ok(Some(n as u32)),
                    _ => Err(Error::internal(
                        "settings item holds an invalid shard count",
                        format_args!("{name} = {v:?}"),
                    )),
                },
            }
        };
        let write_shards = count("write_shards")?.unwrap_or(1);
        let read_shards = count("read_shards")?.unwrap_or(1);
        let phase = match item.string("phase") {
            None => Phase::Stable,
            Some(p) => Phase::parse(p)
                .ok_or_else(|| Error::internal("settings item holds an unknown phase", p))?,
        };
        Ok(Settings {
            write_shards,
            read_shards,
            phase,
            target: count("target")?.unwrap_or(write_shards),
            fold_from: count("fold_from")?.unwrap_or(read_shards),
            phase_at_ms: item.int("phase_at").unwrap_or(0),
            version: match item.get("ver") {
                None => 0,
                Some(v) => match item.int("ver") {
                    Some(n) if n > 0 => n as u64,
                    _ => {
                        return Err(Error::internal(
                            "settings item holds an invalid version",
                            format_args!("{v:?}"),
                        ));
                    }
                },
            },
            sample: match (item.int("sample_w"), item.int("sample_at")) {
                (Some(writes), Some(at_ms)) => Some(WriteSample { writes, at_ms }),
                _ => None,
            },
            cool_since_ms: item.int("cool_since"),
            has_base: item.flag("base").unwrap_or(false),
        })
    }
}

/// The settings item for `s` at `version`; carries the sparse index's key
/// only while the reel is [`Settings::indexed`].
pub(super) fn settings_item(reel: &ReelId, s: &Settings, version: u64) -> Item {
    let n = |v: i64| AttributeValue::N(v.to_string());
    let mut item = HashMap::from([
        ("pk".to_owned(), AttributeValue::S(keys::settings_key(reel))),
        ("write_shards".to_owned(), n(s.write_shards.into())),
        ("read_shards".to_owned(), n(s.read_shards.into())),
        (
            "phase".to_owned(),
            AttributeValue::S(s.phase.as_str().to_owned()),
        ),
        ("target".to_owned(), n(s.target.into())),
        ("fold_from".to_owned(), n(s.fold_from.into())),
        ("phase_at".to_owned(), n(s.phase_at_ms)),
        ("ver".to_owned(), n(version as i64)),
    ]);
    if let Some(sample) = s.sample {
        item.insert("sample_w".to_owned(), n(sample.writes));
        item.insert("sample_at".to_owned(), n(sample.at_ms));
    }
    if let Some(c) = s.cool_since_ms {
        item.insert("cool_since".to_owned(), n(c));
    }
    if s.has_base {
        item.insert("base".to_owned(), AttributeValue::Bool(true));
    }
    if s.indexed() {
        item.insert(
            keys::RESIZE_INDEX_ATTR.to_owned(),
            AttributeValue::S(keys::RESIZE_INDEX_VALUE.to_owned()),
        );
    }
    item
}

impl From<&Item> for LikeRow {
    /// A like row's stamp and the token of the request that wrote it.
    fn from(item: &Item) -> Self {
        LikeRow {
            liked_at_ms: item.int("liked_at"),
            token: item.string("tok").map(str::to_owned),
        }
    }
}

impl TryFrom<&Item> for KeyRecord {
    type Error = Error;

    /// An `Idempotency-Key` record: the action it answered and whether it
    /// changed anything.
    fn try_from(item: &Item) -> Result<Self, Error> {
        let action = match item.string("action") {
            Some("like") => Action::Like,
            Some("unlike") => Action::Unlike,
            other => {
                return Err(Error::internal(
                    "idempotency record with an unknown action",
                    format_args!("{other:?}"),
                ));
            }
        };
        Ok(KeyRecord {
            action,
            changed: item.flag("changed").unwrap_or(false),
        })
    }
}

impl From<&Item> for Ledger {
    /// A reel's reconciliation ledger.
    fn from(item: &Item) -> Self {
        Ledger {
            corrections: item.int("corrections").map_or(0, |n| n.max(0) as u64),
            last_run: item.string("last_run").map(str::to_owned),
            last_drift: item.int("last_drift").unwrap_or(0),
        }
    }
}
