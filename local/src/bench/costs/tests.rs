//! The `costs` variant's arithmetic and requests, and the plain cell other
//! tests use.

use super::*;

/// A cell of 1,000 requests answered: 1,000 write units on the request
/// path, 2,042 written and 21 read by the aggregation (counting.md's
/// breadth case: 21 chunks of 49 reels).
pub(in crate::bench) fn cell(mode: Mode, op: Op, spread: Spread) -> CostCell {
    CostCell {
        mode,
        op,
        spread,
        ok: 1000,
        failed: 0,
        per_request: if op == Op::View { VIEWS_PER_REQUEST } else { 1 },
        request: Units {
            write: 1000.0,
            read: 0.0,
        },
        aggregation: Units {
            write: 2042.0,
            read: 21.0,
        },
        request_calls: BTreeMap::new(),
        aggregation_calls: BTreeMap::new(),
        request_invoked: BTreeMap::new(),
        aggregation_invoked: BTreeMap::new(),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn units_are_shared_by_the_operations_answered() {
    let c = cell(Mode::Stream, Op::Like, Spread::Breadth);
    assert!(close(c.request_wu(), 1.0));
    assert!(close(c.aggregation_wu(), 2.042));
    assert!(close(c.aggregation_ru(), 0.021));
    assert!(close(c.total_wu(), 3.042));
    assert!(close(c.total_ru(), 0.021));
    // A failed request costs what it cost, shared by the ones answered.
    let half = CostCell {
        ok: 500,
        failed: 500,
        ..c.clone()
    };
    assert!(close(half.request_wu(), 2.0));
    // Views: per view, 10 a request.
    let v = cell(Mode::Views, Op::View, Spread::Viral);
    assert!(close(v.request_wu(), 0.1));
    assert!(close(v.total_wu(), 0.3042));
    // Nothing answered: no division by zero.
    let none = CostCell { ok: 0, ..c };
    assert!(none.total_wu().is_finite());
}

#[test]
fn arithmetic_is_counting_md_s() {
    let a = |mode, op, spread| cell(mode, op, spread).arithmetic_wu();
    use {Mode::*, Op::*, Spread::*};
    // Transactional: 2 items × 2, keyed 3 × 2, wherever the reel.
    for spread in [Breadth, Viral] {
        assert_eq!(a(Transactional, Like, spread), Some(4.0));
        assert_eq!(a(Transactional, KeyedLike, spread), Some(6.0));
        assert_eq!(a(Transactional, Unlike, spread), Some(4.0));
        assert_eq!(a(Transactional, KeyedUnlike, spread), Some(6.0));
    }
    // Stream: the request path's 1 / 4 / 2 / 4, plus the chunk's share:
    // at breadth 2 + 2 ÷ 49, on one reel 4 ÷ 1,000.
    let breadth = 2.0 + 2.0 / 49.0;
    assert!(close(a(Stream, Like, Breadth).unwrap(), 1.0 + breadth));
    assert!(close(a(Stream, KeyedLike, Breadth).unwrap(), 4.0 + breadth));
    assert!(close(a(Stream, Unlike, Breadth).unwrap(), 2.0 + breadth));
    assert!(close(a(Stream, KeyedUnlike, Viral).unwrap(), 4.004));
    assert!(close(a(Stream, Like, Viral).unwrap(), 1.004));
    // Views: docs/views.md's arithmetic is per chunk, not here.
    assert_eq!(a(Views, View, Breadth), None);
}

#[test]
fn cells_spread_as_named_and_unlikes_undo_their_likes() {
    let reels = |rs: &[Request]| {
        rs.iter()
            .map(|r| match r {
                Request::Like { reel, .. } | Request::Views { reel, .. } => reel.clone(),
                Request::Counts { .. } => String::new(),
            })
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let like = like_requests(Op::Like, Spread::Breadth);
    assert_eq!(like.len(), OPS as usize);
    assert_eq!(reels(&like), OPS as usize);
    assert_eq!(reels(&like_requests(Op::KeyedLike, Spread::Viral)), 1);
    // Each unlike is its like's user and reel; keyed ones a key of their
    // own (a like's key again would answer the like).
    let pairs = [(Op::Like, Op::Unlike), (Op::KeyedLike, Op::KeyedUnlike)];
    for (on, off) in pairs {
        for spread in [Spread::Breadth, Spread::Viral] {
            for (l, u) in like_requests(on, spread)
                .iter()
                .zip(like_requests(off, spread))
            {
                let (
                    Request::Like {
                        reel, user, key, ..
                    },
                    Request::Like {
                        reel: r2,
                        user: u2,
                        key: k2,
                        unlike,
                    },
                ) = (l, u)
                else {
                    panic!("likes cells send likes");
                };
                assert!(unlike);
                assert_eq!((reel, user), (&r2, &u2));
                assert_eq!(key.is_some(), on == Op::KeyedLike);
                assert!(key.is_none() || key != &k2);
            }
        }
    }
}

#[test]
fn the_stacks_count_every_unit_and_run_nothing_else() {
    let env = |stream, views| -> BTreeMap<String, String> {
        costs_env(stream, views).into_iter().collect()
    };
    let t = env(false, true);
    let s = env(true, false);
    for e in [&t, &s] {
        // The proxy on, its cap out of reach; no schedule, no growth.
        assert_eq!(e["FAULTS"], "seed=1,write_cap=1000000");
        assert_eq!(e["LOCAL_SCHEDULE_SECS"], "0");
        assert_eq!(e["AUTO_RESHARD"], "off");
        // The caches as deployed, outlived by the wait before each cell.
        let ms = |k: &str| Duration::from_millis(e[k].parse().unwrap());
        assert!(ms("CACHE_TTL_MS") < COSTS_CACHES_COLD);
        assert!(ms("SETTINGS_TTL_MS") < COSTS_CACHES_COLD);
    }
    assert_eq!(s.get("COUNTING").map(String::as_str), Some("stream"));
    assert_eq!(t.get("COUNTING"), None);
    assert_eq!(t["LOCAL_VIEWS"], "on");
    assert_eq!(s["LOCAL_VIEWS"], "off");
}

#[test]
fn a_half_with_no_call_is_zero_not_minus_zero() {
    // The sum of no operation's units is −0, which prints as "-0.000".
    let u = Units::of(&faultproxy::Stats::default());
    assert!(u.write.is_sign_positive() && u.read.is_sign_positive());
    assert_eq!(format!("{:.3}", u.write), "0.000");
}
