//! One instance's set over an in-memory store: what it trusts, what it
//! registers, what another instance's registrations teach it.

use super::mem::MemKnown;
use super::*;
use crate::store::KnownMeta;

fn reels(ids: &[&str]) -> Vec<ReelId> {
    ids.iter().map(|r| ReelId::parse(r).unwrap()).collect()
}

/// A store whose set is complete and folded a second ago, holding `ids`.
fn complete(ids: &[&str]) -> Arc<MemKnown> {
    let store = MemKnown::default();
    *store.meta.lock().unwrap() = Some(KnownMeta {
        to_ms: crate::clock::now_ms() - 1_000,
        seen_ms: crate::clock::now_ms(),
        complete: true,
        version: 1,
        ..KnownMeta::default()
    });
    let mut segments = store.segments.lock().unwrap();
    for id in ids {
        let (s, f) = fingerprint(id);
        let seg = segments
            .entry(s)
            .or_insert_with(|| crate::store::KnownSegment {
                index: s,
                ..Default::default()
            });
        merge_sorted(&mut seg.fps, vec![f]);
    }
    drop(segments);
    Arc::new(store)
}

/// A set refreshed on every read (`CACHE_TTL_MS` 0).
fn instance(store: &Arc<MemKnown>) -> Known<MemKnown> {
    Known::new(store.clone(), Duration::ZERO, Duration::from_millis(5_000))
}

fn names(a: &Absent) -> Option<Vec<&str>> {
    let mut v: Vec<&str> = a.0.iter().map(ReelId::as_str).collect();
    v.sort();
    a.1.map(|_| v)
}

#[tokio::test]
async fn an_incomplete_set_answers_nothing_and_writers_register_once() {
    let store = Arc::new(MemKnown::default());
    let k = instance(&store);
    assert_eq!(names(&k.absent(&reels(&["a"])).await), None);
    let r = reels(&["a", "b"]);
    k.register(&[&r[0], &r[1], &r[0]]).await.unwrap();
    k.register(&[&r[0]]).await.unwrap();
    assert_eq!(store.puts.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn another_instances_registration_is_read_at_the_next_refresh() {
    let store = complete(&["old"]);
    let (a, b) = (instance(&store), instance(&store));
    let r = reels(&["old", "new"]);
    assert_eq!(names(&a.absent(&r).await), Some(vec!["new"]));
    // Known to the writer already: nothing is put.
    b.register(&[&r[0]]).await.unwrap();
    assert_eq!(store.puts.load(Ordering::Relaxed), 0);
    b.register(&[&r[1]]).await.unwrap();
    assert_eq!(store.puts.load(Ordering::Relaxed), 1);
    assert_eq!(names(&a.absent(&r).await), Some(vec![]));
}

#[tokio::test]
async fn a_registration_stamped_within_the_margin_before_a_refresh_is_read() {
    let store = complete(&[]);
    let a = instance(&store);
    let r = reels(&["late"]);
    assert_eq!(names(&a.absent(&r).await), Some(vec!["late"]));
    // A put stamped before that refresh, readable only after it (a slow
    // writer): the next refresh reads back the margin.
    let stamp = crate::clock::now_ms() - a.margin_ms() + 500;
    store
        .registrations
        .lock()
        .unwrap()
        .push((stamp, "late".into()));
    assert_eq!(names(&a.absent(&r).await), Some(vec![]));
}

#[tokio::test]
async fn a_store_that_fails_leaves_the_set_untrusted_and_a_like_unregistered() {
    let store = complete(&[]);
    let a = instance(&store);
    let r = reels(&["x"]);
    assert!(a.absent(&r).await.1.is_some());
    store.failing.store(true, Ordering::Relaxed);
    assert_eq!(names(&a.absent(&r).await), None);
    assert!(a.register(&[&r[0]]).await.is_err());
    assert!(a.stats().failures.load(Ordering::Relaxed) >= 1);
}

#[tokio::test]
async fn a_meta_recheck_reads_the_registrations_it_answers_for() {
    // Trusted for a minute, its meta item rechecked on every read: the
    // recheck is the read's refresh, and must read what was registered
    // since (it answered "never counted" for a reel just liked).
    let store = complete(&[]);
    let a = Known::new(
        store.clone(),
        Duration::from_secs(60),
        Duration::from_millis(5_000),
    )
    .with_recheck(Duration::ZERO);
    let r = reels(&["new"]);
    assert_eq!(names(&a.absent(&r).await), Some(vec!["new"]));
    instance(&store).register(&[&r[0]]).await.unwrap();
    assert_eq!(names(&a.absent(&r).await), Some(vec![]));
}

#[tokio::test]
async fn a_set_whose_fold_stopped_running_is_not_trusted() {
    // A rollback to a release that did not register: its warm runs did
    // not fold, and an instance loading before the next fold must not
    // trust the set that still says complete.
    let store = complete(&[]);
    if let Some(m) = store.meta.lock().unwrap().as_mut() {
        m.seen_ms = crate::clock::now_ms() - fold::FOLD_GAP_MS - 1_000;
    }
    assert_eq!(names(&instance(&store).absent(&reels(&["x"])).await), None);
}

#[tokio::test]
async fn a_writer_learns_what_another_registered_before_it_registers() {
    // The like function registers a new reel; the aggregator's instance,
    // which loaded the set before, counts it next: nothing is put again.
    let store = complete(&[]);
    let (like, aggregator) = (instance(&store), instance(&store));
    let r = reels(&["new"]);
    aggregator.register(&[]).await.unwrap();
    like.register(&[&r[0]]).await.unwrap();
    aggregator.register(&[&r[0]]).await.unwrap();
    assert_eq!(store.puts.load(Ordering::Relaxed), 1);
}
