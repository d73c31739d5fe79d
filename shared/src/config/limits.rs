//! What one caller may make a function instance write, and what the
//! cache warmer keeps warm: bounds read once, used by one room each.

/// What one caller may make a function instance write (see
/// `service::limits`, where each bound is explained).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WriteLimits {
    /// `USER_WRITES_PER_SEC` (default 5): likes and unlikes a second per
    /// user, on average.
    pub per_sec: f64,
    /// `USER_WRITE_BURST` (default 20): ... in one burst.
    pub burst: u32,
    /// `REEL_TOGGLES_PER_MIN` (default 10): likes and unlikes of one reel
    /// per user per minute.
    pub toggles_per_min: u32,
    /// `USER_REELS_PER_HOUR` (default 300): distinct reels one user
    /// writes per hour.
    pub reels_per_hour: u32,
    /// `USER_KEYS_PER_MIN` (default 120): writes with an `Idempotency-Key`
    /// per user per minute.
    pub keys_per_min: u32,
}

/// The cache warmer's reach ([`crate::warmer`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmConfig {
    /// `WARM_REELS` (default 100, 0 = off): the top reels of each trending
    /// list whose totals the warmer keeps.
    pub reels: usize,
    /// `WARM_PERIOD_MS` (default 1000): how often it sums them again. Below
    /// `CACHE_TTL_MS`, or instances find them too old to serve.
    pub period: std::time::Duration,
}
