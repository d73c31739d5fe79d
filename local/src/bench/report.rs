//! The Markdown the bench prints: one line of what was offered, the table
//! of medians (with min–max over the runs) per variant, whether every run
//! was exact, and the stream-at-scale variants' own small table against
//! issue 21's target. `scripts/benchmarks.sh` puts it into BENCHMARKS.md
//! as it is, so its format is that file's.

use super::costs::{self, CostCell, Mode, Op, Spread};
use super::variant::{
    CONFLICT_HOLD_MS, SCALE_FROM, SCALE_TO, STREAM_SHARDS, VIEWS_SHARDS, Variant,
};
use super::views::{VIEWS_PER_REQUEST, ViewsResult, WARMUP};
use super::{BACKGROUND_REELS, BenchOptions, RunResult};
use std::collections::BTreeMap;

/// The table of `results` (variant → its runs), columns in name order.
pub(super) fn markdown(opts: &BenchOptions, results: &BTreeMap<String, Vec<RunResult>>) -> String {
    type Get = fn(&RunResult) -> f64;
    let rows: [(&str, Get, usize); 20] = [
        (
            "accepted likes/s (offered)",
            |r| r.accepted_likes_per_sec,
            1,
        ),
        ("refused % (whole run)", |r| r.refused_pct, 1),
        ("refused % (second half)", |r| r.refused_pct_second_half, 1),
        ("latency p50 ms", |r| r.latency_p50_ms, 1),
        ("latency p99 ms", |r| r.latency_p99_ms, 1),
        ("busiest key WCU/s", |r| r.busiest_key_wcu_per_sec, 0),
        ("shards when the load ends", |r| r.shards as f64, 0),
        (
            "ceiling likes/s (shards × cap ÷ units)",
            |r| r.ceiling_likes_per_sec,
            0,
        ),
        ("offered ÷ ceiling", |r| r.offered_to_ceiling, 2),
        (
            "WCU per viral like (keyed, but stream: none)",
            |r| r.wcu_per_viral_like,
            2,
        ),
        (
            "WCU per background like (no key)",
            |r| r.wcu_per_background_like,
            2,
        ),
        ("RCU per feed read (10 reels)", |r| r.rcu_per_read, 2),
        (
            "freshness p50 ms (answer → in the shards)",
            |r| r.freshness_p50_ms,
            0,
        ),
        ("freshness p99 ms", |r| r.freshness_p99_ms, 0),
        ("shard reads/s", |r| r.shard_reads_per_sec, 0),
        (
            "shard reads/s without a cache (equiv.)",
            |r| r.shard_reads_per_sec_uncached_equiv,
            0,
        ),
        (
            "stored − offered, after client retries",
            |r| (r.final_count - r.acknowledged) as f64,
            0,
        ),
        (
            "$ per million viral likes",
            |r| r.dollars_per_million_likes,
            3,
        ),
        (
            "$ per million background likes",
            |r| r.dollars_per_million_background_likes,
            3,
        ),
        (
            "$ per million feed reads",
            |r| r.dollars_per_million_reads,
            3,
        ),
    ];
    let mut out = String::new();
    out.push_str(&format!(
        "Offered: {:.0} likes/s on one reel from distinct users ({:.0}/s for `stream`, {:.0}/s for `stream-scale` and `stream-scale-mixed`), {:.0} likes/s on {} background reels (none in `stream-scale`), {:.0} feed reads/s (10 reels each); {:.0} s per variant, {} runs; write cap {:.0} units per key per second; fixed variants {} shards. Medians, with min–max over the runs; — where a figure does not apply.\n\n",
        opts.viral_rate,
        opts.stream_rate,
        opts.stream_scale_rate,
        opts.background_rate,
        BACKGROUND_REELS,
        opts.read_rate,
        opts.seconds,
        opts.runs,
        opts.write_cap,
        opts.fixed_shards
    ));
    let columns: Vec<(&str, &[RunResult])> = results
        .iter()
        .map(|(v, rs)| (v.as_str(), rs.as_slice()))
        .collect();
    out.push_str(&columns_table(&rows, &columns));
    let exact = results.values().flatten().all(|r| r.exact);
    out.push_str(&format!(
        "\nEvery run exact (stored count = acknowledged likes): {}.\n",
        if exact { "yes" } else { "NO" }
    ));
    let scale: Vec<(Variant, &[RunResult])> = Variant::ALL
        .into_iter()
        .filter(|v| v.is_scale())
        .filter_map(|v| results.get(v.as_str()).map(|rs| (v, rs.as_slice())))
        .collect();
    if !scale.is_empty() {
        out.push_str(&scale_table(&scale));
    }
    out
}

/// A table row: its name, the figure of one run, and its decimals.
type Row<'a, T> = (&'a str, fn(&T) -> f64, usize);

/// A Markdown table: one row per [`Row`] of `rows`, one column per
/// `(heading, runs)` of `columns`, each cell [`cell`].
fn columns_table<T>(rows: &[Row<'_, T>], columns: &[(&str, &[T])]) -> String {
    let mut out = String::from("| metric |");
    for (head, _) in columns {
        out.push_str(&format!(" {head} |"));
    }
    out.push_str("\n| --- |");
    for _ in columns {
        out.push_str(" --- |");
    }
    out.push('\n');
    for (name, get, prec) in rows {
        out.push_str(&format!("| {name} |"));
        for (_, rs) in columns {
            out.push_str(&format!(" {} |", cell(rs, *get, *prec)));
        }
        out.push('\n');
    }
    out
}

/// One cell: the median of `get` over `rs` with its min–max if they
/// differ, or — if any run has no such figure (NaN).
fn cell<T>(rs: &[T], get: fn(&T) -> f64, prec: usize) -> String {
    let vals: Vec<f64> = rs.iter().map(get).collect();
    let (lo, hi) = vals
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(*x), b.max(*x))
        });
    let m = median(vals.clone());
    if vals.is_empty() || vals.iter().any(|v| !v.is_finite()) {
        "—".to_owned()
    } else if (hi - lo).abs() < 1e-9 {
        format!("{m:.prec$}")
    } else {
        format!("{m:.prec$} ({lo:.prec$}–{hi:.prec$})")
    }
}

/// The stream-at-scale variants' figures (each with its runs), and
/// whether every run met issue 21's target: at most 1 % of the
/// aggregator's transactions conflicted, no record sent to `OnFailure`,
/// exact, the resize completed. `stream-scale` is the setting, one
/// viral reel, judged over all its transactions; `stream-scale-mixed` adds
/// the background reels, judged on the viral reel's shards with the share
/// over all its transactions shown beside. Their freshness and rates are
/// their columns in the table above.
fn scale_table(variants: &[(Variant, &[RunResult])]) -> String {
    type Get = fn(&RunResult) -> f64;
    let rows: [(&str, Get, usize); 7] = [
        (
            "aggregator transactions conflicted %",
            |r| r.aggregator_conflicted_pct,
            2,
        ),
        (
            "… on the viral reel's shards %",
            |r| r.viral_conflicted_pct,
            2,
        ),
        ("batches delivered again", |r| r.batches_retried, 0),
        ("… of them partly applied first", |r| r.batches_partial, 0),
        ("records sent to OnFailure", |r| r.records_discarded, 0),
        (
            "resize requests refused before one got through",
            |r| r.resize_refused,
            0,
        ),
        (
            "resize completed, s after the load started",
            |r| r.resize_done_s,
            1,
        ),
    ];
    let mut out = format!(
        "\nStream mode at scale: {STREAM_SHARDS} stream shards, the conflict model on (a transaction holds its items {CONFLICT_HOLD_MS} ms before its answer goes out), the viral reel grown {SCALE_FROM} → {SCALE_TO} shards halfway through the load (completed by the scheduled resharder; waited for after the load if need be). `stream-scale` is issue 21's setting, the viral reel alone; `stream-scale-mixed` adds the background reels' likes.\n\n"
    );
    let columns: Vec<(&str, &[RunResult])> =
        variants.iter().map(|(v, rs)| (v.as_str(), *rs)).collect();
    out.push_str(&columns_table(&rows, &columns));
    let yes = |b: bool| if b { "yes" } else { "NO" };
    // Nothing lost or counted twice, and the resize done: both variants.
    let sound =
        |r: &RunResult| r.records_discarded == 0.0 && r.exact && r.resize_done_s.is_finite();
    out.push('\n');
    for (v, rs) in variants {
        let line = match v {
            Variant::StreamScaleMixed => format!(
                "`{v}`: ≤ 1 % of the aggregator's transactions conflicted on the viral reel's shards, 0 to OnFailure, exact, resized, in every run: {}. ≤ 1 % of all its transactions, the background reels' included: {} (docs/counting.md, \"What a conflict is worth\").\n",
                yes(rs.iter().all(|r| sound(r) && r.viral_conflicted_pct <= 1.0)),
                yes(rs.iter().all(|r| r.aggregator_conflicted_pct <= 1.0)),
            ),
            _ => format!(
                "`{v}`: target (≤ 1 % of the aggregator's transactions conflicted, 0 to OnFailure, exact, resized) met in every run: {}.\n",
                yes(rs
                    .iter()
                    .all(|r| sound(r) && r.aggregator_conflicted_pct <= 1.0)),
            ),
        };
        out.push_str(&line);
    }
    out
}

/// The `views` variant's table (its runs `rs`): figures, not a verdict
/// (the cost target, ≤ 0.05 write units per view, is shown next to them).
pub(super) fn views_table(opts: &BenchOptions, rs: &[ViewsResult]) -> String {
    type Get = fn(&ViewsResult) -> f64;
    let rows: [(&str, Get, usize); 23] = [
        ("requests/s accepted (202)", |r| r.requests_per_sec, 0),
        ("views/s accepted", |r| r.views_per_sec, 0),
        ("accepted % (202 of all answers)", |r| r.accepted_pct, 2),
        ("latency p50 ms (202)", |r| r.latency_p50_ms, 1),
        ("latency p99 ms (202)", |r| r.latency_p99_ms, 1),
        (
            "freshness p50 ms (202 → in the table)",
            |r| r.freshness_p50_ms,
            0,
        ),
        ("freshness p99 ms", |r| r.freshness_p99_ms, 0),
        ("drain s (after the load)", |r| r.drain_seconds, 1),
        (
            "WCU per view, sized (2 per KB per item)",
            |r| r.wcu_per_view_sized,
            4,
        ),
        (
            "WCU per view, as the proxy counts",
            |r| r.wcu_per_view_proxy,
            4,
        ),
        ("WCU per chunk, sized", |r| r.wcu_sized_per_chunk, 1),
        (
            "viral partition WCU/s, most (proxy)",
            |r| r.viral_key_max_wcu_per_sec,
            0,
        ),
        ("chunks applied", |r| r.chunks as f64, 0),
        ("records per chunk, mean", |r| r.records_per_chunk_mean, 1),
        ("records per chunk, max", |r| r.records_per_chunk_max, 0),
        (
            "records per invocation, mean",
            |r| r.records_per_invocation,
            1,
        ),
        (
            "records put again by the producer",
            |r| r.producer_retries as f64,
            0,
        ),
        ("batches delivered again", |r| r.batches_retried as f64, 0),
        (
            "records sent to OnFailure",
            |r| r.records_discarded as f64,
            0,
        ),
        ("unique viewers, true", |r| r.unique_viewers_true as f64, 0),
        (
            "unique viewers, estimate",
            |r| r.unique_viewers_estimate as f64,
            0,
        ),
        ("unique viewers, error %", |r| r.unique_viewers_error_pct, 2),
        (
            "stored − accepted views, after the drain",
            |r| r.stored_views as f64 - r.accepted_views as f64,
            0,
        ),
    ];
    let (lo, hi) = VIEWS_PER_REQUEST;
    let mut out = format!(
        "\n`views`: one viral reel's views through `POST /views` → Kinesis ({VIEWS_SHARDS} shards) → the views aggregator → the views table; {} closed-loop workers for {:.0} s, each request {lo}–{hi} views from one of {} viewers, with an `Idempotency-Key` (refused ones sent again after the load), after a {}-second warm-up on another reel. Medians, with min–max over the runs.\n\n| metric | views |\n| --- | --- |\n",
        opts.views_workers,
        opts.seconds,
        opts.views_viewers,
        WARMUP.as_secs()
    );
    for (name, get, prec) in rows {
        out.push_str(&format!("| {name} | {} |\n", cell(rs, get, prec)));
    }
    let exact = rs.iter().all(|r| r.exact);
    let cheap = rs.iter().all(|r| r.wcu_per_view_sized <= 0.05);
    let yes = |b: bool| if b { "yes" } else { "NO" };
    out.push_str(&format!(
        "\nEvery run exact (table = accepted = read views): {}. At most 0.05 write units per view (sized) in every run: {}.\n",
        yes(exact),
        yes(cheap)
    ));
    out
}

/// The heading of the `costs` variant's section: `scripts/benchmarks.sh`
/// cuts the bench's output at it and gives the section a place of its
/// own in BENCHMARKS.md, which docs/counting.md and docs/views.md link
/// to (`#cost-per-operation-all-in`).
pub(super) const COSTS_HEADING: &str = "## Cost per operation, all in";

/// The `costs` variant's section: its heading, what a row is, and one
/// row per cell with the request path's and the aggregation's units per
/// operation, their totals, and docs/counting.md's arithmetic beside
/// them.
pub(super) fn costs_table(cells: &[CostCell]) -> String {
    let mut out = format!(
        "\n{COSTS_HEADING}\n\n`likes-local bench` with `BENCH_VARIANTS=costs`: DynamoDB capacity units per operation, as the fault proxy counted them (no fault injected, no cap reached), on the machine and commit at the top of this file. Each mode on a stack of its own; each cell alone: {ops} operations through the HTTP API, at breadth (one on each of {ops} reels) or on one viral reel; an unlike removes a like of the like cell of its spread with the same key-ness; each cell starts once the read caches of the cell before it have expired. *Request* is what the proxy counted from the first request to the last answer, with the event sources paused (the row, the key's record, the shard in transactional mode, the settings read); *aggregation* is what it counted from then until the sources had drained (the aggregator's transactions and checkpoints, the views' seen items, and the reads they make). Views go through the views pipeline (the same in both modes), {per} views a request, keyed, figures per view; their request path writes Kinesis, not DynamoDB, and the proxy charges a transactional item 2 units whatever its size, so the views' sketch items (about 2.1 KB, 6 units each) are undercounted here (the `views` variant's *sized* figure is the upper bound). *Arithmetic* is docs/counting.md's for the cell's writes: 2 units a transactional item, 1 a plain write, 2 × (1 + reels) a stream-mode chunk ({chunk} reels a chunk at breadth, one chunk per {batch} records on one reel). One run: units are counts, not timings.\n\n| mode | operation | spread | ok (failed) | WU/op request | RU/op request | WU/op aggregation | RU/op aggregation | total WU/op | total RU/op | arithmetic WU/op |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        ops = thousands(costs::OPS),
        per = costs::VIEWS_PER_REQUEST,
        chunk = costs::CHUNK_REELS,
        batch = thousands(costs::BATCH_RECORDS as u32),
    );
    for c in cells {
        let mode = match c.mode {
            Mode::Transactional => "transactional",
            Mode::Stream => "stream",
            Mode::Views => "views (either)",
        };
        let op = match c.op {
            Op::Like => "like",
            Op::KeyedLike => "like, keyed",
            Op::Unlike => "unlike",
            Op::KeyedUnlike => "unlike, keyed",
            Op::View => "view",
            Op::Read => "feed read (10 reels, uncached)",
        };
        let spread = match c.spread {
            Spread::Breadth => "breadth",
            Spread::Viral => "one reel",
        };
        let arithmetic = c
            .arithmetic_wu()
            .map_or_else(|| "—".to_owned(), |a| format!("{a:.3}"));
        out.push_str(&format!(
            "| {mode} | {op} | {spread} | {} ({}) | {:.3} | {:.3} | {:.3} | {:.3} | **{:.3}** | {:.3} | {arithmetic} |\n",
            c.ok,
            c.failed,
            c.request_wu(),
            c.request_ru(),
            c.aggregation_wu(),
            c.aggregation_ru(),
            c.total_wu(),
            c.total_ru(),
        ));
    }
    out
}

/// `n` with a comma every three digits, as the prose around it writes
/// numbers.
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

/// The median of `v` (the mean of the middle two for an even count), 0 if
/// empty.
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{test_options, test_result};

    /// A run of `v` whose viral shards saw `viral` % conflicted, and all
    /// its transactions `all` %.
    fn scale_run(v: Variant, all: f64, viral: f64, discarded: f64, done: f64) -> RunResult {
        RunResult {
            aggregator_conflicted_pct: all,
            viral_conflicted_pct: viral,
            batches_retried: 3.0,
            batches_partial: 1.0,
            records_discarded: discarded,
            resize_refused: 0.0,
            resize_done_s: done,
            ..test_result(v)
        }
    }

    fn table(scale: Vec<(Variant, Vec<RunResult>)>) -> String {
        let mut results = BTreeMap::new();
        results.insert("stream".to_owned(), vec![test_result(Variant::Stream)]);
        for (v, runs) in scale {
            results.insert(v.as_str().to_owned(), runs);
        }
        markdown(&test_options(), &results)
    }

    #[test]
    fn stream_at_scale_has_its_own_table_against_its_target() {
        use Variant::{StreamScale as Solo, StreamScaleMixed as Mixed};
        let t = table(vec![
            (
                Solo,
                vec![
                    scale_run(Solo, 0.5, 0.5, 0.0, 12.0),
                    scale_run(Solo, 1.0, 1.0, 0.0, 14.0),
                ],
            ),
            (Mixed, vec![scale_run(Mixed, 4.0, 0.5, 0.0, 15.0)]),
        ]);
        assert!(
            t.contains("| metric | stream-scale | stream-scale-mixed |"),
            "{t}"
        );
        assert!(
            t.contains("| aggregator transactions conflicted % | 0.75 (0.50–1.00) | 4.00 |"),
            "{t}"
        );
        assert!(t.contains("| … on the viral reel's shards % | 0.75 (0.50–1.00) | 0.50 |"));
        assert!(t.contains("| records sent to OnFailure | 0 | 0 |"));
        assert!(
            t.contains("| resize completed, s after the load started | 13.0 (12.0–14.0) | 15.0 |")
        );
        assert!(t.contains("`stream-scale`: target (≤ 1 % of the aggregator's transactions conflicted, 0 to OnFailure, exact, resized) met in every run: yes."));
        assert!(t.contains("conflicted on the viral reel's shards, 0 to OnFailure, exact, resized, in every run: yes. ≤ 1 % of all its transactions, the background reels' included: NO"));
        // In the main table their figures are their columns; the others' are —.
        assert!(!t.contains("conflicted % | —"));
        // issue 21's variant is judged over all its transactions.
        for bad in [
            scale_run(Solo, 1.5, 0.5, 0.0, 12.0),
            scale_run(Solo, 0.5, 0.5, 2.0, 12.0),
            scale_run(Solo, 0.5, 0.5, 0.0, f64::NAN),
            RunResult {
                exact: false,
                ..scale_run(Solo, 0.5, 0.5, 0.0, 12.0)
            },
        ] {
            assert!(table(vec![(Solo, vec![bad])]).contains("met in every run: NO."));
        }
        let mixed = |r| table(vec![(Mixed, vec![r])]);
        assert!(mixed(scale_run(Mixed, 0.8, 0.5, 0.0, 12.0)).contains(
            "in every run: yes. ≤ 1 % of all its transactions, the background reels' included: yes"
        ));
        assert!(mixed(scale_run(Mixed, 3.0, 1.5, 0.0, 12.0)).contains("in every run: NO. "));
        // The background reels: none offered in issue 21's variant.
        assert!(t.contains("(none in `stream-scale`)"));
        // Without either variant, no such table.
        assert!(!table(Vec::new()).contains("conflicted"));
    }

    #[test]
    fn views_have_their_own_table() {
        let r = ViewsResult {
            views_per_sec: 4000.0,
            wcu_per_view_sized: 0.02,
            exact: true,
            ..crate::bench::views::test_views_result()
        };
        let t = views_table(&test_options(), &[r.clone(), r]);
        assert!(t.contains("| views/s accepted | 4000 |"), "{t}");
        assert!(t.contains("exact (table = accepted = read views): yes"));
        assert!(t.contains("per view (sized) in every run: yes"));
    }

    #[test]
    fn costs_have_their_own_section_one_row_a_cell() {
        let cells = [
            crate::bench::costs::tests::cell(Mode::Stream, Op::Like, Spread::Breadth),
            crate::bench::costs::tests::cell(Mode::Views, Op::View, Spread::Viral),
        ];
        let t = costs_table(&cells);
        // Its own heading, which the script cuts at and the docs link to.
        assert!(t.starts_with("\n## Cost per operation, all in\n"), "{t}");
        assert!(t.contains("| mode | operation | spread | ok (failed) | WU/op request |"));
        // 1,000 likes: 1,000 units of rows, 2,042 of aggregation, 21 of
        // its reads; the arithmetic is counting.md's 1 + 2 + 2 ÷ 49.
        assert!(
            t.contains("| stream | like | breadth | 1000 (0) | 1.000 | 0.000 | 2.042 | 0.021 | **3.042** | 0.021 | 3.041 |"),
            "{t}"
        );
        // Views: per view (10 a request), no counting.md arithmetic.
        assert!(
            t.contains("| views (either) | view | one reel | 1000 (0) | 0.100 | 0.000 | 0.204 | 0.002 | **0.304** | 0.002 | — |"),
            "{t}"
        );
        assert_eq!(t.lines().filter(|l| l.starts_with("| ")).count(), 2 + 2);
        assert!(t.contains("one on each of 1,000 reels"));
        assert_eq!(
            [thousands(7), thousands(1000), thousands(1234567)],
            ["7", "1,000", "1,234,567"]
        );
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
