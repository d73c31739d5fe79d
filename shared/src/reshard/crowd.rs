//! Contention that calls for more shards only when it comes from a crowd:
//! distinct sources meeting on one reel's shards within a window. The like
//! path's sources are users: one user's parallel likes only meet
//! themselves, and must never grow a reel. (Stream mode has no such
//! contention: each stream shard writes items of its own.)

use crate::keys::ReelId;
use moka::future::Cache;
use std::time::{Duration, Instant};

/// Contention counts within this window.
pub const CROWD_WINDOW: Duration = Duration::from_secs(10);

/// The distinct sources seen contending on each reel (hashes, at most
/// `needed`), and when the first was seen; kept in memory only, per
/// instance.
pub struct Crowd {
    needed: usize,
    seen: Cache<ReelId, (Vec<u64>, Instant)>,
    /// Reels that crossed the threshold lately: what they meet until their
    /// grow took effect is not new evidence (see [`Crowd::new`]).
    quiet: Option<Cache<ReelId, ()>>,
}

impl Crowd {
    /// A crowd is `needed` distinct sources within [`CROWD_WINDOW`]; none
    /// when `needed` is 0. After a crowd is seen on a reel, the reel's
    /// contention is ignored for `quiet` (zero: not at all), so that one
    /// crowd asks for one grow, not one per window while the grow is
    /// under way.
    pub fn new(needed: u32, quiet: Duration) -> Self {
        Crowd {
            needed: needed as usize,
            seen: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(CROWD_WINDOW * 6)
                .build(),
            quiet: (!quiet.is_zero()).then(|| {
                Cache::builder()
                    .max_capacity(10_000)
                    .time_to_live(quiet)
                    .build()
            }),
        }
    }

    /// Notes that `source` met contention on `reel`. `true` when that makes
    /// a crowd: the reel's sources are then forgotten, so the next grow
    /// needs a crowd of its own.
    pub async fn note(&self, reel: &ReelId, source: u64) -> bool {
        if self.needed == 0 {
            return false;
        }
        if let Some(q) = &self.quiet
            && q.contains_key(reel)
        {
            return false;
        }
        let needed = self.needed;
        let now = Instant::now();
        let (sources, _) = self
            .seen
            .entry(reel.clone())
            .and_upsert_with(|e| async move {
                match e.map(|e| e.into_value()) {
                    Some((mut sources, first)) if now.duration_since(first) < CROWD_WINDOW => {
                        if sources.len() < needed && !sources.contains(&source) {
                            sources.push(source);
                        }
                        (sources, first)
                    }
                    _ => (vec![source], now),
                }
            })
            .await
            .into_value();
        if sources.len() < needed {
            return false;
        }
        self.seen.invalidate(reel).await;
        if let Some(q) = &self.quiet {
            q.insert(reel.clone(), ()).await;
        }
        true
    }
}

/// A source's hash for [`Crowd::note`].
pub fn source(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reel(s: &str) -> ReelId {
        ReelId::parse(s).unwrap()
    }

    #[tokio::test]
    async fn a_crowd_is_distinct_sources_and_one_source_is_never_one() {
        let c = Crowd::new(3, Duration::ZERO);
        let r = reel("r1");
        for _ in 0..10 {
            assert!(!c.note(&r, source("a")).await);
        }
        assert!(!c.note(&r, source("b")).await);
        assert!(!c.note(&reel("r2"), source("c")).await);
        assert!(c.note(&r, source("c")).await);
        // Forgotten once seen: the next grow needs a crowd of its own.
        assert!(!c.note(&r, source("a")).await);
        assert!(!Crowd::new(0, Duration::ZERO).note(&r, 1).await);
    }

    #[tokio::test]
    async fn after_a_crowd_the_reel_is_quiet_for_a_while() {
        let c = Crowd::new(2, Duration::from_millis(200));
        let r = reel("r1");
        assert!(!c.note(&r, 1).await);
        assert!(c.note(&r, 2).await);
        assert!(!c.note(&r, 3).await);
        assert!(!c.note(&r, 4).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!c.note(&r, 5).await);
        assert!(c.note(&r, 6).await);
    }
}
