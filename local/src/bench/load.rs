//! The load: open-loop likes on the viral reel, background likes and feed
//! reads, and the retries of refused likes after it. Open loop means that
//! requests go out on schedule whether or not earlier ones have been
//! answered, so that throttling shows as refusals, not as a slower client.

use super::variant::Variant;
use super::{BACKGROUND_REELS, BenchOptions, VIRAL};
use aws_sdk_dynamodb::types::AttributeValue;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the likes go: the product's HTTP API, or for the naive variant
/// the counters table through the fault proxy, with the product's own SDK
/// settings (retries and timeouts).
pub(super) struct Target {
    /// The client of every HTTP request of the load.
    pub http: reqwest::Client,
    /// The local gateway's base URL.
    pub base: String,
    /// The naive counter's SDK client, through the proxy.
    pub naive: aws_sdk_dynamodb::Client,
    /// The counters table's name.
    pub counters: String,
    /// Whose likes these are.
    pub variant: Variant,
}

impl Target {
    /// One like of the viral reel by `user`: whether it was acknowledged.
    /// The product's like carries an `Idempotency-Key`, as a careful
    /// client's would, so that its retry after a refusal counts once
    /// (except in stream mode, whose likes are unkeyed); the naive counter
    /// has nothing of the kind.
    pub async fn viral_like(&self, user: &str) -> bool {
        if self.variant.is_naive() {
            let r = self
                .naive
                .update_item()
                .table_name(&self.counters)
                .key("pk", AttributeValue::S(format!("naive#{VIRAL}")))
                .update_expression("ADD n :one")
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .send()
                .await;
            return r.is_ok();
        }
        let mut req = self
            .http
            .put(format!("{}/reels/{VIRAL}/like", self.base))
            .header("x-user-id", user);
        if !self.variant.is_stream() {
            req = req.header("idempotency-key", format!("bench-{user}"));
        }
        req.send().await.is_ok_and(|r| r.status().is_success())
    }
}

/// One viral like as its client saw it.
pub(super) struct Sample {
    /// Its user (`{prefix}v{i}`): one like per user.
    pub user: String,
    /// When its answer came, since the load started.
    pub at: Duration,
    /// Acknowledged (not refused).
    pub ok: bool,
    /// From sending it to its answer.
    pub latency: Duration,
}

/// What the load's clients saw: every viral like, and whether each
/// background like and each feed read succeeded.
pub(super) struct Load {
    /// The viral likes, in the order they were sent.
    pub viral: Vec<Sample>,
    /// Per background like: acknowledged.
    pub background: Vec<bool>,
    /// Per feed read: answered.
    pub reads: Vec<bool>,
}

/// Drives the three loads together for `opts.seconds`. Users are
/// `{prefix}v…` (viral) and `{prefix}b…` (background), so that each run's
/// like rows are its own and their write units can be told apart.
pub(super) async fn drive(
    opts: &BenchOptions,
    target: &Arc<Target>,
    prefix: &str,
    t0: Instant,
) -> Load {
    let viral = viral_likes(
        target.clone(),
        target.variant.offered_rate(opts),
        opts.seconds,
        prefix.to_owned(),
        t0,
    );
    let background = background_likes(target.clone(), opts, prefix.to_owned());
    let reads = feed_reads(target.clone(), opts);
    let (viral, background, reads) = tokio::join!(viral, background, reads);
    Load {
        viral,
        background,
        reads,
    }
}

/// Likes on the viral reel at `rate`, each from a new user.
async fn viral_likes(
    target: Arc<Target>,
    rate: f64,
    seconds: f64,
    prefix: String,
    t0: Instant,
) -> Vec<Sample> {
    open_loop(rate, seconds, move |i| {
        let target = target.clone();
        let user = format!("{prefix}v{i}");
        async move {
            let sent = Instant::now();
            let ok = target.viral_like(&user).await;
            Sample {
                user,
                at: t0.elapsed(),
                ok,
                latency: sent.elapsed(),
            }
        }
    })
    .await
}

/// Likes on the background reels (`bg0`…), round robin, each from a new
/// user and without an `Idempotency-Key`: the product's plain like.
async fn background_likes(target: Arc<Target>, opts: &BenchOptions, prefix: String) -> Vec<bool> {
    open_loop(
        target.variant.background_rate(opts),
        opts.seconds,
        move |i| {
            let target = target.clone();
            let reel = format!("bg{}", i as usize % BACKGROUND_REELS);
            let user = format!("{prefix}b{i}");
            async move {
                target
                    .http
                    .put(format!("{}/reels/{reel}/like", target.base))
                    .header("x-user-id", &user)
                    .send()
                    .await
                    .map(|r| r.status().is_success())
                    .unwrap_or(false)
            }
        },
    )
    .await
}

/// Feed reads of the viral reel and every background reel at once.
async fn feed_reads(target: Arc<Target>, opts: &BenchOptions) -> Vec<bool> {
    let ids = std::iter::once(VIRAL.to_owned())
        .chain((0..BACKGROUND_REELS).map(|i| format!("bg{i}")))
        .collect::<Vec<_>>()
        .join(",");
    open_loop(opts.read_rate, opts.seconds, move |i| {
        let (target, ids) = (target.clone(), ids.clone());
        async move {
            // Each feed read is another user's, as a feed's are: one
            // caller's reads are bounded a minute (CALLER_READ_UNITS_PER_MIN).
            target
                .http
                .get(format!("{}/likes?reel_ids={ids}", target.base))
                .header("x-user-id", format!("feed{i}"))
                .send()
                .await
                .map(|r| r.status().is_success())
                .unwrap_or(false)
        }
    })
    .await
}

/// Sends `count` requests at `rate` a second on schedule (open loop); each
/// is `make(i)`, run as its own task.
pub(super) async fn open_loop<F, Fut, T>(rate: f64, seconds: f64, make: F) -> Vec<T>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let count = (rate * seconds).round() as u64;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(count as usize);
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        tasks.push(tokio::spawn(make(i)));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(v) = t.await {
            out.push(v);
        }
    }
    out
}

/// Retries every refused viral like after the load, as its client would,
/// until acknowledged (16 users at a time, up to 50 attempts each): then
/// every offered like must be counted exactly once. Returns how many never
/// got through. Not part of the measured rates.
pub(super) async fn retry_refused(target: &Target, viral: &[Sample]) -> usize {
    let refused_users: Vec<String> = viral
        .iter()
        .filter(|s| !s.ok)
        .map(|s| s.user.clone())
        .collect();
    let mut unsettled = 0usize;
    for chunk in refused_users.chunks(16) {
        let settled = futures::future::join_all(chunk.iter().map(|user| async {
            for attempt in 0..50u64 {
                if target.viral_like(user).await {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20 * attempt.min(10))).await;
            }
            false
        }))
        .await;
        unsettled += settled.iter().filter(|ok| !**ok).count();
    }
    unsettled
}
