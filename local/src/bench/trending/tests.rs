//! What is made of a run's figures: the lists against the truth, the
//! extra units from the proxy's loads and the items' sizes.

use super::units::{Item, extra_units, sizes};
use super::*;
use aws_sdk_dynamodb::types::AttributeValue as V;
use likes::trending::{Entry, Ranked};

fn ranked(reels: &[(&str, i64)], max_error: u64) -> Ranked {
    Ranked {
        reels: reels
            .iter()
            .map(|(r, n)| Entry {
                reel: ReelId::parse(r).unwrap(),
                count: *n,
                likes: None,
                views: None,
            })
            .collect(),
        as_of_ms: 0,
        max_error,
        candidates: reels.len(),
        warmed: false,
    }
}

#[test]
fn precision_and_recall_count_the_reels_above_the_error() {
    let truth: HashMap<String, i64> = [("a", 50), ("b", 40), ("c", 3), ("d", 2), ("e", 1)]
        .into_iter()
        .map(|(r, n)| (r.to_owned(), n))
        .collect();
    // Exact above the error (10); below it, "d" missed and "e" listed.
    let a = accuracy(
        &ranked(&[("a", 50), ("b", 40), ("c", 3), ("e", 1)], 10),
        &truth,
    );
    assert_eq!((a.precision, a.recall, a.eligible), (1.0, 1.0, 2));
    assert_eq!(a.recall_all, 0.8, "4 of the 5 true reels");
    assert!(a.counts_exact);
    // A reel above the error missed fails recall; a wrong count is seen.
    let a = accuracy(&ranked(&[("a", 51), ("c", 3)], 10), &truth);
    assert_eq!((a.precision, a.recall), (1.0, 0.5));
    assert!(!a.counts_exact);
}

#[test]
fn the_extra_units_are_the_sketch_puts_and_the_buckets_share() {
    let mut small = Item::new();
    small.insert("pk".into(), V::S("l#r".into()));
    small.insert("n".into(), V::N("5".into()));
    // Window buckets that take the item past 1 KB: 1 unit more a write.
    let mut big = small.clone();
    big.insert("x".into(), V::S("y".repeat(1_000)));
    big.insert("ch499068".into(), V::N("3".repeat(40)));
    let (with, without) = sizes(&big);
    assert!(with > 1024 && without <= 1024, "{with} {without}");
    let load = |p: &str, wu: f64, items: u64| faultproxy::KeyLoad {
        partition: format!("V/{p}"),
        write_units: wu,
        items_written: items,
        ..Default::default()
    };
    let loads = [
        load("top#likes#1", 8.0, 2),
        load("top#views#1", 4.0, 1),
        load("l#r", 100.0, 10),
        load("agg#x", 50.0, 10),
    ];
    let e = extra_units("V", &loads, &[small, big]);
    assert_eq!((e.sketch_likes, e.sketch_views), (8.0, 4.0));
    // Half the partition's items add a unit: 10 writes × 0.5 × 2.
    assert_eq!(e.window_likes, 10.0);
    assert_eq!(e.window_views, 0.0);
    // Transactional mode: the buckets ride on the shard items.
    let mut shard = Item::new();
    shard.insert("pk".into(), V::S("007#reel#r#likes".into()));
    shard.insert("x".into(), V::S("y".repeat(1_000)));
    shard.insert("ch499068".into(), V::N("3".repeat(40)));
    let e = extra_units(
        "C",
        &[load("007#reel#r#likes", 40.0, 10)].map(|mut l| {
            l.partition = l.partition.replace("V/", "C/");
            l
        }),
        &[shard],
    );
    assert_eq!(e.window_likes, 20.0, "10 writes × 1 unit × 2");
}
