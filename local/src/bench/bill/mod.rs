//! The whole bill (issue 38): dollars per million likes and per million
//! views, line by line, for three traffic shapes, from what the `costs`
//! variant measured (`costs/`: DynamoDB units by the fault proxy; handler
//! time, records per batch and log bytes per invocation by
//! [`crate::meter`]), the template's facts (`facts.rs`: each function's
//! memory, the log level, tracing, the access log) and one table of
//! prices (`prices.rs`, `BENCH_REGION`). `render.rs` writes the section.
//!
//! Per operation (a like, a view, a feed read) the cell's figures become
//! a [`Usage`]: HTTP API requests, Lambda invocations of every function
//! that ran (the aggregators' amortised over the operations of their
//! batches), GB-seconds from each invocation's billed milliseconds (its
//! handler time rounded up to a whole millisecond) × the function's
//! memory, DynamoDB units, Kinesis records and their sizes, and the bytes
//! written to CloudWatch Logs. [`lines`] prices a usage; a shape is a sum
//! of usages ([`Shape`]).

mod facts;
mod prices;
mod render;
#[cfg(test)]
mod tests;

use super::BenchOptions;
use super::costs::{self, CostCell, Invoked, Mode, Op, Spread};
use anyhow::Result;
pub(crate) use facts::Facts;
pub(crate) use prices::{Item, Prices};
use std::collections::BTreeMap;
use std::ops::{Add, Mul};

/// Feed reads (`GET /counts`) per like in the feed-heavy shape.
pub(super) const FEED_READS_PER_LIKE: f64 = 20.0;
/// Bytes of Lambda's own records per invocation with `LogFormat: JSON`
/// (`platform.start` and `platform.report`, with the X-Ray fields of
/// active tracing): an estimate from the shapes of the records in the
/// Lambda Developer Guide, not measured (the local stack has no Lambda).
pub(super) const PLATFORM_BYTES: f64 = 580.0;
/// Share of requests X-Ray's default sampling rule records beyond the
/// first each second (its reservoir): the rate a busy function sees.
pub(super) const XRAY_SAMPLED: f64 = 0.05;
/// Records a second one provisioned Kinesis shard takes in.
pub(super) const SHARD_RECORDS_PER_SEC: f64 = 1000.0;
/// Hours in the month the fixed costs are given for (365 × 24 ÷ 12).
pub(super) const MONTH_HOURS: f64 = 730.0;
const GB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Runs the `costs` variant with the meter on, at the template's log
/// level.
pub(super) async fn measure(opts: &BenchOptions) -> Result<Vec<CostCell>> {
    let facts = Facts::load(&opts.template)?;
    crate::meter::enable(true, &facts.log_level);
    let cells = costs::run_costs(opts).await;
    crate::meter::enable(false, &facts.log_level);
    cells
}

/// The bill's section of the bench's Markdown.
pub(super) fn section(opts: &BenchOptions, cells: &[CostCell]) -> Result<String> {
    let facts = Facts::load(&opts.template)?;
    let prices = Prices::of(&opts.region)?;
    render::section(cells, &facts, &prices)
}

/// What one operation uses of everything billed, in the units of the
/// prices (per operation; [`lines`] scales to a million).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Usage {
    pub api_requests: f64,
    pub invocations: f64,
    pub gb_seconds: f64,
    pub wru: f64,
    pub rru: f64,
    /// Kinesis records, and the KB on-demand bills for them (each record
    /// rounded up to 1 KB), and the PUT payload units (25 KB).
    pub kinesis_records: f64,
    pub kinesis_kb: f64,
    pub put_units: f64,
    /// Bytes into the functions' log groups: their `tracing` lines, EMF
    /// records and Lambda's platform records.
    pub lambda_log_bytes: f64,
    /// Bytes into the API's access log group.
    pub access_log_bytes: f64,
    pub traces: f64,
}

impl Add for Usage {
    type Output = Usage;
    fn add(self, o: Usage) -> Usage {
        Usage {
            api_requests: self.api_requests + o.api_requests,
            invocations: self.invocations + o.invocations,
            gb_seconds: self.gb_seconds + o.gb_seconds,
            wru: self.wru + o.wru,
            rru: self.rru + o.rru,
            kinesis_records: self.kinesis_records + o.kinesis_records,
            kinesis_kb: self.kinesis_kb + o.kinesis_kb,
            put_units: self.put_units + o.put_units,
            lambda_log_bytes: self.lambda_log_bytes + o.lambda_log_bytes,
            access_log_bytes: self.access_log_bytes + o.access_log_bytes,
            traces: self.traces + o.traces,
        }
    }
}

impl Mul<f64> for Usage {
    type Output = Usage;
    fn mul(self, k: f64) -> Usage {
        Usage {
            api_requests: self.api_requests * k,
            invocations: self.invocations * k,
            gb_seconds: self.gb_seconds * k,
            wru: self.wru * k,
            rru: self.rru * k,
            kinesis_records: self.kinesis_records * k,
            kinesis_kb: self.kinesis_kb * k,
            put_units: self.put_units * k,
            lambda_log_bytes: self.lambda_log_bytes * k,
            access_log_bytes: self.access_log_bytes * k,
            traces: self.traces * k,
        }
    }
}

/// One function's invocations of a cell, per operation of the cell
/// (`ops`): an aggregator's batch is shared by the operations of its
/// records.
pub(crate) fn function_usage(i: &Invoked, memory_gb: f64, tracing: bool, ops: f64) -> Usage {
    let m = &i.meter;
    let invocations = m.invocations as f64;
    // Kinesis bills each record by its own size; the meter has their sum,
    // so each is taken at the mean size.
    let (kb, put_units) = if m.records > 0 && m.record_bytes > 0 {
        let mean = m.record_bytes as f64 / m.records as f64;
        let r = m.records as f64;
        (r * (mean / 1024.0).ceil(), r * (mean / 25_600.0).ceil())
    } else {
        (0.0, 0.0)
    };
    let kinesis_records = if m.record_bytes > 0 {
        m.records as f64
    } else {
        0.0
    };
    let bytes = m.log_bytes as f64 + i.emf_bytes as f64 + PLATFORM_BYTES * invocations;
    Usage {
        invocations,
        gb_seconds: m.billed_ms / 1000.0 * memory_gb,
        kinesis_records,
        kinesis_kb: kb,
        put_units,
        lambda_log_bytes: bytes,
        traces: if tracing {
            XRAY_SAMPLED * invocations
        } else {
            0.0
        },
        ..Usage::default()
    } * (1.0 / ops)
}

/// One operation of `cell`, all in: its request, the functions both
/// halves invoked, the DynamoDB units, the access log line.
pub(crate) fn usage(cell: &CostCell, facts: &Facts) -> Result<Usage> {
    let ops = cell.ops();
    let mut u = Usage {
        api_requests: (cell.ok + cell.failed) as f64 / ops,
        wru: cell.total_wu(),
        rru: cell.total_ru(),
        ..Usage::default()
    };
    u.access_log_bytes = u.api_requests * facts.access_log_bytes() as f64;
    for (function, i) in cell.request_invoked.iter().chain(&cell.aggregation_invoked) {
        if function.is_empty() || i.meter.invocations == 0 {
            // EMF records of no invocation (none expected): their bytes
            // still count.
            u.lambda_log_bytes += i.emf_bytes as f64 / ops;
            continue;
        }
        u = u + function_usage(i, facts.memory_gb(function)?, facts.tracing, ops);
    }
    Ok(u)
}

/// One line of a bill: a priced quantity per million operations.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Line {
    pub what: &'static str,
    pub item: Item,
    /// In the price's unit, per million operations.
    pub quantity: f64,
    pub dollars: f64,
    /// Counted in the total (the views stream's other capacity mode is
    /// shown beside, not added).
    pub in_total: bool,
}

/// `u` (per operation) priced per million operations, line by line;
/// Kinesis on demand in the total if `on_demand`, provisioned otherwise.
pub(crate) fn lines(u: &Usage, p: &Prices, on_demand: bool) -> Vec<Line> {
    let m = 1e6;
    let kinesis_gb = u.kinesis_kb * 1024.0 * m / GB;
    let rows: [(&'static str, Item, f64, bool); 12] = [
        (
            "HTTP API requests",
            Item::HttpApiMillion,
            u.api_requests,
            true,
        ),
        (
            "Lambda invocations",
            Item::LambdaMillion,
            u.invocations,
            true,
        ),
        (
            "Lambda duration",
            Item::LambdaArmGbSecond,
            u.gb_seconds * m,
            true,
        ),
        ("DynamoDB writes", Item::WruMillion, u.wru, true),
        ("DynamoDB reads", Item::RruMillion, u.rru, true),
        (
            "Kinesis on demand: data in",
            Item::KinesisGbIn,
            kinesis_gb,
            on_demand,
        ),
        (
            "Kinesis on demand: data out",
            Item::KinesisGbOut,
            kinesis_gb,
            on_demand,
        ),
        (
            "Kinesis provisioned: PUT payload units",
            Item::KinesisPutUnitsMillion,
            u.put_units,
            !on_demand,
        ),
        (
            "Kinesis provisioned: shard-hours (shards full)",
            Item::KinesisShardHour,
            u.kinesis_records * m / (SHARD_RECORDS_PER_SEC * 3600.0),
            !on_demand,
        ),
        (
            "CloudWatch Logs: functions (lines, EMF, platform)",
            Item::LambdaLogsGb,
            u.lambda_log_bytes * m / GB,
            true,
        ),
        (
            "CloudWatch Logs: API access log",
            Item::LogsGb,
            u.access_log_bytes * m / GB,
            true,
        ),
        ("X-Ray traces", Item::XrayMillion, u.traces, true),
    ];
    rows.into_iter()
        .map(|(what, item, quantity, in_total)| Line {
            what,
            item,
            quantity,
            dollars: quantity * p.get(item),
            in_total,
        })
        .collect()
}

/// The sum of the lines counted in the total.
pub(crate) fn total(lines: &[Line]) -> f64 {
    lines.iter().filter(|l| l.in_total).map(|l| l.dollars).sum()
}

/// The three traffic shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// One viral reel: every like and view on it (the one-reel cells).
    Viral,
    /// The long tail: every operation on a reel of its own (the breadth
    /// cells: a Zipf tail's limit, no two records of a batch on one reel).
    LongTail,
    /// The long tail's likes with [`FEED_READS_PER_LIKE`] feed reads each.
    FeedHeavy,
}

impl Shape {
    pub(crate) const ALL: [Shape; 3] = [Shape::Viral, Shape::LongTail, Shape::FeedHeavy];

    fn spread(self) -> Spread {
        match self {
            Shape::Viral => Spread::Viral,
            Shape::LongTail | Shape::FeedHeavy => Spread::Breadth,
        }
    }

    /// One like (unkeyed) of this shape in `mode`, reads included; None
    /// if a cell it needs was not measured.
    pub(crate) fn like(self, cells: &[CostCell], mode: Mode, f: &Facts) -> Result<Option<Usage>> {
        let Some(like) = find(cells, mode, Op::Like, self.spread()) else {
            return Ok(None);
        };
        let mut u = usage(like, f)?;
        if self == Shape::FeedHeavy {
            let Some(read) = find(cells, mode, Op::Read, Spread::Breadth) else {
                return Ok(None);
            };
            u = u + usage(read, f)? * FEED_READS_PER_LIKE;
        }
        Ok(Some(u))
    }

    /// One view of this shape.
    pub(crate) fn view(self, cells: &[CostCell], f: &Facts) -> Result<Option<Usage>> {
        find(cells, Mode::Views, Op::View, self.spread())
            .map(|c| usage(c, f))
            .transpose()
    }
}

pub(crate) fn find(cells: &[CostCell], mode: Mode, op: Op, spread: Spread) -> Option<&CostCell> {
    cells
        .iter()
        .find(|c| c.mode == mode && c.op == op && c.spread == spread)
}

/// Every distinct custom metric the cells' EMF records wrote.
pub(crate) fn custom_metrics(cells: &[CostCell]) -> usize {
    let mut all = std::collections::BTreeSet::new();
    for c in cells {
        for i in c
            .request_invoked
            .values()
            .chain(c.aggregation_invoked.values())
        {
            all.extend(i.emf_metrics.iter().cloned());
        }
    }
    all.len()
}

/// Per function of `cells`: invocations, billed ms and log bytes summed
/// (for the measured-inputs table).
pub(crate) fn by_function(cells: &[CostCell]) -> BTreeMap<String, Invoked> {
    let mut out: BTreeMap<String, Invoked> = BTreeMap::new();
    for c in cells {
        for (f, i) in c.request_invoked.iter().chain(&c.aggregation_invoked) {
            let o = out.entry(f.clone()).or_default();
            o.meter.invocations += i.meter.invocations;
            o.meter.seconds += i.meter.seconds;
            o.meter.billed_ms += i.meter.billed_ms;
            o.meter.records += i.meter.records;
            o.meter.record_bytes += i.meter.record_bytes;
            o.meter.log_bytes += i.meter.log_bytes;
            o.emf_bytes += i.emf_bytes;
            o.emf_records += i.emf_records;
        }
    }
    out
}
