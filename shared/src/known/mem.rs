//! An in-memory [`KnownStore`] for the unit tests: the items as the table
//! would hold them, with the same conditional writes, and calls counted.

use crate::error::Error;
use crate::store::{KnownMeta, KnownScan, KnownScanPage, KnownSegment, KnownStore};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub(crate) struct MemKnown {
    pub meta: Mutex<Option<KnownMeta>>,
    pub segments: Mutex<BTreeMap<usize, KnownSegment>>,
    /// (time, reel), as registrations are put.
    pub registrations: Mutex<Vec<(i64, String)>>,
    /// What the backfill's scans find: the counters table's reels, then
    /// the views table's, one page each.
    pub counted: Mutex<(Vec<String>, Vec<String>)>,
    pub reads: AtomicU64,
    pub puts: AtomicU64,
    /// Fail every call while set.
    pub failing: std::sync::atomic::AtomicBool,
}

impl MemKnown {
    fn check(&self) -> Result<(), Error> {
        if self.failing.load(Ordering::Relaxed) {
            return Err(Error::Throttled);
        }
        Ok(())
    }
}

impl KnownStore for MemKnown {
    async fn known_meta(&self) -> Result<Option<KnownMeta>, Error> {
        self.check()?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(self.meta.lock().unwrap().clone())
    }

    async fn known_segments(&self) -> Result<Vec<KnownSegment>, Error> {
        self.check()?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(self.segments.lock().unwrap().values().cloned().collect())
    }

    async fn registrations(&self, minute: i64, from_ms: i64) -> Result<Vec<(i64, String)>, Error> {
        self.check()?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .registrations
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| at.div_euclid(60_000) == minute && *at >= from_ms)
            .cloned()
            .collect())
    }

    async fn register(&self, at_ms: i64, reels: &[String]) -> Result<(), Error> {
        self.check()?;
        self.puts.fetch_add(reels.len() as u64, Ordering::Relaxed);
        let mut r = self.registrations.lock().unwrap();
        r.extend(reels.iter().map(|reel| (at_ms, reel.clone())));
        Ok(())
    }

    async fn put_segment(&self, segment: &KnownSegment) -> Result<bool, Error> {
        self.check()?;
        let mut s = self.segments.lock().unwrap();
        let stored = s.get(&segment.index).map_or(0, |s| s.version);
        if stored != segment.version {
            return Ok(false);
        }
        let mut next = segment.clone();
        next.version += 1;
        s.insert(segment.index, next);
        Ok(true)
    }

    async fn put_meta(&self, meta: &KnownMeta) -> Result<bool, Error> {
        self.check()?;
        let mut m = self.meta.lock().unwrap();
        if m.as_ref().map_or(0, |m| m.version) != meta.version {
            return Ok(false);
        }
        let mut next = meta.clone();
        next.version += 1;
        *m = Some(next);
        Ok(true)
    }

    async fn scan_known(
        &self,
        table: KnownScan,
        last: Option<&(String, Option<String>)>,
    ) -> Result<KnownScanPage, Error> {
        self.check()?;
        let c = self.counted.lock().unwrap();
        let all = match table {
            KnownScan::Counters => &c.0,
            KnownScan::Views => &c.1,
        };
        // One reel a page, the last key its id.
        let at = match last {
            None => 0,
            Some((pk, _)) => all
                .iter()
                .position(|r| r == pk)
                .map_or(all.len(), |i| i + 1),
        };
        Ok(KnownScanPage {
            reels: all.get(at).cloned().into_iter().collect(),
            next: all
                .get(at)
                .filter(|_| at + 1 < all.len())
                .map(|r| (r.clone(), None)),
        })
    }
}
