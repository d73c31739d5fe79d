//! The routes of the HTTP API and which Lambda function serves each: the
//! one place that knows both, so request parsing and the handlers depend on
//! it and never on each other.

use lambda_http::{Request, RequestExt};
use percent_encoding::percent_decode_str;

/// Which Lambda function is answering: each serves only its own routes, as
/// the template wires them, and answers 404 for anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    /// `PUT|DELETE /reels/{reel_id}/like`, and `DELETE
    /// /admin/users/{user_id}/likes` (IAM-authorized erasure: the same
    /// unlike transactions, so the same grants).
    Like,
    /// `GET /reels/{reel_id}/likes`, `GET /likes`, `GET /healthz`, `GET
    /// /reels/{reel_id}/views`, `GET /counts`, `GET
    /// /reels/{reel_id}/stats`, `GET /trending`, and the
    /// API's `$default` route (unknown paths, answered with a JSON 404).
    Read,
    /// `GET|POST /admin/reels/{reel_id}/shards` (IAM-authorized), besides
    /// the scheduled run, which is not an HTTP event.
    Reshard,
    /// `POST /views`: a viewer's batch into the views log.
    View,
}

impl Function {
    pub(crate) fn serves(self, route: &Route) -> bool {
        match self {
            Function::Like => matches!(route, Route::Like(_) | Route::AdminUserLikes(_)),
            Function::Reshard => matches!(route, Route::AdminShards(_) | Route::AdminReels),
            Function::View => matches!(route, Route::Views),
            Function::Read => !matches!(
                route,
                Route::Like(_)
                    | Route::AdminShards(_)
                    | Route::AdminReels
                    | Route::AdminUserLikes(_)
                    | Route::Views
            ),
        }
    }
}

impl Function {
    /// The `Function` dimension of its metrics.
    pub fn name(self) -> &'static str {
        match self {
            Function::Like => "like",
            Function::Read => "read",
            Function::Reshard => "reshard",
            Function::View => "view",
        }
    }
}

/// The routes of the HTTP API, matched on the path alone; the method is
/// checked afterwards so that a known path with a wrong method gets 405.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/reels/{reel_id}/like`: PUT likes, DELETE unlikes.
    Like(String),
    /// `/reels/{reel_id}/likes`: GET the count.
    ReelLikes(String),
    /// `/likes?reel_ids=a,b,c`: GET many counts.
    BatchLikes,
    /// `/healthz`: GET readiness.
    Health,
    /// `/admin/reels/{reel_id}/shards`: GET the resize state, POST
    /// `{"shards": M}` to start a resize.
    AdminShards(String),
    /// `/admin/reels`: GET the reels with more than one shard or a resize
    /// in progress.
    AdminReels,
    /// `/admin/users/{user_id}/likes`: DELETE every like of the user
    /// (erasure). `None` when the decoded segment is not UTF-8: a user id
    /// may hold any character, so a lossy decode would name another user
    /// (`Jos%E9` would erase `Jos\u{FFFD}`'s likes and answer that nothing
    /// was left), where a reel id's character set refuses the replacement.
    AdminUserLikes(Option<String>),
    /// `/views`: POST a viewer's batch of views.
    Views,
    /// `/reels/{reel_id}/views`: GET the views and unique viewers.
    ReelViews(String),
    /// `/counts?reel_ids=a,b,c`: GET likes and views of many reels.
    Counts,
    /// `/reels/{reel_id}/stats`: GET its net likes and views over the last
    /// hour, 24 hours and 7 days.
    ReelStats(String),
    /// `/trending?metric=&window=&limit=`: GET the top reels.
    Trending,
}

impl Route {
    /// Matches the raw (percent-encoded) path. The reel id segment is
    /// percent-decoded the way API Gateway decodes path parameters, so
    /// `%23` arrives as `#` and is refused by validation, not routed.
    pub(crate) fn parse(raw_path: &str) -> Option<Route> {
        let rest = raw_path.strip_prefix('/')?;
        let segments: Vec<&str> = rest.split('/').collect();
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        match segments.as_slice() {
            ["reels", id, "like"] => Some(Route::Like(decode(id))),
            ["reels", id, "likes"] => Some(Route::ReelLikes(decode(id))),
            ["likes"] => Some(Route::BatchLikes),
            ["healthz"] => Some(Route::Health),
            ["admin", "reels", id, "shards"] => Some(Route::AdminShards(decode(id))),
            ["admin", "reels"] => Some(Route::AdminReels),
            ["admin", "users", id, "likes"] => Some(Route::AdminUserLikes(
                percent_decode_str(id)
                    .decode_utf8()
                    .ok()
                    .map(|s| s.into_owned()),
            )),
            ["views"] => Some(Route::Views),
            ["reels", id, "views"] => Some(Route::ReelViews(decode(id))),
            ["counts"] => Some(Route::Counts),
            ["reels", id, "stats"] => Some(Route::ReelStats(decode(id))),
            ["trending"] => Some(Route::Trending),
            _ => None,
        }
    }

    pub(crate) fn allow(&self) -> &'static str {
        match self {
            Route::Like(_) => "PUT, DELETE",
            Route::AdminShards(_) => "GET, POST",
            Route::AdminUserLikes(_) => "DELETE",
            Route::Views => "POST",
            _ => "GET",
        }
    }

    // Only the handlers ask for it (not built without `dynamodb`).
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Route::Like(_) => "like",
            Route::ReelLikes(_) => "reel_likes",
            Route::BatchLikes => "batch_likes",
            Route::Health => "healthz",
            Route::AdminShards(_) => "admin_shards",
            Route::AdminReels => "admin_reels",
            Route::AdminUserLikes(_) => "admin_user_likes",
            Route::Views => "views",
            Route::ReelViews(_) => "reel_views",
            Route::Counts => "counts",
            Route::ReelStats(_) => "reel_stats",
            Route::Trending => "trending",
        }
    }
}

/// The route of a request, if `function` serves it. The handler also names
/// its logs and metrics after it, failed requests included.
pub(crate) fn route(req: &Request, function: Function) -> Option<Route> {
    Route::parse(&raw_path(req)).filter(|r| function.serves(r))
}

/// The path API Gateway saw (`rawPath`), or the URI's path for events that
/// lack it.
fn raw_path(req: &Request) -> String {
    let raw = req.raw_http_path();
    if raw.is_empty() {
        req.uri().path().to_owned()
    } else {
        raw.to_owned()
    }
}
