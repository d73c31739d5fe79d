//! The retry policy of [`LikeService::write`], driven by a store that
//! answers from a script: the faults no emulator produces (conflicts,
//! throttling cancellations) and what the service makes of them. The
//! DynamoDB behaviour itself is tested against dynoxide in `tests/`.
//!
//! And the cached sum against a read that overlaps this instance's own
//! transaction, with the timing made explicit by a store whose calls
//! take set times (the emulator answers too fast to show the race).
use super::super::fake::{self, Fake, like, scripted};
use super::*;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn a_like_of_an_id_the_reel_check_refuses_writes_nothing() {
    use futures::future::BoxFuture;
    /// Knows only `pub1`.
    struct Catalogue;
    impl crate::service::ReelCheck for Catalogue {
        fn exists<'a>(&'a self, reel: &'a ReelId) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin(async move { Ok(reel.as_str() == "pub1") })
        }
    }
    let done = TxResult::Committed { replayed: false };
    let svc = scripted(vec![done, done], &[]).with_reel_check(Arc::new(Catalogue));
    let mut req = like("u", "r1");
    req.reel = ReelId::parse("made-up").unwrap();
    assert!(matches!(svc.write(req).await, Err(Error::UnknownReel)));
    assert_eq!(svc.store().calls(), 0);
    // An unlike of it is no new reel (a reel deleted since can still be
    // unliked); a like of a known reel goes through.
    let mut req = fake::unlike("u", "r2");
    req.reel = ReelId::parse("made-up").unwrap();
    svc.write(req).await.unwrap();
    let mut req = like("u", "r3");
    req.reel = ReelId::parse("pub1").unwrap();
    svc.write(req).await.unwrap();
    assert_eq!(svc.store().calls(), 2);
}

#[tokio::test]
async fn conflicts_are_retried_then_succeed_with_the_retries_counted() {
    let conflict = TxResult::Retry(RetryReason::Conflict);
    let svc = scripted(
        vec![conflict, conflict, TxResult::Committed { replayed: false }],
        &[],
    );
    let out = svc.write(like("u", "req")).await.unwrap();
    // The sum (41) was read after the commit, so it already includes it.
    assert_eq!(
        (out.path, out.retries, out.changed, out.count),
        (WritePath::Applied, 2, true, 41)
    );
    assert_eq!(svc.store().calls(), 3);
}

#[tokio::test]
async fn a_stream_mode_like_its_own_retry_committed_answers_with_it() {
    // Before: answered from a fresh sum, which in stream mode holds the
    // like only once the aggregator has applied it: changed, count 41.
    for answer in [
        TxResult::Committed { replayed: true },
        TxResult::CommittedUnsure,
    ] {
        let svc = scripted(vec![answer], &[("COUNTING", "stream")]);
        let out = svc.write(like("u", "req")).await.unwrap();
        assert_eq!((out.changed, out.count), (true, 42), "{:?}", out.path);
    }
}

#[tokio::test]
async fn a_sum_cached_before_the_write_is_adjusted_by_it() {
    let svc = scripted(vec![TxResult::Committed { replayed: false }], &[]);
    svc.count(&ReelId::parse("r").unwrap()).await.unwrap();
    let out = svc.write(like("u", "req")).await.unwrap();
    assert_eq!((out.changed, out.count), (true, 42));
    let svc = scripted(vec![TxResult::AlreadyInState], &[]);
    svc.count(&ReelId::parse("r").unwrap()).await.unwrap();
    let out = svc.write(like("u", "req")).await.unwrap();
    assert_eq!((out.changed, out.count), (false, 41));
}

#[tokio::test]
async fn retries_are_bounded_and_end_in_429_errors() {
    let svc = scripted(
        vec![TxResult::Retry(RetryReason::Conflict)],
        &[("TX_MAX_ATTEMPTS", "4")],
    );
    assert_eq!(
        svc.write(like("u", "req")).await.unwrap_err(),
        Error::Contended
    );
    assert_eq!(svc.store().calls(), 4);

    let svc = scripted(
        vec![TxResult::Retry(RetryReason::Throttled)],
        &[("TX_MAX_ATTEMPTS", "3")],
    );
    let err = svc.write(like("u", "req")).await.unwrap_err();
    assert_eq!(err.status(), 429);
    assert!(err.retry_after_secs().is_some_and(|s| (1..=3).contains(&s)));
    assert_eq!(svc.store().calls(), 3);
}

#[tokio::test]
async fn no_attempt_starts_that_could_not_finish_within_the_budget() {
    // One call may take the whole budget: no retry can fit after the first.
    let svc = scripted(
        vec![TxResult::Retry(RetryReason::Conflict)],
        &[
            ("TX_MAX_ATTEMPTS", "50"),
            ("REQUEST_BUDGET_MS", "100"),
            ("DDB_OPERATION_TIMEOUT_MS", "100"),
            ("RETRY_BASE_MS", "30"),
            ("RETRY_MAX_MS", "30"),
        ],
    );
    assert_eq!(
        svc.write(like("u", "req")).await.unwrap_err(),
        Error::Contended
    );
    assert_eq!(svc.store().calls(), 1);
}

#[tokio::test]
async fn a_read_that_overlaps_the_commit_is_not_adjusted_again() {
    // One counter; a read answers 200 ms after it is sent; a transaction
    // commits 10 ms after it is sent and its answer arrives 400 ms later.
    // (Wide margins: the ordering must hold on a loaded CI machine.)
    let svc = Arc::new(LikeService::new(
        Fake::new(0).timed(
            Duration::from_millis(200),
            Duration::from_millis(10),
            Duration::from_millis(400),
        ),
        &fake::config(&[("CACHE_TTL_MS", "60000")]),
    ));
    let reel = ReelId::parse("r").unwrap();
    // A reader sends its sum first; the like is sent 5 ms later and
    // commits while the read is in flight, so the read includes it,
    // but it is cached before the like's answer arrives.
    let reader = tokio::spawn({
        let (svc, reel) = (svc.clone(), reel.clone());
        async move { svc.count(&reel).await.unwrap().count }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let out = svc.write(like("u", "req")).await.unwrap();
    assert_eq!(
        reader.await.unwrap(),
        1,
        "the overlapping read saw the commit"
    );
    assert_eq!(out.count, 1, "not adjusted a second time");
    assert_eq!(
        svc.count(&reel).await.unwrap().count,
        1,
        "the cached sum is exact"
    );
}
