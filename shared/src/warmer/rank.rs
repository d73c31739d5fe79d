//! Ranking a list now ([`crate::trending`]): the writers' hourly sketches
//! name the candidates, each is read exactly, and the list is ranked by
//! that count. What an instance does when no warmer's list is fresh, and
//! what the warmer does for every instance.

use crate::App;
use crate::app::Views;
use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::window::Window;
use crate::store::HourSketches;
use crate::trending::{self, Entry, MAX_CANDIDATES, Metric, Ranked};
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::sync::Arc;

/// Views reads in flight at once while ranking.
pub(crate) const READS_IN_FLIGHT: usize = 10;

/// The lists this deployment ranks: likes and views, over an hour and a
/// day, when it reads views at all (the sketches are in the views table).
pub fn lists(app: &App) -> Vec<(Metric, Window)> {
    if app.views.reader.is_none() {
        return Vec::new();
    }
    [Metric::Likes, Metric::Views]
        .into_iter()
        .flat_map(|m| [(m, Window::Hour), (m, Window::Day)])
        .collect()
}

/// Ranks `metric` over `window` now; the totals are left unread.
pub async fn rank(app: &App, metric: Metric, window: Window) -> Result<Ranked, Error> {
    let reader = app.views.reader.as_ref().ok_or_else(Views::missing)?;
    let now = crate::clock::now_ms();
    // Each hour's sketches merged; an hour that ended a while ago from
    // this instance's copy (`trending::ended_hour_ttl`).
    let settled = trending::sketch::hour_of(now - trending::ENDED_HOUR_SETTLE_MS);
    let hours: Vec<Arc<Vec<u8>>> = futures::stream::iter(trending::hours(window, now))
        .map(|hour| async move {
            let read = async move {
                let sketches: HourSketches = reader.hour_sketches(metric.name(), hour).await?;
                Ok(trending::sketch::merge_hour(
                    sketches.iter().map(Vec::as_slice),
                ))
            };
            if hour < settled {
                app.trending.ended_hour(metric, hour, read).await
            } else {
                read.await.map(Arc::new)
            }
        })
        .buffer_unordered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
    let (names, max_error) = trending::sketch::candidates(hours.iter().map(|h| h.as_slice()));
    let candidates: Vec<ReelId> = names
        .iter()
        .filter_map(|n| ReelId::parse(n).ok())
        .take(MAX_CANDIDATES)
        .collect();
    let counts: Vec<(ReelId, i64)> = match metric {
        Metric::Likes => {
            let c = app.service.counts(&candidates).await?;
            c.into_iter()
                .map(|(r, c)| (r, c.windows.get(window)))
                .collect()
        }
        Metric::Views => {
            futures::stream::iter(candidates.iter().cloned())
                .map(|r| async move {
                    let v = reader.counts(&r).await?;
                    Ok::<_, Error>((r, v.windows.get(window)))
                })
                .buffer_unordered(READS_IN_FLIGHT)
                .try_collect()
                .await?
        }
    };
    Ok(Ranked {
        reels: trending::rank(counts, trending::MAX_LIST)
            .into_iter()
            .map(|(reel, count)| Entry {
                reel,
                count,
                likes: None,
                views: None,
            })
            .collect(),
        as_of_ms: now,
        max_error,
        candidates: candidates.len(),
        warmed: false,
    })
}

/// Fills in each listed reel's totals from `likes` and `views`.
pub fn with_totals(
    mut ranked: Ranked,
    likes: &HashMap<ReelId, i64>,
    views: &HashMap<ReelId, u64>,
) -> Ranked {
    for e in &mut ranked.reels {
        e.likes = likes.get(&e.reel).copied();
        e.views = views.get(&e.reel).copied();
    }
    ranked
}

/// Fills in each listed reel's totals from this instance's cached reads
/// (a reel whose read fails is left without).
pub async fn totals(app: &App, ranked: Ranked) -> Ranked {
    let reels: Vec<ReelId> = ranked.reels.iter().map(|e| e.reel.clone()).collect();
    let likes: HashMap<ReelId, i64> = match app.service.counts(&reels).await {
        Ok(c) => c.into_iter().map(|(r, c)| (r, c.count)).collect(),
        Err(e) => {
            tracing::info!(error = e.code(), "a list's like totals unread");
            HashMap::new()
        }
    };
    let views: HashMap<ReelId, u64> = match &app.views.reader {
        Some(reader) => {
            futures::stream::iter(reels)
                .map(|r| async move { reader.counts(&r).await.ok().map(|v| (r, v.views)) })
                .buffer_unordered(READS_IN_FLIGHT)
                .filter_map(|x| async move { x })
                .collect()
                .await
        }
        None => HashMap::new(),
    };
    with_totals(ranked, &likes, &views)
}
