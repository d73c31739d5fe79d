//! Stream mode (`COUNTING=stream`): a like writes only its row, and the
//! aggregate function, fed by the local event source from the emulator's
//! stream with Lambda's semantics, adds it to the reel's shards exactly once.
//!
//! * The HTTP contract is the transactional mode's: statuses, `changed`,
//!   `Idempotency-Key` retries (also after like → unlike), and the tapper
//!   sees their own like in the answer while the stream carries it.
//! * Once the stream is drained, every reel's shard sum equals its like
//!   rows, and no like wrote a shard item itself.
//! * Through the fault proxy (the aggregator's transactions: lost answers
//!   after commit, conflicts, throttles; the Streams API calls too) and the
//!   event source's own faults (batches delivered again, invocations whose
//!   answer is lost so the whole batch is retried, batches handed
//!   over again out of order, as Lambda may, records repeated in a batch,
//!   invocations that commit after their retry started), over four virtual
//!   stream shards whose aggregators meet in the proxy's conflict model,
//!   with chunks of two reels so that a crash lands between the
//!   transactions of one batch: still exactly once.
//! * Rows written by transactional mode are not counted again after a
//!   switch to stream mode, and removals recorded before `STREAM_SINCE_MS`
//!   are not subtracted again.

mod common;

use common::{TestStack, drained};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const STREAM: &[(&str, &str)] = &[
    ("COUNTING", "stream"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("AUTO_RESHARD", "off"),
];

/// A like or unlike, retried by the client on 429/503 like a real app.
async fn act(
    t: &TestStack,
    user: &str,
    reel: &str,
    like: bool,
    key: Option<&str>,
) -> common::Reply {
    let path = format!("/reels/{reel}/like");
    let method = if like { "PUT" } else { "DELETE" };
    let headers: Vec<(&str, &str)> = key.map(|k| ("idempotency-key", k)).into_iter().collect();
    for _ in 0..50 {
        let r = t.send(method, &path, Some(user), &headers, None).await;
        if r.status != 429 && r.status != 503 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{method} {path} as {user}: still refused after 50 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_mode_counts_every_like_once_with_the_same_contract() {
    let t = TestStack::start(STREAM).await;
    assert_eq!(
        t.stack.streams.len(),
        1,
        "one event source, from template.yaml"
    );

    // The tapper's own like shows in the answer at once, and a double tap
    // changes nothing.
    let first = act(&t, "fan-0", "viral", true, None).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(
        (
            first.body["liked"].as_bool(),
            first.body["changed"].as_bool()
        ),
        (Some(true), Some(true))
    );
    assert_eq!(first.body["count"], 1, "the answer holds the own like");
    let again = act(&t, "fan-0", "viral", true, None).await;
    assert_eq!(again.body["changed"], false);
    assert!(again.body["count"].as_i64() >= Some(1), "never falls back");

    // Many users at once; every answer counts at least the own like, and
    // one instance's answers never fall while only likes happen.
    let answers: Vec<i64> = futures::future::join_all((1..40).map(|u| {
        let t = &t;
        async move {
            let r = act(t, &format!("fan-{u}"), "viral", true, None).await;
            assert_eq!((r.status, r.body["changed"].as_bool()), (200, Some(true)));
            r.body["count"].as_i64().unwrap()
        }
    }))
    .await;
    assert!(answers.iter().all(|c| *c >= 1));
    // One after another, each tapper's answer holds their like and never
    // falls below the one before (likes only), while the stream lags.
    let mut last = 0;
    for u in 0..15 {
        let r = act(&t, &format!("seq-{u}"), "steady", true, None).await;
        let c = r.body["count"].as_i64().unwrap();
        assert!(
            c > last,
            "answer {c} after {last}: each like lands, none falls back"
        );
        last = c;
        let read = t.http_count("steady").await;
        assert!(
            read >= last,
            "a read right after answers {read}, the like said {last}"
        );
    }

    // Idempotency-Key: a retry of a key answers as the first did, also
    // after the user unliked since; the unlike is counted once.
    let keyed = act(&t, "keyed", "viral", true, Some("k-like")).await;
    assert_eq!(keyed.body["changed"], true);
    // Past CACHE_TTL_MS (2 s): the unlike sums afresh, with or without the
    // like the stream carries, and its answer drops the like all the same.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let unlike = act(&t, "keyed", "viral", false, Some("k-unlike")).await;
    assert_eq!(unlike.body["changed"], true);
    assert_eq!(
        unlike.body["count"].as_i64(),
        keyed.body["count"].as_i64().map(|c| c - 1),
        "the unlike's answer holds the own like no longer"
    );
    let late = act(&t, "keyed", "viral", true, Some("k-like")).await;
    assert_eq!(
        (late.body["changed"].as_bool(), late.body["liked"].as_bool()),
        (Some(true), Some(true)),
        "the key's answer, not a new like"
    );
    let unliked_again = act(&t, "keyed", "viral", false, Some("k-unlike")).await;
    assert_eq!(unliked_again.body["changed"], true);
    // An unlike of a non-like changes nothing.
    let none = act(&t, "nobody", "viral", false, None).await;
    assert_eq!(none.body["changed"], false);

    drained(&t, Duration::from_secs(30)).await;
    assert_eq!(t.like_rows("steady").await, 15);
    let rows = t.like_rows("viral").await as i64;
    assert_eq!(rows, 40, "fan-0..fan-39; keyed unliked");
    assert_eq!(
        t.shard_sum("viral").await,
        rows,
        "the shards hold every row once"
    );
    // The like path wrote no shard: the only writer of shard items is the
    // aggregator, whose checkpoint names the stream shard.
    let checkpoints = t.scan_prefix("agg#").await;
    assert_eq!(checkpoints.len(), 1, "one stream shard, one checkpoint");
    // Reads show the truth once the cache and the own-change promise
    // (STREAM_VISIBLE_MS) have run out.
    let started = Instant::now();
    loop {
        let c = t.http_count("viral").await;
        if c == rows {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "reads still answer {c}, not {rows}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_like_counts_once_under_stream_and_aggregator_faults() {
    let mut env = STREAM.to_vec();
    env.extend([
        // The aggregator's transactions lose answers after committing,
        // conflict and are throttled; the Streams API calls are throttled
        // and slowed too; the like path is left alone (its faults are
        // faults.rs's).
        (
            "FAULTS",
            "seed=11,TransactWriteItems.lost=0.15,TransactWriteItems.conflict=0.3,\
             TransactWriteItems.throttle=0.1,GetRecords.throttle=0.1,GetRecords.latency=0.2,\
             max_latency_ms=20,stall_ms=600,conflict_hold_ms=60",
        ),
        (
            "LOCAL_STREAM_FAULTS",
            "seed=5,redeliver=0.5,lost=0.3,reorder=0.7,duplicate=0.3,late_commit=0.2,\
             final_window=0.3",
        ),
        // Four virtual stream shards: four aggregators at once on the same
        // reels, their transactions meeting in the proxy's conflict model.
        ("LOCAL_STREAM_SHARDS", "4"),
        // Two reels a transaction: a batch is several transactions, and a
        // lost invocation answer lands between them.
        ("AGGREGATE_CHUNK_REELS", "2"),
        // Few attempts per transaction: some chunks give up, and the batch
        // is handed back from there after the chunks before it committed.
        ("TX_MAX_ATTEMPTS", "3"),
        ("DDB_ATTEMPT_TIMEOUT_MS", "400"),
        ("DDB_OPERATION_TIMEOUT_MS", "2000"),
        ("CACHE_TTL_MS", "0"),
    ]);
    let t = TestStack::start(&env).await;
    let reels: Vec<String> = (0..8).map(|i| format!("hot{i}")).collect();
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    let stats = &t.stack.streams[0].stats;
    let seen = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let proxy = t.stack.proxy.as_ref().expect("FAULTS starts the proxy");
    // Transactions the conflict model refused: another transaction held
    // an item. Stream shards write items of their own, so it is a stream
    // shard's own invocations overlapping (a late commit, a batch handed
    // over again while the first still runs) on its checkpoint; the hold
    // (60 ms) makes that likely, below the SDK's attempt timeout.
    let modeled = || {
        let m = proxy.stats().modeled_conflicts;
        m.refused.values().sum::<u64>() + m.in_progress
    };
    // Every fault class of the event source, and the conflict model.
    let struck = || {
        [
            seen(&stats.redelivered),
            seen(&stats.lost),
            seen(&stats.reordered),
            seen(&stats.duplicated),
            seen(&stats.final_windows),
            seen(&stats.late_commits),
            modeled(),
        ]
    };
    // Waves of likes and some unlikes on eight reels: three, and more
    // (up to twelve) until every fault above has struck at least once.
    // The event source's faults strike per invocation, and how many
    // invocations three waves make depends on how busy the machine is (a
    // loaded one batches more records per invocation): 16 invocations
    // once drew no redelivery at all.
    for wave in 0..12 {
        if wave >= 3 && struck().iter().all(|n| *n > 0) {
            break;
        }
        futures::future::join_all((0..24).map(|u| {
            let (t, reels) = (&t, &reels);
            async move {
                let reel = &reels[(u + wave) % reels.len()];
                let user = format!("w{wave}-u{u}");
                let r = act(t, &user, reel, true, None).await;
                assert_eq!(r.status, 200, "{:?}", r.body);
                if u % 5 == 0 {
                    let r = act(t, &user, reel, false, Some(&format!("unlike-{user}"))).await;
                    assert_eq!(r.body["changed"], true);
                }
            }
        }))
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for reel in &reels {
        want.insert(reel.clone(), t.like_rows(reel).await as i64);
    }
    drained(&t, Duration::from_secs(120)).await;
    let mut got = BTreeMap::new();
    for reel in &reels {
        got.insert(reel.clone(), t.shard_sum(reel).await);
    }
    eprintln!(
        "event source: invocations {}, delivered {}, retries {}, bisections {}, partial {}, discarded {}; \
         redelivered, lost, reordered, duplicated, final windows, late commits, modeled conflicts: {:?}",
        seen(&stats.invocations),
        seen(&stats.delivered),
        seen(&stats.retries),
        seen(&stats.bisections),
        seen(&stats.partial),
        seen(&stats.discarded),
        struck(),
    );
    assert_eq!(stats.discarded(), 0, "no batch ran out of retries");
    assert_eq!(got, want, "shard sums equal the like rows once drained");
    // The windowed counts ride on the same transactions: every like and
    // unlike of the run, made within the hour, is in each window once.
    for reel in &reels {
        let n = want[reel];
        assert_eq!(t.like_windows(reel).await, [n, n, n], "{reel}");
    }
    // Each class struck: the counts above were made under all of them.
    let [
        redelivered,
        lost,
        reordered,
        duplicated,
        final_windows,
        late_commits,
        conflicts,
    ] = struck();
    assert!(redelivered > 0, "some batches were delivered twice");
    assert!(lost > 0, "some invocations lost their answer");
    assert!(
        reordered > 0,
        "some batches were handed over again out of order"
    );
    assert!(duplicated > 0, "some batches carried a record twice");
    assert!(
        final_windows > 0,
        "some windows ended with an empty final invoke"
    );
    assert!(
        late_commits > 0,
        "some timed-out invocations committed after their retry started"
    );
    assert!(
        conflicts > 0,
        "the conflict model refused some transactions of a stream shard's overlapping invocations"
    );
    assert_eq!(
        seen(&stats.bisections),
        0,
        "the template never bisects: halves could come out of order"
    );
    let proxy = proxy.stats();
    eprintln!("modeled conflicts: {:?}", proxy.modeled_conflicts);
    assert!(
        proxy.injected_of("lost_dropped") + proxy.injected_of("lost_stalled") > 0
            && proxy.injected_of("conflict") > 0,
        "{proxy:?}"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_counted_by_their_transactions_are_not_counted_again() {
    let dir = std::env::temp_dir().join(format!("likes-switch-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("db.sqlite");
    let file_str = file.to_string_lossy().into_owned();
    // Transactional mode: five likes, one unlike, counted by transactions.
    let t = TestStack::start_on_file(&file, &[("LOCAL_SCHEDULE_SECS", "0")]).await;
    for u in 0..5 {
        assert_eq!(
            act(&t, &format!("old{u}"), "switched", true, None)
                .await
                .body["changed"],
            true
        );
    }
    assert_eq!(
        act(&t, "old0", "switched", false, None).await.body["changed"],
        true
    );
    assert_eq!(t.shard_sum("switched").await, 4);
    t.stop().await;
    // The switch: writes paused (here: none in flight), then stream mode
    // from now on.
    // The boundary: the next whole second (stream records are stamped
    // rounded down to the second); writes resume after it.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let since_ms = (now_ms / 1000 + 1) * 1000;
    tokio::time::sleep(Duration::from_millis(since_ms - now_ms + 50)).await;
    let since = since_ms.to_string();
    let mut env = STREAM.to_vec();
    env.push(("STREAM_SINCE_MS", &since));
    let t = TestStack::start_on_file(&file, &env).await;
    // The event source starts from the stream's oldest record: the old
    // inserts carry no stream mark and the old removal is before the
    // switch, so neither changes the count; new likes and an unlike of an
    // old row do.
    assert_eq!(
        act(&t, "new0", "switched", true, None).await.body["changed"],
        true
    );
    assert_eq!(
        act(&t, "old1", "switched", false, None).await.body["changed"],
        true
    );
    drained(&t, Duration::from_secs(30)).await;
    assert_eq!(t.like_rows("switched").await, 4);
    assert_eq!(t.shard_sum("switched").await, 4);
    t.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    drop(file_str);
}

/// Stream mode with a settle time of 2 s standing in for the event
/// source's record age (the test makes sure its records in flight land
/// within it), and short request bounds, so that a run's cut is near.
fn scaled_reconcile_env() -> Vec<(&'static str, &'static str)> {
    let mut env = STREAM.to_vec();
    env.extend([
        ("RECONCILE_STREAM_SETTLE_SECS", "2"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("DDB_OPERATION_TIMEOUT_MS", "900"),
        ("RECONCILE_CLOCK_SKEW_MS", "0"),
    ]);
    env
}

/// One reconciliation invocation (`mode`, and a deadline `within` from
/// now if given), its summary.
async fn reconcile(t: &TestStack, mode: &str, within: Option<Duration>) -> serde_json::Value {
    likes::triggers::handle_reconcile_event(
        &t.stack.app,
        &serde_json::json!({ "mode": mode }),
        within.map(|d| std::time::Instant::now() + d),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_never_compares_a_reel_while_records_can_be_in_flight() {
    let t = TestStack::start(&scaled_reconcile_env()).await;
    // Records in flight: the aggregator is held back, so the rows hold five
    // likes and the shards none.
    let source = &t.stack.streams[0];
    source.pause(true);
    for u in 0..5 {
        assert_eq!(
            act(&t, &format!("u{u}"), "late", true, None).await.body["changed"],
            true
        );
    }
    assert_eq!(
        (t.like_rows("late").await, t.shard_sum("late").await),
        (5, 0)
    );
    // An invocation that cannot wait out the settle time counts the rows,
    // then stops before comparing anything: it corrects nothing and says
    // when the run may go on. (The old rule compared at once and deferred
    // "settling" drift, here 5, to a later sighting.)
    let first = reconcile(&t, "start", Some(Duration::from_millis(1_500))).await;
    assert_eq!(first["complete"], false, "{first}");
    assert_eq!(first["phase"], "scan_counters", "{first}");
    assert_eq!(first["reels_checked"], 0, "{first}");
    assert_eq!(first["reels_corrected"], 0, "{first}");
    let ready = first["stream_ready_at_ms"].as_i64().expect("a ready time");
    assert!(
        first["cut_ms"].as_i64().is_some_and(|c| c < ready),
        "{first}"
    );
    assert_eq!(t.shard_sum("late").await, 0);
    // The records land within the bound, as Lambda's record age enforces.
    source.pause(false);
    drained(&t, Duration::from_secs(30)).await;
    assert_eq!(t.shard_sum("late").await, 5);
    // The continuation resumes the run, waits out the rest, and finds the
    // reel exact: the rows that were in flight were never "corrected".
    let resumed = reconcile(&t, "resume", None).await;
    assert_eq!(resumed["complete"], true, "{resumed}");
    assert_eq!(resumed["reels_corrected"], 0, "{resumed}");
    assert_eq!(resumed["reels_deferred"], 0, "{resumed}");
    assert_eq!(t.shard_sum("late").await, 5);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_repairs_a_reel_that_keeps_being_liked() {
    let t = TestStack::start(&scaled_reconcile_env()).await;
    for u in 0..10 {
        for reel in ["busy", "fickle", "calm"] {
            act(&t, &format!("early{u}"), reel, true, None).await;
        }
    }
    drained(&t, Duration::from_secs(30)).await;
    assert_eq!(t.shard_sum("busy").await, 10);
    // Drift, as a batch lost to OnFailure would leave (or a hand edit).
    t.add_to_shard("busy", 0, 7).await;
    t.add_to_shard("fickle", 0, -3).await;
    t.add_to_shard("calm", 0, 2).await;
    // An unlike just before the run: after its cut, before its scan, so
    // the scan cannot count that row as it was at the cut.
    assert_eq!(
        act(&t, "early0", "fickle", false, None).await.body["changed"],
        true
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A like every few hundred milliseconds (the scaled clock's "every
    // few seconds") on the busy reel all through the run.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let liker = {
        let (stop, base) = (stop.clone(), t.stack.base_url.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = http
                    .put(format!("{base}/reels/busy/like"))
                    .header("x-user-id", format!("late{n}"))
                    .send()
                    .await
                    .expect("like");
                assert!(r.status().is_success(), "{}", r.status());
                n += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            n
        })
    };
    let run = {
        let app = t.stack.app.clone();
        tokio::spawn(async move {
            likes::triggers::handle_reconcile_event(
                &app,
                &serde_json::json!({"mode": "start"}),
                None,
            )
            .await
            .unwrap()
        })
    };
    // An unlike once the scan is over (the run waits out the settle time):
    // the scan counted the row, and the shards still hold it from before
    // the cut, so it stops nothing.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(
        act(&t, "early0", "calm", false, None).await.body["changed"],
        true
    );
    let summary = run.await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let liked_later = liker.await.unwrap();
    assert!(
        liked_later >= 5,
        "likes kept coming all through the run: {liked_later}"
    );
    assert_eq!(summary["complete"], true, "{summary}");
    let names = |key: &str| -> Vec<String> {
        let mut v: Vec<String> = summary[key]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect();
        v.sort();
        v
    };
    // Corrected by this one run although likes landed all through it; the
    // reel unliked between the cut and the scan waits for another run.
    assert_eq!(names("corrected_reels"), ["busy", "calm"], "{summary}");
    assert_eq!(names("deferred_reels"), ["fickle"], "{summary}");
    assert_eq!(summary["total_abs_drift"], 7 + 2, "{summary}");
    // Rows liked from the cut on were left out of the count.
    assert!(summary["rows_after_cut"].as_u64() > Some(0), "{summary}");
    drained(&t, Duration::from_secs(30)).await;
    assert_eq!(t.like_rows("busy").await, 10 + liked_later);
    for reel in ["busy", "calm"] {
        assert_eq!(
            t.shard_sum(reel).await,
            t.like_rows(reel).await as i64,
            "{reel} repaired exactly"
        );
    }
    assert_eq!(t.shard_sum("fickle").await, 9 - 3, "left as it was");
    // A run whose cut is after that unlike repairs that one too.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let next = reconcile(&t, "start", None).await;
    assert_eq!(next["reels_corrected"], 1, "{next}");
    for reel in ["busy", "calm", "fickle"] {
        assert_eq!(
            t.shard_sum(reel).await,
            t.like_rows(reel).await as i64,
            "{reel}"
        );
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stopped_between_its_transactions_is_finished_once() {
    let mut env = STREAM.to_vec();
    env.extend([
        // Two write units a second per key: a stream shard's checkpoint
        // takes one chunk a second, so the second chunk of a batch is
        // throttled until its retries give up, after the first committed.
        ("FAULTS", "seed=3,write_cap=2"),
        ("AGGREGATE_CHUNK_REELS", "1"),
        ("TX_MAX_ATTEMPTS", "2"),
        ("RETRY_BASE_MS", "5"),
        ("RETRY_MAX_MS", "20"),
    ]);
    let t = TestStack::start(&env).await;
    let source = &t.stack.streams[0];
    source.pause(true);
    // Two reels, one chunk each: the first commits, the second is
    // throttled on the checkpoint key until the next second.
    for r in 0..2 {
        assert_eq!(
            act(&t, "one-fan", &format!("split{r}"), true, None)
                .await
                .body["changed"],
            true
        );
    }
    source.pause(false);
    drained(&t, Duration::from_secs(60)).await;
    let stats = &source.stats;
    assert_eq!(stats.discarded(), 0, "no batch ran out of retries");
    for r in 0..2 {
        assert_eq!(t.shard_sum(&format!("split{r}")).await, 1, "split{r}");
    }
    assert!(
        stats.partial.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "a batch was handed back after its first transaction"
    );
    t.stop().await;
}
