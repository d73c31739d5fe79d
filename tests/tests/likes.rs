//! Exactly-once likes and unlikes, through the HTTP API of the local stack
//! (real handlers, real SDK, embedded dynoxide): concurrent likes from
//! distinct users count exactly; double taps and Idempotency-Key retries
//! count once; like → unlike → like is never swallowed; unlikes of
//! non-likes change nothing; and every write path (applied, replayed,
//! already-in-state, resolved by the key's record, resolved by the like
//! row, including resizes between a request and its retry) is taken and
//! counted once; a late retry of a key never undoes a later like or unlike;
//! a write without identity is 401; answered counts follow the caller's own
//! changes with the cache on, and stay exact under concurrent likes and
//! reads.

mod common;

use common::TestStack;
use futures::StreamExt;
use likes::keys::{Action, ReelId, UserId};
use likes::service::{WritePath, WriteRequest};
use likes::token::{LOCAL_SHARD_KEY, RequestIdentity, RequestToken, ShardKey};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_likes_from_distinct_users_count_exactly() {
    let t = TestStack::uncached().await;
    t.set_shards("viral", 10, 10).await;
    let users = 400;
    let replies: Vec<_> = futures::stream::iter(0..users)
        .map(|i| {
            let t = &t;
            async move { t.like(&format!("fan-{i}"), "viral").await }
        })
        .buffer_unordered(48)
        .collect()
        .await;
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["changed"], true);
        assert_eq!(r.body["liked"], true);
    }
    assert_eq!(t.like_rows("viral").await, users);
    assert_eq!(t.shard_sum("viral").await, users as i64);
    assert_eq!(t.http_count("viral").await, users as i64);
    // The writes went to the write shards, and to more than one of them.
    let shards = t.shards("viral").await;
    assert!(shards.iter().all(|(s, _)| *s < 10), "{shards:?}");
    assert!(shards.len() > 5, "{shards:?}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_taps_count_once() {
    let t = TestStack::uncached().await;
    t.set_shards("reel-1", 4, 4).await;
    let replies: Vec<_> = futures::stream::iter(0..8)
        .map(|_| t.like("tapper", "reel-1"))
        .buffer_unordered(8)
        .collect()
        .await;
    assert!(
        replies
            .iter()
            .all(|r| r.status == 200 && r.body["liked"] == true)
    );
    let changed = replies.iter().filter(|r| r.body["changed"] == true).count();
    assert_eq!(changed, 1, "exactly one of the taps changed the state");
    assert_eq!(t.like_rows("reel-1").await, 1);
    assert_eq!(t.shard_sum("reel-1").await, 1);
    assert_eq!(t.http_count("reel-1").await, 1);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_retries_count_once_and_answer_like_the_original() {
    let t = TestStack::uncached().await;
    for _ in 0..3 {
        let r = t.like_with_key("u1", "reel-2", "tap-1").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["liked"], true);
        assert_eq!(
            r.body["changed"], true,
            "a retry answers what the original did"
        );
        assert_eq!(r.body["count"], 1);
    }
    assert_eq!(t.shard_sum("reel-2").await, 1);
    assert_eq!(t.like_rows("reel-2").await, 1);
    // Without the key, a repeat is a new request: already liked.
    let r = t.like("u1", "reel-2").await;
    assert_eq!(r.body["changed"], false);
    assert_eq!(t.shard_sum("reel-2").await, 1);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn like_unlike_like_is_never_swallowed() {
    let t = TestStack::uncached().await;
    let steps = [
        ("PUT", true, 1),
        ("DELETE", false, 0),
        ("PUT", true, 1),
        ("DELETE", false, 0),
        ("PUT", true, 1),
    ];
    for (method, liked, count) in steps {
        let r = t
            .send(method, "/reels/reel-3/like", Some("u7"), &[], None)
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["liked"], liked);
        assert_eq!(r.body["changed"], true, "{method} must change the state");
        assert_eq!(r.body["count"], count);
        assert_eq!(t.shard_sum("reel-3").await, count);
        assert_eq!(t.like_rows("reel-3").await as i64, count);
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlike_of_a_non_like_changes_nothing() {
    let t = TestStack::uncached().await;
    t.like("someone-else", "reel-4").await;
    let r = t.unlike("u9", "reel-4").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["liked"], false);
    assert_eq!(r.body["changed"], false);
    assert_eq!(r.body["count"], 1);
    assert_eq!(t.shard_sum("reel-4").await, 1, "no -1 was written anywhere");
    assert_eq!(t.like_rows("reel-4").await, 1);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_without_identity_are_refused_and_write_nothing() {
    let t = TestStack::uncached().await;
    for method in ["PUT", "DELETE"] {
        let r = t.send(method, "/reels/reel-5/like", None, &[], None).await;
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.body["error"]["code"], "unauthorized");
    }
    assert_eq!(t.like_rows("reel-5").await, 0);
    assert!(t.shards("reel-5").await.is_empty());
    t.stop().await;
}

fn write(
    user: &str,
    reel: &str,
    action: Action,
    key: Option<&str>,
    request_id: &str,
) -> WriteRequest {
    WriteRequest {
        user: UserId::parse(user).unwrap(),
        reel: ReelId::parse(reel).unwrap(),
        action,
        idempotency_key: key.map(str::to_owned),
        request_id: Some(request_id.to_owned()),
    }
}

/// The service's write paths, each taken for real against the emulator's
/// ClientRequestToken handling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_path_counts_once() {
    let t = TestStack::uncached().await;
    let svc = &t.stack.app.service;

    // Applied, then a client retry with the same key: the retry is a new
    // request with its own clock (the shard's `updated_at`), so DynamoDB
    // answers IdempotentParameterMismatch and the key's record answers.
    let first = svc
        .write(write("u1", "paths", Action::Like, None, "req-1"))
        .await
        .unwrap();
    assert_eq!((first.path, first.changed), (WritePath::Applied, true));
    let un = svc
        .write(write("u1", "paths", Action::Unlike, Some("k-un"), "req-2"))
        .await
        .unwrap();
    assert_eq!((un.path, un.changed), (WritePath::Applied, true));
    let replay = svc
        .write(write("u1", "paths", Action::Unlike, Some("k-un"), "req-3"))
        .await
        .unwrap();
    assert_eq!(
        (replay.path, replay.changed, replay.liked),
        (WritePath::ResolvedByRecord, true, false)
    );
    assert_eq!(t.shard_sum("paths").await, 0);
    // A byte-identical resend of one attempt (what the SDK's own retries
    // send): DynamoDB replays the success without writing again.
    let store = t.stack.app.service.store();
    let tx = likes::store::LikeTx {
        user: UserId::parse("u9").unwrap(),
        reel: ReelId::parse("paths").unwrap(),
        action: Action::Like,
        token: RequestToken::for_fields("test", &["resend"]),
        shard: Some(0),
        now_ms: 1,
        record: None,
    };
    use likes::store::{CounterStore, TxResult};
    assert_eq!(
        store.write_like(&tx).await.unwrap(),
        TxResult::Committed { replayed: false }
    );
    assert_eq!(
        store.write_like(&tx).await.unwrap(),
        TxResult::Committed { replayed: true }
    );
    assert_eq!(t.shard_sum("paths").await, 1);
    assert_eq!(
        store
            .write_like(&likes::store::LikeTx {
                action: Action::Unlike,
                token: RequestToken::for_fields("test", &["resend-un"]),
                ..tx
            })
            .await
            .unwrap(),
        TxResult::Committed { replayed: false }
    );
    assert_eq!(t.shard_sum("paths").await, 0);

    // A retried like with the same key carries a new liked_at, so DynamoDB
    // answers IdempotentParameterMismatch; the key's record (written with
    // the change) answers for it: no second count.
    let a = svc
        .write(write("u2", "paths", Action::Like, Some("k-like"), "req-4"))
        .await
        .unwrap();
    assert_eq!(a.path, WritePath::Applied);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let b = svc
        .write(write("u2", "paths", Action::Like, Some("k-like"), "req-5"))
        .await
        .unwrap();
    assert_eq!(
        (b.path, b.changed, b.liked),
        (WritePath::ResolvedByRecord, true, true)
    );
    assert_eq!(t.shard_sum("paths").await, 1);

    // A resize between an unlike and its retry moves the retry's shard, so
    // the retried request differs from the first: a mismatch again, answered
    // from the record. Pick a key whose shard moves.
    let (user, reel) = (
        UserId::parse("u2").unwrap(),
        ReelId::parse("paths").unwrap(),
    );
    let key = (0..)
        .map(|i| format!("k-un-{i}"))
        .find(|k| {
            // The local stack's shard key (no SHARD_KEY set).
            let tok =
                RequestToken::derive(&user, &reel, Action::Unlike, &RequestIdentity::ClientKey(k));
            ShardKey::new(LOCAL_SHARD_KEY).shard(&tok, 50) != 0
        })
        .unwrap();
    let c = svc
        .write(write("u2", "paths", Action::Unlike, Some(&key), "req-6"))
        .await
        .unwrap();
    assert_eq!((c.path, c.shard), (WritePath::Applied, Some(0)));
    t.set_shards("paths", 50, 50).await;
    let d = svc
        .write(write("u2", "paths", Action::Unlike, Some(&key), "req-7"))
        .await
        .unwrap();
    assert_eq!((d.path, d.changed), (WritePath::ResolvedByRecord, true));
    assert_eq!(t.shard_sum("paths").await, 0);
    assert_eq!(t.like_rows("paths").await, 0);

    // Without a key: the same request (same request id) delivered again is
    // never re-applied. An unlike carries no timestamp, so without a resize
    // the second delivery is a replay; with its shard moved, DynamoDB says
    // IdempotentParameterMismatch and the like row answers.
    let u4 = UserId::parse("u4").unwrap();
    let id = (0..)
        .map(|i| format!("req-8-{i}"))
        .find(|id| {
            let tok =
                RequestToken::derive(&u4, &reel, Action::Unlike, &RequestIdentity::RequestId(id));
            let key = ShardKey::new(LOCAL_SHARD_KEY);
            key.shard(&tok, 50) != key.shard(&tok, 7)
        })
        .unwrap();
    t.set_shards("paths", 7, 7).await;
    svc.write(write("u4", "paths", Action::Like, None, "req-8"))
        .await
        .unwrap();
    let e = svc
        .write(write("u4", "paths", Action::Unlike, None, &id))
        .await
        .unwrap();
    assert_eq!(e.path, WritePath::Applied);
    svc.write(write("u4", "paths", Action::Like, None, "req-8b"))
        .await
        .unwrap();
    t.set_shards("paths", 50, 50).await;
    let f = svc
        .write(write("u4", "paths", Action::Unlike, None, &id))
        .await
        .unwrap();
    assert_eq!(
        (f.path, f.liked, f.changed),
        (WritePath::ResolvedByRow, false, true)
    );
    assert_eq!(t.like_rows("paths").await, 1, "the later like stands");
    assert_eq!(t.shard_sum("paths").await, 1);

    // Already in state.
    let g = svc
        .write(write("u3", "paths", Action::Unlike, None, "req-9"))
        .await
        .unwrap();
    assert_eq!((g.path, g.changed), (WritePath::AlreadyInState, false));
    assert_eq!(t.shard_sum("paths").await, 1);
    t.stop().await;
}

/// A retry of a key has no further effect even after the user changed
/// state in between: it answers what the original did and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_of_a_key_never_undoes_a_later_action() {
    let t = TestStack::uncached().await;
    // like(K) → unlike → retry like(K): still unliked.
    let r = t.like_with_key("u1", "late", "K").await;
    assert_eq!(
        (r.body["changed"].as_bool(), r.body["count"].as_i64()),
        (Some(true), Some(1))
    );
    assert_eq!(t.unlike("u1", "late").await.body["changed"], true);
    let r = t.like_with_key("u1", "late", "K").await;
    assert_eq!(
        (
            r.status,
            r.body["liked"].as_bool(),
            r.body["changed"].as_bool()
        ),
        (200, Some(true), Some(true))
    );
    assert_eq!(r.body["count"], 0, "the count is today's");
    assert_eq!(
        (t.like_rows("late").await, t.shard_sum("late").await),
        (0, 0)
    );

    // A key whose original changed nothing keeps changing nothing:
    // like → like(K2) (already liked) → unlike → retry like(K2): still unliked.
    t.like("u2", "late").await;
    assert_eq!(
        t.like_with_key("u2", "late", "K2").await.body["changed"],
        false
    );
    t.unlike("u2", "late").await;
    let r = t.like_with_key("u2", "late", "K2").await;
    assert_eq!(r.body["changed"], false);
    assert_eq!(
        (t.like_rows("late").await, t.shard_sum("late").await),
        (0, 0)
    );

    // Same for unlike: like → unlike(K3) → like → retry unlike(K3): still liked.
    t.like("u3", "late").await;
    assert_eq!(
        t.send(
            "DELETE",
            "/reels/late/like",
            Some("u3"),
            &[("idempotency-key", "K3")],
            None
        )
        .await
        .body["changed"],
        true
    );
    t.like("u3", "late").await;
    let r = t
        .send(
            "DELETE",
            "/reels/late/like",
            Some("u3"),
            &[("idempotency-key", "K3")],
            None,
        )
        .await;
    assert_eq!(
        (r.body["liked"].as_bool(), r.body["changed"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!(
        (t.like_rows("late").await, t.shard_sum("late").await),
        (1, 1)
    );
    t.stop().await;
}

/// With the default cache on, the counts a like/unlike answers follow this
/// instance's own changes, and a retry does not add its change again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_counts_follow_own_changes_with_the_cache_on() {
    let t = TestStack::start(&[("CACHE_TTL_MS", "60000")]).await;
    t.like("other", "cached-writes").await;
    let mut counts = Vec::new();
    for method in ["PUT", "DELETE", "PUT", "DELETE", "PUT"] {
        let r = t
            .send(method, "/reels/cached-writes/like", Some("me"), &[], None)
            .await;
        counts.push(r.body["count"].as_i64().unwrap());
    }
    assert_eq!(counts, [2, 1, 2, 1, 2]);
    let r = t.like_with_key("you", "cached-writes", "k").await;
    assert_eq!(r.body["count"], 3);
    let r = t.like_with_key("you", "cached-writes", "k").await;
    assert_eq!(r.body["count"], 3, "a retry is not counted again");
    assert_eq!(
        t.like("me", "cached-writes").await.body["count"],
        3,
        "already liked: unchanged"
    );
    assert_eq!(t.http_count("cached-writes").await, 3);
    assert_eq!(t.shard_sum("cached-writes").await, 3);
    t.stop().await;
}

/// Many likes and reads of one reel at once on one instance, cache on: the
/// cached sum, adjusted for the instance's own writes while reads overlap
/// them, ends exactly at the truth (no change counted twice or missed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_own_writes_and_reads_keep_the_cached_sum_exact() {
    let t = TestStack::start(&[("CACHE_TTL_MS", "60000")]).await;
    t.set_shards("busy", 8, 8).await;
    let users = 200;
    let writes = futures::stream::iter(0..users)
        .map(|i| {
            let t = &t;
            async move {
                let r = t.like(&format!("fan-{i}"), "busy").await;
                assert_eq!(r.status, 200);
                if i % 4 == 0 {
                    let r = t.unlike(&format!("fan-{i}"), "busy").await;
                    assert_eq!(r.status, 200);
                }
            }
        })
        .buffer_unordered(24)
        .collect::<Vec<_>>();
    let reads = futures::stream::iter(0..200)
        .map(|_| t.send("GET", "/reels/busy/likes", None, &[], None))
        .buffer_unordered(8)
        .collect::<Vec<_>>();
    let (_, replies) = tokio::join!(writes, reads);
    assert!(replies.iter().all(|r| r.status == 200));
    let truth = t.shard_sum("busy").await;
    assert_eq!(truth, 150);
    assert_eq!(t.http_count("busy").await, truth, "the cached sum is exact");
    t.stop().await;
}
