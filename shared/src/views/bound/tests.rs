use super::*;
use crate::aggregate::records::SequenceNumber;

fn part(seq: u64, viewer: &str, views: &[(&str, u32)]) -> Part {
    Part {
        seq: SequenceNumber::parse_kinesis(&seq.to_string()).unwrap(),
        arrival_ms: 0,
        id: Some(seq),
        viewer: viewer.to_owned(),
        day: "2026-12-06".to_owned(),
        at_ms: 0,
        views: views
            .iter()
            .map(|(r, n)| (ReelId::parse(r).unwrap(), *n))
            .collect(),
    }
}

const ALLOW: ViewerAllowance = ViewerAllowance {
    views: 600,
    reels: 3,
};

#[test]
fn a_viewer_is_cut_at_its_allowance_and_others_are_not() {
    let a = part(1, "attacker", &[("victim", 1000)]);
    let b = part(2, "someone", &[("victim", 2), ("other", 1)]);
    let c = part(3, "attacker", &[("victim", 5)]);
    let out = bound(ALLOW, &HashMap::new(), &[&a, &b, &c]);
    let r = |s: &str| ReelId::parse(s).unwrap();
    assert_eq!(out.views[0], vec![(r("victim"), 600)]);
    assert_eq!(out.views[1], vec![(r("victim"), 2), (r("other"), 1)]);
    assert!(out.views[2].is_empty(), "no views left this minute");
    assert_eq!(out.dropped_views, 400 + 5);
    assert_eq!(
        out.usage,
        vec![
            Usage {
                viewer: viewer_tag("attacker"),
                views: 600,
                reels: 1
            },
            Usage {
                viewer: viewer_tag("someone"),
                views: 3,
                reels: 2
            },
        ]
    );
}

#[test]
fn what_the_window_already_counted_is_taken_first_and_entries_are_bounded() {
    let prior = HashMap::from([(viewer_tag("v"), (10, 2))]);
    let p = part(1, "v", &[("a", 1), ("b", 1), ("c", 1)]);
    let out = bound(ALLOW, &prior, &[&p]);
    // Two entries counted before in the window: one more reel only.
    assert_eq!(out.views[0], vec![(ReelId::parse("a").unwrap(), 1)]);
    assert_eq!(out.dropped_views, 2);
}

#[test]
fn the_same_parts_and_window_decide_the_same() {
    let parts: Vec<Part> = (0..50)
        .map(|i| part(i, &format!("v{}", i % 3), &[("x", 40), ("y", 7)]))
        .collect();
    let refs: Vec<&Part> = parts.iter().collect();
    let prior = HashMap::from([(viewer_tag("v1"), (500, 1))]);
    assert_eq!(bound(ALLOW, &prior, &refs), bound(ALLOW, &prior, &refs));
}

#[test]
fn usage_packs_and_unpacks_and_the_tag_is_pinned() {
    let u = vec![
        Usage {
            viewer: 7,
            views: 600,
            reels: 3,
        },
        Usage {
            viewer: u32::MAX,
            views: 1,
            reels: 1,
        },
    ];
    let packed = Usage::pack(&u);
    assert_eq!(packed.len(), 2 * Usage::BYTES);
    assert_eq!(Usage::unpack(&packed), u);
    assert_eq!(Usage::unpack(&packed[..9]), u[..1]);
    // Stored in seen items: a change here is a change of format.
    assert_eq!(viewer_tag("user-42"), viewer_tag("user-42"));
    assert_eq!(format!("{:08x}", viewer_tag("user-42")), GOLDEN_USER_42);
}

/// `viewer_tag("user-42")`: SHA-256 of `likes/viewer-bound/v1user-42` (Python's
/// hashlib agrees), its first four bytes; pinned.
const GOLDEN_USER_42: &str = "a3bbb8a4";
