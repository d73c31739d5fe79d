//! The requests of one cost cell, sent through the HTTP API by a few
//! closed-loop workers: closed loop because a cell measures units per
//! operation, not a rate, and a queue of unanswered requests would only
//! add timeouts to it.

use anyhow::{Context, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Requests in flight at once: enough to keep the emulator busy on 2
/// cores, few enough that none waits near its timeout.
const WORKERS: usize = 16;

/// One request of a cell.
#[derive(Clone, Debug)]
pub(super) enum Request {
    /// `PUT` (like) or `DELETE` (unlike) `/reels/{reel}/like` as `user`,
    /// with `key` as its `Idempotency-Key` if any.
    Like {
        reel: String,
        user: String,
        key: Option<String>,
        unlike: bool,
    },
    /// `POST /views`: `count` views of `reel` by `user`, keyed as the
    /// views variant's are.
    Views {
        reel: String,
        user: String,
        count: u32,
        key: String,
    },
    /// `GET /counts` of `reels` (a feed screen), as some viewer.
    Counts { reels: Vec<String> },
}

impl Request {
    async fn send(&self, http: &reqwest::Client, base: &str) -> bool {
        let req = match self {
            Request::Like {
                reel,
                user,
                key,
                unlike,
            } => {
                let url = format!("{base}/reels/{reel}/like");
                let req = if *unlike {
                    http.delete(url)
                } else {
                    http.put(url)
                };
                let req = req.header("x-user-id", user);
                match key {
                    Some(k) => req.header("idempotency-key", k),
                    None => req,
                }
            }
            Request::Views {
                reel,
                user,
                count,
                key,
            } => http
                .post(format!("{base}/views"))
                .header("x-user-id", user)
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"views":[{{"reel_id":"{reel}","count":{count}}}]}}"#
                )),
            // Each feed read is another user's, as a feed's are: one
            // caller's reads are bounded a minute (CALLER_READ_UNITS_PER_MIN).
            Request::Counts { reels } => http
                .get(format!("{base}/counts?reel_ids={}", reels.join(",")))
                .header(
                    "x-user-id",
                    format!("feed-{}", reels.first().map_or("none", String::as_str)),
                ),
        };
        req.send().await.is_ok_and(|r| r.status().is_success())
    }
}

/// Sends every request of `requests` once; how many were answered with a
/// success and how many were not (a failed one is not sent again: no
/// fault is injected, so any is worth reporting rather than hiding).
pub(super) async fn send_all(
    http: &reqwest::Client,
    base: &str,
    requests: Vec<Request>,
) -> Result<(u64, u64)> {
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (requests, next) = (requests.clone(), next.clone());
            let (http, base) = (http.clone(), base.to_owned());
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u64, 0u64);
                while let Some(r) = requests.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if r.send(&http, &base).await {
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for w in workers {
        let (o, f) = w.await.context("a cost worker")?;
        ok += o;
        failed += f;
    }
    Ok((ok, failed))
}
