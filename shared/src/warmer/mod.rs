//! The cache warmer (issue 37): a scheduled function that ranks each
//! trending list once for every instance, and keeps the listed reels'
//! totals summed, so that an instance reading a trending reel reads one
//! item instead of its shard and writer items, and one serving a list
//! reads the list instead of ranking it ([`crate::store::WarmStore`] says
//! what it stores and when an instance may serve it).
//!
//! An invocation runs rounds until its deadline nears (the schedule
//! starts one a minute): each round sums the warm reels (the top
//! `WARM_REELS` of each list) and writes their figures; every
//! [`LIST_TTL`] a round also ranks the lists again and writes them, with
//! the warm set. Two invocations that overlap (a slow one, a retried one)
//! write the same kind of figures, each stamped with its own read: a
//! reader takes whichever it finds at its age.
//!
//! # Layout
//!
//! * `mod.rs` (here): the run and its summary.
//! * `rank`: ranking a list now, what an instance without a fresh
//!   warmer's list does too.

pub mod rank;

use crate::App;
use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::window::Window;
use crate::store::WarmStore;
use crate::store::{StoredList, WarmFigures, WarmSet, WarmViews};
use crate::trending::{LIST_TTL, Metric, Ranked};
use futures::StreamExt;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A run stops this long before its invocation's deadline.
const STOP_BEFORE: Duration = Duration::from_secs(2);

/// How long a run without a deadline lasts at most.
const RUN_MAX: Duration = Duration::from_secs(55);

/// What one invocation did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Rounds run (each sums the warm reels once).
    pub rounds: u32,
    /// Lists ranked and written, over all rounds.
    pub lists: u32,
    /// Reels kept warm in the last round.
    pub reels: usize,
    /// Figures written, over all rounds.
    pub figures: u64,
    /// Reads or writes that failed (each round goes on without them).
    pub errors: u32,
}

/// Runs rounds until `deadline` nears (or `rounds` are done).
pub async fn keep_warm(
    app: &App,
    deadline: Option<Instant>,
    rounds: Option<u32>,
) -> Result<Summary, Error> {
    let warm = app.config.warm;
    let mut s = Summary::default();
    if warm.reels == 0 {
        return Ok(s);
    }
    let stop_at = deadline.map_or_else(|| Instant::now() + RUN_MAX, |d| d - STOP_BEFORE);
    let mut lists: Vec<((Metric, Window), Ranked)> = Vec::new();
    let mut ranked_at: Option<Instant> = None;
    loop {
        let start = Instant::now();
        let rerank = ranked_at.is_none_or(|t| t.elapsed() >= LIST_TTL);
        if rerank {
            lists.clear();
            for (m, w) in rank::lists(app) {
                match Box::pin(rank::rank(app, m, w)).await {
                    Ok(r) => lists.push(((m, w), r)),
                    Err(e) => {
                        tracing::warn!(
                            error = e.code(),
                            metric = m.name(),
                            window = w.name(),
                            "a list could not be ranked"
                        );
                        s.errors += 1;
                    }
                }
            }
            ranked_at = Some(start);
        }
        let reels: Vec<ReelId> = lists
            .iter()
            .flat_map(|(_, r)| r.reels.iter().take(warm.reels).map(|e| e.reel.clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let (likes, views) = Box::pin(sum_warm_reels(app, &reels, &mut s)).await;
        if rerank {
            let now = crate::clock::now_ms();
            let like_totals: HashMap<ReelId, i64> =
                likes.iter().map(|(r, f)| (r.clone(), f.n)).collect();
            let view_totals: HashMap<ReelId, u64> =
                views.iter().map(|(r, v)| (r.clone(), v.views)).collect();
            for ((m, w), r) in &lists {
                let r = rank::with_totals(r.clone(), &like_totals, &view_totals);
                match app
                    .service
                    .store()
                    .put_list(m.name(), w.name(), &StoredList::from(&r))
                    .await
                {
                    Ok(()) => s.lists += 1,
                    Err(e) => {
                        tracing::warn!(error = e.code(), "a list could not be written");
                        s.errors += 1;
                    }
                }
            }
            let set = WarmSet {
                written_ms: now,
                reels: reels.iter().map(|r| r.as_str().to_owned()).collect(),
            };
            if let Err(e) = app.service.store().put_warm_set(&set).await {
                tracing::warn!(error = e.code(), "the warm set could not be written");
                s.errors += 1;
            }
        }
        s.rounds += 1;
        s.reels = reels.len();
        if rounds.is_some_and(|n| s.rounds >= n) {
            break;
        }
        let next = start + warm.period;
        if next + start.elapsed() > stop_at {
            break;
        }
        tokio::time::sleep_until(next.into()).await;
    }
    Ok(s)
}

/// Sums `reels` now (likes and views) and writes their figures; what was
/// summed, for the lists' totals.
async fn sum_warm_reels(
    app: &App,
    reels: &[ReelId],
    s: &mut Summary,
) -> (
    HashMap<ReelId, crate::store::ShardSum>,
    HashMap<ReelId, WarmViews>,
) {
    if reels.is_empty() {
        return (HashMap::new(), HashMap::new());
    }
    // Stamped before any read is sent: a reader takes the figures as at
    // least this old.
    let read_ms = crate::clock::now_ms();
    let likes = match app.service.sums_now(reels).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                error = e.code(),
                "the warm reels' likes could not be summed"
            );
            s.errors += 1;
            HashMap::new()
        }
    };
    let views: HashMap<ReelId, WarmViews> = match &app.views.reader {
        Some(reader) => {
            futures::stream::iter(reels.iter().cloned())
                .map(|r| async move { (reader.read_now(&r).await, r) })
                .buffer_unordered(rank::READS_IN_FLIGHT)
                .filter_map(|(v, r)| async move {
                    let v = v.ok()?;
                    Some((
                        r,
                        WarmViews {
                            views: v.views,
                            unique_viewers: v.unique_viewers,
                            views_7d: v.views_7d,
                            unique_viewers_7d: v.unique_viewers_7d,
                            windows: v.windows,
                            as_of_ms: v.as_of_ms,
                        },
                    ))
                })
                .collect()
                .await
        }
        None => HashMap::new(),
    };
    let figures: Vec<(ReelId, WarmFigures)> = reels
        .iter()
        .map(|r| {
            let f = WarmFigures {
                read_ms,
                likes: likes.get(r).map(|l| (*l).into()),
                views: views.get(r).cloned(),
            };
            (r.clone(), f)
        })
        .filter(|(_, f)| f.likes.is_some() || f.views.is_some())
        .collect();
    match app.service.store().put_warm(&figures).await {
        Ok(()) => s.figures += figures.len() as u64,
        Err(e) => {
            tracing::warn!(error = e.code(), "the warm figures could not be written");
            s.errors += 1;
        }
    }
    (likes, views)
}
