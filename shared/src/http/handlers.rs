//! The `like` and `read` handlers.

use super::cache_control::Cacheable;
use super::charge::{READ_ROUTES, charge, view_reads};
use super::request::{self, Command};
use super::routes::{self, Function, Route};
use crate::App;
use crate::app::Views;
use crate::error::Error;
use crate::keys::{Action, ReelId, UserId};
use crate::reshard::Begin;
use crate::service::{WritePath, WriteRequest};
use crate::store::Settings;
use lambda_http::http::{HeaderValue, StatusCode, header};
use lambda_http::{Body, Request, Response};
use serde_json::{Value, json};
use std::time::Instant;
use tracing::Instrument;

/// Reels whose views one `GET /counts` reads at once.
const VIEW_READS_IN_FLIGHT: usize = 8;

/// Most reels `GET /admin/reels` lists.
const ADMIN_LIST_MAX: usize = 1000;

/// What a like or unlike did, for the request's metrics.
#[derive(Default)]
struct WriteMetrics {
    likes: u64,
    unlikes: u64,
    duplicates: u64,
    /// Which path the write took (`applied`, `replayed`, ...): the
    /// `WritePath` label of the `Writes` counter (a fixed set of values).
    path: Option<&'static str>,
}

/// Counts served from the cache warmer's figures since the start.
fn warm_hits(app: &App) -> u64 {
    app.service.warm_hits() + app.views.reader.as_ref().map_or(0, |r| r.warm_hits())
}

/// Counts (likes or views) answered as never counted, without a read
/// ([`crate::known`]), since the instance started.
fn never_counted(app: &App) -> u64 {
    app.known.as_ref().map_or(0, |k| {
        k.stats().absent.load(std::sync::atomic::Ordering::Relaxed)
    })
}

/// Shard items read by this instance's store so far.
fn shard_reads(app: &App) -> u64 {
    let s = app.service.store().stats();
    s.shard_reads_batch
        .load(std::sync::atomic::Ordering::Relaxed)
        + s.shard_reads_transactional
            .load(std::sync::atomic::Ordering::Relaxed)
}

/// Answers one request. Never fails and never panics: errors become JSON.
pub async fn handle(app: &App, function: Function, req: Request) -> Response<Body> {
    let started = Instant::now();
    let (hits_before, misses_before) = app.service.cache_stats();
    let (conflicts_before, throttles_before) = app.service.retry_stats();
    let shards_before = shard_reads(app);
    let warm_before = warm_hits(app);
    let never_before = never_counted(app);
    let view_retries_before = app.views.producer.as_ref().map_or(0, |p| p.retries());
    let mut writes = WriteMetrics::default();
    let method = req.method().clone();
    let route_name = routes::route(&req, function)
        .as_ref()
        .map_or("none", Route::name);
    let request_id = request::request_id(&req);
    // All validation happens here, before any I/O and in the same function
    // the fuzz target and property tests call: from here on the handler
    // acts only on the ids the command carries.
    let parsed = request::parse_with(&req, app.config.auth_mode, &app.config.access, function);
    let cacheable = parsed.as_ref().ok().and_then(Cacheable::of);
    // Count reads are charged to their caller, across instances: one past
    // its minute's bound is refused before anything is read.
    let reader = READ_ROUTES
        .contains(&route_name)
        .then(|| request::caller(&req, app.config.auth_mode));
    let result = match parsed {
        Err(e) => Err(e),
        Ok(command) => match tokio::time::timeout(
            app.config.request_timeout,
            // Every log line of the request carries its id and route.
            execute(
                app,
                command,
                request_id.clone(),
                reader.as_deref(),
                &mut writes,
            )
            .instrument(
                // At ERROR level, so that it is there whatever the log level.
                tracing::error_span!(
                    "request",
                    request_id = request_id.as_deref(),
                    route = route_name
                ),
            ),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => {
                // A write cut off here may or may not have committed; a
                // retry counts once either way.
                tracing::warn!(request_id, route = route_name, "request timeout");
                Err(Error::Unavailable)
            }
        },
    };
    let result_error = result.as_ref().err().cloned();
    let views_accepted = result
        .as_ref()
        .ok()
        .and_then(|(_, b)| b.get("accepted"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let response = match result {
        Ok((status, body)) => {
            let mut resp = json_response(status, &body);
            if let Some(c) = cacheable.filter(|_| status == StatusCode::OK)
                && let Some(v) = c.header(&body, app.config.cache_ttl)
            {
                resp.headers_mut().insert(header::CACHE_CONTROL, v);
            }
            resp
        }
        Err(e) => error_response(&e),
    };
    let status = response.status().as_u16();
    let latency_ms = started.elapsed().as_millis() as u64;
    // The request's metrics, flushed as its EMF record. Counters are deltas
    // of this instance's totals: exact on Lambda, where an instance serves
    // one request at a time.
    let m = app.config.metrics.record(function.name());
    m.count("Requests", 1)
        .sample("Latency", latency_ms as f64)
        .count("ServerErrors", u64::from(status >= 500))
        .count("ClientErrors", u64::from((400..500).contains(&status)));
    if route_name == "like" {
        let given_up = |e: Error| u64::from(matches!(&result_error, Some(x) if *x == e));
        // Retries are counted by the service, so that a request that gave
        // up still reports the retries it made.
        let (conflicts, throttles) = app.service.retry_stats();
        m.count("LikesApplied", writes.likes)
            .count("UnlikesApplied", writes.unlikes)
            .count("DuplicatesAbsorbed", writes.duplicates)
            .count(
                "ConflictsRetried",
                conflicts.saturating_sub(conflicts_before),
            )
            .count(
                "ThrottlesRetried",
                throttles.saturating_sub(throttles_before),
            )
            .count("ConflictsGivenUp", given_up(Error::Contended))
            .count("ThrottlesGivenUp", given_up(Error::Throttled));
        // `applied`, the ordinary path, is not written: it is
        // `LikesApplied` + `UnlikesApplied` less `replayed` and `committed`,
        // and a document of its own (a second label set) would add a
        // quarter to what an ordinary like logs.
        if let Some(path) = writes.path.filter(|p| *p != WritePath::Applied.as_str()) {
            m.count_by("Writes", "WritePath", path, 1);
        }
    }
    if route_name == "views" {
        let retries = app.views.producer.as_ref().map_or(0, |p| p.retries());
        m.count(
            "ViewPutRetries",
            retries.saturating_sub(view_retries_before),
        );
        m.count("ViewsAccepted", views_accepted);
    }
    if matches!(route_name, "like" | "reel_likes" | "batch_likes") {
        let (hits, misses) = app.service.cache_stats();
        m.count("CacheHits", hits.saturating_sub(hits_before))
            .count("CacheMisses", misses.saturating_sub(misses_before))
            .count("ShardsRead", shard_reads(app).saturating_sub(shards_before));
    }
    // Only when some were: not a field on every log line.
    if let warm @ 1.. = warm_hits(app).saturating_sub(warm_before) {
        m.count("WarmHits", warm);
    }
    if let never @ 1.. = never_counted(app).saturating_sub(never_before) {
        m.count("NeverCounted", never);
    }
    app.config.metrics.flush(request_id.as_deref());
    if status >= 500 {
        tracing::error!(request_id, route = route_name, %method, status, latency_ms, "request");
    } else {
        tracing::info!(request_id, route = route_name, %method, status, latency_ms, "request");
    }
    response
}

/// Carries out a validated command: the handler's only I/O.
async fn execute(
    app: &App,
    command: Command,
    request_id: Option<String>,
    reader: Option<&str>,
    writes: &mut WriteMetrics,
) -> Result<(StatusCode, Value), Error> {
    // A count read is charged to its caller, across instances: one past
    // its minute's bound is refused before anything is read.
    let charged = |caller: Option<&str>| {
        let caller = caller.map(str::to_owned);
        let before = (app.service.cache_stats().1, view_reads(app));
        async move {
            if let Some(c) = &caller {
                app.service.admit_reads(c).await?;
            }
            Ok::<_, Error>((caller, before))
        }
    };
    match command {
        Command::Write {
            user,
            reel,
            action,
            idempotency_key,
        } => {
            let req = WriteRequest {
                user,
                reel,
                action,
                idempotency_key,
                request_id,
            };
            like_or_unlike(app, req, writes).await
        }
        Command::Count { reel, user } => {
            let c = charged(reader).await?;
            let out = reel_count(app, &reel, user.as_ref()).await;
            charge(app, c).await;
            out
        }
        Command::Counts { reels } => {
            let c = charged(reader).await?;
            let out = reel_counts(app, &reels).await;
            charge(app, c).await;
            out
        }
        Command::Views {
            viewer,
            views,
            idempotency_key,
        } => accept_views(app, &viewer, views, idempotency_key).await,
        Command::ReelViews { reel } => {
            let c = charged(reader).await?;
            let out = views_of_reel(app, &reel).await;
            charge(app, c).await;
            out
        }
        Command::ReelStats { reel } => {
            let c = charged(reader).await?;
            let out = super::stats::reel_stats(app, &reel).await;
            charge(app, c).await;
            out
        }
        Command::Trending {
            metric,
            window,
            limit,
        } => {
            let c = charged(reader).await?;
            // Boxed: ranking is a large future (see `stats`).
            let out = Box::pin(super::trending::list(app, metric, window, limit)).await;
            charge(app, c).await;
            out
        }
        Command::LikesAndViews { reels } => {
            let c = charged(reader).await?;
            let out = likes_and_views(app, &reels).await;
            charge(app, c).await;
            out
        }
        Command::Health => {
            app.service.ready().await?;
            Ok((StatusCode::OK, json!({ "status": "ok" })))
        }
        Command::ListResized => resized_reels(app).await,
        Command::ShardState { reel } => {
            let s = app.reshard.state(&reel).await?;
            Ok((StatusCode::OK, shards_json(&reel, &s, None)))
        }
        Command::Resize {
            reel,
            shards,
            principal,
        } => resize(app, &reel, shards, &principal).await,
        Command::Erase { user, principal } => erase_user(app, &user, &principal).await,
    }
}

impl WriteMetrics {
    /// A transaction that committed under this request's token (now, or
    /// an earlier attempt's, replayed) is a like or unlike applied; a
    /// write that wrote nothing, a duplicate absorbed.
    fn tally(&mut self, action: Action, path: WritePath) {
        match path {
            WritePath::Applied | WritePath::Replayed | WritePath::Committed
                if action == Action::Like =>
            {
                self.likes = 1
            }
            WritePath::Applied | WritePath::Replayed | WritePath::Committed => self.unlikes = 1,
            _ => self.duplicates = 1,
        }
        self.path = Some(path.as_str());
    }
}

/// `PUT` or `DELETE /reels/{reel_id}/like`.
async fn like_or_unlike(
    app: &App,
    req: WriteRequest,
    writes: &mut WriteMetrics,
) -> Result<(StatusCode, Value), Error> {
    let (reel, action) = (req.reel.clone(), req.action);
    let out = app.service.write(req).await?;
    writes.tally(action, out.path);
    Ok((
        StatusCode::OK,
        json!({ "reel_id": reel.as_str(), "liked": out.liked, "changed": out.changed, "count": out.count }),
    ))
}

/// `GET /reels/{reel_id}/likes`, with `liked_by_me` for a known caller.
async fn reel_count(
    app: &App,
    reel: &ReelId,
    user: Option<&UserId>,
) -> Result<(StatusCode, Value), Error> {
    let (count, liked) = match user {
        Some(u) => {
            let (c, l) = tokio::join!(app.service.count(reel), app.service.liked(u, reel));
            (c?, Some(l?))
        }
        None => (app.service.count(reel).await?, None),
    };
    let mut body = json!({
        "reel_id": reel.as_str(),
        "count": count.count,
        "age_ms": count.age().as_millis() as u64,
    });
    if let Some(liked) = liked {
        body["liked_by_me"] = Value::Bool(liked);
    }
    Ok((StatusCode::OK, body))
}

/// `GET /likes?reel_ids=...`.
async fn reel_counts(app: &App, reels: &[ReelId]) -> Result<(StatusCode, Value), Error> {
    let counts = app.service.counts(reels).await?;
    let mut map = serde_json::Map::with_capacity(reels.len());
    let mut age_ms = 0u64;
    let mut unavailable: Vec<&str> = Vec::new();
    for r in reels {
        if let Some(c) = counts.get(r) {
            map.insert(r.as_str().to_owned(), json!(c.count));
            age_ms = age_ms.max(c.age().as_millis() as u64);
        } else if !unavailable.contains(&r.as_str()) {
            // Its sum failed; the others are answered anyway.
            unavailable.push(r.as_str());
        }
    }
    // age_ms is that of the oldest sum in the answer.
    Ok((StatusCode::OK, batch_body(map, age_ms, &unavailable)))
}

/// A batch answer; `unavailable` only when some reel has none.
fn batch_body(counts: serde_json::Map<String, Value>, age_ms: u64, unavailable: &[&str]) -> Value {
    let mut body = json!({ "counts": counts, "age_ms": age_ms });
    if !unavailable.is_empty() {
        body["unavailable"] = json!(unavailable);
    }
    body
}

/// `POST /views`: the viewer's bounds are checked before anything is put,
/// so a refused batch costs no stream record.
async fn accept_views(
    app: &App,
    viewer: &UserId,
    views: Vec<(ReelId, u32)>,
    idempotency_key: Option<String>,
) -> Result<(StatusCode, Value), Error> {
    let producer = app.views.producer.as_ref().ok_or_else(Views::missing)?;
    let total: u64 = views.iter().map(|(_, n)| u64::from(*n)).sum();
    producer.admit(viewer, total).await?;
    // After the viewer's bounds (in memory, so a flood never reaches the
    // deployment's catalogue): a batch naming a reel the check refuses is
    // refused whole, nothing put.
    let reels: Vec<&ReelId> = views.iter().map(|(r, _)| r).collect();
    app.service.admit_reels(&reels).await?;
    let record = crate::views::record::ViewRecord {
        id: crate::views::accept::event_id(viewer, idempotency_key.as_deref(), &views),
        viewer: viewer.as_str().to_owned(),
        at_ms: crate::clock::now_ms(),
        views,
    };
    let accepted = producer.put(&record).await?;
    Ok((StatusCode::ACCEPTED, json!({ "accepted": accepted })))
}

/// `GET /reels/{reel_id}/views`.
async fn views_of_reel(app: &App, reel: &ReelId) -> Result<(StatusCode, Value), Error> {
    let reader = app.views.reader.as_ref().ok_or_else(Views::missing)?;
    let c = reader.counts(reel).await?;
    Ok((
        StatusCode::OK,
        json!({
            "reel_id": reel.as_str(),
            "views": c.views,
            "unique_viewers": c.unique_viewers,
            "views_7d": c.views_7d,
            "unique_viewers_7d": c.unique_viewers_7d,
            "age_ms": c.age().as_millis() as u64,
        }),
    ))
}

/// `GET /counts?reel_ids=...`.
async fn likes_and_views(app: &App, reels: &[ReelId]) -> Result<(StatusCode, Value), Error> {
    let reader = app.views.reader.as_ref().ok_or_else(Views::missing)?;
    // Likes as `GET /likes` sums them; views reel by reel, at most
    // VIEW_READS_IN_FLIGHT at a time (each is two queries, cached),
    // so a feed of 100 reels is no burst of 200 queries.
    let views_of = async {
        let mut out = Vec::with_capacity(reels.len());
        for group in reels.chunks(VIEW_READS_IN_FLIGHT) {
            out.extend(futures::future::join_all(group.iter().map(|r| reader.counts(r))).await);
        }
        out
    };
    let (likes, views) = tokio::join!(app.service.counts(reels), views_of);
    let likes = likes?;
    let mut map = serde_json::Map::with_capacity(reels.len());
    let mut age_ms = 0u64;
    let mut unavailable: Vec<&str> = Vec::new();
    for (r, v) in reels.iter().zip(views) {
        match (likes.get(r), v) {
            (Some(l), Ok(v)) => {
                age_ms = age_ms
                    .max(l.age().as_millis() as u64)
                    .max(v.age().as_millis() as u64);
                map.insert(
                    r.as_str().to_owned(),
                    json!({
                        "likes": l.count,
                        "views": v.views,
                        "unique_viewers": v.unique_viewers,
                        "views_7d": v.views_7d,
                        "unique_viewers_7d": v.unique_viewers_7d,
                    }),
                );
            }
            _ => unavailable.push(r.as_str()),
        }
    }
    Ok((StatusCode::OK, batch_body(map, age_ms, &unavailable)))
}

/// `GET /admin/reels`: most shards first; the listing stops at
/// ADMIN_LIST_MAX reels.
async fn resized_reels(app: &App) -> Result<(StatusCode, Value), Error> {
    let reels = app.reshard.list().await?;
    let list: Vec<Value> = reels
        .iter()
        .take(ADMIN_LIST_MAX)
        .map(|(r, s)| shards_json(r, s, None))
        .collect();
    Ok((
        StatusCode::OK,
        json!({ "count": reels.len(), "truncated": reels.len() > ADMIN_LIST_MAX, "reels": list }),
    ))
}

/// `POST /admin/reels/{reel_id}/shards`.
async fn resize(
    app: &App,
    reel: &ReelId,
    shards: u32,
    principal: &str,
) -> Result<(StatusCode, Value), Error> {
    // Attributable: who asked, whatever came of it.
    tracing::info!(reel = %reel, shards, principal = %principal, "admin resize asked");
    let (outcome, s) = app.reshard.begin(reel, shards).await?;
    // 202: a resize is under way (started now or joined); 200: the
    // reel already has that many shards.
    let status = match outcome {
        Begin::Unchanged => StatusCode::OK,
        Begin::Started | Begin::Joined => StatusCode::ACCEPTED,
    };
    Ok((status, shards_json(reel, &s, Some(outcome))))
}

/// `DELETE /admin/users/{user_id}/likes`.
async fn erase_user(
    app: &App,
    user: &UserId,
    principal: &str,
) -> Result<(StatusCode, Value), Error> {
    // Attributable, as a resize is; the user id is what was asked.
    tracing::info!(principal = %principal, "admin erasure of a user's likes asked");
    // A quarter of the budget: the last unlike started may take the
    // whole budget itself, and the request stays within its bound.
    let done = app
        .service
        .erase(user, app.config.request_budget / 4)
        .await?;
    tracing::info!(principal = %principal, removed = done.removed, complete = done.complete, "admin erasure");
    Ok((
        StatusCode::OK,
        json!({ "user_id": user.as_str(), "removed": done.removed, "complete": done.complete }),
    ))
}

/// The resize state of a reel as the admin routes show it.
fn shards_json(reel: &ReelId, s: &Settings, outcome: Option<Begin>) -> Value {
    let mut body = json!({
        "reel_id": reel.as_str(),
        "read_shards": s.read_shards,
        "write_shards": s.write_shards,
        "target": s.target,
        "phase": s.phase.as_str(),
        "phase_since_ms": s.phase_at_ms,
        "version": s.version,
    });
    if let Some(o) = outcome {
        body["outcome"] = json!(o);
    }
    body
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Body::Text(body.to_string()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Writes, errors, readiness and admin answers are never cached; count
    // answers replace this with their lifetime (`Cacheable`).
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The only place an [`Error`] becomes a response.
pub(crate) fn error_response(e: &Error) -> Response<Body> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(status, &e.body());
    if let Some(secs) = e.retry_after_secs() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Error::MethodNotAllowed { allow } = e {
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    resp
}
