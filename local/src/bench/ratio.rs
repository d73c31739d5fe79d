//! The like path against the physical limit under it: the like endpoint's
//! rate next to the rate of the bare SDK call it is built on, measured in
//! one process against one emulator, interleaved round by round, so that
//! what the machine and the emulator cost cancels out and what the product
//! adds on top shows as a ratio. A regression of the like path (an extra
//! read per like, a lock on a shared cache) moves the ratio; a slower or
//! busier machine moves both rates, not their ratio.
//!
//! Per counting mode, each round runs both sides for `BENCH_RATIO_SECONDS`
//! with `BENCH_RATIO_CONCURRENCY` closed-loop workers, in alternating order,
//! each on a fresh stack (empty tables; no fault proxy, no metrics, no
//! schedule, no automatic growth):
//!
//! * transactional: `PUT /reels/{id}/like` from a fresh user each time,
//!   against the two-item `TransactWriteItems` it sends (the like row's
//!   conditional `Put` and the shard's `ADD`, with a `ClientRequestToken`
//!   and `ReturnConsumedCapacity`, the same attributes), sent with the
//!   product's own SDK client settings; and, as a third figure, the same
//!   transaction without a token;
//! * stream: the same request (one conditional `PutItem` of the row, the
//!   aggregator running as it does locally) against a bare conditional
//!   `PutItem` of such a row.
//!
//! Why the tokenless figure: the emulator keeps every token of the last ten
//! minutes in a map and, on each tokened transaction, walks all of them to
//! drop the expired ones (dynoxide 3.2, `evict_expired`, under the lock the
//! transaction holds), so a token costs it time that grows with the rate.
//! Profiled here, that walk was 28 % of the serving process's CPU during
//! the like benchmark. DynamoDB charges nothing for a token; the like needs
//! one (exactly once under the SDK's retries), so the ratio compares like
//! with like, and the third figure shows what the emulator charges for it.
//!
//! Beside each rate, the process's CPU time per success (user + system,
//! every thread: client, gateway, handler, SDK and the embedded emulator
//! alike): on a machine whose cores the run saturates, the rate is about
//! the cores over that figure, and the difference between the sides is
//! what one like costs on top of its bare call, in microseconds, which a
//! busy machine moves far less than it moves the rates.
//!
//! The figures are medians of the rounds. Numbers only: no pass or fail
//! (a timed test would fail on a loaded machine, not on a regression).

use super::report::median;
use crate::stack::{Stack, StackOptions, client_for};
use anyhow::{Context, Result, anyhow, bail};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnConsumedCapacity, TransactWriteItem, Update,
};
use likes::keys::{self, ReelId};
use likes::token::RequestToken;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What to run; each field has a `BENCH_RATIO_*` variable.
#[derive(Clone, Debug, Serialize)]
pub struct RatioOptions {
    /// Rounds per mode; the figures are their medians
    /// (`BENCH_RATIO_ROUNDS`, default 5).
    pub rounds: u32,
    /// Seconds each side runs per round (`BENCH_RATIO_SECONDS`, default 5).
    pub seconds: f64,
    /// Closed-loop workers on each side (`BENCH_RATIO_CONCURRENCY`,
    /// default 16, as `wrk -c16`).
    pub concurrency: usize,
    /// Where the rounds go as JSON (`BENCH_RATIO_OUT`).
    pub out: PathBuf,
    /// The template the stack reads its tables from.
    #[serde(skip)]
    pub template: PathBuf,
}

impl RatioOptions {
    /// The options from the environment, with the defaults above.
    pub fn from_env(template: PathBuf) -> Result<Self> {
        let num = super::positive_env;
        Ok(RatioOptions {
            rounds: num("BENCH_RATIO_ROUNDS", 5.0)? as u32,
            seconds: num("BENCH_RATIO_SECONDS", 5.0)?,
            concurrency: num("BENCH_RATIO_CONCURRENCY", 16.0)? as usize,
            out: PathBuf::from(
                std::env::var("BENCH_RATIO_OUT")
                    .unwrap_or_else(|_| "target/bench/ratio.json".into()),
            ),
            template,
        })
    }

    /// The settings in effect, as `(variable, value)` pairs.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("BENCH_RATIO_ROUNDS", self.rounds.to_string()),
            ("BENCH_RATIO_SECONDS", self.seconds.to_string()),
            ("BENCH_RATIO_CONCURRENCY", self.concurrency.to_string()),
        ]
    }
}

/// How the like path counts, and so which bare call it is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `COUNTING=transactional`: against a two-item `TransactWriteItems`.
    Transactional,
    /// `COUNTING=stream`: against one conditional `PutItem`.
    Stream,
}

impl Mode {
    /// The `COUNTING` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Transactional => "transactional",
            Mode::Stream => "stream",
        }
    }

    /// What the bare side sends.
    pub fn raw_call(self) -> &'static str {
        match self {
            Mode::Transactional => {
                "TransactWriteItems: conditional Put of the row + ADD on a shard, with a token"
            }
            Mode::Stream => "PutItem of the row, conditional",
        }
    }
}

/// One mode's rounds.
#[derive(Clone, Debug, Serialize)]
pub struct RatioResult {
    /// The counting mode.
    pub mode: Mode,
    /// Likes a second the endpoint answered 200, per round.
    pub endpoint: Vec<f64>,
    /// Calls a second the bare SDK call succeeded, per round.
    pub raw: Vec<f64>,
    /// Transactional mode: the bare transaction without its token, per
    /// round (empty in stream mode, whose bare call carries none).
    pub raw_untokened: Vec<f64>,
    /// The process's CPU microseconds per like answered 200, per round.
    pub endpoint_cpu_us: Vec<f64>,
    /// ... per bare call that succeeded (with its token), per round.
    pub raw_cpu_us: Vec<f64>,
    /// Answers other than 200 (endpoint) or failed calls (bare), in all.
    pub endpoint_errors: u64,
    /// See `endpoint_errors`.
    pub raw_errors: u64,
    /// The medians of the rounds, and their ratio.
    pub endpoint_median: f64,
    /// See `endpoint_median`.
    pub raw_median: f64,
    /// See `endpoint_median` (`None` in stream mode).
    pub raw_untokened_median: Option<f64>,
    /// `endpoint_median / raw_median`.
    pub ratio: f64,
    /// Medians of the CPU figures.
    pub endpoint_cpu_us_median: f64,
    /// See `endpoint_cpu_us_median`.
    pub raw_cpu_us_median: f64,
}

/// One side's round: successes a second, CPU per success, failures.
#[derive(Clone, Copy, Debug)]
struct SideRound {
    rate: f64,
    cpu_us: f64,
    errors: u64,
}

/// The CPU time this process used so far, user and system, all threads
/// (`/proc/self/stat`'s `utime` and `stime`, in clock ticks of 1/100 s:
/// Linux's `USER_HZ` on every architecture it reports through `/proc`).
fn process_cpu() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    cpu_of_stat(&stat)
}

/// [`process_cpu`] of the text of a `/proc/<pid>/stat`.
fn cpu_of_stat(stat: &str) -> Result<Duration> {
    // The command name, field 2, is in parentheses and may hold spaces:
    // fields are counted after its closing one (field 3 is the state).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("no command name in /proc/self/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| anyhow!("field {} of /proc/self/stat", i + 3))
    };
    // utime is field 14, stime 15.
    Ok(Duration::from_millis(10 * (ticks(11)? + ticks(12)?)))
}

/// Runs both modes and returns the Markdown table; the rounds go to
/// [`RatioOptions::out`].
pub async fn run(opts: RatioOptions) -> Result<String> {
    if opts.rounds == 0 || opts.concurrency == 0 {
        bail!("BENCH_RATIO_ROUNDS and BENCH_RATIO_CONCURRENCY must be at least 1");
    }
    let mut results = Vec::new();
    for mode in [Mode::Transactional, Mode::Stream] {
        crate::errln!("bench ratio: {}", mode.as_str());
        results.push(run_mode(&opts, mode).await?);
    }
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &opts.out,
        serde_json::to_string_pretty(&serde_json::json!({
            "options": opts,
            "settings": opts.settings(),
            "modes": results,
        }))?,
    )?;
    Ok(markdown(&opts, &results))
}

/// One side of one mode for one round, on a stack of its own: the
/// emulator slows down as its tables and its stream grow (measured here: a
/// third of the rate after three rounds on one stack), so each measurement
/// starts from empty tables, as the other side's does.
async fn measure_side(
    opts: &RatioOptions,
    mode: Mode,
    side: Side,
    round: u32,
) -> Result<SideRound> {
    let mut so = StackOptions::isolated(opts.template.clone());
    for (k, v) in [
        ("COUNTING", mode.as_str()),
        ("METRICS", "off"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
    ] {
        so.env.insert(k.into(), v.into());
    }
    let stack = Stack::start(so).await.context("starting the stack")?;
    let sides = Sides {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(opts.concurrency * 2)
            .build()?,
        base: stack.base_url.clone(),
        sdk: client_for(
            &stack.config,
            &stack.dynamo_endpoint,
            &StackOptions::isolated(opts.template.clone()),
        )
        .await,
        likes_table: stack.config.likes_table.clone(),
        counters_table: stack.config.counters_table.clone(),
        mode,
    };
    let result = closed_loop(opts, Arc::new(sides), side, round).await;
    stack.shutdown().await;
    result
}

/// What both sides send to.
struct Sides {
    http: reqwest::Client,
    base: String,
    sdk: Client,
    likes_table: String,
    counters_table: String,
    mode: Mode,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Endpoint,
    Raw,
    /// Transactional mode's bare transaction without a token.
    RawUntokened,
}

/// Both sides of one mode, round after round.
async fn run_mode(opts: &RatioOptions, mode: Mode) -> Result<RatioResult> {
    let (mut endpoint, mut raw, mut untokened) = (Vec::new(), Vec::new(), Vec::new());
    let (mut endpoint_cpu, mut raw_cpu) = (Vec::new(), Vec::new());
    let (mut endpoint_errors, mut raw_errors) = (0, 0);
    for round in 0..opts.rounds {
        // Alternating which side goes first: neither always runs first
        // (each has a fresh stack, but the machine warms up and cools
        // down).
        let mut order = if round % 2 == 0 {
            vec![Side::Endpoint, Side::Raw]
        } else {
            vec![Side::Raw, Side::Endpoint]
        };
        if mode == Mode::Transactional {
            order.push(Side::RawUntokened);
        }
        for side in order {
            let r = measure_side(opts, mode, side, round).await?;
            match side {
                Side::Endpoint => {
                    endpoint.push(r.rate);
                    endpoint_cpu.push(r.cpu_us);
                    endpoint_errors += r.errors;
                }
                Side::Raw => {
                    raw.push(r.rate);
                    raw_cpu.push(r.cpu_us);
                    raw_errors += r.errors;
                }
                Side::RawUntokened => {
                    untokened.push(r.rate);
                    raw_errors += r.errors;
                }
            }
        }
        crate::errln!(
            "  round {}: endpoint {:.0}/s ({:.0} µs CPU each), bare call {:.0}/s ({:.0} µs)",
            round + 1,
            endpoint[endpoint.len() - 1],
            endpoint_cpu[endpoint_cpu.len() - 1],
            raw[raw.len() - 1],
            raw_cpu[raw_cpu.len() - 1]
        );
    }
    let endpoint_median = median(endpoint.clone());
    let raw_median = median(raw.clone());
    let raw_untokened_median = (!untokened.is_empty()).then(|| median(untokened.clone()));
    Ok(RatioResult {
        mode,
        endpoint_cpu_us_median: median(endpoint_cpu.clone()),
        raw_cpu_us_median: median(raw_cpu.clone()),
        endpoint_cpu_us: endpoint_cpu,
        raw_cpu_us: raw_cpu,
        endpoint,
        raw,
        raw_untokened: untokened,
        raw_untokened_median,
        endpoint_errors,
        raw_errors,
        endpoint_median,
        raw_median,
        ratio: if raw_median > 0.0 {
            endpoint_median / raw_median
        } else {
            0.0
        },
    })
}

/// `concurrency` workers sending one side's request back to back for
/// `seconds`, each like from a user of its own on the side's one reel:
/// successes a second, the process's CPU per success, and the failures.
async fn closed_loop(
    opts: &RatioOptions,
    sides: Arc<Sides>,
    side: Side,
    round: u32,
) -> Result<SideRound> {
    let reel = ReelId::parse(match side {
        Side::Endpoint => "ratio-endpoint",
        Side::Raw | Side::RawUntokened => "ratio-raw",
    })
    .map_err(|e| anyhow!("{e}"))?;
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let cpu_before = process_cpu()?;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(opts.seconds);
    // Each worker a task of its own, as each `wrk` connection is its own
    // loop: polled together in one task, the bare side's SDK work
    // (building, signing, parsing each call) ran on one thread at a time,
    // while the endpoint's ran in the server's connection tasks on every
    // worker, which flattered the endpoint.
    let workers = (0..opts.concurrency).map(|worker| {
        let (ok, failed, reel) = (ok.clone(), failed.clone(), reel.clone());
        let sides = sides.clone();
        tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < until {
                i += 1;
                let user = format!("r{round}w{worker}i{i}");
                let done = match side {
                    Side::Endpoint => sides.like(&reel, &user).await,
                    Side::Raw => sides.raw(&reel, &user, true).await,
                    Side::RawUntokened => sides.raw(&reel, &user, false).await,
                };
                if done {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    for worker in futures::future::join_all(workers).await {
        worker.context("a bench worker")?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = process_cpu()?.saturating_sub(cpu_before);
    let ok = ok.load(Ordering::Relaxed);
    Ok(SideRound {
        rate: ok as f64 / elapsed,
        cpu_us: cpu.as_secs_f64() * 1e6 / ok.max(1) as f64,
        errors: failed.load(Ordering::Relaxed),
    })
}

impl Sides {
    /// One like through the gateway; `true` for a 200.
    async fn like(&self, reel: &ReelId, user: &str) -> bool {
        self.http
            .put(format!("{}/reels/{}/like", self.base, reel.as_str()))
            .header("x-user-id", user)
            .send()
            .await
            .is_ok_and(|r| r.status() == reqwest::StatusCode::OK)
    }

    /// The bare call the mode's like is built on, the items as the like
    /// writes them (the transaction with its token, unless `tokened` is
    /// false); `true` if it succeeded.
    async fn raw(&self, reel: &ReelId, user: &str, tokened: bool) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let token = RequestToken::random();
        let mut row = HashMap::from([
            ("user_id".to_owned(), AttributeValue::S(user.to_owned())),
            (
                "reel_id".to_owned(),
                AttributeValue::S(reel.as_str().to_owned()),
            ),
            ("liked_at".to_owned(), AttributeValue::N(now.to_string())),
            (
                "tok".to_owned(),
                AttributeValue::S(token.as_str().to_owned()),
            ),
        ]);
        let new_row = "attribute_not_exists(user_id)";
        match self.mode {
            Mode::Stream => {
                let (attr, value) = keys::COUNTED_BY_STREAM;
                row.insert(attr.to_owned(), AttributeValue::S(value.to_owned()));
                self.sdk
                    .put_item()
                    .table_name(&self.likes_table)
                    .set_item(Some(row))
                    .condition_expression(new_row)
                    .send()
                    .await
                    .is_ok()
            }
            Mode::Transactional => {
                let (Ok(put), Ok(update)) = (
                    Put::builder()
                        .table_name(&self.likes_table)
                        .set_item(Some(row))
                        .condition_expression(new_row)
                        .build(),
                    Update::builder()
                        .table_name(&self.counters_table)
                        .key("pk", AttributeValue::S(keys::shard_key(reel, 0)))
                        .update_expression("ADD #n :one, #w :one SET #u = :at")
                        .expression_attribute_names("#n", "n")
                        .expression_attribute_names("#w", "w")
                        .expression_attribute_names("#u", "updated_at")
                        .expression_attribute_values(":one", AttributeValue::N("1".into()))
                        .expression_attribute_values(":at", AttributeValue::N(now.to_string()))
                        .build(),
                ) else {
                    return false;
                };
                let request = self
                    .sdk
                    .transact_write_items()
                    .transact_items(TransactWriteItem::builder().put(put).build())
                    .transact_items(TransactWriteItem::builder().update(update).build())
                    .return_consumed_capacity(ReturnConsumedCapacity::Indexes);
                let request = if tokened {
                    request.client_request_token(token.as_str())
                } else {
                    request
                };
                request.send().await.is_ok()
            }
        }
    }
}

/// The table of both modes: medians, the ratio, and every round.
fn markdown(opts: &RatioOptions, results: &[RatioResult]) -> String {
    let rounds = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" · ")
    };
    let mut out = format!(
        "{} rounds of {} s per side, {} workers each, interleaved; medians.\n\n\
         | counting | like endpoint (likes/s) | bare SDK call | bare call (calls/s) | ratio | CPU per like, endpoint (µs) | CPU per bare call (µs) | bare call without its token (calls/s) | rounds: endpoint | rounds: bare call |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n",
        opts.rounds, opts.seconds, opts.concurrency
    );
    for r in results {
        out.push_str(&format!(
            "| {} | {:.0} | {} | {:.0} | **{:.2}** | {:.0} | {:.0} | {} | {} | {} |\n",
            r.mode.as_str(),
            r.endpoint_median,
            r.mode.raw_call(),
            r.raw_median,
            r.ratio,
            r.endpoint_cpu_us_median,
            r.raw_cpu_us_median,
            r.raw_untokened_median
                .map_or_else(|| "—".to_owned(), |m| format!("{m:.0}")),
            rounds(&r.endpoint),
            rounds(&r.raw),
        ));
    }
    let errors: u64 = results
        .iter()
        .map(|r| r.endpoint_errors + r.raw_errors)
        .sum();
    if errors > 0 {
        out.push_str(&format!(
            "\n{errors} requests or calls failed and are not counted.\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_row_per_mode_with_its_ratio() {
        let opts = RatioOptions {
            rounds: 2,
            seconds: 1.0,
            concurrency: 4,
            out: "x.json".into(),
            template: "template.yaml".into(),
        };
        let r = RatioResult {
            mode: Mode::Transactional,
            endpoint: vec![900.0, 1000.0],
            raw: vec![1000.0, 1000.0],
            raw_untokened: vec![1300.0, 1500.0],
            endpoint_errors: 0,
            raw_errors: 0,
            endpoint_median: 950.0,
            raw_median: 1000.0,
            raw_untokened_median: Some(1400.0),
            ratio: 0.95,
            endpoint_cpu_us: vec![1100.0, 1050.0],
            raw_cpu_us: vec![990.0, 1010.0],
            endpoint_cpu_us_median: 1075.0,
            raw_cpu_us_median: 1000.0,
        };
        let t = markdown(&opts, &[r]);
        assert!(t.contains("| transactional | 950 |"), "{t}");
        assert!(t.contains("**0.95** | 1075 | 1000 | 1400 |"), "{t}");
        assert!(t.contains("900 · 1000"), "{t}");
    }

    #[test]
    fn cpu_time_is_utime_plus_stime_after_the_command_name() {
        // A command name with a space and a parenthesis, as the kernel
        // allows; utime 250 and stime 31 ticks.
        let stat = "4242 (likes (local) x) R 1 4242 4242 0 -1 4194304 9 0 0 0 250 31 0 0 20 0 9 0";
        assert_eq!(cpu_of_stat(stat).unwrap(), Duration::from_millis(2810));
        assert!(cpu_of_stat("4242 likes R 1").is_err());
        assert!(process_cpu().is_ok());
    }
}
