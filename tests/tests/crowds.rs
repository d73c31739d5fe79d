//! Growth follows real crowds only: through the local stack, with the fault
//! proxy's conflict model (a transaction that meets an item another one
//! holds is cancelled at that item, as DynamoDB does), one user flooding a
//! reel with parallel likes and unlikes grows nothing, while many users
//! liking one reel at once still grow it.

mod common;

use aws_sdk_dynamodb::types::AttributeValue;
use common::TestStack;
use std::time::Duration;

/// Transactional mode behind the conflict model: every transaction holds
/// its items 20 ms before its answer, so concurrent likes of one reel meet
/// on its shard, and one user's concurrent toggles on their own row.
const ENV: &[(&str, &str)] = &[
    ("COUNTING", "transactional"),
    ("FAULTS", "seed=4,conflict_hold_ms=20"),
    ("CONTENTION_GROW_EVENTS", "5"),
    // Enough attempts that every request goes through in the end.
    ("TX_MAX_ATTEMPTS", "20"),
    ("RETRY_BASE_MS", "5"),
    ("RETRY_MAX_MS", "40"),
    ("REQUEST_BUDGET_MS", "10000"),
    ("REQUEST_TIMEOUT_MS", "12000"),
];

/// The reel's settings as stored: (write shards, phase), `None` if it
/// never had any (one shard).
async fn settings(t: &TestStack, reel: &str) -> Option<(u32, String)> {
    let out = t
        .stack
        .client
        .get_item()
        .table_name(&t.stack.config.counters_table)
        .key("pk", AttributeValue::S(format!("reel#{reel}#settings")))
        .consistent_read(true)
        .send()
        .await
        .expect("get settings");
    let item = out.item?;
    let n = |k: &str| {
        item.get(k)
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    };
    let phase = item
        .get("phase")
        .and_then(|v| v.as_s().ok())
        .cloned()
        .unwrap_or_default();
    Some((n("target").max(n("write_shards")), phase))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_user_flooding_a_reel_grows_nothing_and_a_crowd_still_does() {
    let t = TestStack::start(ENV).await;
    // One user, 16 requests at a time, liking and unliking one reel (one
    // that had no like before): their transactions meet on their own row
    // and on the reel's one shard. Before, any five conflicts within 10 s
    // grew the reel ×4, and again, up to MAX_SHARDS.
    let mut refused = 0;
    for round in 0..12 {
        let replies = futures::future::join_all((0..16).map(|i| {
            let like = (round + i) % 2 == 0;
            let path = "/reels/lonely/like";
            let t = &t;
            async move {
                t.send(
                    if like { "PUT" } else { "DELETE" },
                    path,
                    Some("flooder"),
                    &[],
                    None,
                )
                .await
            }
        }))
        .await;
        for r in replies {
            assert!(r.status < 500, "{} {:?}", r.status, r.body);
            refused += usize::from(r.status == 429);
        }
    }
    let conflicts = t
        .stack
        .proxy
        .as_ref()
        .expect("FAULTS")
        .stats()
        .modeled_conflicts
        .total();
    assert!(
        conflicts >= 20,
        "the flood met itself: {conflicts} conflicts"
    );
    // A grow starts in the background: give it time to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        settings(&t, "lonely").await,
        None,
        "one user grew the reel ({refused} requests refused)"
    );
    // The count is still exact.
    assert_eq!(
        t.shard_sum("lonely").await,
        t.like_rows("lonely").await as i64
    );

    // A crowd: 64 users liking one reel, 16 at a time.
    for batch in 0..4 {
        futures::future::join_all((0..16).map(|i| {
            let user = format!("fan{batch}-{i}");
            let t = &t;
            async move {
                let r = t
                    .send("PUT", "/reels/viral/like", Some(&user), &[], None)
                    .await;
                assert!(r.status < 500, "{} {:?}", r.status, r.body);
            }
        }))
        .await;
    }
    let mut grown = None;
    for _ in 0..50 {
        grown = settings(&t, "viral").await;
        if grown.as_ref().is_some_and(|(shards, _)| *shards > 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        grown.as_ref().is_some_and(|(shards, _)| *shards > 1),
        "a crowd grows the reel: {grown:?}"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_ground_offline_do_not_pin_a_shard() {
    use likes::keys::{Action, ReelId, UserId};
    use likes::token::{RequestIdentity, RequestToken};
    let t = TestStack::start(&[("COUNTING", "transactional")]).await;
    t.set_shards("target", 8, 8).await;
    let reel = ReelId::parse("target").unwrap();
    // 32 callers, each grinding Idempotency-Keys until the token's own bits
    // (the shard before: all the client's fields) name shard 0 of 8.
    for u in 0..32 {
        let user = format!("bot{u}");
        let id = UserId::parse(&user).unwrap();
        let key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| {
                RequestToken::derive(&id, &reel, Action::Like, &RequestIdentity::ClientKey(k))
                    .shard(8)
                    == 0
            })
            .unwrap();
        let r = t.like_with_key(&user, "target", &key).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    // Keyed under the deployment's secret, they spread anyway (before: all
    // 32 on shard 0).
    let shards = t.shards("target").await;
    let used = shards.iter().filter(|(_, n)| *n > 0).count();
    assert!(used >= 5, "{shards:?}");
    assert_eq!(t.shard_sum("target").await, 32);
    t.stop().await;
}
