//! A batch read over a store whose sum of one reel always fails.
use super::super::fake::scripted;
use super::*;
use crate::store::TxResult;

#[tokio::test]
async fn a_batch_read_does_not_fail_because_of_one_reel() {
    let svc = scripted(vec![TxResult::Committed { replayed: false }], &[]);
    let reels: Vec<ReelId> = ["a", "failing", "b"]
        .iter()
        .map(|r| ReelId::parse(r).unwrap())
        .collect();
    let counts = svc.counts(&reels).await.unwrap();
    let mut got: Vec<(&str, i64)> = counts.iter().map(|(r, c)| (r.as_str(), c.count)).collect();
    got.sort();
    assert_eq!(got, [("a", 41), ("b", 41)], "the failing reel is left out");
    // Alone, it still fails (there is nothing else to answer).
    assert_eq!(
        svc.counts(&reels[1..2]).await.unwrap_err(),
        Error::Contended
    );
}

#[tokio::test]
async fn a_cached_reel_is_answered_when_the_one_reel_read_fails() {
    let svc = scripted(vec![TxResult::Committed { replayed: false }], &[]);
    let (a, failing) = (
        ReelId::parse("a").unwrap(),
        ReelId::parse("failing").unwrap(),
    );
    svc.counts(std::slice::from_ref(&a)).await.unwrap();
    // Before: the one reel read failed the whole answer (429), though
    // "a" was in the cache.
    let counts = svc.counts(&[a, failing]).await.unwrap();
    let got: Vec<(&str, i64)> = counts.iter().map(|(r, c)| (r.as_str(), c.count)).collect();
    assert_eq!(got, [("a", 41)], "the failing reel is left out");
}

#[tokio::test]
async fn a_throttled_batch_read_fails_fast_instead_of_reading_reel_by_reel() {
    let svc = scripted(vec![TxResult::Committed { replayed: false }], &[]);
    let reels: Vec<ReelId> = ["a", "throttled", "b"]
        .iter()
        .map(|r| ReelId::parse(r).unwrap())
        .collect();
    // Before: each reel read again on its own (two more sums, at the
    // moment the table throttles), "a" and "b" answered.
    assert_eq!(svc.counts(&reels).await.unwrap_err(), Error::Throttled);
    assert_eq!(svc.store().sums(), 0, "no read reel by reel");
    // With counts in the cache, those are answered and the rest left
    // out (the handler lists them as unavailable).
    let a = std::slice::from_ref(&reels[0]);
    assert_eq!(svc.counts(a).await.unwrap()[&reels[0]].count, 41);
    let counts = svc.counts(&reels).await.unwrap();
    assert_eq!(counts.keys().collect::<Vec<_>>(), [&reels[0]]);
}

#[test]
fn a_batch_read_stops_at_its_read_budget_in_request_order() {
    let reel = |r: &str| ReelId::parse(r).unwrap();
    let shards = |n: u32| Settings {
        write_shards: n,
        read_shards: n,
        ..Settings::default()
    };
    let plan = [("a", 40), ("b", 40), ("c", 40), ("d", 1)].map(|(r, n)| (reel(r), shards(n)));
    let (read, over) = within_budget(plan.clone().into_iter(), 100);
    let read: Vec<&str> = read.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(read, ["a", "b"]);
    // The cheap reel after the cut is left out too: the client asks
    // again for the tail of its list.
    assert_eq!(over, [reel("c"), reel("d")]);
    // The first reel is read whatever it costs.
    let (read, over) = within_budget(plan.into_iter(), 10);
    assert_eq!((read.len(), over.len()), (1, 3));
}
