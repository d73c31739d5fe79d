//! Bounded, jittered exponential backoff ("full jitter").
//!
//! Used where the SDK does not retry for us: cancelled transactions
//! (TransactionConflict, throttling reasons) and BatchGetItem's
//! UnprocessedKeys. Every caller counts the retries it took.

use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub max_attempts: u32,
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// `TX_MAX_ATTEMPTS`, `RETRY_BASE_MS` and `RETRY_MAX_MS`.
    pub fn from_config(config: &crate::config::Config) -> Self {
        Backoff {
            max_attempts: config.tx_max_attempts,
            base: config.retry_base,
            max: config.retry_max,
        }
    }

    /// The pause before attempt `attempt + 1` (attempt counts from 1): a
    /// uniform draw from `0..=min(max, base * 2^(attempt-1))`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let ceiling = self.base.saturating_mul(1u32 << exp).min(self.max);
        let ms = ceiling.as_millis() as u64;
        Duration::from_millis(fastrand::u64(0..=ms))
    }

    /// Whether another attempt is allowed after `attempt` attempts.
    pub fn allows(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_bounded_and_grow() {
        let b = Backoff {
            max_attempts: 5,
            base: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        for attempt in 1..30 {
            let cap = Duration::from_millis((10u64 << (attempt - 1).min(20)).min(100));
            for _ in 0..50 {
                assert!(b.delay(attempt) <= cap);
            }
        }
        assert!(b.allows(4));
        assert!(!b.allows(5));
    }
}
