//! `GET /reels/{reel_id}/stats`: a reel's net likes and its views over the
//! last hour, 24 hours and 7 days (issue 37), from the buckets the writes
//! that count them keep on the count items ([`crate::keys::window`]).

use crate::App;
use crate::app::Views;
use crate::error::Error;
use crate::keys::ReelId;
use crate::keys::window::Window;
use lambda_http::http::StatusCode;
use serde_json::{Value, json};

/// The answer: per window, where it starts (`from`, Unix ms: its oldest
/// bucket's start, at most one bucket before the window's length), the
/// net likes and the views; `as_of` (Unix ms) is the clock of the older of
/// the two reads (each cached as the counts are, `age_ms` the older's
/// age). Likes are net: an unlike in the window of a like before it makes
/// the figure go down, and can take it below zero.
pub(super) async fn reel_stats(app: &App, reel: &ReelId) -> Result<(StatusCode, Value), Error> {
    let reader = app.views.reader.as_ref().ok_or_else(Views::missing)?;
    // Boxed: each read is a large future, and two side by side in the
    // handler's would grow every request's.
    let (likes, views) = tokio::join!(
        Box::pin(app.service.windows(reel)),
        Box::pin(reader.counts(reel))
    );
    let (likes, views) = (likes?, views?);
    let as_of = likes.windows_at_ms.min(views.as_of_ms);
    let mut windows = serde_json::Map::new();
    for w in Window::ALL {
        windows.insert(
            w.name().to_owned(),
            json!({
                "from": w.from_ms(as_of),
                "likes": likes.windows.get(w),
                "views": views.windows.get(w),
            }),
        );
    }
    Ok((
        StatusCode::OK,
        json!({
            "reel_id": reel.as_str(),
            "windows": windows,
            "as_of": as_of,
            "age_ms": likes.age().max(views.age()).as_millis() as u64,
        }),
    ))
}
