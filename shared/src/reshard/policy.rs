//! The sizing policy: how many shards a write rate needs, how far a
//! saturated or contended reel grows, and the start of such a grow. It
//! lives with the resize protocol that acts on it; [`ResizeConfig`] only
//! carries its settings.

use super::{Plan, now_ms, plan, read_settings, stamp, strays};
use crate::config::ResizeConfig;
use crate::error::Error;
use crate::keys::ReelId;
use crate::store::{CounterStore, Phase, Settings};

impl ResizeConfig {
    /// The sizing rule: `ceil(rate × headroom / safe writes per shard)`,
    /// between 1 and `max_shards`.
    pub fn shards_for_rate(&self, writes_per_sec: f64) -> u32 {
        let n = (writes_per_sec.max(0.0) * self.headroom / self.shard_writes_per_sec).ceil();
        (n as u32).clamp(1, self.max_shards)
    }

    /// The shard count to grow a reel now writing to `write_shards` shards
    /// to, given its observed write rate (`None`: not measured) and whether
    /// its like transactions are being throttled or conflicting.
    ///
    /// A reel at or above its safe rate (`write_shards ×
    /// SHARD_WRITES_PER_SEC`), or contended, is saturated: the rate seen
    /// counts only the likes that got through, never the demand, so the
    /// sizing rule on it grows the reel one ceiling at a time (9,000/s from
    /// 1 shard: 1 → 3 → 8 → 20 → 45, each grow two resize waits). A
    /// saturated reel grows at least `SATURATED_GROWTH` times instead
    /// (1 → 4 → 16 → 64), so a viral reel spends fewer waits throttled; the
    /// extra shards cost a few read units per summed read until the
    /// cool-down folds them. Between 1 and `MAX_SHARDS`; callers grow only
    /// when it is above `write_shards`.
    pub fn grow_target(&self, write_shards: u32, rate: Option<f64>, contended: bool) -> u32 {
        let by_rate = rate.map_or(1, |r| self.shards_for_rate(r));
        let saturated = contended
            || rate.is_some_and(|r| r >= f64::from(write_shards) * self.shard_writes_per_sec);
        if saturated {
            let grown = write_shards.saturating_mul(self.saturated_growth);
            by_rate.max(grown.clamp(1, self.max_shards))
        } else {
            by_rate
        }
    }
}

/// Starts growing `reel` to `target` shards unless it already has as many
/// or a resize is in progress (automatic growth: the read path's observed
/// rate, the like path's contention). `Ok(true)` when this call started it.
pub async fn request_grow<S: CounterStore>(
    store: &S,
    reel: &ReelId,
    target: u32,
    reason: &'static str,
) -> Result<bool, Error> {
    request_grow_to(store, reel, |_| target, reason).await
}

/// [`request_grow`] to a target taken from the settings in place (the
/// stream aggregator doubles what it finds).
pub async fn request_grow_to<S: CounterStore>(
    store: &S,
    reel: &ReelId,
    target_of: impl Fn(&Settings) -> u32,
    reason: &'static str,
) -> Result<bool, Error> {
    for _ in 0..3 {
        let cur = read_settings(store, reel).await?;
        let target = target_of(&cur);
        if cur.phase != Phase::Stable || target <= cur.write_shards {
            return Ok(false);
        }
        let Plan::Put(next) = plan(&cur, target, now_ms())? else {
            return Ok(false);
        };
        let found = strays(store, reel, &cur, &next).await?;
        if !found.is_empty() {
            // This path may not delete items (IAM); an admin resize, the
            // scheduled run or reconciliation clears them.
            tracing::warn!(reel = %reel, target, strays = ?found, "not growing: items outside the read range are not empty; reconciliation clears them");
            return Ok(false);
        }
        if store.put_settings(reel, cur.version, &next).await? {
            tracing::info!(reel = %reel, from = cur.write_shards, target, reason, "automatic grow started");
            // However late the put above was sent, the wait starts now.
            stamp(
                store,
                reel,
                &Settings {
                    version: cur.version + 1,
                    ..next
                },
            )
            .await;
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        let map: std::collections::HashMap<&str, &str> = pairs.iter().copied().collect();
        Config::from_lookup(|k| map.get(k).map(|v| v.to_string())).unwrap()
    }

    #[test]
    fn sizing_rule() {
        let c = cfg(&[("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")]);
        // ceil(rate × 2.0 / 400), between 1 and 100.
        assert_eq!(c.resize.shards_for_rate(0.0), 1);
        assert_eq!(c.resize.shards_for_rate(200.0), 1);
        assert_eq!(c.resize.shards_for_rate(300.0), 2);
        assert_eq!(c.resize.shards_for_rate(9_000.0), 45);
        assert_eq!(c.resize.shards_for_rate(1e6), 100);
    }

    #[test]
    fn saturated_reels_grow_by_the_factor_at_least() {
        let c = cfg(&[("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")]);
        let r = &c.resize;
        // Below its safe rate (2 × 400): the rule on the rate.
        assert_eq!(r.grow_target(2, Some(700.0), false), 4);
        assert_eq!(r.grow_target(1, Some(350.0), false), 2);
        // At or above it, the rate is only what got through: at least ×4.
        assert_eq!(r.grow_target(1, Some(500.0), false), 4);
        assert_eq!(r.grow_target(4, Some(2_000.0), false), 16);
        // ... or the rule, when it asks for more.
        assert_eq!(r.grow_target(2, Some(9_000.0), false), 45);
        // Contended, with no rate: ×4; never past MAX_SHARDS.
        assert_eq!(r.grow_target(1, None, true), 4);
        assert_eq!(r.grow_target(30, None, true), 100);
        // A viral reel at 9,000/s from one shard, each grow sized on what
        // the last size let through (500 likes/s a shard at most):
        // 1 → 4 → 16 → 64, three grows where the rule alone takes four.
        let mut shards = 1;
        let mut grows = Vec::new();
        loop {
            let seen = (f64::from(shards) * 500.0).min(9_000.0);
            let next = r.grow_target(shards, Some(seen), false);
            if next <= shards {
                break;
            }
            shards = next;
            grows.push(shards);
        }
        assert_eq!(grows, [4, 16, 64]);
        // The rule alone, for comparison.
        let (mut shards, mut rule) = (1u32, Vec::new());
        loop {
            let seen = (f64::from(shards) * 500.0).min(9_000.0);
            let next = r.shards_for_rate(seen);
            if next <= shards {
                break;
            }
            shards = next;
            rule.push(shards);
        }
        assert_eq!(rule, [3, 8, 20, 45]);
        let c = cfg(&[
            ("COUNTERS_TABLE", "c"),
            ("LIKES_TABLE", "l"),
            ("SATURATED_GROWTH", "8"),
        ]);
        assert_eq!(c.resize.grow_target(1, None, true), 8);
    }
}
