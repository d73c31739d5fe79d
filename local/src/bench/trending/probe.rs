//! The `trending` variant's probes (a burst of likes on a reel of its
//! own, timed to its place in the list), the tail of likes that keeps the
//! stream flowing after the load, and the drain.

use super::super::platform::traffic::Client;
use super::{
    PROBE_EVERY, PROBE_LIKES, PROBE_POLL, PROBE_TIMEOUT, TAIL_DEADLINE, TAIL_LIKES, TAIL_SECONDS,
};
use crate::stack::Stack;
use anyhow::{Result, anyhow};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One probe as it went.
#[derive(Clone, Debug)]
pub(super) struct Probe {
    pub reel: String,
    /// Likes taken.
    pub taken: usize,
    /// From its last like taken to its showing in the list.
    pub freshness_ms: Option<f64>,
}

/// A probe every [`PROBE_EVERY`] while the load runs, each timed on its
/// own.
pub(super) async fn probe_all(client: Arc<Client>, prefix: String, seconds: f64) -> Vec<Probe> {
    let n = (seconds / PROBE_EVERY.as_secs_f64()).floor().max(1.0) as usize;
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tasks.push(tokio::spawn(probe(
            client.clone(),
            format!("{prefix}probe{i}"),
            Duration::from_secs_f64(PROBE_EVERY.as_secs_f64() * i as f64 + 1.0),
        )));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        if let Ok(p) = t.await {
            out.push(p);
        }
    }
    out
}

async fn probe(client: Arc<Client>, reel: String, after: Duration) -> Probe {
    tokio::time::sleep(after).await;
    let likes = futures::future::join_all((0..PROBE_LIKES).map(|u| {
        let (client, reel) = (client.clone(), reel.clone());
        async move {
            for _ in 0..50 {
                if client.like(&reel, &format!("{reel}-u{u}")).await {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        }
    }))
    .await;
    let taken = likes.iter().filter(|ok| **ok).count();
    let last = Instant::now();
    let mut freshness_ms = None;
    while last.elapsed() < PROBE_TIMEOUT {
        if let Some(list) = client
            .get_json("/trending?metric=likes&window=1h&limit=100")
            .await
        {
            let shown = list["reels"].as_array().into_iter().flatten().any(|r| {
                r["reel_id"] == reel.as_str()
                    && r["count"].as_i64().is_some_and(|n| n >= taken as i64)
            });
            if shown {
                freshness_ms = Some(last.elapsed().as_secs_f64() * 1000.0);
                break;
            }
        }
        tokio::time::sleep(PROBE_POLL).await;
    }
    Probe {
        reel,
        taken,
        freshness_ms,
    }
}

/// The tail's likes and views, one of each per user: (reel, taken).
pub(super) async fn tail(client: &Client, prefix: &str) -> Result<(String, usize)> {
    let reel = format!("{prefix}tail");
    let gap = Duration::from_secs_f64(TAIL_SECONDS / TAIL_LIKES as f64);
    let mut taken = 0;
    let started = Instant::now();
    for u in 0..TAIL_LIKES {
        if started.elapsed() > TAIL_DEADLINE {
            return Err(anyhow!(
                "trending: the tail took over {} s ({taken} of {TAIL_LIKES} taken): the stack refuses likes or views",
                TAIL_DEADLINE.as_secs()
            ));
        }
        // A like and a view each, from users of their own: both streams
        // flow, each record on a shard of its user's key.
        let user = format!("{reel}-u{u}");
        let view = [(reel.clone(), 1)];
        for _ in 0..50 {
            if client.like(&reel, &user).await
                && client.views(&user, &format!("{user}-k"), &view).await
            {
                taken += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(gap).await;
    }
    if taken < TAIL_LIKES {
        return Err(anyhow!("trending: tail likes or views refused"));
    }
    Ok((reel, taken))
}

/// Waits until both streams are drained (5 minutes at most).
pub(super) async fn drain(stack: &Stack) -> Result<()> {
    let start = Instant::now();
    while !(stack.streams_caught_up().await? && stack.views_drained().await?) {
        if start.elapsed() > Duration::from_secs(300) {
            return Err(anyhow!(
                "trending: the streams were not drained in 5 minutes"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
