//! What a count read is charged to its caller (issue 36): the estimate of
//! its read units, and the routes that are charged. The bound itself, and
//! how it holds across instances, is `crate::service`'s read budget.

use crate::App;

/// The routes whose count reads are charged to their caller.
pub(super) const READ_ROUTES: [&str; 6] = [
    "reel_likes",
    "batch_likes",
    "reel_views",
    "counts",
    "reel_stats",
    "trending",
];

/// Charges what a count read cost (its reels read from the tables since
/// `before`) to its caller, if it has one.
pub(super) async fn charge(app: &App, (caller, before): (Option<String>, (u64, u64))) {
    if let Some(c) = caller {
        let units = read_units(app, app.service.cache_stats().1.saturating_sub(before.0))
            + view_reads(app).saturating_sub(before.1);
        app.service.charge_reads(&c, units).await;
    }
}

/// What `misses` reels read from the tables cost, as estimated for a
/// caller's read budget: the settings and shard items (one unit each,
/// strongly consistent) and, in stream mode, the writer query (one).
fn read_units(app: &App, misses: u64) -> u64 {
    let per_reel = match app.service.counting() {
        crate::config::Counting::Transactional => 2,
        crate::config::Counting::Stream => 3,
    };
    misses * per_reel
}

/// Reels whose views this instance read from the table (two half-unit
/// queries each: charged as one unit).
pub(super) fn view_reads(app: &App) -> u64 {
    app.views.reader.as_ref().map_or(0, |r| r.reads())
}
