//! Which reel ids name reels: the seam a deployment plugs its own check
//! into. Any 1–64 character id is a reel by default ([`AnyReel`]), so a
//! caller could like ids nobody published; the per-caller bounds
//! (`service::limits`) cap how many a user adds, and a deployment that
//! knows its reels refuses the rest with a [`ReelCheck`] of its own
//! (docs/operations.md, "Your own reel ids").
//!
//! A like and a view batch ask: an unlike writes no new reel (and a reel
//! deleted since it was liked can still be unliked), and reads write
//! nothing. Views of invented ids would otherwise be stored for ever, a
//! partition each.
//! Answers are cached per instance, an existing reel for
//! [`KNOWN_TTL`], an unknown one for [`UNKNOWN_TTL`], so a viral reel
//! costs the check one lookup per instance, not one per like.

use crate::error::Error;
use crate::keys::ReelId;
use futures::future::BoxFuture;
use moka::future::Cache;
use std::sync::Arc;
use std::time::Duration;

/// How long an instance trusts "this reel exists".
pub const KNOWN_TTL: Duration = Duration::from_secs(600);
/// How long an instance trusts "no such reel": short, so a reel published a
/// moment after a like of it was refused can be liked soon.
pub const UNKNOWN_TTL: Duration = Duration::from_secs(10);

/// A deployment's answer to "is this a reel?" (its catalogue, a signed
/// id's signature, a pattern its ids follow). An `Err` fails the like
/// with that error (`Error::Unavailable` for a catalogue that could not be
/// reached) and is not cached.
pub trait ReelCheck: Send + Sync + 'static {
    /// Whether `reel` names a reel that may be liked.
    fn exists<'a>(&'a self, reel: &'a ReelId) -> BoxFuture<'a, Result<bool, Error>>;
}

/// Every valid id is a reel (the default).
pub struct AnyReel;

impl ReelCheck for AnyReel {
    fn exists<'a>(&'a self, _reel: &'a ReelId) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async { Ok(true) })
    }
}

/// A [`ReelCheck`] with its answers cached; `None` for [`AnyReel`], which
/// asks nothing and needs no cache.
pub(super) struct Reels(Option<(Arc<dyn ReelCheck>, Cache<ReelId, bool>)>);

impl Reels {
    /// Every reel exists.
    pub(super) fn any() -> Self {
        Reels(None)
    }

    /// `check`'s answers, cached for up to `max_reels` reels.
    pub(super) fn checked(check: Arc<dyn ReelCheck>, max_reels: u64) -> Self {
        let known = Cache::builder()
            .max_capacity(max_reels)
            .expire_after(Expiry)
            .build();
        Reels(Some((check, known)))
    }

    /// `Ok` when `reel` may be liked; [`Error::UnknownReel`] when the check
    /// says it is no reel. Concurrent first likes of one reel share one
    /// lookup.
    pub(super) async fn admit(&self, reel: &ReelId) -> Result<(), Error> {
        let Some((check, known)) = &self.0 else {
            return Ok(());
        };
        let exists = known
            .try_get_with_by_ref(reel, check.exists(reel))
            .await
            .map_err(|e: Arc<Error>| (*e).clone())?;
        if exists {
            Ok(())
        } else {
            Err(Error::UnknownReel)
        }
    }
}

/// [`KNOWN_TTL`] for a reel that exists, [`UNKNOWN_TTL`] for one that does
/// not.
struct Expiry;

impl moka::Expiry<ReelId, bool> for Expiry {
    fn expire_after_create(
        &self,
        _reel: &ReelId,
        exists: &bool,
        _at: std::time::Instant,
    ) -> Option<Duration> {
        Some(if *exists { KNOWN_TTL } else { UNKNOWN_TTL })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Knows the reels named `pub…`, and counts its lookups.
    #[derive(Default)]
    struct Catalogue {
        lookups: AtomicU32,
    }

    impl ReelCheck for Catalogue {
        fn exists<'a>(&'a self, reel: &'a ReelId) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin(async move {
                self.lookups.fetch_add(1, Ordering::Relaxed);
                if reel.as_str() == "down" {
                    return Err(Error::Unavailable);
                }
                Ok(reel.as_str().starts_with("pub"))
            })
        }
    }

    fn reel(s: &str) -> ReelId {
        ReelId::parse(s).unwrap()
    }

    #[tokio::test]
    async fn a_check_refuses_unknown_reels_and_is_asked_once_per_reel() {
        let catalogue = Arc::new(Catalogue::default());
        let reels = Reels::checked(catalogue.clone(), 100);
        for _ in 0..3 {
            reels.admit(&reel("pub1")).await.unwrap();
            assert!(matches!(
                reels.admit(&reel("made-up")).await,
                Err(Error::UnknownReel)
            ));
        }
        assert_eq!(catalogue.lookups.load(Ordering::Relaxed), 2);
        // A failed lookup fails the like and is asked again next time.
        for _ in 0..2 {
            assert!(matches!(
                reels.admit(&reel("down")).await,
                Err(Error::Unavailable)
            ));
        }
        assert_eq!(catalogue.lookups.load(Ordering::Relaxed), 4);
        // The default asks nothing and refuses nothing.
        Reels::any().admit(&reel("made-up")).await.unwrap();
    }
}
