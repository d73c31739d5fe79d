//! Planning a resize: the first step from a reel's settings to a target,
//! and which count items a step brings into the readers' range.

use super::{Begin, UNOBSERVED};
use crate::error::Error;
use crate::keys;
use crate::store::{CountItem, Phase, Settings};

/// Whether the phase's next step waits [`Config::resize_wait`] after it.
pub(super) fn waits(phase: Phase) -> bool {
    matches!(phase, Phase::Growing | Phase::Draining)
}

pub(super) enum Plan {
    Put(Settings),
    Keep(Begin),
}

/// The first step of a resize of `cur` to `target`, as a new settings item.
/// A resize in progress to another target refuses (409). The step it
/// returns is not stamped ([`UNOBSERVED`]): its wait starts when it is seen
/// in place ([`stamp`]), never when it was computed.
pub(super) fn plan(cur: &Settings, target: u32, now: i64) -> Result<Plan, Error> {
    if cur.phase != Phase::Stable {
        return if cur.target == target {
            Ok(Plan::Keep(Begin::Joined))
        } else {
            Err(Error::Conflict {
                code: "resize_in_progress",
                message: format!(
                    "this reel is being resized to {} shards ({}); try again when it is done",
                    cur.target,
                    cur.phase.as_str()
                ),
            })
        };
    }
    let have = cur.shards_to_sum();
    if target == cur.write_shards && target == have {
        // A multi-shard settings item written by hand (no version) is
        // registered in the resize index, so the schedule tends it.
        if cur.version == 0 && cur.indexed() {
            return Ok(Plan::Put(Settings {
                phase_at_ms: now,
                ..*cur
            }));
        }
        return Ok(Plan::Keep(Begin::Unchanged));
    }
    let min_target = have.saturating_sub(keys::MAX_TRANSACT_ITEMS - 1).max(1);
    if target < min_target {
        return Err(Error::bad_request(
            "invalid_shards",
            format!(
                "a reel shrinks by at most {} shards at a time: shrink to {min_target} first",
                keys::MAX_TRANSACT_ITEMS - 1
            ),
        ));
    }
    let mut next = Settings {
        target,
        phase_at_ms: UNOBSERVED,
        cool_since_ms: None,
        ..*cur
    };
    if target > cur.write_shards {
        next.phase = Phase::Growing;
        next.read_shards = target.max(have);
    } else {
        next.phase = Phase::Draining;
        next.write_shards = target;
        next.read_shards = have;
        next.has_base = true;
    }
    next.fold_from = next.read_shards;
    Ok(Plan::Put(next))
}

/// The items that `next` adds to what readers sum under `cur`: the shards
/// a grow starts reading, and the base item a reel's first shrink does.
pub(super) fn entering(cur: &Settings, next: &Settings) -> Vec<CountItem> {
    let mut items: Vec<CountItem> = (cur.shards_to_sum()..next.shards_to_sum())
        .map(CountItem::Shard)
        .collect();
    if next.has_base && !cur.has_base {
        items.push(CountItem::Base);
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ReelId;

    fn stable(n: u32) -> Settings {
        Settings {
            write_shards: n,
            read_shards: n,
            target: n,
            fold_from: n,
            ..Settings::default()
        }
    }

    #[test]
    fn grow_raises_reads_first() {
        let Ok(Plan::Put(s)) = plan(&stable(1), 20, 7) else {
            panic!("no plan")
        };
        assert_eq!(
            (s.phase, s.read_shards, s.write_shards, s.target),
            (Phase::Growing, 20, 1, 20)
        );
        // Not stamped with the time it was computed: its wait starts when it
        // is seen in place.
        assert_eq!(s.phase_at_ms, UNOBSERVED);
        let Ok(Plan::Put(d)) = plan(&stable(20), 3, 7) else {
            panic!("no plan")
        };
        assert_eq!((d.phase, d.phase_at_ms), (Phase::Draining, UNOBSERVED));
        assert!(s.indexed());
        assert!(s.read_items(&ReelId::parse("r").unwrap()).atomic.is_empty());
    }

    #[test]
    fn shrink_lowers_writes_first_and_folds_atomically() {
        let Ok(Plan::Put(s)) = plan(&stable(20), 3, 7) else {
            panic!("no plan")
        };
        assert_eq!(
            (s.phase, s.read_shards, s.write_shards, s.fold_from),
            (Phase::Draining, 20, 3, 20)
        );
        let r = ReelId::parse("r").unwrap();
        let items = s.read_items(&r);
        // The base item and shards 3..20 in one transaction; 0..3 batched.
        assert_eq!(items.atomic.len(), 1 + 17);
        assert_eq!(items.atomic[0], keys::base_key(&r));
        assert_eq!(items.atomic[1], keys::shard_key(&r, 3));
        assert_eq!(
            items.batch,
            (0..3).map(|i| keys::shard_key(&r, i)).collect::<Vec<_>>()
        );
        // Once stable again, the base item stays in every (batched) read.
        let stable_after = Settings {
            phase: Phase::Stable,
            read_shards: 3,
            ..s
        };
        let items = stable_after.read_items(&r);
        assert!(items.atomic.is_empty());
        assert_eq!(items.batch.last(), Some(&keys::base_key(&r)));
        // One shrink retires at most 99 shards.
        assert_eq!(
            plan(&stable(1000), 1, 0).err().map(|e| e.status()),
            Some(400)
        );
        assert!(matches!(plan(&stable(1000), 901, 0), Ok(Plan::Put(_))));
    }

    #[test]
    fn resizes_in_progress_join_or_refuse() {
        let Ok(Plan::Put(s)) = plan(&stable(1), 8, 0) else {
            panic!("no plan")
        };
        assert!(matches!(plan(&s, 8, 1), Ok(Plan::Keep(Begin::Joined))));
        assert_eq!(plan(&s, 9, 1).err().map(|e| e.status()), Some(409));
        let versioned = Settings {
            version: 3,
            ..stable(4)
        };
        assert!(matches!(
            plan(&versioned, 4, 1),
            Ok(Plan::Keep(Begin::Unchanged))
        ));
        // A hand-written multi-shard item (no version) is registered in the
        // index by asking for the count it already has; one shard never is.
        let Ok(Plan::Put(r)) = plan(&stable(4), 4, 1) else {
            panic!("not registered")
        };
        assert_eq!(
            (r.phase, r.write_shards, r.read_shards),
            (Phase::Stable, 4, 4)
        );
        assert!(r.indexed());
        assert!(matches!(
            plan(&stable(1), 1, 1),
            Ok(Plan::Keep(Begin::Unchanged))
        ));
    }
}
