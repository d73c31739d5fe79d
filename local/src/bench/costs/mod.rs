//! The `costs` variant (issue 35): what each operation costs in DynamoDB
//! units, all in, as the fault proxy counts them. Per counting mode, on a
//! stack of its own: an unkeyed and a keyed like, an unkeyed and a keyed
//! unlike, each at breadth (one operation on each of [`OPS`] reels: the
//! long tail, where no two records of a chunk share a reel) and on one
//! viral reel ([`OPS`] operations on it); and views, through the views
//! pipeline, at breadth and on one reel (the views pipeline does not
//! depend on `COUNTING`, so they run once, on the transactional stack).
//!
//! Every cell is measured alone, in two halves: with the event sources
//! paused, the proxy's counters reset, the requests sent and answered,
//! their units read (the request path: the row, the key's record, the
//! shard, the settings it reads); then the counters reset again, the
//! sources let go and drained, and the units read again (the aggregation:
//! its transactions, checkpoints, seen items and the reads it makes).
//! Pausing is also what makes the spreads what they say: the aggregator
//! gets the cell's records in full batches, so at breadth every chunk
//! holds [`CHUNK_REELS`] reels of one record each and on the viral reel
//! one chunk holds a whole batch. Each cell starts once the read caches
//! the cell before it filled have expired, so its reads are its own. The
//! figures are counts, not timings: the variant runs once per bench,
//! whatever `BENCH_RUNS` says.
//!
//! Each half also reads what Lambda would bill ([`crate::meter`]): per
//! function, the invocations, their time in the handler, the records of
//! their events and the bytes they logged, with the bytes of their EMF
//! metric records (the stacks keep those in memory, `METRICS=memory`);
//! and a [`Op::Read`] cell per mode measures a feed read (`GET /counts`
//! of [`FEED_REELS`] reels, every reel uncached). `bill/` makes dollars of
//! it all.

mod send;
#[cfg(test)]
pub(super) mod tests;

use super::BenchOptions;
use super::variant::{COSTS_CACHES_COLD, costs_env};
use crate::stack::{Stack, StackOptions};
use anyhow::{Context, Result, anyhow};
use send::{Request, send_all};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Operations per cell: at breadth also its reels. Enough that one
/// chunk's checkpoint or one cold settings read moves a per-operation
/// figure by a thousandth.
pub(super) const OPS: u32 = 1000;
/// Views one `POST /views` carries in the views cells (a viewer's few
/// seconds of watching, as the `views` variant sends them).
pub(super) const VIEWS_PER_REQUEST: u32 = 10;
/// `AGGREGATE_CHUNK_REELS`' default: reels one aggregation chunk holds.
pub(super) const CHUNK_REELS: f64 = 49.0;
/// The aggregator's `BatchSize` in the template: records one batch holds.
pub(super) const BATCH_RECORDS: f64 = 1000.0;
/// Reels one feed read (`GET /counts`) of the read cells asks for.
pub(super) const FEED_REELS: u32 = 10;

/// Which stack a cell ran on, and so which path it measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `COUNTING=transactional`: the request path writes everything.
    Transactional,
    /// `COUNTING=stream`: the request path writes the row (and key), the
    /// aggregator the shards.
    Stream,
    /// The views pipeline, the same in both modes.
    Views,
}

/// What a cell's requests do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// `PUT /reels/{id}/like`, no `Idempotency-Key`.
    Like,
    /// ... with one.
    KeyedLike,
    /// `DELETE /reels/{id}/like` of an earlier cell's like, no key.
    Unlike,
    /// ... with one.
    KeyedUnlike,
    /// `POST /views` of [`VIEWS_PER_REQUEST`] views, keyed; its figures
    /// are per view.
    View,
    /// `GET /counts` of [`FEED_REELS`] reels no request has read before
    /// (a feed screen, its cache missed): per feed read.
    Read,
}

/// How a cell's operations are spread over reels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spread {
    /// One operation on each of [`OPS`] reels.
    Breadth,
    /// All [`OPS`] on one reel.
    Viral,
}

/// Capacity units the proxy counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Units {
    /// Write capacity units.
    pub write: f64,
    /// Read capacity units.
    pub read: f64,
}

impl Units {
    /// What `stats` counted. `+ 0.0`: the sum of no operation is −0,
    /// which the table would print as "-0.000".
    fn of(stats: &faultproxy::Stats) -> Units {
        Units {
            write: stats.total_write_units() + 0.0,
            read: stats.total_read_units() + 0.0,
        }
    }
}

/// One cell: an operation at one spread in one mode, and what it cost.
#[derive(Clone, Debug, Serialize)]
pub struct CostCell {
    pub mode: Mode,
    pub op: Op,
    pub spread: Spread,
    /// Requests answered with a success: what the units are shared by.
    pub ok: u64,
    /// ... and not (expected 0: no fault is injected).
    pub failed: u64,
    /// Operations one request carries (views per request; 1 otherwise).
    pub per_request: u32,
    /// The request path's units: with the event sources paused, from the
    /// first request to the last answer.
    pub request: Units,
    /// The aggregation's: from then to the sources drained.
    pub aggregation: Units,
    /// DynamoDB calls of each half, by operation (what the units came
    /// from, for whoever must explain a figure).
    pub request_calls: BTreeMap<String, u64>,
    /// ... and of the aggregation's half.
    pub aggregation_calls: BTreeMap<String, u64>,
    /// What each function's invocations of the request half cost in
    /// Lambda's terms, by function name.
    pub request_invoked: BTreeMap<String, Invoked>,
    /// ... and of the aggregation's half.
    pub aggregation_invoked: BTreeMap<String, Invoked>,
}

/// One function's invocations in one half of a cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Invoked {
    /// What the meter counted.
    #[serde(flatten)]
    pub meter: crate::meter::FunctionStats,
    /// Bytes of the EMF metric records the function wrote (newlines
    /// included).
    pub emf_bytes: u64,
    /// ... and those records.
    pub emf_records: u64,
    /// The custom metrics they wrote (`Function=like/Requests`: a name
    /// under one set of dimension values is one metric to CloudWatch).
    pub emf_metrics: std::collections::BTreeSet<String>,
}

impl CostCell {
    /// Operations the units are shared by: views for the views cells.
    pub(super) fn ops(&self) -> f64 {
        (self.ok * u64::from(self.per_request)).max(1) as f64
    }
    /// Write units per operation on the request path; the five below
    /// alike, per their half and kind of unit.
    pub fn request_wu(&self) -> f64 {
        self.request.write / self.ops()
    }
    pub fn request_ru(&self) -> f64 {
        self.request.read / self.ops()
    }
    pub fn aggregation_wu(&self) -> f64 {
        self.aggregation.write / self.ops()
    }
    pub fn aggregation_ru(&self) -> f64 {
        self.aggregation.read / self.ops()
    }
    pub fn total_wu(&self) -> f64 {
        self.request_wu() + self.aggregation_wu()
    }
    pub fn total_ru(&self) -> f64 {
        self.request_ru() + self.aggregation_ru()
    }

    /// docs/counting.md's arithmetic for the cell's write units per
    /// operation, all in (None for views, whose docs/views.md arithmetic
    /// is per chunk of a full stream shard, not per request). A
    /// transactional item is 2 units, a plain write 1; in stream mode an
    /// aggregation chunk is 2 × (1 + its reels): at breadth a chunk of
    /// [`CHUNK_REELS`] reels of one record each, 2 + 2 ÷ 49 per record;
    /// on the viral reel one chunk per batch of [`BATCH_RECORDS`], 4 ÷
    /// 1,000.
    pub fn arithmetic_wu(&self) -> Option<f64> {
        let request = match (self.mode, self.op) {
            (Mode::Views, _) | (_, Op::View | Op::Read) => return None,
            (Mode::Transactional, Op::Like | Op::Unlike) => 4.0,
            (Mode::Transactional, Op::KeyedLike | Op::KeyedUnlike) => 6.0,
            (Mode::Stream, Op::Like) => 1.0,
            (Mode::Stream, Op::Unlike) => 2.0,
            (Mode::Stream, Op::KeyedLike | Op::KeyedUnlike) => 4.0,
        };
        let aggregation = match (self.mode, self.spread) {
            (Mode::Stream, Spread::Breadth) => 2.0 + 2.0 / CHUNK_REELS,
            (Mode::Stream, Spread::Viral) => 4.0 / BATCH_RECORDS.min(f64::from(OPS)),
            _ => 0.0,
        };
        Some(request + aggregation)
    }
}

/// Runs the variant: each mode on its own stack, the views on the
/// transactional one; every cell, in order.
pub(super) async fn run_costs(opts: &BenchOptions) -> Result<Vec<CostCell>> {
    let mut cells = Vec::new();
    for mode in [Mode::Transactional, Mode::Stream] {
        let views = mode == Mode::Transactional;
        let mut so = StackOptions::isolated(opts.template.clone());
        so.views = views;
        so.env.extend(costs_env(mode == Mode::Stream, views));
        // The EMF records, kept for the bill rather than dropped.
        so.env.insert("METRICS".into(), "memory".into());
        let stack = Stack::start(so).await.context("starting the stack")?;
        let measured = measure_mode(&stack, mode, views, &mut cells).await;
        stack.shutdown().await;
        measured?;
    }
    Ok(cells)
}

/// Every cell of `mode` on `stack` (and the views cells if `views`).
async fn measure_mode(
    stack: &Stack,
    mode: Mode,
    views: bool,
    cells: &mut Vec<CostCell>,
) -> Result<()> {
    let cost = Meter::new(stack)?;
    for spread in [Spread::Breadth, Spread::Viral] {
        for op in [Op::Like, Op::KeyedLike, Op::Unlike, Op::KeyedUnlike] {
            let cell = cost
                .cell(mode, op, spread, like_requests(op, spread))
                .await?;
            crate::errln!("  {}", cell_line(&cell));
            cells.push(cell);
        }
    }
    let feed = (0..OPS)
        .map(|i| Request::Counts {
            reels: (0..FEED_REELS).map(|j| format!("feed{i}x{j}")).collect(),
        })
        .collect();
    let cell = cost.cell(mode, Op::Read, Spread::Breadth, feed).await?;
    crate::errln!("  {}", cell_line(&cell));
    cells.push(cell);
    if views {
        // kinesis-mock answers its first puts in seconds: a warm-up on
        // a reel of its own, measured by nobody.
        let warm = (0..50).map(|i| view_request("warmup", i, "w")).collect();
        cost.cell(Mode::Views, Op::View, Spread::Viral, warm)
            .await?;
        for spread in [Spread::Breadth, Spread::Viral] {
            let requests = (0..OPS)
                .map(|i| match spread {
                    Spread::Breadth => view_request(&format!("vb{i}"), i, "b"),
                    Spread::Viral => view_request("vviral", i, "v"),
                })
                .collect();
            let cell = cost.cell(Mode::Views, Op::View, spread, requests).await?;
            crate::errln!("  {}", cell_line(&cell));
            cells.push(cell);
        }
    }
    Ok(())
}

/// The cell's one progress line.
fn cell_line(c: &CostCell) -> String {
    format!(
        "costs: {:?} {:?} {:?}: {} ok, {} failed; WU/op {:.3} request + {:.3} aggregation, RU/op {:.3} + {:.3}",
        c.mode,
        c.op,
        c.spread,
        c.ok,
        c.failed,
        c.request_wu(),
        c.aggregation_wu(),
        c.request_ru(),
        c.aggregation_ru()
    )
}

/// The requests of a likes cell. An unlike removes the like of the cell
/// before it with the same key-ness (same users, same reels), so every
/// unlike removes a like and none is a no-op.
fn like_requests(op: Op, spread: Spread) -> Vec<Request> {
    let (keyed, unlike) = match op {
        Op::Like | Op::View | Op::Read => (false, false),
        Op::KeyedLike => (true, false),
        Op::Unlike => (false, true),
        Op::KeyedUnlike => (true, true),
    };
    let s = match spread {
        Spread::Breadth => "b",
        Spread::Viral => "v",
    };
    let who = if keyed { "k" } else { "u" };
    (0..OPS)
        .map(|i| Request::Like {
            reel: match spread {
                Spread::Breadth => format!("{s}{who}{i}"),
                Spread::Viral => "viral".into(),
            },
            user: format!("{s}{who}{i}"),
            key: keyed.then(|| format!("{s}{who}{i}-{}", if unlike { "off" } else { "on" })),
            unlike,
        })
        .collect()
}

/// View request `i` of a views cell on `reel` (`tag` keeps its viewer and
/// key apart from the other cells').
fn view_request(reel: &str, i: u32, tag: &str) -> Request {
    Request::Views {
        reel: reel.to_owned(),
        user: format!("viewer-{tag}{i}"),
        count: VIEWS_PER_REQUEST,
        key: format!("views-{tag}{i}"),
    }
}

/// What a cell is measured with: the stack's proxy and an HTTP client.
struct Meter<'a> {
    stack: &'a Stack,
    proxy: &'a faultproxy::Proxy,
    http: reqwest::Client,
}

impl<'a> Meter<'a> {
    fn new(stack: &'a Stack) -> Result<Self> {
        Ok(Meter {
            stack,
            proxy: stack.proxy.as_deref().context("the stack has a proxy")?,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()?,
        })
    }

    /// Holds every event source's deliveries back, or lets them go.
    fn pause(&self, paused: bool) {
        for s in &self.stack.streams {
            s.pause(paused);
        }
        if let Some(source) = self.stack.views.as_ref().and_then(|v| v.source.as_ref()) {
            source.pause(paused);
        }
    }

    /// Waits until every source has handed every record to its function
    /// for good: the aggregation's part is done.
    async fn drain(&self) -> Result<()> {
        let start = Instant::now();
        while !(self.stack.streams_caught_up().await? && self.stack.views_drained().await?) {
            if start.elapsed() > Duration::from_secs(120) {
                return Err(anyhow!("costs: the streams were not drained in 2 minutes"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Sends `requests` with the sources paused, then drains them; the
    /// units of each half (the module's comment says why in two).
    async fn cell(
        &self,
        mode: Mode,
        op: Op,
        spread: Spread,
        requests: Vec<Request>,
    ) -> Result<CostCell> {
        self.pause(true);
        tokio::time::sleep(COSTS_CACHES_COLD).await;
        self.proxy.reset_stats();
        let half = Half::start();
        let (ok, failed) = send_all(&self.http, &self.stack.base_url, requests).await?;
        let request = self.proxy.stats();
        let request_invoked = half.end();
        self.proxy.reset_stats();
        let half = Half::start();
        self.pause(false);
        self.drain().await?;
        let aggregation = self.proxy.stats();
        let aggregation_invoked = half.end();
        Ok(CostCell {
            mode,
            op,
            spread,
            ok,
            failed,
            per_request: if op == Op::View { VIEWS_PER_REQUEST } else { 1 },
            request: Units::of(&request),
            aggregation: Units::of(&aggregation),
            request_calls: request.forwarded,
            aggregation_calls: aggregation.forwarded,
            request_invoked,
            aggregation_invoked,
        })
    }
}

/// The meter and the EMF records of one half of a cell, from its start.
struct Half {
    emf_from: usize,
}

/// The metrics' memory sink, which the stacks write with `METRICS=memory`.
fn emf_sink() -> likes::metrics::Metrics {
    likes::metrics::Metrics::from_lookup(|k| (k == "METRICS").then(|| "memory".into()))
}

impl Half {
    fn start() -> Half {
        crate::meter::reset();
        Half {
            emf_from: emf_sink().lines().len(),
        }
    }

    /// Every function's figures since [`Half::start`]; each EMF record is
    /// its `Function` dimension's.
    fn end(self) -> BTreeMap<String, Invoked> {
        let mut out: BTreeMap<String, Invoked> = crate::meter::snapshot()
            .into_iter()
            .map(|(f, meter)| {
                (
                    f,
                    Invoked {
                        meter,
                        ..Invoked::default()
                    },
                )
            })
            .collect();
        for line in emf_sink().lines().iter().skip(self.emf_from) {
            let doc: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            let function = doc["Function"].as_str().unwrap_or_default().to_owned();
            let i = out.entry(function).or_default();
            i.emf_bytes += line.len() as u64 + 1;
            i.emf_records += 1;
            for d in doc["_aws"]["CloudWatchMetrics"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let dims: Vec<String> = d["Dimensions"][0]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|k| k.as_str())
                    .map(|k| format!("{k}={}", doc[k].as_str().unwrap_or_default()))
                    .collect();
                for m in d["Metrics"].as_array().into_iter().flatten() {
                    let name = m["Name"].as_str().unwrap_or_default();
                    i.emf_metrics.insert(format!("{}/{name}", dims.join(",")));
                }
            }
        }
        out
    }
}
