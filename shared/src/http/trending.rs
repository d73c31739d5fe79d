//! `GET /trending`: the reels most liked or viewed over the last hour or
//! 24 hours (issue 37): the writers' hourly sketches name the candidates,
//! each is read exactly ([`crate::keys::window`]), and the list is ranked
//! by that count ([`crate::trending`]). The cache warmer's list while it
//! is fresh ([`crate::warmer`]), read again every
//! [`crate::trending::WARMED_LIST_TTL`], else ranked here once per
//! [`crate::trending::LIST_TTL`]; the same to every caller.

use crate::App;
use crate::error::Error;
use crate::keys::window::Window;
use crate::store::WarmStore;
use crate::trending::{Metric, Ranked};
use crate::warmer::rank::{rank, totals};
use lambda_http::http::StatusCode;
use serde_json::{Value, json};

/// The answer: the top `limit` reels of `metric` over `window`, each with
/// its rank and its exact count over the window at `as_of`.
pub(super) async fn list(
    app: &App,
    metric: Metric,
    window: Window,
    limit: u32,
) -> Result<(StatusCode, Value), Error> {
    let ranked = app
        .trending
        .get((metric, window), Box::pin(served(app, metric, window)))
        .await?;
    let reels: Vec<Value> = ranked
        .reels
        .iter()
        .take(limit as usize)
        .enumerate()
        .map(|(i, e)| {
            json!({
                "rank": i + 1,
                "reel_id": e.reel.as_str(),
                "count": e.count,
                "likes": e.likes,
                "views": e.views,
            })
        })
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
            "age_ms": (crate::clock::now_ms() - ranked.as_of_ms).max(0),
            "ranked_by": if ranked.warmed { "warmer" } else { "instance" },
        }),
    ))
}

/// The list to serve: the cache warmer's while it is fresh (one item
/// read, the reels' totals in it), else ranked here, with the totals of
/// this instance's cached reads.
async fn served(app: &App, metric: Metric, window: Window) -> Result<Ranked, Error> {
    match app
        .service
        .store()
        .trending_list(metric.name(), window.name())
        .await
    {
        Ok(Some(list)) => {
            if let Some(r) = list.fresh(crate::clock::now_ms()) {
                return Ok(r);
            }
        }
        Ok(None) => {}
        Err(e) => tracing::info!(error = e.code(), "the warmer's list unread: ranking here"),
    }
    let ranked = Box::pin(rank(app, metric, window)).await?;
    Ok(Box::pin(totals(app, ranked)).await)
}
