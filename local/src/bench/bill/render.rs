//! The bill's section of BENCHMARKS.md: the prices, what was measured,
//! the log bytes of a like, the three shapes' bills line by line, and the
//! fixed monthly costs.

use super::prices::{Item, TAKEN};
use super::{
    FEED_READS_PER_LIKE, Facts, Line, MONTH_HOURS, PLATFORM_BYTES, Prices, Shape, XRAY_SAMPLED,
    by_function, custom_metrics, find, lines, total,
};
use crate::bench::costs::{CostCell, Mode, Op, Spread, VIEWS_PER_REQUEST};
use anyhow::Result;

/// The heading, which docs/deploying.md links to (`#the-whole-bill`).
pub(crate) const BILL_HEADING: &str = "## The whole bill";

pub(crate) fn section(cells: &[CostCell], facts: &Facts, prices: &Prices) -> Result<String> {
    let on_demand = facts.views_stream_mode != "PROVISIONED";
    let mut out = format!(
        "\n{BILL_HEADING}\n\nDollars per million likes and per million views in {region}, from the cells above: the proxy's DynamoDB units, and what [`likes_local::meter`](local/src/meter.rs) measured of each function invocation (its time in the handler, each invocation rounded up to a whole millisecond as Lambda bills it, × the function's `MemorySize` in template.yaml, arm64 prices; the records of each aggregator batch, whose invocation is shared by them; the bytes the function logged at the template's default log level, {level}, as its JSON subscriber writes them, and its EMF records). Lambda's own `platform.start` and `platform.report` records are an estimate, {platform:.0} bytes an invocation, not measured; the API's access log line is the template's format with values of typical length ({access} bytes). X-Ray ({tracing}) is taken at the default sampling rule's {xray:.0} %. The handler times are the local stack's, under the cells' 16 concurrent requests on this machine with the emulator applying one operation at a time: they include that queueing and lack DynamoDB's few milliseconds a call, so the duration lines are the least transferable (the other lines are counts and sizes and carry over).\n\nShapes: *one viral reel* (the one-reel cells), *long tail* (the breadth cells: every like on a reel of its own, the limit of a Zipf tail over many reels) and *feed-heavy* (the long tail's likes, each with {feed:.0} feed reads of `GET /counts`, {reels} reels a read, every reel uncached: the cost of a read when its instance's cache misses, an upper bound). Likes are unkeyed likes; views come {per} to a `POST /views`. The views stream is billed {mode} (the template's `ViewsStreamMode` default); the other mode's lines are shown in italics, not added.\n\n",
        region = prices.region,
        level = facts.log_level,
        platform = PLATFORM_BYTES,
        access = facts.access_log_bytes(),
        tracing = if facts.tracing {
            "`Tracing: Active`"
        } else {
            "off in the template"
        },
        xray = XRAY_SAMPLED * 100.0,
        feed = FEED_READS_PER_LIKE,
        reels = crate::bench::costs::FEED_REELS,
        per = VIEWS_PER_REQUEST,
        mode = if on_demand {
            "on demand"
        } else {
            "provisioned"
        },
    );
    out.push_str(&like_log_line(cells));
    for shape in Shape::ALL {
        let name = match shape {
            Shape::Viral => "One viral reel",
            Shape::LongTail => "Long tail",
            Shape::FeedHeavy => "Feed-heavy",
        };
        let columns = [
            shape.like(cells, Mode::Transactional, facts)?,
            shape.like(cells, Mode::Stream, facts)?,
            shape.view(cells, facts)?,
        ];
        let priced: Vec<Option<Vec<Line>>> = columns
            .iter()
            .map(|u| u.as_ref().map(|u| lines(u, prices, on_demand)))
            .collect();
        out.push_str(&format!(
            "\n### {name}\n\n| $ per million | likes, transactional | likes, stream | views |\n| --- | --- | --- | --- |\n"
        ));
        let rows = priced.iter().flatten().map(Vec::len).max().unwrap_or(0);
        for r in 0..rows {
            let cells_of: Vec<Option<&Line>> =
                priced.iter().map(|c| c.as_ref().map(|l| &l[r])).collect();
            let Some(first) = cells_of.iter().flatten().next() else {
                continue;
            };
            if cells_of.iter().flatten().all(|l| l.quantity == 0.0) {
                continue;
            }
            let name = if first.in_total {
                first.what.to_owned()
            } else {
                format!("*{}*", first.what)
            };
            out.push_str(&format!("| {name} |"));
            for c in &cells_of {
                out.push_str(&format!(
                    " {} |",
                    c.map_or("—".into(), |l| money(l.dollars))
                ));
            }
            out.push('\n');
        }
        out.push_str("| **total** |");
        for c in &priced {
            out.push_str(&format!(
                " {} |",
                c.as_ref()
                    .map_or("—".into(), |l| format!("**{}**", money(total(l))))
            ));
        }
        out.push('\n');
    }
    out.push_str(&inputs(cells, facts)?);
    out.push_str(&fixed(cells, prices, on_demand));
    out.push_str(&price_table(prices));
    Ok(out)
}

/// Dollars with as many decimals as a small figure needs.
pub(crate) fn money(d: f64) -> String {
    if d == 0.0 {
        "0".to_owned()
    } else if d >= 1.0 {
        format!("{d:.2}")
    } else if d >= 0.01 {
        format!("{d:.3}")
    } else {
        format!("{d:.4}")
    }
}

/// A like's log bytes at the template's level: the measured figure the
/// issue asks for.
fn like_log_line(cells: &[CostCell]) -> String {
    let Some(i) = find(cells, Mode::Transactional, Op::Like, Spread::Breadth)
        .and_then(|c| c.request_invoked.get("like"))
        .filter(|i| i.meter.invocations > 0)
    else {
        return String::new();
    };
    let n = i.meter.invocations as f64;
    let lines = i.meter.log_bytes as f64 / n;
    let emf = i.emf_bytes as f64 / n;
    let measured = if crate::meter::counts_logs() {
        format!("{lines:.0} bytes of `tracing` lines")
    } else {
        "its `tracing` lines not measured (no counting layer in this process)".to_owned()
    };
    format!(
        "**Log bytes per request, a like at the default level (measured):** {total:.0} bytes a like from the like function: {measured} (an ordinary like logs its `request` line, naming its innermost span once; the `write` line only when the write retried or took a path other than applied or already in state) and {emf:.0} bytes of EMF records ({recs:.1} a like); with Lambda's platform records (estimated) {all:.0}.\n",
        total = lines + emf,
        recs = i.emf_records as f64 / n,
        all = lines + emf + PLATFORM_BYTES,
    )
}

/// What was measured, per function, over every cell.
fn inputs(cells: &[CostCell], facts: &Facts) -> Result<String> {
    let mut out = String::from(
        "\nMeasured per function, over every cell (the handler's time, local; billed: each invocation rounded up to 1 ms):\n\n| function | MemorySize MB | invocations | handler ms, mean | billed ms, mean | records a batch | bytes a record | log bytes an invocation (lines + EMF) |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (f, i) in by_function(cells) {
        if f.is_empty() || i.meter.invocations == 0 {
            continue;
        }
        let n = i.meter.invocations as f64;
        let per_record = if i.meter.records > 0 && i.meter.record_bytes > 0 {
            format!(
                "{:.0}",
                i.meter.record_bytes as f64 / i.meter.records as f64
            )
        } else {
            "—".into()
        };
        out.push_str(&format!(
            "| {f} | {:.0} | {} | {:.2} | {:.2} | {} | {per_record} | {:.0} + {:.0} |\n",
            facts.memory_gb(&f)? * 1024.0,
            i.meter.invocations,
            i.meter.seconds * 1000.0 / n,
            i.meter.billed_ms / n,
            if i.meter.records > 0 {
                format!("{:.1}", i.meter.records as f64 / n)
            } else {
                "—".into()
            },
            i.meter.log_bytes as f64 / n,
            i.emf_bytes as f64 / n,
        ));
    }
    Ok(out)
}

/// What is paid by the month whatever the traffic.
fn fixed(cells: &[CostCell], p: &Prices, on_demand: bool) -> String {
    let metrics = custom_metrics(cells);
    let stream = if on_demand {
        format!(
            "the views stream on demand, {} a month ({MONTH_HOURS:.0} stream-hours × ${});",
            money(MONTH_HOURS * p.get(Item::KinesisStreamHour)),
            p.get(Item::KinesisStreamHour)
        )
    } else {
        "the views stream's provisioned shards, in the views column at full use;".to_owned()
    };
    format!(
        "\nPaid by the month, not per request (not in the totals): {stream} {metrics} custom metrics (each name under one set of dimension values, as the cells' EMF records wrote them; a deployment's schedules, reconciliation and errors add more), {} a month at ${} each; the alarms and the dashboard, at CloudWatch's per-alarm and per-dashboard prices.\n",
        money(metrics as f64 * p.get(Item::MetricMonth)),
        p.get(Item::MetricMonth),
    )
}

/// The prices used, with where and when they were taken.
fn price_table(p: &Prices) -> String {
    let mut out = format!(
        "\nPrices ({}; `BENCH_REGION`; first tiers, no free tier, taken {TAKEN}; the table is `local/src/bench/bill/prices.rs`):\n\n| per | $ | source | note |\n| --- | --- | --- | --- |\n",
        p.region
    );
    for r in p.all() {
        out.push_str(&format!(
            "| {} | {} | <{}> | {} |\n",
            r.item.unit(),
            r.dollars,
            r.item.source(),
            if r.note.is_empty() {
                "confirmed"
            } else {
                r.note
            }
        ));
    }
    out
}
