//! Reconciliation at scales and in conditions the other reconcile tests do
//! not reach, through the real store against embedded dynoxide (which
//! refuses items over DynamoDB's 400 KB): twenty thousand checkpoints with
//! the run state bounded by a constant and every row counted once; a run
//! carried by many invocations with deadlines so short that each does a
//! little, none repeating what another finished; and a stray shard item
//! outside a reel's read range, removed by reconciliation so that a later
//! grow does not change the count.

mod common;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use common::TestStack;
use futures::StreamExt;
use likes::keys::ReelId;
use likes::reconcile::{Options, Summary, state_bytes_bound};
use likes::reshard::Progress;
use std::collections::HashMap;
use std::time::{Duration, Instant};

async fn stack(extra: &[(&str, &str)]) -> TestStack {
    let mut env = vec![
        ("CACHE_TTL_MS", "0"),
        ("SETTINGS_TTL_MS", "0"),
        ("REQUEST_TIMEOUT_MS", "1000"),
        ("REQUEST_BUDGET_MS", "800"),
        ("DDB_OPERATION_TIMEOUT_MS", "500"),
        ("RECONCILE_CLOCK_SKEW_MS", "0"),
        ("RECONCILE_SEGMENTS", "4"),
        ("RECONCILE_MAX_READ_UNITS", "1000000"),
        ("RECONCILE_MAX_WRITE_UNITS", "1000000"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
    ];
    env.retain(|(k, _)| !extra.iter().any(|(x, _)| x == k));
    env.extend_from_slice(extra);
    TestStack::start(&env).await
}

/// Writes `rows` like rows directly (user `u{i}`, reel `{prefix}{i % reels}`)
/// with BatchWriteItem, looping on unprocessed items, and gives each reel's
/// shard 0 its row count plus `drift(reel index)`. Returns the rows per reel.
async fn seed(
    t: &TestStack,
    prefix: &str,
    rows: usize,
    reels: usize,
    drift: impl Fn(usize) -> i64,
) -> HashMap<String, i64> {
    let table = t.stack.config.likes_table.clone();
    let batches: Vec<Vec<usize>> = (0..rows)
        .collect::<Vec<_>>()
        .chunks(25)
        .map(<[usize]>::to_vec)
        .collect();
    futures::stream::iter(batches)
        .for_each_concurrent(8, |batch| {
            let (client, table) = (t.stack.client.clone(), table.clone());
            async move {
                let mut pending: Vec<WriteRequest> = batch
                    .iter()
                    .map(|i| {
                        let put = PutRequest::builder()
                            .item("user_id", AttributeValue::S(format!("u{i}")))
                            .item(
                                "reel_id",
                                AttributeValue::S(format!("{prefix}{}", i % reels)),
                            )
                            .item("liked_at", AttributeValue::N("1".into()))
                            .build()
                            .unwrap();
                        WriteRequest::builder().put_request(put).build()
                    })
                    .collect();
                for _ in 0..20 {
                    let out = client
                        .batch_write_item()
                        .request_items(&table, std::mem::take(&mut pending))
                        .send()
                        .await
                        .expect("batch write");
                    pending = out
                        .unprocessed_items
                        .and_then(|mut u| u.remove(&table))
                        .unwrap_or_default();
                    if pending.is_empty() {
                        return;
                    }
                }
                panic!("unprocessed like rows remain");
            }
        })
        .await;
    let mut per_reel = HashMap::new();
    for i in 0..rows {
        *per_reel
            .entry(format!("{prefix}{}", i % reels))
            .or_insert(0i64) += 1;
    }
    for r in 0..reels {
        let name = format!("{prefix}{r}");
        t.put_shard(&name, 0, per_reel[&name] + drift(r)).await;
    }
    per_reel
}

/// The size DynamoDB charges an item: attribute names plus values.
fn item_bytes(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter()
        .map(|(k, v)| {
            k.len()
                + match v {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::N(n) => n.len(),
                    AttributeValue::B(b) => b.as_ref().len(),
                    _ => 8,
                }
        })
        .sum()
}

async fn assert_exact(t: &TestStack, expected: &HashMap<String, i64>) {
    for (reel, rows) in expected {
        assert_eq!(t.like_rows(reel).await as i64, *rows, "{reel} rows");
        assert_eq!(t.shard_sum(reel).await, *rows, "{reel} repaired");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_checkpoints_keep_the_run_state_bounded() {
    // One row a page and a checkpoint a page: 20,000 checkpoints, where the
    // old run state (a part per checkpoint in one item) passed 400 KB near
    // 8,700.
    let t = stack(&[
        ("RECONCILE_PAGE_ITEMS", "1"),
        ("RECONCILE_CHECKPOINT_PAGES", "1"),
    ])
    .await;
    let rows = 20_000;
    let expected = seed(&t, "big-", rows, 40, |r| if r % 5 == 0 { 3 } else { 0 }).await;
    let started = Instant::now();
    let s = t
        .stack
        .app
        .reconcile
        .run(&Options::default())
        .await
        .expect("reconcile");
    let elapsed = started.elapsed();
    assert!(s.complete, "{s:?}");
    assert_eq!(s.rows_scanned, rows as u64, "every row counted once: {s:?}");
    assert!(s.checkpoints >= rows as u64, "{s:?}");
    assert_eq!(s.count_lines, rows as u64, "one reel a one-row checkpoint");
    assert_eq!(s.count_writes, s.count_lines, "nothing added twice: {s:?}");
    assert_eq!((s.reels_checked, s.reels_corrected), (40, 8), "{s:?}");
    assert_exact(&t, &expected).await;

    // The largest item the run wrote, as it reports it and as stored: the
    // state is bounded by its segment count, whatever the checkpoints.
    let bound = state_bytes_bound(4) as u64;
    assert!(
        s.largest_item_bytes <= bound,
        "{} > {bound}",
        s.largest_item_bytes
    );
    assert!(s.largest_state_bytes > 0 && s.largest_state_bytes <= s.largest_item_bytes);
    let items = t.scan(&t.stack.config.counters_table).await;
    let largest = items.iter().map(item_bytes).max().unwrap_or(0) as u64;
    assert!(largest <= bound, "an item of {largest} bytes > {bound}");
    let state = items
        .iter()
        .find(|i| {
            i.get("pk")
                .and_then(|v| v.as_s().ok())
                .is_some_and(|p| p == "recon#run")
        })
        .expect("run state");
    eprintln!(
        "reconcile scale: {} rows, {} checkpoints, {} invocation(s) in {:.1} s ({:.0} rows/s, debug build); \
         largest item written {} bytes (bound {bound}); run state now {} bytes; largest counters item {largest} bytes",
        s.rows_scanned,
        s.checkpoints,
        s.invocations,
        elapsed.as_secs_f64(),
        s.rows_scanned as f64 / elapsed.as_secs_f64(),
        s.largest_item_bytes,
        item_bytes(state),
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_many_short_invocations_completes_without_repeating_work() {
    // Pages of 100 rows over 600 reels: each checkpoint holds about 200
    // reel counts, more than one batch of count-item updates, so deadlines
    // also fall in the middle of adding a checkpoint.
    let t = stack(&[
        ("RECONCILE_PAGE_ITEMS", "100"),
        ("RECONCILE_CHECKPOINT_PAGES", "2"),
    ])
    .await;
    let expected = seed(
        &t,
        "short-",
        3_000,
        600,
        |r| if r % 50 == 0 { -2 } else { 0 },
    )
    .await;
    let mut last: Option<Summary> = None;
    let mut invocations = 0u32;
    while !last.as_ref().is_some_and(|s| s.complete) {
        invocations += 1;
        assert!(invocations < 5_000, "the run does not finish: {last:?}");
        let s = t
            .stack
            .app
            .reconcile
            .run(&Options {
                deadline: Some(Instant::now() + Duration::from_millis(40)),
                ..Options::default()
            })
            .await
            .expect("reconcile");
        // Each invocation hands the run over when it stops: never busy.
        assert_ne!(s.invocation, "busy", "{s:?}");
        if let Some(prev) = &last {
            assert_eq!(s.run_id, prev.run_id, "one run throughout");
            assert!(s.rows_scanned >= prev.rows_scanned);
        }
        last = Some(s);
    }
    let s = last.unwrap();
    eprintln!(
        "short invocations: {} invocations, {} checkpoints, {} count lines, {} count writes",
        s.invocations, s.checkpoints, s.count_lines, s.count_writes
    );
    assert!(s.invocations >= 10, "each invocation did a little: {s:?}");
    assert_eq!(s.invocations, invocations);
    assert_eq!(s.rows_scanned, 3_000, "every row counted once: {s:?}");
    assert_eq!(
        s.count_writes, s.count_lines,
        "no checkpoint's counts were added twice: {s:?}"
    );
    assert_eq!((s.reels_checked, s.reels_corrected), (600, 12), "{s:?}");
    assert_exact(&t, &expected).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_shard_outside_the_read_range_is_cleared_and_a_grow_keeps_the_count() {
    let t = stack(&[
        ("SETTINGS_TTL_MS", "100"),
        ("RESIZE_MARGIN_MS", "0"),
        ("RESHARD_MAX_WAIT_MS", "5000"),
    ])
    .await;
    futures::stream::iter(0..25)
        .for_each_concurrent(8, |i| {
            let t = &t;
            async move {
                let r = t.like(&format!("fan-{i}"), "stray").await;
                assert_eq!(r.status, 200, "{}", r.body);
            }
        })
        .await;
    // An outside edit: shard 1 of a one-shard reel, which no reader sums.
    t.put_shard("stray", 1, -30).await;
    assert_eq!(t.http_count("stray").await, 25);
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let s = t
        .stack
        .app
        .reconcile
        .run(&Options::default())
        .await
        .expect("reconcile");
    assert!(s.complete, "{s:?}");
    assert_eq!(
        (s.strays_cleared, s.stray_reels.clone()),
        (1, vec!["stray".to_owned()]),
        "{s:?}"
    );
    assert_eq!(s.reels_corrected, 0, "the count itself agreed: {s:?}");
    assert_eq!(
        t.shards("stray").await,
        vec![(0, 25), (1, 0)],
        "shard 1 is emptied"
    );

    // Growing to 4 now reads shards 1..3: the count does not move.
    let r = &t.stack.app.reshard;
    let id = ReelId::parse("stray").unwrap();
    r.begin(&id, 4).await.expect("grow");
    let started = Instant::now();
    loop {
        assert_eq!(
            t.http_count("stray").await,
            25,
            "the count shown never changes"
        );
        match r.advance(&id).await.expect("advance") {
            Progress::Stable(s) => {
                assert_eq!(s.read_shards, 4);
                break;
            }
            Progress::Waiting { .. } => tokio::time::sleep(Duration::from_millis(100)).await,
            Progress::Interrupted => unreachable!(),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "grow stuck");
    }
    assert_eq!(t.http_count("stray").await, 25);
    t.stop().await;
}
