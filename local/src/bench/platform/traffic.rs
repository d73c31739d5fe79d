//! The platform's traffic, open loop: likes of Zipf-drawn reels from
//! users of their own (unkeyed, as stream mode's likes are), requests of
//! views of several such reels each (keyed), a trickle of likes and views
//! on the cold reel, likes on the freshness reel with its count polled
//! through the API; then the refused requests sent again until taken.

use super::super::load::{Sample, open_loop};
use super::zipf::{Reel, Zipf};
use super::{COLD, FRESH};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Reels one view request carries (drawn; a reel drawn twice is one
/// entry), and the views of each: 1 to [`MAX_VIEWS`].
pub(in crate::bench) const ENTRIES: u32 = 4;
pub(in crate::bench) const MAX_VIEWS: u32 = 4;
/// Likes a second on the freshness reel, and how often its count is read.
pub(in crate::bench) const FRESH_RATE: f64 = 10.0;
pub(in crate::bench) const FRESH_POLL: Duration = Duration::from_millis(50);
/// Likes and view requests a second on the cold reel.
pub(in crate::bench) const COLD_RATE: f64 = 1.0;
/// Viewers the view requests draw from.
const VIEWERS: u32 = 50_000;

/// The HTTP side.
pub(in crate::bench) struct Client {
    pub http: reqwest::Client,
    pub base: String,
}

impl Client {
    /// An unkeyed like of `reel` by `user`: whether it was taken.
    pub async fn like(&self, reel: &str, user: &str) -> bool {
        self.http
            .put(format!("{}/reels/{reel}/like", self.base))
            .header("x-user-id", user)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// A keyed view request: whether it was answered 202.
    pub async fn views(&self, user: &str, key: &str, entries: &[(String, u32)]) -> bool {
        let items: Vec<serde_json::Value> = entries
            .iter()
            .map(|(r, n)| serde_json::json!({"reel_id": r, "count": n}))
            .collect();
        self.http
            .post(format!("{}/views", self.base))
            .header("x-user-id", user)
            .header("idempotency-key", key)
            .json(&serde_json::json!({ "views": items }))
            .send()
            .await
            .is_ok_and(|r| r.status().as_u16() == 202)
    }

    /// `GET path`'s JSON body, if answered 200.
    pub async fn get_json(&self, path: &str) -> Option<serde_json::Value> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("x-user-id", "platform-reader")
            .send()
            .await
            .ok()?;
        if r.status().as_u16() != 200 {
            return None;
        }
        r.json().await.ok()
    }
}

/// A like as its client saw it.
#[derive(Clone, Debug)]
pub(in crate::bench) struct Like {
    pub reel: String,
    pub user: String,
    pub ok: bool,
}

/// A view request as its client saw it.
#[derive(Clone, Debug)]
pub(in crate::bench) struct ViewRequest {
    pub user: String,
    pub key: String,
    pub entries: Vec<(String, u32)>,
    pub ok: bool,
}

/// What the traffic did.
#[derive(Default)]
pub(in crate::bench) struct Sent {
    pub likes: Vec<Like>,
    pub views: Vec<ViewRequest>,
    /// The freshness reel's likes, as the freshness arithmetic takes them.
    pub fresh: Vec<Sample>,
    /// Its count as read through the API: (seconds since t0, likes).
    pub sums: Vec<(f64, i64)>,
}

impl Sent {
    /// Views taken, per reel.
    pub fn views_by_reel(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for v in self.views.iter().filter(|v| v.ok) {
            for (r, n) in &v.entries {
                *out.entry(r.clone()).or_default() += u64::from(*n);
            }
        }
        out
    }
}

/// One view request's entries: [`ENTRIES`] draws merged by reel.
pub(in crate::bench) fn view_entries(zipf: &Zipf, rng: &mut fastrand::Rng) -> Vec<(String, u32)> {
    let mut by: BTreeMap<Reel, u32> = BTreeMap::new();
    for _ in 0..ENTRIES {
        *by.entry(zipf.draw(rng)).or_default() += rng.u32(1..=MAX_VIEWS);
    }
    by.into_iter().map(|(r, n)| (r.id(), n)).collect()
}

/// Drives the traffic from `t0` for `seconds`: likes at `rate`, view
/// requests at half of it, the cold and freshness trickles; answers what
/// was sent. `seed` and `prefix` keep runs apart.
pub(in crate::bench) async fn drive(
    client: Arc<Client>,
    zipf: Arc<Zipf>,
    rate: f64,
    seconds: f64,
    prefix: &str,
    seed: u64,
    t0: Instant,
) -> Sent {
    let watching = Arc::new(AtomicBool::new(true));
    let poller = tokio::spawn(poll(client.clone(), watching.clone(), t0));
    let likes = {
        let (client, zipf, prefix) = (client.clone(), zipf.clone(), prefix.to_owned());
        open_loop(rate, seconds, move |i| {
            let reel = zipf
                .draw(&mut fastrand::Rng::with_seed(seed ^ (i << 1)))
                .id();
            let user = format!("{prefix}l{i}");
            let client = client.clone();
            async move {
                let ok = client.like(&reel, &user).await;
                Like { reel, user, ok }
            }
        })
    };
    let views = {
        let (client, zipf, prefix) = (client.clone(), zipf.clone(), prefix.to_owned());
        open_loop(rate / 2.0, seconds, move |i| {
            let mut rng = fastrand::Rng::with_seed(seed ^ (i << 1 | 1));
            let entries = view_entries(&zipf, &mut rng);
            let user = format!("{prefix}w{}", rng.u32(0..VIEWERS));
            let key = format!("{prefix}v{i}");
            let client = client.clone();
            async move {
                let ok = client.views(&user, &key, &entries).await;
                ViewRequest {
                    user,
                    key,
                    entries,
                    ok,
                }
            }
        })
    };
    let cold_likes = {
        let (client, prefix) = (client.clone(), prefix.to_owned());
        open_loop(COLD_RATE, seconds, move |i| {
            let (client, user) = (client.clone(), format!("{prefix}c{i}"));
            async move {
                let ok = client.like(COLD, &user).await;
                Like {
                    reel: COLD.to_owned(),
                    user,
                    ok,
                }
            }
        })
    };
    let cold_views = {
        let (client, prefix) = (client.clone(), prefix.to_owned());
        open_loop(COLD_RATE, seconds, move |i| {
            let client = client.clone();
            let (user, key) = (format!("{prefix}cw{i}"), format!("{prefix}cv{i}"));
            let entries = vec![(COLD.to_owned(), 1)];
            async move {
                let ok = client.views(&user, &key, &entries).await;
                ViewRequest {
                    user,
                    key,
                    entries,
                    ok,
                }
            }
        })
    };
    let fresh = {
        let (client, prefix) = (client.clone(), prefix.to_owned());
        open_loop(FRESH_RATE, seconds, move |i| {
            let (client, user) = (client.clone(), format!("{prefix}f{i}"));
            async move {
                let sent = Instant::now();
                let ok = client.like(FRESH, &user).await;
                Sample {
                    user,
                    at: t0.elapsed(),
                    ok,
                    latency: sent.elapsed(),
                }
            }
        })
    };
    let (mut likes, mut views, cold_likes, cold_views, fresh) =
        tokio::join!(likes, views, cold_likes, cold_views, fresh);
    likes.extend(cold_likes);
    views.extend(cold_views);
    // The freshness reel's last likes are watched until they show (or
    // for 30 s at most).
    let taken = fresh.iter().filter(|s| s.ok).count() as i64;
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && fresh_count(&client).await.unwrap_or(0) < taken {
        tokio::time::sleep(FRESH_POLL).await;
    }
    watching.store(false, Ordering::Relaxed);
    let sums = poller.await.unwrap_or_default();
    Sent {
        likes,
        views,
        fresh,
        sums,
    }
}

/// The freshness reel's count through the API.
async fn fresh_count(client: &Client) -> Option<i64> {
    client
        .get_json(&format!("/reels/{FRESH}/likes"))
        .await?
        .get("count")?
        .as_i64()
}

/// Reads the freshness reel's count every [`FRESH_POLL`] while `watching`.
async fn poll(client: Arc<Client>, watching: Arc<AtomicBool>, t0: Instant) -> Vec<(f64, i64)> {
    let mut out = Vec::new();
    while watching.load(Ordering::Relaxed) {
        if let Some(n) = fresh_count(&client).await {
            out.push((t0.elapsed().as_secs_f64(), n));
        }
        tokio::time::sleep(FRESH_POLL).await;
    }
    out
}

/// Sends every refused like and view request again (the views with their
/// keys), 16 at a time, up to 50 attempts each, marking those taken;
/// answers how many never were.
pub(in crate::bench) async fn settle(client: &Client, sent: &mut Sent) -> usize {
    let mut unsettled = 0;
    for chunk in sent.likes.chunks_mut(16) {
        let done = futures::future::join_all(chunk.iter().filter(|l| !l.ok).map(|l| async {
            for attempt in 0..50u64 {
                if client.like(&l.reel, &l.user).await {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20 * attempt.min(10))).await;
            }
            false
        }))
        .await;
        let mut done = done.into_iter();
        for l in chunk.iter_mut().filter(|l| !l.ok) {
            l.ok = done.next().unwrap_or(false);
            unsettled += usize::from(!l.ok);
        }
    }
    for chunk in sent.views.chunks_mut(16) {
        let done = futures::future::join_all(chunk.iter().filter(|v| !v.ok).map(|v| async {
            for attempt in 0..50u64 {
                if client.views(&v.user, &v.key, &v.entries).await {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20 * attempt.min(10))).await;
            }
            false
        }))
        .await;
        let mut done = done.into_iter();
        for v in chunk.iter_mut().filter(|v| !v.ok) {
            v.ok = done.next().unwrap_or(false);
            unsettled += usize::from(!v.ok);
        }
    }
    unsettled
}
