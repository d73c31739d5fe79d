//! The event source's behaviour, seen from the function: virtual shards and
//! their order, and each fault class doing what it says. A recording
//! function stands in for the aggregator, records are fed to the lanes as
//! the reader routes them, and the test reads the invocations it recorded.

use super::StreamSourceStats;
use super::deliver::{Handler, delivery};
use super::faults::SourceFaults;
use super::lanes::{Layout, Router};
use super::mapping::run_lane;
use crate::template::StreamSourceDef;
use aws_sdk_dynamodbstreams::types::{AttributeValue, Record, StreamRecord};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const REAL: &str = "shard-0001";

/// One invocation, as the function saw it.
#[derive(Clone, Debug)]
struct Call {
    shard: String,
    seqs: Vec<u64>,
    users: Vec<String>,
    last_of_window: bool,
    event: Value,
    /// Its start and end among all starts and ends (one clock for all).
    began: usize,
    ended: Option<usize>,
}

#[derive(Default)]
struct Log {
    calls: Vec<Call>,
    clock: usize,
}

type Answer = dyn Fn(&Call, usize) -> Result<Value, String> + Send + Sync;

fn ok() -> Result<Value, String> {
    Ok(json!({ "state": {}, "batchItemFailures": [] }))
}

fn recording(log: Arc<Mutex<Log>>, delay: Duration, answer: Arc<Answer>) -> Handler {
    Arc::new(move |event: Value, _deadline| {
        let (log, answer) = (log.clone(), answer.clone());
        Box::pin(async move {
            let records = event["Records"].as_array().cloned().unwrap_or_default();
            let call = Call {
                shard: event["shardId"].as_str().unwrap_or_default().to_owned(),
                seqs: records
                    .iter()
                    .map(|r| {
                        r["dynamodb"]["SequenceNumber"]
                            .as_str()
                            .unwrap()
                            .parse()
                            .unwrap()
                    })
                    .collect(),
                users: records
                    .iter()
                    .map(|r| {
                        r["dynamodb"]["Keys"]["user_id"]["S"]
                            .as_str()
                            .unwrap()
                            .to_owned()
                    })
                    .collect(),
                last_of_window: event["isFinalInvokeForWindow"] == true,
                event,
                began: 0,
                ended: None,
            };
            let (index, seen) = {
                let mut l = log.lock().unwrap();
                let mut call = call;
                call.began = l.clock;
                l.clock += 1;
                l.calls.push(call.clone());
                (l.calls.len() - 1, call)
            };
            tokio::time::sleep(delay).await;
            let out = answer(&seen, index);
            let mut l = log.lock().unwrap();
            l.calls[index].ended = Some(l.clock);
            l.clock += 1;
            out
        })
    })
}

fn record(user: &str, seq: u64) -> Record {
    Record::builder()
        .dynamodb(
            StreamRecord::builder()
                .keys("user_id", AttributeValue::S(user.into()))
                .keys("reel_id", AttributeValue::S("reel".into()))
                .sequence_number(seq.to_string())
                .build(),
        )
        .build()
}

/// `n` likes by `users` users in turn, sequence numbers 100, 101, ...
fn likes(n: u64, users: u64) -> Vec<Record> {
    (0..n)
        .map(|i| record(&format!("user-{}", i % users), 100 + i))
        .collect()
}

fn def(batch_size: u32, max_retries: i64, bisect: bool) -> StreamSourceDef {
    StreamSourceDef {
        function: "AggregateFunction".into(),
        code_uri: "functions/aggregate".into(),
        table: "LikesTable".into(),
        batch_size,
        batching_window_secs: 0,
        max_retries,
        max_record_age_secs: -1,
        bisect,
        report_failures: true,
        tumbling_window_secs: 60,
        starting_position: "TRIM_HORIZON".into(),
        timeout_secs: None,
    }
}

struct Run {
    calls: Vec<Call>,
    stats: Arc<StreamSourceStats>,
    layout: Layout,
}

/// Feeds `records` to `lanes` lanes (rolling over every `roll` records) as
/// the reader would, runs the lanes' workers until they delivered all,
/// and waits for invocations left running by `late_commit`.
async fn run(
    records: Vec<Record>,
    (lanes, roll): (u32, u64),
    def: StreamSourceDef,
    faults: &str,
    delay: Duration,
    answer: Arc<Answer>,
) -> Run {
    let faults = SourceFaults::parse(faults).unwrap();
    let log = Arc::new(Mutex::new(Log::default()));
    let stats = Arc::new(StreamSourceStats::default());
    let delivery = Arc::new(delivery(
        recording(log.clone(), delay, answer),
        def,
        "arn:aws:dynamodb:local:000000000000:table/LikesTable/stream/x".into(),
        Duration::from_secs(30),
        faults,
        stats.clone(),
    ));
    let layout = Layout {
        lanes,
        roll_records: roll,
        partition_key: "user_id".into(),
    };
    let mut router = Router::new(layout.clone(), REAL);
    stats
        .outstanding
        .fetch_add(records.len() as u64, Ordering::SeqCst);
    for r in records {
        if let Some(opened) = router.route(r) {
            stats.shards.lock().unwrap().push(opened);
        }
    }
    router.close();
    let (_stop, stopped) = watch::channel(false);
    let workers: Vec<_> = router
        .lanes()
        .iter()
        .map(|lane| {
            tokio::spawn(run_lane(
                delivery.clone(),
                layout.clone(),
                REAL.into(),
                lane.clone(),
                stopped.clone(),
            ))
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    if faults.late_commit > 0.0 {
        // Two polls at most before it starts, then its own delay.
        tokio::time::sleep(Duration::from_millis(600) + delay * 2).await;
    }
    let calls = log.lock().unwrap().calls.clone();
    assert_eq!(
        stats.outstanding.load(Ordering::SeqCst),
        0,
        "all handed over"
    );
    Run {
        calls,
        stats,
        layout,
    }
}

fn always_ok() -> Arc<Answer> {
    Arc::new(|_, _| ok())
}

fn overlap(a: &Call, b: &Call) -> bool {
    let end = |c: &Call| c.ended.unwrap_or(usize::MAX);
    a.began < end(b) && b.began < end(a)
}

/// Every pair of invocations of one shard that ran at the same time.
fn overlapping_in_a_shard(calls: &[Call]) -> usize {
    let mut n = 0;
    for (i, a) in calls.iter().enumerate() {
        for b in &calls[i + 1..] {
            n += usize::from(a.shard == b.shard && overlap(a, b));
        }
    }
    n
}

#[tokio::test]
async fn k_virtual_shards_partition_by_key_each_with_its_own_shard_id() {
    let r = run(
        likes(120, 16),
        (4, 0),
        def(8, 3, true),
        "",
        Duration::from_millis(20),
        always_ok(),
    )
    .await;
    let mut by_shard: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut shard_of_user: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in &r.calls {
        by_shard.entry(c.shard.clone()).or_default().extend(&c.seqs);
        for u in &c.users {
            shard_of_user
                .entry(u.clone())
                .or_default()
                .insert(c.shard.clone());
        }
        assert_eq!(
            c.event["eventSourceARN"],
            r.calls[0].event["eventSourceARN"]
        );
    }
    let ids: Vec<&str> = by_shard.keys().map(String::as_str).collect();
    assert_eq!(
        ids,
        [
            "shard-0001-v0",
            "shard-0001-v1",
            "shard-0001-v2",
            "shard-0001-v3"
        ]
    );
    // Each key in one shard, the one its hash names; each shard's records
    // in stream order, every record once.
    for (user, shards) in &shard_of_user {
        let want = r
            .layout
            .shard_id(REAL, r.layout.lane_of(&record(user, 1)), 0);
        assert_eq!(shards.iter().collect::<Vec<_>>(), [&want], "{user}");
    }
    let mut all: Vec<u64> = Vec::new();
    for seqs in by_shard.values() {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        all.extend(seqs);
    }
    all.sort_unstable();
    assert_eq!(all, (100..220).collect::<Vec<_>>());
    let opened = r.stats.shards.lock().unwrap().clone();
    assert_eq!(opened.len(), 4);
    assert!(opened.iter().all(|(_, parent)| parent.is_none()));
    // Side by side across shards, one batch at a time within one.
    let across = r.calls.iter().enumerate().any(|(i, a)| {
        r.calls[i + 1..]
            .iter()
            .any(|b| a.shard != b.shard && overlap(a, b))
    });
    assert!(across, "the virtual shards are invoked concurrently");
    assert_eq!(overlapping_in_a_shard(&r.calls), 0);
    let done = r.stats.done.lock().unwrap().clone();
    assert_eq!(done.len(), 4, "a checkpoint per virtual shard: {done:?}");
}

#[tokio::test]
async fn a_child_shard_is_delivered_only_after_its_parent_is_done() {
    // Each shard's first invocation fails, so a parent is still being
    // retried when its child's records are waiting.
    let tried: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let answer: Arc<Answer> = Arc::new(move |c, _| {
        if tried.lock().unwrap().insert(c.shard.clone()) {
            Err("first try".into())
        } else {
            ok()
        }
    });
    let r = run(
        likes(40, 7),
        (2, 6),
        def(4, 3, true),
        "",
        Duration::ZERO,
        answer,
    )
    .await;
    let opened = r.stats.shards.lock().unwrap().clone();
    let children: Vec<&(String, Option<String>)> =
        opened.iter().filter(|(_, p)| p.is_some()).collect();
    assert!(children.len() >= 4, "{opened:?}");
    for (child, parent) in children {
        let parent = parent.as_deref().unwrap();
        let named = (0..2).any(|lane| {
            (1..10).any(|g| {
                child == &r.layout.shard_id(REAL, lane, g)
                    && parent == r.layout.shard_id(REAL, lane, g - 1)
            })
        });
        assert!(named, "{child} rolled over from {parent}");
        let parent_end = r
            .calls
            .iter()
            .filter(|c| c.shard == parent)
            .filter_map(|c| c.ended)
            .max()
            .unwrap();
        let child_start = r
            .calls
            .iter()
            .filter(|c| &c.shard == child)
            .map(|c| c.began)
            .min()
            .unwrap();
        assert!(parent_end < child_start, "{parent} before {child}");
    }
    // Every shard holds at most six records, all delivered.
    let mut per_shard: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for c in &r.calls {
        per_shard.entry(&c.shard).or_default().extend(&c.seqs);
    }
    assert!(per_shard.values().all(|s| s.len() <= 6), "{per_shard:?}");
    assert_eq!(per_shard.values().map(BTreeSet::len).sum::<usize>(), 40);
    assert_eq!(r.stats.discarded(), 0);
}

/// The records an invocation sees for the first time come after every
/// record seen before, in order.
fn assert_first_sightings_in_order(calls: &[Call]) {
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    let mut newest = 0;
    for c in calls {
        for s in &c.seqs {
            if seen.insert(*s) {
                assert!(*s > newest, "{s} first seen after {newest}: {:?}", c.seqs);
                newest = *s;
            }
        }
    }
}

#[tokio::test]
async fn reorder_hands_a_batch_over_again_out_of_order_never_the_first_time() {
    let r = run(
        likes(30, 5),
        (1, 0),
        def(6, 3, true),
        "seed=3,redeliver=1,reorder=1",
        Duration::ZERO,
        always_ok(),
    )
    .await;
    let s = &r.stats;
    let reordered = s.reordered.load(Ordering::Relaxed);
    assert_eq!(
        reordered,
        s.redelivered.load(Ordering::Relaxed),
        "every redelivery"
    );
    assert_eq!(reordered, 5);
    assert_first_sightings_in_order(&r.calls);
    // Each batch in order, then again out of order, perhaps with the next
    // records of the shard after it.
    for pair in r.calls.chunks(2) {
        let (first, again) = (&pair[0], &pair[1]);
        assert!(
            first.seqs.windows(2).all(|w| w[0] < w[1]),
            "{:?}",
            first.seqs
        );
        let n = first.seqs.len();
        assert!(
            again.seqs[..n].windows(2).any(|w| w[0] > w[1]),
            "{:?}",
            again.seqs
        );
        let mut head = again.seqs[..n].to_vec();
        head.sort_unstable();
        assert_eq!(head, first.seqs);
        let tail = &again.seqs[n..];
        let next: Vec<u64> = (0..tail.len() as u64)
            .map(|i| first.seqs[n - 1] + 1 + i)
            .collect();
        assert_eq!(tail, next, "appended: the records that follow, in order");
    }
    assert!(
        s.appended.load(Ordering::Relaxed) > 0,
        "some batches had records appended"
    );
}

#[tokio::test]
async fn a_partial_failure_of_a_reordered_batch_goes_on_from_the_failed_number() {
    // The first invocation fails; its retry (reordered) reports the batch's
    // fourth record as failed; the next delivery holds it and the records
    // after it, whatever their order.
    let answer: Arc<Answer> = Arc::new(|c, index| match index {
        0 => Err("crash".into()),
        1 => Ok(json!({ "state": {}, "batchItemFailures": [{ "itemIdentifier": "103" }] })),
        _ => {
            assert!(c.seqs.iter().all(|s| *s >= 103), "{:?}", c.seqs);
            ok()
        }
    });
    let r = run(
        likes(6, 2),
        (1, 0),
        def(6, 5, false),
        "seed=1,reorder=1",
        Duration::ZERO,
        answer,
    )
    .await;
    assert_eq!(r.stats.partial.load(Ordering::Relaxed), 1);
    let mut third: Vec<u64> = r.calls[2].seqs.clone();
    third.sort_unstable();
    third.dedup();
    assert_eq!(third, [103, 104, 105]);
    assert_eq!(r.stats.done.lock().unwrap()[0].1, "105");
}

#[tokio::test]
async fn duplicate_repeats_one_record_inside_a_batch() {
    let r = run(
        likes(20, 3),
        (1, 0),
        def(5, 3, true),
        "seed=8,duplicate=1",
        Duration::ZERO,
        always_ok(),
    )
    .await;
    assert_eq!(r.calls.len(), 4);
    assert_eq!(r.stats.duplicated.load(Ordering::Relaxed), 4);
    for c in &r.calls {
        let distinct: BTreeSet<u64> = c.seqs.iter().copied().collect();
        assert_eq!((c.seqs.len(), distinct.len()), (6, 5), "{:?}", c.seqs);
    }
    assert_first_sightings_in_order(&r.calls);
}

#[tokio::test]
async fn final_window_follows_a_batch_with_an_empty_last_invoke() {
    let r = run(
        likes(12, 4),
        (2, 0),
        def(3, 3, true),
        "seed=2,final_window=1",
        Duration::ZERO,
        always_ok(),
    )
    .await;
    let finals: Vec<&Call> = r.calls.iter().filter(|c| c.last_of_window).collect();
    let batches = r.calls.len() - finals.len();
    assert_eq!(finals.len(), batches, "one after each batch");
    assert_eq!(
        r.stats.final_windows.load(Ordering::Relaxed),
        batches as u64
    );
    for f in finals {
        assert!(f.seqs.is_empty());
        assert!(f.shard.starts_with("shard-0001-v"), "{}", f.shard);
        assert_eq!(f.event["isWindowTerminatedEarly"], false);
        assert!(f.event["state"].is_object() && f.event["window"]["start"].is_string());
    }
    // The final invoke comes right after a batch of its own shard.
    for (i, c) in r.calls.iter().enumerate().filter(|(_, c)| c.last_of_window) {
        let before = r.calls[..i]
            .iter()
            .rev()
            .find(|b| b.shard == c.shard)
            .unwrap();
        assert!(!before.last_of_window && !before.seqs.is_empty());
    }
}

#[tokio::test]
async fn late_commit_leaves_a_timed_out_invocation_running_past_its_retry() {
    let r = run(
        likes(24, 6),
        (2, 0),
        def(4, 20, false),
        "seed=6,late_commit=0.4",
        Duration::from_millis(120),
        always_ok(),
    )
    .await;
    let s = &r.stats;
    assert!(s.late_commits.load(Ordering::Relaxed) > 0);
    assert!(
        s.late_overlaps.load(Ordering::Relaxed) > 0,
        "some ran on into their retry"
    );
    assert!(
        overlapping_in_a_shard(&r.calls) > 0,
        "two invocations of one shard at once"
    );
    // Every abandoned invocation still ran to its end.
    assert!(r.calls.iter().all(|c| c.ended.is_some()));
    assert_eq!(s.discarded(), 0);
    let delivered: BTreeSet<u64> = r.calls.iter().flat_map(|c| c.seqs.clone()).collect();
    assert_eq!(delivered.len(), 24);
}

#[tokio::test]
async fn an_answer_without_state_is_a_failed_invocation() {
    let answer: Arc<Answer> = Arc::new(|_, _| Ok(json!({ "batchItemFailures": [] })));
    let r = run(
        likes(3, 3),
        (1, 0),
        def(3, 1, false),
        "",
        Duration::ZERO,
        answer,
    )
    .await;
    assert_eq!(r.calls.len(), 2, "the first try and one retry");
    assert_eq!(r.stats.discarded(), 3);
}
