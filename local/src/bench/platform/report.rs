//! The `platform` variant's section of BENCHMARKS.md: what it ran (the
//! Zipf universe, the shards, the compression of time, each figure from
//! the settings or the runs), then one row per figure with its min–max
//! over the runs, its target and whether every run met it. A verdict is
//! computed from the runs, never written down.

use super::age::{self, Age};
use super::probe::ReadCost;
use super::traffic::{COLD_RATE, ENTRIES, FRESH_POLL, FRESH_RATE, MAX_VIEWS};
use super::zipf::{REELS, S, VIRAL_SHARE};
use super::{PlatformResult, Probes, WARM_RANK};
use crate::bench::BenchOptions;
use crate::bench::variant::{CONFLICT_HOLD_MS, PLATFORM_KINESIS_SHARDS, PLATFORM_STREAM_SHARDS};

/// The section's heading (`scripts/benchmarks.sh` places the section by it).
pub(in crate::bench) const PLATFORM_HEADING: &str = "## A platform's year, compressed";

/// An end-of-run read may cost at most this many times the start's.
pub(super) const READ_GROWTH_TARGET: f64 = 1.5;
/// The aggregators' transactions refused, at most, %.
pub(super) const REFUSED_TARGET_PCT: f64 = 1.0;

/// One row: the figure, its value over the runs, the target and the
/// verdict (`None`: no target, a figure to read).
#[derive(Debug, PartialEq)]
pub(super) struct Row {
    pub name: String,
    pub value: String,
    pub target: String,
    pub met: Option<bool>,
}

/// `lo–hi` of `get` over `rs` with `prec` decimals (one value if equal).
pub(in crate::bench) fn range<R>(rs: &[R], get: impl Fn(&R) -> f64, prec: usize) -> String {
    let vals: Vec<f64> = rs.iter().map(get).collect();
    if vals.is_empty() || vals.iter().any(|v| !v.is_finite()) {
        return "—".to_owned();
    }
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if (hi - lo).abs() < 0.5 * 10f64.powi(-(prec as i32)) {
        format!("{lo:.prec$}")
    } else {
        format!("{lo:.prec$}–{hi:.prec$}")
    }
}

/// end ÷ start, 1 when both are 0, infinite from 0 to more.
pub(super) fn growth(start: f64, end: f64) -> f64 {
    if start == 0.0 {
        if end == 0.0 { 1.0 } else { f64::INFINITY }
    } else {
        end / start
    }
}

/// Every row of the section, from the runs.
pub(super) fn rows(rs: &[PlatformResult]) -> Vec<Row> {
    let row = |name: &str, value: String, target: &str, met: Option<bool>| Row {
        name: name.to_owned(),
        value,
        target: target.to_owned(),
        met,
    };
    let all = |f: &dyn Fn(&PlatformResult) -> bool| Some(!rs.is_empty() && rs.iter().all(f));
    let mut out = vec![
        row(
            "aggregator writes conflicted or refused, % of all (likes' and views' transactions)",
            range(rs, |r| r.refused_pct, 2),
            "≤ 1 %",
            all(&|r| r.refused_pct <= REFUSED_TARGET_PCT),
        ),
        row(
            "… transactions sent",
            range(rs, |r| r.transactions as f64, 0),
            "",
            None,
        ),
        row(
            "batches handed back to the event sources",
            range(rs, |r| r.batches_handed_back as f64, 0),
            "0",
            all(&|r| r.batches_handed_back == 0),
        ),
        row(
            "records sent to OnFailure",
            range(rs, |r| r.records_discarded as f64, 0),
            "0",
            all(&|r| r.records_discarded == 0),
        ),
        row(
            "reels whose served likes ≠ their like rows",
            range(
                rs,
                |r| (r.exactness.likes_wrong + r.exactness.unavailable) as f64,
                0,
            ),
            "0 (of every reel touched)",
            all(&|r| r.exactness.likes_wrong == 0 && r.exactness.unavailable == 0),
        ),
        row(
            "reels whose served views ≠ the views taken",
            range(
                rs,
                |r| (r.exactness.views_wrong + r.exactness.unavailable) as f64,
                0,
            ),
            "0 (of every reel touched)",
            all(&|r| r.exactness.views_wrong == 0 && r.exactness.unavailable == 0),
        ),
        row(
            "reels touched",
            range(rs, |r| r.reels_touched as f64, 0),
            "",
            None,
        ),
        row(
            "requests never taken after retries",
            range(rs, |r| r.unsettled as f64, 0),
            "0",
            all(&|r| r.unsettled == 0),
        ),
        row(
            "write units per like, all in",
            range(rs, |r| r.wu_per_like, 3),
            "",
            None,
        ),
        row(
            "read units per like (the aggregator's and the like path's)",
            range(rs, |r| r.ru_per_like, 3),
            "",
            None,
        ),
        row(
            "write units per view, all in",
            range(rs, |r| r.wu_per_view, 4),
            "",
            None,
        ),
        row(
            "read units per view (the aggregator's)",
            range(rs, |r| r.ru_per_view, 4),
            "",
            None,
        ),
    ];
    type Get = fn(&Probes) -> ReadCost;
    let probes: [(&str, Get); 6] = [
        ("cold reel, likes", |p| p.cold_likes),
        ("cold reel, views", |p| p.cold_views),
        ("warm reel, likes", |p| p.warm_likes),
        ("warm reel, views", |p| p.warm_views),
        ("viral reel, likes", |p| p.viral_likes),
        ("viral reel, views", |p| p.viral_views),
    ];
    let target = format!("end ≤ {READ_GROWTH_TARGET}× start");
    for (name, get) in probes {
        let ru = move |r: &PlatformResult| (get(&r.start).read_units, get(&r.end).read_units);
        let items =
            move |r: &PlatformResult| (get(&r.start).items as f64, get(&r.end).items as f64);
        // The proxy counts no `Query` (the views' read): nothing to judge.
        let zero = |r: &PlatformResult| ru(r) == (0.0, 0.0) && items(r) == (0.0, 0.0);
        if !rs.is_empty() && rs.iter().all(zero) {
            out.push(row(
                &format!("uncached read, {name}"),
                "not counted (a `Query`: the proxy counts none)".to_owned(),
                &target,
                None,
            ));
            continue;
        }
        out.push(row(
            &format!("uncached read, {name}: read units start → end"),
            format!(
                "{} → {}",
                range(rs, |r| ru(r).0, 1),
                range(rs, |r| ru(r).1, 1)
            ),
            &target,
            all(&|r| growth(ru(r).0, ru(r).1) <= READ_GROWTH_TARGET),
        ));
        out.push(row(
            &format!("uncached read, {name}: items start → end"),
            format!(
                "{} → {}",
                range(rs, |r| items(r).0, 0),
                range(rs, |r| items(r).1, 0)
            ),
            &target,
            all(&|r| growth(items(r).0, items(r).1) <= READ_GROWTH_TARGET),
        ));
    }
    out.push(row(
        "freshness p50 ms (a like's 200 → in an uncached read)",
        range(rs, |r| r.freshness_p50_ms, 0),
        "",
        None,
    ));
    out.push(row(
        "freshness p99 ms",
        range(rs, |r| r.freshness_p99_ms, 0),
        "",
        None,
    ));
    out
}

/// The section: heading, what ran, the table, the verdicts' summary.
pub(in crate::bench) fn section(opts: &BenchOptions, rs: &[PlatformResult]) -> String {
    let plan = Age::planned(
        opts.platform_rate,
        opts.platform_seconds,
        PLATFORM_STREAM_SHARDS,
        opts.platform_roll_records,
    );
    let seen = range(rs, |r| r.generations_seen, 1);
    let reshards = range(rs, |r| f64::from(r.reshards), 0);
    let likes = range(rs, |r| r.likes as f64, 0);
    let views = range(rs, |r| r.views as f64, 0);
    let mut out = format!(
        "\n{PLATFORM_HEADING}\n\n`likes-local bench` with `BENCH_VARIANTS=platform`, {runs} runs (each cell below is the min–max over them). Stream mode, on a stack of its own: likes and views of reels drawn from a Zipf law (s = {S}) over {reels} reels, plus one viral reel on top taking {viral:.0} % of both, at its default shard count (stream mode counts in the stream shards' writer items, not in shard items); {lanes} virtual stream shards, each aggregated by an instance of its own; the fault proxy's conflict model on (a transaction holds its items {hold} ms before its answer goes out) and DynamoDB's cap of 1,000 write units per key a second; the views through {kin} Kinesis shards (kinesis-mock). Offered: {rate} likes a second from users of their own (unkeyed) and half as many view requests (keyed, {entries} Zipf draws of 1–{maxv} views each) for {secs} s, plus a cold reel liked and viewed {cold} a second and a freshness reel liked {fresh} a second; refused requests are sent again after the load. Taken in the end: {likes} likes and {views} views a run.\n\n\
*Time, compressed.* A DynamoDB stream shard rolls over about every {h} h: {gy} roll-overs of a lineage a year. Here a virtual stream shard rolls over every {roll} records (`BENCH_PLATFORM_ROLL_RECORDS`), so one generation stands for {h} h: the settings plan {pg:.1} generations of each of the {lanes} lineages ({ph:.0} h of AWS's rhythm, {py:.2} % of a year's roll-overs); the runs' streams showed {seen}. The views stream is split and merged once a simulated day (one generation in {gr:.0}, at least once a run): planned {pr}, done {reshards} a run, evenly over the load, each a split of the widest open shard and a merge of its two children a second later. A year does not fit in a run on this machine; the read targets compare the end of this much ageing with its start.\n\n\
*Reads.* The count cache is off (`CACHE_TTL_MS=0`) and each probe read waits out the settings cache first, so each is an uncached read through the API (`GET /reels/{{id}}/likes`, `GET /reels/{{id}}/views`), alone, read twice and the cheaper kept (a read folds the writer items quiet for the settle time, here 1 s, `RECONCILE_STREAM_SETTLE_SECS`, standing for AWS's 10 minutes), counted by the proxy (read units; items read), before the load (after each probe reel was liked and viewed by {seed_users} users, so that every open stream and Kinesis shard carries it, and the viral reel viewed by {viral_viewers} more, so that its unique-viewers sketches are at their full size: the start is a reel every live writer carries, and the end differs from it by age, not by spread) and after the drain: the cold reel, the universe's rank {warm} (warm) and the viral reel. Units per like are every unit of the Counters and Likes tables and of the likes' writer items (`l#…` partitions of the Views table) over the load and the drain ÷ like rows (the reads without the freshness reel's partitions, which the bench's polls read); per view, the rest of the Views table's ÷ views taken. Freshness: from a freshness-reel like's 200 to its count, read through the API every {poll} ms, holding it.\n\n| figure | measured (min–max) | target | met |\n| --- | --- | --- | --- |\n",
        runs = rs.len(),
        reels = thousands(REELS),
        viral = 100.0 * VIRAL_SHARE,
        lanes = PLATFORM_STREAM_SHARDS,
        seed_users = super::SEED_USERS,
        viral_viewers = thousands(super::VIRAL_SEED_VIEWERS as u32),
        hold = CONFLICT_HOLD_MS,
        kin = PLATFORM_KINESIS_SHARDS,
        rate = opts.platform_rate,
        entries = ENTRIES,
        maxv = MAX_VIEWS,
        secs = opts.platform_seconds,
        cold = COLD_RATE,
        fresh = FRESH_RATE,
        h = age::HOURS_PER_GENERATION,
        gy = thousands(age::GENERATIONS_PER_YEAR as u32),
        roll = opts.platform_roll_records,
        pg = plan.generations,
        ph = plan.simulated_hours,
        py = plan.year_pct,
        gr = age::GENERATIONS_PER_RESHARD,
        pr = plan.reshards,
        warm = WARM_RANK,
        poll = FRESH_POLL.as_millis(),
    );
    let rows = rows(rs);
    for r in &rows {
        let met = match r.met {
            None => "",
            Some(true) => "met",
            Some(false) => "**not met**",
        };
        let target = if r.target.is_empty() {
            "—"
        } else {
            r.target.as_str()
        };
        out.push_str(&format!(
            "| {} | {} | {target} | {met} |\n",
            r.name, r.value
        ));
    }
    let judged: Vec<&Row> = rows.iter().filter(|r| r.met.is_some()).collect();
    let missed: Vec<&str> = judged
        .iter()
        .filter(|r| r.met == Some(false))
        .map(|r| r.name.as_str())
        .collect();
    out.push_str(&format!(
        "\nTargets met in every run: {} of {}.{}\n",
        judged.len() - missed.len(),
        judged.len(),
        if missed.is_empty() {
            String::new()
        } else {
            format!(" Not met: {}.", missed.join("; "))
        }
    ));
    let examples: Vec<String> = rs
        .iter()
        .flat_map(|r| r.exactness.examples.iter().take(3))
        .map(|(what, served, truth)| format!("{what}: served {served}, truth {truth}"))
        .collect();
    if !examples.is_empty() {
        out.push_str(&format!("Differences, a few: {}.\n", examples.join("; ")));
    }
    out
}

/// `n` with a comma every three digits.
fn thousands(n: u32) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
