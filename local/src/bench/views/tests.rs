//! The `views` variant's tests, and the plain figures other tests use.

use super::*;

/// A run with plain figures, for tests of what is made of results.
pub(in crate::bench) fn test_views_result() -> ViewsResult {
    ViewsResult {
        variant: Variant::Views,
        workers: 32,
        viewers: 200_000,
        stream_shards: VIEWS_SHARDS,
        load_seconds: 20.0,
        requests: 1000,
        accepted_requests: 1000,
        accepted_pct: 100.0,
        answers: BTreeMap::from([("202".to_owned(), 1000)]),
        requests_per_sec: 50.0,
        views_per_sec: 750.0,
        latency_p50_ms: 5.0,
        latency_p99_ms: 20.0,
        freshness_p50_ms: 1000.0,
        freshness_p99_ms: 2000.0,
        drain_seconds: 1.0,
        retried_requests: 0,
        unsettled_requests: 0,
        accepted_views: 15_000,
        stored_views: 15_000,
        read_views: 15_000,
        exact: true,
        unique_viewers_true: 1000,
        unique_viewers_estimate: 1010,
        unique_viewers_error_pct: 1.0,
        wcu_proxy: 100.0,
        wcu_per_view_proxy: 0.0067,
        wcu_sized: 300.0,
        wcu_per_view_sized: 0.02,
        wcu_sized_per_chunk: 30.0,
        viral_key_max_wcu_per_sec: 16.0,
        transactions: 10,
        chunks: 10,
        records_per_chunk_mean: 100.0,
        records_per_chunk_p50: 100.0,
        records_per_chunk_max: 150.0,
        seen_item_bytes_max: 1300,
        view_item_bytes_max: 2200,
        invocations: 10,
        records_per_invocation: 100.0,
        batches_retried: 0,
        records_discarded: 0,
        kinesis_requests: BTreeMap::new(),
        records_put: 1000,
        producer_retries: 0,
    }
}

/// An item of `pairs`, for tests.
pub(super) fn item(pairs: &[(&str, AttributeValue)]) -> Item {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

use aws_sdk_dynamodb::primitives::Blob;

#[test]
fn freshness_matches_cumulative_views_to_the_first_poll_holding_them() {
    // Three answers of 10, 15 and 5 views: totals 10, 25, 30.
    let acks = [(1.2, 15), (1.0, 10), (1.4, 5)];
    let sums = [(0.9, 0), (1.1, 10), (1.5, 20), (1.7, 30), (1.9, 30)];
    // 10 at 1.1 (100 ms), 25 at 1.7 (500 ms), 30 at 1.7 (300 ms).
    let (p50, p99) = freshness(&acks, &sums);
    assert_eq!((p50.round(), p99.round()), (300.0, 500.0));
    // In the table before the answer: 0, not negative.
    let (p50, _) = freshness(&[(2.0, 5)], &[(1.0, 5)]);
    assert_eq!(p50, 0.0);
    // A total never reached is left out; no polls, no figures.
    assert_eq!(
        freshness(&[(1.0, 5), (1.1, 5)], &[(1.5, 5)]),
        (500.0, 500.0)
    );
    assert_eq!(freshness(&acks, &[]), (0.0, 0.0));
    // Polls are matched in order: a later request never matches an
    // earlier poll than an earlier request did.
    let (p50, p99) = freshness(&[(1.0, 10), (1.05, 2)], &[(1.1, 10), (1.2, 4), (1.3, 12)]);
    assert_eq!((p50.round(), p99.round()), (250.0, 250.0));
}

#[test]
fn items_are_sized_as_dynamodb_counts_them() {
    let i = item(&[
        ("pk", AttributeValue::S("v#viral".into())),
        ("v", AttributeValue::N("12300".into())),
        ("hll", AttributeValue::B(Blob::new(vec![0u8; 2000]))),
    ]);
    // 2 + 7, 1 + (3 digits: 2 bytes) + 1, 3 + 2000.
    assert_eq!(item_bytes(&i), 9 + 4 + 2003);
    assert_eq!(value_bytes(&AttributeValue::N("-0.5".into())), 2);
    assert_eq!(error_pct(102, 100), 2.0);
    assert_eq!(error_pct(0, 0), 0.0);
}

#[test]
fn sized_units_charge_every_chunk_its_items() {
    let (arn, shard) = ("arn:s", "shardId-0");
    let writer = likes::keys::views_writer(arn, shard);
    let s = |v: &str| AttributeValue::S(v.into());
    let seen = |ids: usize, sort: &str| {
        item(&[
            ("pk", s(&likes::keys::views_seen_key(arn, shard))),
            ("sk", s(sort)),
            ("ids", AttributeValue::B(Blob::new(vec![1u8; 8 * ids]))),
        ])
    };
    let items = vec![
        // 2 chunks: 200 records (1.6 KB: 2 KB, 4 units), 10 (2 units);
        // one of the warm-up's, not counted.
        seen(200, "a"),
        seen(10, "b"),
        seen(50, "0"),
        item(&[
            ("pk", s(&likes::keys::views_checkpoint_key(arn, shard))),
            ("sk", s("-")),
        ]),
        item(&[
            ("pk", s(&viral_pk())),
            ("sk", s(&likes::keys::views_all_sort(&writer))),
            ("hll", AttributeValue::B(Blob::new(vec![0u8; 2100]))),
        ]),
        // Another writer's item and another reel's: not this shard's.
        item(&[
            ("pk", s(&viral_pk())),
            ("sk", s("all#wother")),
            ("hll", AttributeValue::B(Blob::new(vec![0u8; 5000]))),
        ]),
    ];
    let before = HashSet::from([(likes::keys::views_seen_key(arn, shard), "0".to_owned())]);
    let got = sized_units(&items, arn, &[shard.to_owned()], &before);
    // Seen items 4 + 2; per chunk: checkpoint 2, view item (3 KB) 6.
    assert_eq!(got.units, 6.0 + 2.0 * 8.0);
    assert_eq!(got.records_per_chunk, vec![200.0, 10.0]);
    assert!(got.view_bytes_max > 2100 && got.view_bytes_max < 3072);
}
