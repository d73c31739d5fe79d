//! `GET /trending`: the reels most liked or viewed over the last hour or
//! 24 hours (issue 37): the writers' hourly sketches name the candidates,
//! each is read exactly ([`crate::keys::window`]), and the list is ranked
//! by that count ([`crate::trending`]). Ranked once per instance per
//! [`LIST_TTL`], the same for every caller.

use crate::App;
use crate::app::Views;
use crate::config::Counting;
use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::window::Window;
use crate::store::{AggregateStore, HourSketches};
use crate::trending::{self, LIST_TTL, MAX_CANDIDATES, Metric, Ranked};
use futures::{StreamExt, TryStreamExt};
use lambda_http::http::StatusCode;
use serde_json::{Value, json};
use std::time::Instant;

/// Views reads in flight at once while ranking.
const READS_IN_FLIGHT: usize = 10;

/// The answer: the top `limit` reels of `metric` over `window`, each with
/// its rank and its exact count over the window at `as_of`.
pub(super) async fn list(
    app: &App,
    metric: Metric,
    window: Window,
    limit: u32,
) -> Result<(StatusCode, Value), Error> {
    if metric == Metric::Likes && app.config.counting != Counting::Stream {
        // Transactional mode runs no aggregator to keep the sketches: a
        // valid request this deployment cannot answer (409, not 400).
        return Err(Error::Conflict {
            code: "trending_unavailable",
            message: "likes are ranked in stream counting mode only; views in both".into(),
        });
    }
    let ranked = app
        .trending
        .get((metric, window), Box::pin(rank(app, metric, window)))
        .await?;
    let reels: Vec<Value> = ranked
        .reels
        .iter()
        .take(limit as usize)
        .enumerate()
        .map(|(i, (reel, n))| json!({"rank": i + 1, "reel_id": reel.as_str(), "count": n}))
        .collect();
    Ok((
        StatusCode::OK,
        json!({
            "metric": metric.name(),
            "window": window.name(),
            "from": window.from_ms(ranked.as_of_ms),
            "as_of": ranked.as_of_ms,
            "reels": reels,
            "max_error": ranked.max_error,
            "age_ms": ranked.ranked_at.elapsed().min(LIST_TTL).as_millis() as u64,
        }),
    ))
}

/// Ranks `metric` over `window` now.
async fn rank(app: &App, metric: Metric, window: Window) -> Result<Ranked, Error> {
    let reader = app.views.reader.as_ref().ok_or_else(Views::missing)?;
    let now = crate::clock::now_ms();
    let hours: Vec<(i64, HourSketches)> = futures::stream::iter(trending::hours(window, now))
        .map(|hour| async move {
            Ok::<_, Error>((hour, reader.hour_sketches(metric.name(), hour).await?))
        })
        .buffer_unordered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
    // The writers still in an hour hold its sketch in their checkpoints;
    // one that moved on since stored it as ended (and is skipped here).
    let live: Vec<(i64, String)> = hours
        .iter()
        .flat_map(|(h, (_, live))| live.iter().map(move |k| (*h, k.clone())))
        .collect();
    let live: Vec<Option<Vec<u8>>> = futures::stream::iter(live)
        .map(|(hour, key)| async move {
            let sketch = match metric {
                Metric::Likes => app.aggregate.store().checkpoint(&key).await?.sketch,
                Metric::Views => reader.live_sketch(&key).await?,
            };
            Ok::<_, Error>(sketch.filter(|s| s.hour == hour).map(|s| s.bytes))
        })
        .buffer_unordered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
    let ended = hours.iter().flat_map(|(_, (ended, _))| ended);
    let (names, max_error) =
        trending::sketch::candidates(ended.chain(live.iter().flatten()).map(Vec::as_slice));
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
        reels: trending::rank(counts, crate::http::MAX_TRENDING as usize),
        as_of_ms: now,
        max_error,
        candidates: candidates.len(),
        ranked_at: Instant::now(),
    })
}
