//! The fold over an in-memory store: registrations merged, the backfill
//! paced by its delay and making the set complete, a full segment ending
//! it.

use super::*;
use crate::keys::ReelId;
use crate::known::mem::MemKnown;
use crate::known::{Known, KnownReels};
use std::collections::HashSet;

const MARGIN: i64 = 7_000;
const T0: i64 = 1_700_000_000_000;

fn reels(ids: &[&str]) -> Vec<ReelId> {
    ids.iter().map(|r| ReelId::parse(r).unwrap()).collect()
}

async fn absent(store: &Arc<MemKnown>, ids: &[&str]) -> Option<HashSet<String>> {
    let k = Known::new(
        store.clone(),
        Duration::from_secs(60),
        Duration::from_millis(5_000),
    );
    let (out, at) = k.absent(&reels(ids)).await;
    at.map(|_| out.iter().map(|r| r.as_str().to_owned()).collect())
}

#[tokio::test]
async fn registrations_and_backfilled_reels_end_in_the_segments() {
    let store = Arc::new(MemKnown::default());
    *store.counted.lock().unwrap() = (vec!["old".into(), "older".into()], vec!["viewed".into()]);
    let fold = Fold::new(store.clone(), MARGIN, 0);
    // The first run: the meta item, and the backfill's three pages.
    let r = fold.fold_at(T0).await.unwrap();
    assert_eq!((r.backfilled, r.complete, r.lost), (3, true, false));
    store
        .registrations
        .lock()
        .unwrap()
        .push((T0 + 1_000, "liked".into()));
    // Too soon: nothing is merged, nothing is written.
    let r = fold.fold_at(T0 + 60_000).await.unwrap();
    assert_eq!(
        r,
        FoldReport {
            complete: true,
            ..FoldReport::default()
        }
    );
    let r = fold
        .fold_at(T0 + FOLD_EVERY_MS + MARGIN + 1_000)
        .await
        .unwrap();
    assert_eq!((r.registrations, r.added, r.complete), (1, 1, true));
    let meta = store.meta.lock().unwrap().clone().unwrap();
    assert_eq!(meta.to_ms, T0 + FOLD_EVERY_MS + 1_000);
    // The registration is gone (TTL): the segments hold it.
    store.registrations.lock().unwrap().clear();
    let found = store
        .segments
        .lock()
        .unwrap()
        .values()
        .map(|s| s.fps.len())
        .sum::<usize>();
    assert_eq!(found, 4);
}

#[tokio::test]
async fn the_backfill_waits_for_writers_without_registrations_to_stop() {
    let store = Arc::new(MemKnown::default());
    *store.counted.lock().unwrap() = (vec!["old".into()], Vec::new());
    let fold = Fold::new(store.clone(), MARGIN, 3_600_000);
    // Once a minute, as scheduled: no backfill for the delay's hour.
    let mut t = T0;
    while t < T0 + 3_600_000 {
        let r = fold.fold_at(t).await.unwrap();
        assert_eq!((r.backfilled, r.complete), (0, false), "at {}", t - T0);
        t += 60_000;
    }
    let r = fold.fold_at(T0 + 3_600_000).await.unwrap();
    assert_eq!((r.backfilled, r.complete), (1, true));
}

#[tokio::test]
async fn a_registration_put_before_the_first_fold_is_merged() {
    // A writer that registered a reel (and kept it in its set) before any
    // fold ran: the first fold reads a day back.
    let store = Arc::new(MemKnown::default());
    store
        .registrations
        .lock()
        .unwrap()
        .push((T0 - 3_600_000, "early".into()));
    let r = Fold::new(store.clone(), MARGIN, 0)
        .fold_at(T0)
        .await
        .unwrap();
    assert_eq!((r.registrations, r.added, r.complete), (1, 1, true));
}

#[tokio::test]
async fn a_full_segment_ends_the_set_for_good() {
    let store = Arc::new(MemKnown::default());
    let (seg, fp) = fingerprint("z");
    let fps: Vec<u32> = (0..SEGMENT_MAX_FPS as u32)
        .map(|i| if i >= fp { i + 1 } else { i })
        .collect();
    store.segments.lock().unwrap().insert(
        seg,
        crate::store::KnownSegment {
            index: seg,
            fps,
            version: 1,
        },
    );
    let fold = Fold::new(store.clone(), MARGIN, 0);
    assert!(fold.fold_at(T0).await.unwrap().complete);
    store
        .registrations
        .lock()
        .unwrap()
        .push((T0 + 1, "z".into()));
    let r = fold
        .fold_at(T0 + FOLD_EVERY_MS + MARGIN + 10)
        .await
        .unwrap();
    assert!(!r.complete);
    let meta = store.meta.lock().unwrap().clone().unwrap();
    assert!(meta.full && !meta.complete);
    // Readers no longer trust it: every reel is read.
    assert_eq!(absent(&store, &["nobody"]).await, None);
}

#[tokio::test]
async fn a_fold_that_did_not_run_for_a_while_backfills_again() {
    // A rollback to a release without the known reels: its writers
    // counted without registering, and its warm runs folded nothing.
    let store = Arc::new(MemKnown::default());
    let fold = Fold::new(store.clone(), MARGIN, 0);
    assert!(fold.fold_at(T0).await.unwrap().complete);
    *store.counted.lock().unwrap() = (vec!["counted-meanwhile".into()], Vec::new());
    assert!(fold.fold_at(T0 + FOLD_GAP_MS).await.unwrap().complete);
    let later = T0 + 2 * FOLD_GAP_MS + 1;
    let r = fold.fold_at(later).await.unwrap();
    assert_eq!((r.backfilled, r.complete), (1, true));
    assert_eq!(store.meta.lock().unwrap().clone().unwrap().first_ms, later);
}

#[tokio::test]
async fn a_reader_trusts_the_set_only_once_complete_and_never_for_a_counted_reel() {
    let store = Arc::new(MemKnown::default());
    *store.counted.lock().unwrap() = (vec!["old".into()], vec!["viewed".into()]);
    assert_eq!(absent(&store, &["old", "nobody"]).await, None);
    Fold::new(store.clone(), MARGIN, 0)
        .fold_at(crate::clock::now_ms())
        .await
        .unwrap();
    let out = absent(&store, &["old", "viewed", "nobody"])
        .await
        .expect("trusted");
    assert_eq!(out, HashSet::from(["nobody".to_owned()]));
}
