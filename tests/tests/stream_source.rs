//! The stream event source with several virtual shards
//! (`LOCAL_STREAM_SHARDS`), rolling over into children
//! (`LOCAL_STREAM_ROLL_RECORDS`), and its own faults (`LOCAL_STREAM_FAULTS`),
//! end to end: likes and unlikes of many users on a few reels through the
//! HTTP routes, then the shard sums against the Likes table's rows.
//!
//! * Four virtual shards aggregate one reel at once, each with its own
//!   checkpoint, under redeliveries, lost answers, end-of-window invokes
//!   and timed-out invocations that commit late: exactly once.
//! * The same with every fault class, `reorder` and `duplicate` too: exact
//!   only with an aggregator that sorts and de-duplicates a batch by
//!   sequence number and never moves its checkpoint back.
//!
//! What the source hands over under each fault is pinned by the unit tests
//! of local/src/streams/tests.rs.

mod common;

use common::{TestStack, drained};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const REELS: usize = 3;

/// A like or unlike, retried by the client on 429/503 like a real app.
async fn act(t: &TestStack, user: &str, reel: &str, like: bool) -> common::Reply {
    let path = format!("/reels/{reel}/like");
    let method = if like { "PUT" } else { "DELETE" };
    for _ in 0..50 {
        let r = t.send(method, &path, Some(user), &[], None).await;
        if r.status != 429 && r.status != 503 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{method} {path} as {user}: still refused after 50 tries");
}

/// Waves of many users liking the few reels, every third unliking again
/// and every seventh liking once more: three, and more (up to twelve)
/// until each of `faults` has struck. The event source's faults strike per
/// invocation, and how many invocations three waves make depends on how
/// busy the machine is (a loaded one batches more records per
/// invocation): a run once drew a single end-of-window invoke. Returns
/// each reel's like rows.
async fn traffic(t: &TestStack, faults: &[&AtomicU64]) -> BTreeMap<String, i64> {
    let reels: Vec<String> = (0..REELS).map(|i| format!("vs{i}")).collect();
    for wave in 0..12 {
        if wave >= 3 && faults.iter().all(|n| seen(n) > 0) {
            break;
        }
        futures::future::join_all((0..40).map(|u| {
            let reels = &reels;
            async move {
                let reel = &reels[(u + wave) % reels.len()];
                let user = format!("w{wave}-u{u}");
                let r = act(t, &user, reel, true).await;
                assert_eq!(r.status, 200, "{:?}", r.body);
                if u % 3 == 0 {
                    let r = act(t, &user, reel, false).await;
                    assert_eq!(r.body["changed"], true);
                    if u % 7 == 0 {
                        let r = act(t, &user, reel, true).await;
                        assert_eq!(r.body["changed"], true);
                    }
                }
            }
        }))
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut want = BTreeMap::new();
    for reel in &reels {
        want.insert(reel.clone(), t.like_rows(reel).await as i64);
    }
    want
}

async fn sums(t: &TestStack, reels: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    let mut got = BTreeMap::new();
    for reel in reels.keys() {
        got.insert(reel.clone(), t.shard_sum(reel).await);
    }
    got
}

fn seen(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The stack of these tests: stream mode, four virtual shards rolling over
/// every `roll` records, the source faults `faults`, batches of several
/// transactions.
async fn stack(faults: &str, roll: &str) -> TestStack {
    let mut env = vec![
        ("COUNTING", "stream"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("LOCAL_STREAM_SHARDS", "4"),
        ("LOCAL_STREAM_ROLL_RECORDS", roll),
        ("LOCAL_STREAM_FAULTS", faults),
        // Two reels a transaction: a batch is several transactions, and a
        // late or lost invocation lands between them.
        ("AGGREGATE_CHUNK_REELS", "2"),
        ("CACHE_TTL_MS", "0"),
    ];
    env.extend(common::UNBOUNDED_CALLERS);
    TestStack::start(&env).await
}

fn report(t: &TestStack) {
    let s = &t.stack.streams[0].stats;
    eprintln!(
        "event source: invocations {}, delivered {}, retries {}, bisections {}, partial {}, \
         redelivered {}, lost {}, reordered {}, appended {}, duplicated {}, final_windows {}, \
         late_commits {} ({} ran into their retry), discarded {}, shards {:?}",
        seen(&s.invocations),
        seen(&s.delivered),
        seen(&s.retries),
        seen(&s.bisections),
        seen(&s.partial),
        seen(&s.redelivered),
        seen(&s.lost),
        seen(&s.reordered),
        seen(&s.appended),
        seen(&s.duplicated),
        seen(&s.final_windows),
        seen(&s.late_commits),
        seen(&s.late_overlaps),
        seen(&s.discarded),
        s.shards.lock().map(|v| v.clone()).unwrap_or_default(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_virtual_shards_count_every_like_once_under_late_and_repeated_invocations() {
    let t = stack(
        "seed=21,redeliver=0.3,lost=0.2,final_window=0.3,late_commit=0.25",
        "25",
    )
    .await;
    let s = &t.stack.streams[0].stats;
    let faults = [
        ("redeliver", &s.redelivered),
        ("lost", &s.lost),
        ("final_window", &s.final_windows),
        ("late_commit", &s.late_commits),
    ];
    let want = traffic(&t, &faults.map(|(_, n)| n)).await;
    drained(&t, Duration::from_secs(120)).await;
    let got = sums(&t, &want).await;
    report(&t);
    assert_eq!(s.discarded(), 0, "no batch ran out of retries");
    assert_eq!(got, want, "shard sums equal the like rows once drained");
    for (class, n) in faults {
        assert!(seen(n) > 0, "the {class} fault struck");
    }
    // Four lanes, rolled over into children: every checkpoint belongs to a
    // virtual shard the source opened, one checkpoint per shard.
    let opened = s.shards.lock().unwrap().clone();
    let lanes: BTreeSet<&str> = opened
        .iter()
        .filter(|(_, parent)| parent.is_none())
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(lanes.len(), 4, "{opened:?}");
    assert!(
        opened.iter().any(|(_, parent)| parent.is_some()),
        "some shard rolled over: {opened:?}"
    );
    let ids: BTreeSet<&str> = opened.iter().map(|(id, _)| id.as_str()).collect();
    let checkpoints: Vec<String> = t
        .scan_prefix("agg#")
        .await
        .iter()
        .filter_map(|i| i.get("shard_id").and_then(|v| v.as_s().ok()).cloned())
        .collect();
    assert_eq!(checkpoints.len(), ids.len(), "{checkpoints:?}");
    assert!(checkpoints.iter().all(|c| ids.contains(c.as_str())));
    t.stop().await;
}

/// Needs the aggregator that sorts and de-duplicates a batch by sequence
/// number and never moves its checkpoint back: with `reorder` and
/// `duplicate` on, an aggregator that applies a batch in the order handed
/// over counts some records twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_virtual_shards_count_every_like_once_under_every_fault_class() {
    let t = stack(
        "seed=5,redeliver=0.3,lost=0.3,reorder=0.5,duplicate=0.3,final_window=0.3,\
         late_commit=0.2",
        // Short-lived shards: a batch is cut at each roll-over, so the run
        // makes enough invocations for every fault class to strike.
        "12",
    )
    .await;
    let s = &t.stack.streams[0].stats;
    let faults = [
        ("redeliver", &s.redelivered),
        ("lost", &s.lost),
        ("reorder", &s.reordered),
        ("duplicate", &s.duplicated),
        ("final_window", &s.final_windows),
        ("late_commit", &s.late_commits),
    ];
    let want = traffic(&t, &faults.map(|(_, n)| n)).await;
    drained(&t, Duration::from_secs(120)).await;
    let got = sums(&t, &want).await;
    report(&t);
    assert_eq!(s.discarded(), 0, "no batch ran out of retries");
    assert_eq!(got, want, "shard sums equal the like rows once drained");
    for (class, n) in faults {
        assert!(seen(n) > 0, "the {class} fault struck");
    }
    t.stop().await;
}
