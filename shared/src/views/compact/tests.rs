//! Compaction's plans, and the union a base keeps.

use super::*;
use crate::views::sketch::{Sketch, union_estimate};

fn item(sk: &str, views: u64, viewers: std::ops::Range<u32>) -> ViewFoldItem {
    let mut s = Sketch::new();
    for v in viewers {
        s.add(&format!("viewer-{v}"));
    }
    ViewFoldItem {
        sk: sk.to_owned(),
        views,
        sketch: s.to_bytes(),
        expires_at: sk.starts_with("d#").then_some(1_000),
        version: 0,
        windows: Vec::new(),
    }
}

#[test]
fn only_sealed_writers_fold_and_sums_and_unions_are_kept() {
    let items = vec![
        item("all#base", 10, 0..500),
        item("all#wa", 5, 400..3_000),
        item("all#wb", 7, 2_000..9_000),
        item("all#wlive", 1, 8_000..9_500),
        item("d#2026-12-06#wa", 5, 400..600),
    ];
    let sealed: HashSet<String> = ["wa".to_owned(), "wb".to_owned()].into();
    let folds = plan("v#r", &items, &sealed, 42);
    assert_eq!(folds.len(), 1, "two families fit one transaction");
    let f = &folds[0];
    assert_eq!(f.families.len(), 2);
    let all = f.families.iter().find(|f| f.day.is_none()).unwrap();
    assert_eq!(all.base_sk, "all#base");
    assert_eq!(all.base_version, Some(0));
    assert_eq!(all.views, 12);
    assert_eq!(all.folded.len(), 2);
    let day = f.families.iter().find(|f| f.day.is_some()).unwrap();
    assert_eq!(day.base_sk, "d#2026-12-06#base");
    assert_eq!(day.base_version, None);
    assert_eq!(day.expires_at, Some(1_000));
    // What a reader unions before and after the fold.
    let before = union_estimate(items[..4].iter().map(|i| i.sketch.as_slice()));
    let after = union_estimate([all.sketch.as_slice(), items[3].sketch.as_slice()]);
    assert_eq!(before, after);
}

#[test]
fn a_family_too_big_for_one_transaction_folds_in_order() {
    let mut items: Vec<ViewFoldItem> = (0..150)
        .map(|w| item(&format!("all#w{w:03}"), 1, w..w + 1))
        .collect();
    items.push(item("d#2026-12-06#w000", 1, 0..1));
    let sealed: HashSet<String> = (0..150).map(|w| format!("w{w:03}")).collect();
    let folds = plan("v#r", &items, &sealed, 42);
    let actions: Vec<usize> = folds
        .iter()
        .map(|f| f.families.iter().map(|g| g.folded.len() + 1).sum())
        .collect();
    assert!(actions.iter().all(|a| *a <= 100), "{actions:?}");
    let versions: Vec<Option<u64>> = folds
        .iter()
        .flat_map(|f| f.families.iter())
        .filter(|g| g.day.is_none())
        .map(|g| g.base_version)
        .collect();
    assert_eq!(versions, [None, Some(1)]);
    let folded: usize = folds
        .iter()
        .flat_map(|f| f.families.iter())
        .map(|g| g.folded.len())
        .sum();
    assert_eq!(folded, 151);
    assert!(plan("v#r", &items, &HashSet::new(), 42).is_empty());
}
