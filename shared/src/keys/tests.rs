//! The key formats' unit tests (a file of their own: `keys.rs` keeps to
//! the formats).

#[test]
fn recent_bucket_attributes_name_their_bucket_and_nothing_else() {
    let w = 450_000;
    let start = 4_000_000 * w;
    assert_eq!(recent_delta_attr(w, start), "d450000_4000000");
    assert_eq!(
        parse_recent_attr(&recent_delta_attr(w, start)),
        Some(RecentAttr {
            removals: false,
            width_ms: w,
            start_ms: start
        })
    );
    assert_eq!(
        parse_recent_attr(&recent_removals_attr(250, 500)),
        Some(RecentAttr {
            removals: true,
            width_ms: 250,
            start_ms: 500
        })
    );
    // A shard item's other attributes are never read as buckets.
    for other in [
        "n",
        "w",
        "d",
        "x",
        "d1",
        "d_1",
        "d1_",
        "d0_5",
        "updated_at",
        SHARD_CLOSED,
        "folds",
        "dx1_2",
        "d-1_2",
        "é1_2",
    ] {
        assert_eq!(parse_recent_attr(other), None, "{other}");
    }
}

use super::*;

#[test]
fn reel_ids_follow_the_alphabet_and_length() {
    assert!(ReelId::parse("reel-8841_A").is_ok());
    assert!(ReelId::parse(&"a".repeat(64)).is_ok());
    for bad in [
        "",
        "a#b",
        "a b",
        "ä",
        "../x",
        "a/b",
        "a%23",
        "ｒeel",
        &"a".repeat(65),
    ] {
        assert!(ReelId::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn keys_match_the_documented_formats() {
    let r = ReelId::parse("8841").unwrap();
    assert_eq!(shard_key(&r, 0), "000#reel#8841#likes");
    assert_eq!(shard_key(&r, 7), "007#reel#8841#likes");
    assert_eq!(shard_key(&r, 999), "999#reel#8841#likes");
    assert_eq!(settings_key(&r), "reel#8841#settings");
    assert_eq!(base_key(&r), "base#reel#8841#likes");
    assert_eq!(parse_shard_key("base#reel#8841#likes"), None);
    for pk in [
        "007#reel#8841#likes",
        "base#reel#8841#likes",
        "reel#8841#settings",
        "reel#8841#reconcile",
    ] {
        assert_eq!(reel_of_counter_key(pk), Some(r.clone()), "{pk}");
    }
    for pk in [
        "idem#abc",
        "recon#run",
        "recon#x#seg1#0",
        "reel#a#b#settings",
    ] {
        assert_eq!(reel_of_counter_key(pk), None, "{pk}");
    }
    assert_eq!(reconcile_count_key("17-ab", &r), "recon#17-ab#reel#8841");
    assert_eq!(reel_of_counter_key("recon#17-ab#reel#8841"), None);
    assert_eq!(
        parse_reconcile_count_key("recon#17-ab#reel#8841"),
        Some(("17-ab", r.clone()))
    );
    assert_eq!(parse_reconcile_count_key("recon#run"), None);
    assert_eq!(parse_reconcile_count_key("recon#a#b#reel#8841"), None);
    assert_eq!(parse_settings_key("reel#8841#settings"), Some(r.clone()));
    assert_eq!(parse_settings_key("000#reel#8841#likes"), None);
    assert_eq!(parse_shard_key("007#reel#8841#likes"), Some((7, r)));
    assert_eq!(parse_shard_key("reel#8841#settings"), None);
}

#[test]
fn user_ids_refuse_empty_huge_and_control() {
    assert!(UserId::parse("user-42").is_ok());
    assert!(
        UserId::parse("a#b|c").is_ok(),
        "user ids are never part of a key"
    );
    assert!(UserId::parse("").is_err());
    assert!(UserId::parse("a\nb").is_err());
    assert!(UserId::parse(&"x".repeat(257)).is_err());
}

#[test]
fn utc_days_are_civil_dates() {
    assert_eq!(utc_day(0), "1970-01-01");
    assert_eq!(utc_day(86_399_999), "1970-01-01");
    assert_eq!(utc_day(86_400_000), "1970-01-02");
    assert_eq!(utc_day(951_782_400_000), "2000-02-29");
    assert_eq!(utc_day(1_798_761_599_999), "2026-12-31");
    assert_eq!(utc_day(1_798_761_600_000), "2027-01-01");
    assert_eq!(utc_day(-1), "1969-12-31");
}

#[test]
fn view_sort_keys_name_their_writer_and_day() {
    assert_eq!(
        parse_views_sort(&views_all_sort("w0123")),
        Some((None, "w0123"))
    );
    assert_eq!(
        parse_views_sort(&views_day_sort("2026-12-06", VIEWS_BASE_WRITER)),
        Some((Some("2026-12-06"), "base"))
    );
    assert_eq!(parse_views_sort("seal#w1"), None);
    // The base items sort within the ranges readers query.
    let (a, b) = views_day_range("2026-12-01", "2026-12-07");
    let base = views_day_sort("2026-12-07", VIEWS_BASE_WRITER);
    assert!(a <= base && base <= b);
    assert!(views_all_sort(VIEWS_BASE_WRITER).starts_with(VIEWS_ALL_PREFIX));
}

#[test]
fn writer_parts_round_trip_and_the_part_function_is_pinned() {
    let reel = ReelId::parse("viral-1").unwrap();
    assert_eq!(likes_writers_part_key(&reel, 0), "l#viral-1");
    assert_eq!(likes_writers_part_key(&reel, 7), "l#viral-1#7");
    for part in [0, 1, 63] {
        let pk = likes_writers_part_key(&reel, part);
        assert_eq!(parse_likes_writers_key(&pk), Some((reel.clone(), part)));
    }
    for bad in [
        "l#viral-1#",
        "l#viral-1#07",
        "l#viral-1#64",
        "l#a#b",
        "v#viral-1",
        "l#",
    ] {
        assert_eq!(parse_likes_writers_key(bad), None, "{bad}");
    }
    // Golden values: a change would move every spread writer at once.
    assert_eq!(likes_writer_part("0123456789abcdef", 1), 0);
    assert_eq!(likes_writer_part("0123456789abcdef", 64), 61);
    assert_eq!(likes_writer_part("0123456789abcdef", 8), 5);
    assert_eq!(likes_writer_part("", 64), 0x811c_9dc5 % 64);
    let spread: std::collections::HashSet<u32> = (0..256)
        .map(|i| likes_writer_part(&format!("{i:016x}"), 8))
        .collect();
    assert_eq!(spread.len(), 8, "256 writers reach every one of 8 parts");
}
