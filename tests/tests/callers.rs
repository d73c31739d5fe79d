//! What one valid account can make the like path spend (issue 22): each
//! like or unlike costs 4–6 write units, so a caller toggling as fast as it
//! can, or liking made-up reel ids one after another, would spend the
//! table's throughput and grow what reconciliation walks. Its writes are
//! bounded per function instance, and a refused write reads and writes
//! nothing: the fault proxy counts the write units that reached DynamoDB.

mod common;

use common::TestStack;

/// The stack with the proxy in between (a cap nothing meets) to count
/// write units.
async fn stack(extra: &[(&str, &str)]) -> TestStack {
    let mut env = vec![("FAULTS", "write_cap=1000000")];
    env.extend_from_slice(extra);
    TestStack::start(&env).await
}

/// Write units the proxy counted for what the callers caused: all but
/// the like function's trending sketch puts (`top#likes#…`, transactional
/// mode), which an instance makes at most once per 10 s whatever its
/// callers do (docs/windows.md).
fn write_units(t: &TestStack) -> f64 {
    t.stack
        .proxy
        .as_ref()
        .expect("FAULTS")
        .key_loads()
        .iter()
        .filter(|l| !l.partition.contains("/top#"))
        .map(|l| l.write_units)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_toggling_one_reel_is_refused_past_its_bound() {
    let t = stack(&[]).await;
    let before = write_units(&t);
    let mut statuses = Vec::new();
    for i in 0..100 {
        let r = if i % 2 == 0 {
            t.like("toggler", "target").await
        } else {
            t.unlike("toggler", "target").await
        };
        if r.status == 429 {
            assert_eq!(r.body["error"]["code"], "rate_limited", "{}", r.body);
            let wait: u32 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=60).contains(&wait), "{wait}");
        }
        statuses.push(r.status);
    }
    // REEL_TOGGLES_PER_MIN (10) went through; before, all 100 did
    // (400 write units).
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 90);
    // Ten writes, and the reel's registration among the known reels
    // (once: `likes::known`).
    let spent = write_units(&t) - before;
    assert!(spent <= 10.0 * 4.0 + 1.0, "write units: {spent}");
    // Nothing refused was applied: ten toggles, like and unlike, net zero.
    assert_eq!(t.shard_sum("target").await, 0);
    assert_eq!(t.like_rows("target").await, 0);
    // Another caller is not affected.
    assert_eq!(t.like("bystander", "target").await.status, 200);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_liking_made_up_reels_is_bounded_per_second_and_hour() {
    let t = stack(&[("USER_REELS_PER_HOUR", "30")]).await;
    let before = write_units(&t);
    let mut ok = 0;
    for i in 0..60 {
        let r = t.like("spammer", &format!("made-up-{i}")).await;
        ok += usize::from(r.status == 200);
        if r.status != 200 {
            assert_eq!(
                (r.status, r.body["error"]["code"].as_str()),
                (429, Some("rate_limited"))
            );
        }
    }
    // The burst (USER_WRITE_BURST, 20) and what the rate (5 a second)
    // refilled meanwhile; before, all 60 (240 write units, 60 reels).
    assert!((20..=30).contains(&ok), "{ok} accepted");
    // Each like of a new reel also registers it among the known reels.
    assert!(write_units(&t) - before <= ok as f64 * 5.0);
    // The hour's distinct reels: once 30 are written, a new one waits for
    // the hour, one already written does not.
    let mut written = ok;
    for i in 100.. {
        if written == 30 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if t.like("spammer", &format!("made-up-{i}")).await.status == 200 {
            written += 1;
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let r = t.like("spammer", "one-more").await;
    assert_eq!(r.body["error"]["code"], "rate_limited", "{}", r.body);
    let wait: u32 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(wait > 60, "until the hour is over: {wait}");
    assert_eq!(t.unlike("spammer", "made-up-0").await.status, 200);
    t.stop().await;
}

/// Erasure in `mode`: a user's likes on three reels (one of them with an
/// `Idempotency-Key`) and another user's like; the erasure removes the
/// first user's rows and counts each down once, and a repeat changes
/// nothing.
async fn erasure_in(mode: &str) {
    let t = TestStack::start(&[("COUNTING", mode), ("CACHE_TTL_MS", "0")]).await;
    for reel in ["e1", "e2"] {
        assert_eq!(t.like("leaving", reel).await.status, 200);
    }
    assert_eq!(t.like_with_key("leaving", "e3", "k-1").await.status, 200);
    assert_eq!(t.like("staying", "e1").await.status, 200);
    let settled = |want: [i64; 3]| {
        let t = &t;
        async move {
            for _ in 0..100 {
                let got = [
                    t.shard_sum("e1").await,
                    t.shard_sum("e2").await,
                    t.shard_sum("e3").await,
                ];
                if got == want {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            panic!("shards never reached {want:?}");
        }
    };
    settled([2, 1, 1]).await;
    // A call out of time removes nothing and says so; the next goes on.
    let user = likes::keys::UserId::parse("leaving").unwrap();
    let out = t
        .stack
        .app
        .service
        .erase(&user, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!((out.removed, out.complete), (0, false));
    let erase = || t.send("DELETE", "/admin/users/leaving/likes", None, &[], None);
    let r = erase().await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["removed"].as_i64(), r.body["complete"].as_bool()),
        (Some(3), Some(true)),
        "{}",
        r.body
    );
    // Rows gone, each count down once; the other user's like stays.
    for reel in ["e1", "e2", "e3"] {
        let rows = t.like_rows(reel).await;
        assert_eq!(rows, usize::from(reel == "e1"), "{reel}");
    }
    settled([1, 0, 0]).await;
    // Again: nothing left, nothing changes.
    let r = erase().await;
    assert_eq!(
        (r.body["removed"].as_i64(), r.body["complete"].as_bool()),
        (Some(0), Some(true))
    );
    settled([1, 0, 0]).await;
    assert_eq!(t.http_count("e1").await, 1);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_removes_every_like_of_a_user_once_transactional() {
    erasure_in("transactional").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_removes_every_like_of_a_user_once_stream() {
    erasure_in("stream").await;
}

/// Erasure with the proxy losing answers after committing, throttling,
/// cancelling transactions and failing requests (issue 22, point 7: "safe
/// to retry"): the operator calls again until an answer says `complete`,
/// and every row is gone with each count taken down exactly once.
async fn erasure_under_faults_in(mode: &str) {
    let mut env = vec![
        ("COUNTING", mode),
        ("CACHE_TTL_MS", "0"),
        ("FAULTS", "write_cap=1000000"),
    ];
    env.extend_from_slice(&common::UNBOUNDED_CALLERS);
    let t = TestStack::start(&env).await;
    let reels: Vec<String> = (0..12).map(|i| format!("f{i}")).collect();
    for (i, reel) in reels.iter().enumerate() {
        assert_eq!(t.like("leaving", reel).await.status, 200);
        if i % 2 == 0 {
            assert_eq!(t.like("staying", reel).await.status, 200);
        }
    }
    let want = |gone: bool| -> Vec<i64> {
        (0..reels.len())
            .map(|i| i64::from(i % 2 == 0) + i64::from(!gone))
            .collect()
    };
    let settled = |want: Vec<i64>| {
        let t = &t;
        let reels = &reels;
        async move {
            let mut got = Vec::new();
            for _ in 0..150 {
                got.clear();
                for r in reels {
                    got.push(t.shard_sum(r).await);
                }
                if got == want {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            panic!("shards at {got:?}, never reached {want:?}");
        }
    };
    settled(want(false)).await;
    let proxy = t.stack.proxy.clone().expect("FAULTS starts the proxy");
    proxy.set_faults(faultproxy::Faults::parse("seed=31,all=0.08").unwrap());
    let mut calls = 0;
    let mut failed = 0;
    loop {
        calls += 1;
        assert!(calls <= 100, "erasure never completed");
        let r = t
            .send("DELETE", "/admin/users/leaving/likes", None, &[], None)
            .await;
        if r.status == 200 && r.body["complete"] == serde_json::json!(true) {
            break;
        }
        // Whatever else it answered, the operator calls again.
        failed += u32::from(r.status != 200);
    }
    let stats = proxy.stats();
    proxy.set_faults(faultproxy::Faults::default());
    assert!(stats.failures_injected > 0, "no fault struck: {stats:?}");
    for (i, reel) in reels.iter().enumerate() {
        assert_eq!(t.like_rows(reel).await, usize::from(i % 2 == 0), "{reel}");
    }
    settled(want(true)).await;
    eprintln!("erasure under faults ({mode}): {calls} calls, {failed} failed");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_under_faults_is_exact_transactional() {
    erasure_under_faults_in("transactional").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_under_faults_is_exact_stream() {
    erasure_under_faults_in("stream").await;
}
