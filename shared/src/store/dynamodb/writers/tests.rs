//! Summing a writer partition and planning its folds.

use super::*;

fn item(sk: &str, n: i64, seq: &str, at: i64) -> Item {
    HashMap::from([
        ("pk".to_owned(), AttributeValue::S("l#r".into())),
        ("sk".to_owned(), AttributeValue::S(sk.into())),
        ("n".to_owned(), num(n)),
        ("seq".to_owned(), AttributeValue::S(seq.into())),
        ("updated_at".to_owned(), num(at)),
    ])
}

#[test]
fn items_and_base_sum_and_quiet_ones_are_listed() {
    let mut base = item(keys::LIKES_WRITERS_BASE_SORT, 100, "", 50);
    base.insert("fv".into(), num(3));
    let items = vec![
        item("w#a", 5, "7", 1_000),
        item("w#b", -2, "9", 9_500),
        base,
    ];
    let p = sum_partition(items, 10_000, 1_000, &TailWindow::new(2000, 10_000, 5000)).unwrap();
    assert_eq!((p.n, p.last_write_ms, p.items), (103, 9_500, 3));
    // `a` has been quiet 9 s; `b` wrote 0.5 s ago; the base is no writer.
    let quiet: Vec<&str> = p.quiet.iter().map(|(sk, _, _)| sk.as_str()).collect();
    assert_eq!(quiet, ["w#a"]);
}

#[test]
fn an_item_the_base_already_folded_is_counted_once() {
    // A read that saw `a` before a fold and the base after it: the base
    // names `a` at the seq read, so `a` is left out. `b` was recreated
    // after an older fold of it (another seq): counted.
    let mut base = item(keys::LIKES_WRITERS_BASE_SORT, 40, "", 50);
    base.insert(
        "fs".into(),
        AttributeValue::M(HashMap::from([
            ("w#a".to_owned(), AttributeValue::S("7".into())),
            ("w#b".to_owned(), AttributeValue::S("3".into())),
        ])),
    );
    let items = vec![item("w#a", 5, "7", 1), item("w#b", 2, "9", 1), base];
    let p = sum_partition(items, 10, 1_000, &TailWindow::new(2000, 10_000, 5000)).unwrap();
    assert_eq!(p.n, 42);
}

#[test]
fn own_change_tails_are_summed_and_an_item_without_one_breaks_the_cut() {
    let w = TailWindow::new(2000, 10_000, 5000);
    let tail = |entries: &[(i64, i64)]| {
        AttributeValue::M(
            entries
                .iter()
                .map(|(start, d)| (w.entry_key(*start), num(*d)))
                .collect(),
        )
    };
    let mut a = item("w#a", 5, "7", 99_000);
    // One bucket in the window, one long gone.
    a.insert(w.attr(), tail(&[(98_000, 2), (60_000, 5)]));
    let mut b = item("w#b", 1, "8", 99_500);
    b.insert(w.attr(), tail(&[(99_000, -1)]));
    // Quiet long before the window: no tail needed.
    let old = item("w#c", 4, "3", 10_000);
    let p = sum_partition(vec![a.clone(), b.clone(), old], 100_000, 1_000_000, &w).unwrap();
    assert_eq!(p.tail.since(98_000), Some(1));
    assert_eq!(p.tail.since(99_000), Some(-1));
    // Written lately by an aggregator keeping no tail (or another
    // window), or a base a fold wrote lately: not cut.
    let bare = item("w#d", 1, "9", 99_900);
    let p = sum_partition(vec![a.clone(), bare], 100_000, 1_000_000, &w).unwrap();
    assert_eq!(p.tail.since(98_000), None);
    let base = item(keys::LIKES_WRITERS_BASE_SORT, 3, "", 95_000);
    let p = sum_partition(vec![a, b, base], 100_000, 1_000_000, &w).unwrap();
    assert_eq!(p.tail.since(98_000), None);
}

#[test]
fn a_fold_carries_the_kept_buckets_and_drops_the_base_stale_ones() {
    let window = RecentWindow {
        width_ms: 100,
        keep_ms: 1_000,
    };
    let mut a = item("w#a", 5, "7", 9_000);
    a.insert(keys::recent_delta_attr(100, 9_500), num(2));
    a.insert(keys::recent_delta_attr(100, 100), num(9));
    let mut b = item("w#b", 1, "8", 9_200);
    b.insert(keys::recent_delta_attr(100, 9_500), num(1));
    let mut base = item(keys::LIKES_WRITERS_BASE_SORT, 10, "", 8_000);
    base.insert("fv".into(), num(2));
    base.insert(keys::recent_delta_attr(100, 200), num(4));
    let p = Partition {
        base: Some(base),
        ..Partition::default()
    };
    let taken = vec![
        ("w#a".to_owned(), "7".to_owned(), a),
        ("w#b".to_owned(), "8".to_owned(), b),
    ];
    let plan = FoldPlan::new(&p, &taken, window, 10_000);
    assert_eq!((plan.version, plan.n, plan.updated_at), (2, 6, 9_200));
    assert_eq!(
        plan.add,
        BTreeMap::from([(keys::recent_delta_attr(100, 9_500), 3)])
    );
    assert_eq!(plan.remove, [keys::recent_delta_attr(100, 200)]);
    // One token per fold: another version or another seq is another.
    let t = plan.token("l#r", &taken);
    let mut later = taken.clone();
    later[1].1 = "9".into();
    assert_ne!(t, plan.token("l#r", &later));
    assert_eq!(t, plan.token("l#r", &taken));
}
