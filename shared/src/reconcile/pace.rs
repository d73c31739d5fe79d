//! The pacing of a run's calls: a limiter per capacity kind, and the units
//! an item's read or write costs.

use std::time::{Duration, Instant};

/// Spaces calls so that their capacity units stay under a rate.
pub(super) struct Limiter {
    per_sec: f64,
    next: std::sync::Mutex<Instant>,
}

impl Limiter {
    pub(super) fn new(per_sec: f64) -> Self {
        Limiter {
            per_sec,
            next: std::sync::Mutex::new(Instant::now()),
        }
    }

    pub(super) async fn take(&self, units: f64) {
        let wait = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + Duration::from_secs_f64(units.max(0.0) / self.per_sec);
            start - now
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Write units of an item of `bytes` (one per KB started).
pub(super) fn write_units(bytes: usize) -> f64 {
    bytes.div_ceil(1024).max(1) as f64
}

/// Read units of a consistent read of an item of `bytes` (one per 4 KB).
pub(super) fn read_units(bytes: usize) -> f64 {
    bytes.div_ceil(4096).max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_limiter_spaces_calls_by_their_units() {
        let l = Limiter::new(100.0);
        let t = Instant::now();
        for _ in 0..5 {
            l.take(10.0).await;
        }
        // 50 units at 100/s: the first is free, the rest take ~0.4 s.
        let e = t.elapsed();
        assert!(e >= Duration::from_millis(380), "{e:?}");
    }
}
