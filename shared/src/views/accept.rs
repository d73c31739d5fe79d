//! `POST /views`: a viewer's batch checked, then written to the log as one
//! record, answered only once the record is durably there.

use super::record::ViewRecord;
use crate::error::Error;
use crate::keys::{ReelId, UserId};
use crate::retry::Backoff;
use crate::store::{LogPut, LogPutResult, LogStore};
use crate::token::RequestToken;
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries a batch may have.
pub const MAX_VIEW_ENTRIES: usize = 100;
/// Views one entry may carry.
pub const MAX_VIEW_COUNT: u32 = 1_000;

/// A batch's entries, each reel once (entries of one reel summed), sorted
/// by reel id; `Err` for anything else than the documented body.
///
/// Sorted because the record carries them in this order and the
/// aggregator cuts a record into parts of `chunk::PART_REELS`
/// reels in that order, each part with an event id of its own (the
/// record's [`event_id`] mixed with the part's number). A client's retry
/// of a keyed batch with its entries in another order is the same event:
/// sorted here, it is also cut into the same parts, so each part id stands
/// for the same reels in every copy. Sorting here, when the record is
/// written, rather than when it is cut: a record already in the log keeps
/// the cut it was (partly) applied with.
pub fn parse_batch(body: &[u8]) -> Result<Vec<(ReelId, u32)>, Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        views: Vec<Entry>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        reel_id: String,
        count: serde_json::Value,
    }
    let shape =
        "expected a JSON body {\"views\": [{\"reel_id\": <id>, \"count\": <1..1000>}, ...]}";
    let body: Body =
        serde_json::from_slice(body).map_err(|_| Error::bad_request("invalid_body", shape))?;
    if body.views.is_empty() || body.views.len() > MAX_VIEW_ENTRIES {
        return Err(Error::bad_request(
            "invalid_views",
            format!("views must have 1 to {MAX_VIEW_ENTRIES} entries"),
        ));
    }
    let mut out: Vec<(ReelId, u32)> = Vec::with_capacity(body.views.len());
    for e in body.views {
        let reel = ReelId::parse(&e.reel_id)
            .map_err(|err| Error::bad_request("invalid_reel_id", format!("in views: {}", err.0)))?;
        let count = e
            .count
            .as_u64()
            .filter(|n| (1..=u64::from(MAX_VIEW_COUNT)).contains(n))
            .ok_or_else(|| {
                Error::bad_request(
                    "invalid_count",
                    format!("count must be a whole number from 1 to {MAX_VIEW_COUNT}"),
                )
            })? as u32;
        match out.iter_mut().find(|(r, _)| *r == reel) {
            Some((_, n)) => *n += count,
            None => out.push((reel, count)),
        }
    }
    // Each reel is there once: the order is total.
    out.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    Ok(out)
}

/// The event id of a batch: derived from the viewer, its `Idempotency-Key`
/// and the batch's entries (in reel order) when it sent a key, so that a
/// client's retry of the batch is the same event and a different batch
/// under a used key is another one (never taken for a copy and dropped
/// after it was acknowledged); random without a key (a producer's own
/// retry reuses the record, id and all).
pub fn event_id(viewer: &UserId, idempotency_key: Option<&str>, views: &[(ReelId, u32)]) -> u64 {
    let Some(key) = idempotency_key else {
        return fastrand::u64(..);
    };
    let mut entries: Vec<String> = views.iter().map(|(r, n)| format!("{r}={n}")).collect();
    entries.sort_unstable();
    let mut fields = vec![viewer.as_str(), key];
    fields.extend(entries.iter().map(String::as_str));
    RequestToken::for_fields("views/event", &fields).as_u64()
}

/// Writes accepted batches to the log.
pub struct Producer<L> {
    log: std::sync::Arc<L>,
    backoff: Backoff,
    /// Records put again (refused ones, or all of a call whose answer was
    /// lost), since the instance started.
    retries: AtomicU64,
    /// What one viewer may put.
    limits: super::limits::ViewerLimits,
}

impl<L: LogStore> Producer<L> {
    /// A producer over `log`, retrying as `config` says (`RETRY_*`), each
    /// viewer within `bounds`.
    pub fn new(
        log: std::sync::Arc<L>,
        config: &crate::Config,
        bounds: super::limits::ViewerBounds,
    ) -> Self {
        Producer {
            log,
            backoff: Backoff::from_config(config),
            retries: AtomicU64::new(0),
            limits: super::limits::ViewerLimits::new(
                bounds,
                MAX_VIEW_ENTRIES as u64 * u64::from(MAX_VIEW_COUNT),
            ),
        }
    }

    /// Records put again so far (the `ViewPutRetries` metric's source).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Admits a batch of `views` from `viewer` within its bounds (before
    /// anything is put; see [`super::limits`]).
    pub async fn admit(&self, viewer: &UserId, views: u64) -> Result<(), Error> {
        self.limits.admit(viewer, views).await
    }

    /// Puts `record` in the log, partitioned by its viewer, and returns the
    /// views it carries once it is durably there. A refused record is put
    /// again, and so is a record whose call's answer was lost (it may be in
    /// the log twice then: one event id, counted once); bounded and
    /// jittered, then [`Error::Unavailable`], and the client retries with
    /// its key.
    pub async fn put(&self, record: &ViewRecord) -> Result<u64, Error> {
        let put = LogPut {
            partition_key: record.viewer.clone(),
            data: record.encode(),
        };
        let accepted: u64 = record.views.iter().map(|(_, n)| u64::from(*n)).sum();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let outcome = self.log.put(std::slice::from_ref(&put)).await;
            let reason = match outcome {
                Ok(results) if results.iter().all(|r| *r == LogPutResult::Stored) => {
                    return Ok(accepted);
                }
                Ok(results) => {
                    let code = results.iter().find_map(|r| match r {
                        LogPutResult::Failed { code } => Some(code.clone()),
                        LogPutResult::Stored => None,
                    });
                    code.unwrap_or_default()
                }
                Err(e @ (Error::Throttled | Error::Unavailable)) => e.code().to_owned(),
                Err(e) => return Err(e),
            };
            self.retries.fetch_add(1, Ordering::Relaxed);
            if !self.backoff.allows(attempt) {
                tracing::warn!(reason, attempts = attempt, "views log put gave up");
                return Err(Error::Unavailable);
            }
            tokio::time::sleep(self.backoff.delay(attempt)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_checked_and_a_reels_entries_summed() {
        let ok = parse_batch(br#"{"views":[{"reel_id":"a","count":2},{"reel_id":"b","count":1},{"reel_id":"a","count":1000}]}"#).unwrap();
        assert_eq!(
            ok,
            vec![
                (ReelId::parse("a").unwrap(), 1002),
                (ReelId::parse("b").unwrap(), 1)
            ]
        );
        for (bad, code) in [
            (&b""[..], "invalid_body"),
            (br#"{"views":[]}"#, "invalid_views"),
            (br#"{"views":[{"reel_id":"a","count":0}]}"#, "invalid_count"),
            (
                br#"{"views":[{"reel_id":"a","count":1001}]}"#,
                "invalid_count",
            ),
            (
                br#"{"views":[{"reel_id":"a","count":1.5}]}"#,
                "invalid_count",
            ),
            (
                br#"{"views":[{"reel_id":"a","count":"1"}]}"#,
                "invalid_count",
            ),
            (
                br#"{"views":[{"reel_id":"a#b","count":1}]}"#,
                "invalid_reel_id",
            ),
            (
                br#"{"views":[{"reel_id":"a","count":1,"x":1}]}"#,
                "invalid_body",
            ),
            (
                br#"{"views":[{"reel_id":"a","count":1}],"more":1}"#,
                "invalid_body",
            ),
        ] {
            let e = parse_batch(bad).unwrap_err();
            assert_eq!(e.code(), code, "{}", String::from_utf8_lossy(bad));
            assert_eq!(e.status(), 400);
        }
        let many = format!(
            r#"{{"views":[{}]}}"#,
            vec![r#"{"reel_id":"a","count":1}"#; 101].join(",")
        );
        assert_eq!(
            parse_batch(many.as_bytes()).unwrap_err().code(),
            "invalid_views"
        );
    }

    #[test]
    fn a_keyed_batch_has_one_event_id_per_viewer_key_and_entries() {
        let u = UserId::parse("u1").unwrap();
        let v = UserId::parse("u2").unwrap();
        let batch = |s: &str| parse_batch(s.as_bytes()).unwrap();
        let b = batch(r#"{"views":[{"reel_id":"a","count":2},{"reel_id":"b","count":1}]}"#);
        // The same entries in another order, or one reel's split in two.
        let same = batch(
            r#"{"views":[{"reel_id":"b","count":1},{"reel_id":"a","count":1},{"reel_id":"a","count":1}]}"#,
        );
        let other = batch(r#"{"views":[{"reel_id":"a","count":3}]}"#);
        let id = |u: &UserId, k: Option<&str>, b: &[(ReelId, u32)]| event_id(u, k, b);
        assert_eq!(id(&u, Some("k"), &b), id(&u, Some("k"), &b));
        assert_eq!(id(&u, Some("k"), &b), id(&u, Some("k"), &same));
        assert_ne!(id(&u, Some("k"), &b), id(&u, Some("k"), &other));
        assert_ne!(id(&u, Some("k"), &b), id(&v, Some("k"), &b));
        assert_ne!(id(&u, Some("k"), &b), id(&u, Some("k2"), &b));
        assert_ne!(id(&u, None, &b), id(&u, None, &b));
    }

    #[cfg(feature = "dynamodb")]
    #[test]
    fn a_keyed_batch_in_another_order_is_cut_into_the_same_parts() {
        use super::super::chunk::{PART_REELS, parts};
        use super::super::record::LogRecord;
        use crate::aggregate::records::SequenceNumber;
        let u = UserId::parse("u1").unwrap();
        // 90 reels (three parts), given in two orders; the second also
        // splits one reel's views in two entries.
        let entry = |i: usize, n: u32| format!(r#"{{"reel_id":"r{i}","count":{n}}}"#);
        let forward: Vec<String> = (0..90).map(|i| entry(i, 2)).collect();
        let mut backward: Vec<String> = (1..90).rev().map(|i| entry(i, 2)).collect();
        backward.push(entry(0, 1));
        backward.insert(50, entry(0, 1));
        let body = |e: &[String]| format!(r#"{{"views":[{}]}}"#, e.join(","));
        // What the handler writes for each (a record), as the aggregator
        // reads it back and cuts it.
        let cut = |body: String| {
            let views = parse_batch(body.as_bytes()).unwrap();
            let record = ViewRecord {
                id: event_id(&u, Some("k"), &views),
                viewer: u.as_str().to_owned(),
                at_ms: 1_700_000_000_000,
                views,
            };
            let read = LogRecord {
                seq: SequenceNumber::parse_kinesis("7").unwrap(),
                arrival_ms: 1_000,
                body: ViewRecord::decode(&record.encode()),
            };
            parts(&[read])
                .into_iter()
                .map(|p| (p.seq.as_reported().to_owned(), p.id, p.views))
                .collect::<Vec<_>>()
        };
        let (a, b) = (cut(body(&forward)), cut(body(&backward)));
        assert_eq!(a.len(), 90_usize.div_ceil(PART_REELS));
        assert_eq!(a, b);
        // In reel order: the first part is r0, r1, r10, r11, ...
        let first: Vec<&str> = a[0].2.iter().take(3).map(|(r, _)| r.as_str()).collect();
        assert_eq!(first, ["r0", "r1", "r10"]);
        assert_eq!(a[0].2[0].1, 2);
    }
}
