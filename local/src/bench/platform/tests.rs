//! The variant's pure parts: the Zipf draw, the compression of time, the
//! report's rows and verdicts.

use super::age::Age;
use super::probe::{Exactness, ReadCost, cheaper};
use super::report::{growth, range, rows};
use super::zipf::{Reel, Zipf};
use super::*;

#[test]
fn zipf_ranks_fall_as_a_power_law_and_the_viral_reel_takes_its_share() {
    let z = Zipf::new(100_000, 1.1, 0.2);
    // p(k) ∝ k^-1.1: rank 1 is 2^1.1 times rank 2.
    assert!((z.p(1) / z.p(2) - 2f64.powf(1.1)).abs() < 1e-9);
    assert!((z.p(10) / z.p(100) - 10f64.powf(1.1)).abs() < 1e-6);
    let total: f64 = (1..=100_000).map(|k| z.p(k)).sum();
    assert!((total - 1.0).abs() < 1e-9);
    // The edges of the draw.
    assert_eq!(z.pick(0.1, 0.5), Reel::Viral);
    assert_eq!(z.pick(0.5, 0.0), Reel::Rank(1));
    assert_eq!(z.pick(0.5, 0.999_999_999_9), Reel::Rank(100_000));
    assert_eq!(Reel::Rank(7).id(), "z7");
    assert_eq!(Reel::Viral.id(), "viral");
    // Drawn: the shares come out as set, and a seed repeats its reels.
    let mut rng = fastrand::Rng::with_seed(7);
    let n = 200_000;
    let draws: Vec<Reel> = (0..n).map(|_| z.draw(&mut rng)).collect();
    let share = |r: Reel| draws.iter().filter(|d| **d == r).count() as f64 / n as f64;
    assert!((share(Reel::Viral) - 0.2).abs() < 0.01);
    assert!((share(Reel::Rank(1)) - 0.8 * z.p(1)).abs() < 0.01);
    let mut again = fastrand::Rng::with_seed(7);
    assert!(draws.iter().take(100).all(|d| *d == z.draw(&mut again)));
}

#[test]
fn a_view_request_merges_a_reel_drawn_twice() {
    let z = Zipf::new(3, 1.1, 0.0);
    let mut rng = fastrand::Rng::with_seed(1);
    for _ in 0..100 {
        let e = traffic::view_entries(&z, &mut rng);
        let total: u32 = e.iter().map(|(_, n)| n).sum();
        assert!((traffic::ENTRIES..=traffic::ENTRIES * traffic::MAX_VIEWS).contains(&total));
        let mut ids: Vec<&String> = e.iter().map(|(r, _)| r).collect();
        ids.dedup();
        assert_eq!(ids.len(), e.len());
    }
}

#[test]
fn time_is_compressed_to_generations_of_four_hours() {
    // 300 likes/s × 30 s over 128 lanes rolling every 5 records.
    let a = Age::planned(300.0, 30.0, 128, 5);
    assert!((a.generations - 9000.0 / 128.0 / 5.0).abs() < 1e-9);
    assert!((a.simulated_hours - 4.0 * a.generations).abs() < 1e-9);
    assert!((a.year_pct - 100.0 * a.generations / 2190.0).abs() < 1e-9);
    // One split-and-merge a simulated day (6 generations): 14 → 2.
    assert_eq!(a.reshards, 2);
    // A year's worth, and a run too short for a day: at least one.
    assert_eq!(Age::of(2190.0 * 128.0, 128, 1).reshards, 365);
    assert!((Age::of(2190.0 * 128.0, 128, 1).year_pct - 100.0).abs() < 1e-9);
    assert_eq!(Age::of(10.0, 128, 5).reshards, 1);
    let times = a.reshard_times(30.0);
    assert_eq!(times.len(), 2);
    assert!(times.iter().all(|t| (3.0..=27.0).contains(t)));
    assert!(times[0] < times[1]);
}

fn cost(read_units: f64, items: u64) -> ReadCost {
    ReadCost { read_units, items }
}

fn result(refused_pct: f64, end_viral: f64, likes_wrong: u64) -> PlatformResult {
    let probes = Probes {
        cold_likes: cost(1.0, 2),
        cold_views: cost(0.5, 1),
        warm_likes: cost(1.0, 2),
        warm_views: cost(0.5, 1),
        viral_likes: cost(33.0, 129),
        viral_views: cost(1.0, 9),
    };
    PlatformResult {
        variant: Variant::Platform,
        stream_shards: 128,
        kinesis_shards: 8,
        roll_records: 5,
        offered_likes_per_sec: 300.0,
        load_seconds: 30.0,
        likes: 9000,
        views: 45000,
        unsettled: 0,
        reels_touched: 4000,
        planned: Age::planned(300.0, 30.0, 128, 5),
        generations_seen: 14.0,
        reshards: 2,
        transactions: 1000,
        transactions_refused: (refused_pct * 10.0) as u64,
        refused_pct,
        batches_handed_back: 0,
        records_discarded: 0,
        wu_per_like: 1.5,
        ru_per_like: 0.5,
        wu_per_view: 0.05,
        ru_per_view: 0.01,
        start: probes,
        end: Probes {
            viral_likes: cost(end_viral, 129),
            ..probes
        },
        freshness_p50_ms: 1200.0,
        freshness_p99_ms: 2500.0,
        exactness: Exactness {
            reels: 4000,
            likes_wrong,
            ..Exactness::default()
        },
    }
}

#[test]
fn the_rows_give_min_max_and_judge_every_run() {
    let rs = [
        result(0.5, 33.0, 0),
        result(0.8, 40.0, 0),
        result(0.6, 49.5, 0),
    ];
    let rows = rows(&rs);
    let get = |prefix: &str| rows.iter().find(|r| r.name.starts_with(prefix)).unwrap();
    let refused = get("aggregator writes");
    assert_eq!(
        (refused.value.as_str(), refused.met),
        ("0.50–0.80", Some(true))
    );
    let viral = get("uncached read, viral reel, likes: read units");
    assert_eq!(viral.value, "33.0 → 33.0–49.5");
    assert_eq!(viral.met, Some(true), "49.5 is 1.5× 33");
    assert_eq!(get("reels whose served likes").met, Some(true));
    assert_eq!(get("write units per like").met, None);
    // One run past a target is enough to miss it.
    let rs = [result(0.5, 33.0, 0), result(1.2, 50.0, 3)];
    let rows = super::report::rows(&rs);
    let get = |prefix: &str| rows.iter().find(|r| r.name.starts_with(prefix)).unwrap();
    assert_eq!(get("aggregator writes").met, Some(false));
    assert_eq!(
        get("uncached read, viral reel, likes: read units").met,
        Some(false)
    );
    assert_eq!(get("reels whose served likes").value, "0–3");
    assert_eq!(get("reels whose served likes").met, Some(false));
    // A read the proxy counts nothing of is not judged.
    let mut r = result(0.5, 33.0, 0);
    (r.start.cold_views, r.end.cold_views) = (cost(0.0, 0), cost(0.0, 0));
    let rows = super::report::rows(&[r]);
    let cold = rows
        .iter()
        .find(|r| r.name == "uncached read, cold reel, views")
        .unwrap();
    assert_eq!(cold.met, None);
    // No run: nothing is met.
    assert!(super::report::rows(&[]).iter().all(|r| r.met != Some(true)));
}

#[test]
fn ranges_and_growth_read_as_the_table_prints_them() {
    let rs = [result(0.5, 33.0, 0)];
    assert_eq!(range(&rs, |r| r.wu_per_like, 3), "1.500");
    assert_eq!(range(&rs, |_| f64::NAN, 1), "—");
    assert_eq!(growth(0.0, 0.0), 1.0);
    assert!(growth(0.0, 1.0).is_infinite());
    assert_eq!(growth(2.0, 3.0), 1.5);
}

#[test]
fn the_section_states_targets_and_verdicts_from_the_runs() {
    let opts = crate::bench::test_options();
    let s = super::report::section(&opts, &[result(0.5, 33.0, 0), result(2.0, 33.0, 0)]);
    assert!(s.contains(super::report::PLATFORM_HEADING));
    assert!(s.contains("| aggregator writes conflicted or refused, % of all (likes' and views' transactions) | 0.50–2.00 | ≤ 1 % | **not met** |"));
    assert!(s.contains("Not met: aggregator writes"));
    assert!(s.contains("2,190 roll-overs"));
}

#[test]
fn refusals_count_conflicts_and_throttles_of_transactions_only() {
    let mut s = faultproxy::Stats::default();
    s.requests.insert("TransactWriteItems".into(), 200);
    s.modeled_conflicts
        .refused
        .insert("TransactWriteItems".into(), 3);
    s.modeled_conflicts.refused.insert("PutItem".into(), 9);
    s.modeled_conflicts.in_progress = 1;
    s.injected.insert(
        "capacity_throttle".into(),
        [
            ("TransactWriteItems".to_owned(), 2),
            ("PutItem".to_owned(), 5),
        ]
        .into(),
    );
    assert_eq!(refused_transactions(&s), (200, 6));
    let load = |p: &str, w: f64, r: f64| faultproxy::KeyLoad {
        partition: p.into(),
        write_units: w,
        read_units: r,
        ..Default::default()
    };
    let loads = [
        load("Counters/000#reel#z1#likes", 2.0, 1.0),
        load("Counters/reel#freshprobe#settings", 0.0, 5.0),
        load("Likes/u1", 1.0, 0.0),
        load("Views/v#z1", 4.0, 2.0),
        load("Views/l#z1", 2.0, 1.0),
        load("Views/l#freshprobe", 1.0, 7.0),
    ];
    // The likes' writer items (`l#`) count for the likes, not the views;
    // the freshness reel's reads are left out, its writes are not.
    assert_eq!(
        Units::split(&loads, &["Counters", "Likes"], "Views", "l#"),
        Units {
            like_wu: 6.0,
            like_ru: 2.0,
            view_wu: 4.0,
            view_ru: 2.0,
        }
    );
}

#[test]
fn a_probe_keeps_the_cheaper_read_items_breaking_a_tie() {
    let cost = |read_units: f64, items: u64| ReadCost { read_units, items };
    assert!(cheaper(cost(4.0, 9), cost(5.0, 2)));
    // As many units: the read after the fold (fewer items) is the cheaper.
    assert!(cheaper(cost(4.0, 4), cost(4.0, 8)));
    assert!(!cheaper(cost(4.0, 8), cost(4.0, 4)));
    assert!(!cheaper(cost(4.0, 4), cost(4.0, 4)));
}
