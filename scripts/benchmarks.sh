#!/usr/bin/env bash
# Regenerates BENCHMARKS.md: the shard-sizing planner on the published
# example, the viral-load benchmark (naive counter, fixed shards with and
# without the cache, automatic growth, stream mode, stream mode at scale,
# views, the cost of each operation, a platform's year compressed:
# every `Variant` of local/src/bench/variant.rs unless BENCH_VARIANTS says
# otherwise), and the Lambda figures. One command: `make benchmarks`.
#
# This script is the one writer of BENCHMARKS.md, and of all its prose;
# the others hand it data: the planner's output, the bench's Markdown table
# (and its settings, in target/bench/viral.json), and the Lambda figures'
# record, target/lambda-figures.json, whose tables bench/lambda/report.py
# renders (--fragment). The file ends with the one command that reproduces
# it and the settings it ran with: no ports, no credentials, nothing of
# one machine's run.
#
# Takes a while: a release build of the workspace (about 9 minutes on a
# 2-core machine the first time), the benchmark (BENCH_RUNS × the variants
# × BENCH_SECONDS of load, plus each stack's start and drain), and the
# Lambda figures (their own release builds). Run it on a quiet machine: the
# benchmark measures this machine as much as the code. SKIP_LAMBDA=1 leaves
# the Lambda figures out; LAMBDA_FIGURES=reuse takes those of an earlier
# `make lambda-figures` (target/lambda-figures.json) instead of measuring.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo=${CARGO:-cargo}
# python3 reads the settings out of the JSON records (and the Lambda
# figures need it anyway): checked before the long build, not after.
command -v python3 >/dev/null || { echo "benchmarks: python3 not found" >&2; exit 1; }
out=BENCHMARKS.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The commit measured; BENCHMARKS.md itself (rewritten by this script) does
# not count as a change.
source_rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . ':(exclude)BENCHMARKS.md' 2>/dev/null || echo ' with uncommitted changes')"

machine() {
  echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') × $(nproc)"
  echo "- memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  echo "- $(rustc -V)"
  echo "- $(uname -sr)"
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- source: $source_rev"
}

# Every release build of the benchmarks goes to one target directory (the
# Lambda figures build there too), not target/: a test run can go on while
# it builds.
export CARGO_TARGET_DIR="$root/target/bench-release"
echo "benchmarks: building (release)" >&2
$cargo build --locked --quiet --release -p likes-local --bin likes-local
bin=target/bench-release/release/likes-local

plan() {
  echo '```'
  echo "\$ likes-local plan $*"
  "$bin" plan "$@"
  echo '```'
}

echo "benchmarks: planner" >&2
{
  plan --peak 14000 --cap 1000 --units 1 --shards 20
  plan --peak 18000 --cap 1000 --units 1 --shards 20
  plan --peak 14000 --cap 1000 --headroom 0.3
} > "$work/plan.md"

echo "benchmarks: like path against the bare SDK call" >&2
RUST_LOG=${RUST_LOG:-off} BENCH_RATIO_OUT=target/bench/ratio.json "$bin" bench ratio > "$work/ratio.md"

echo "benchmarks: viral load" >&2
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
RUST_LOG=${RUST_LOG:-off} BENCH_OUT=target/bench/viral.json BENCH_SVG=BENCHMARKS-onset.svg "$bin" bench > "$work/bench-all.md"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
# The `costs` variant's section (heading, prose and table, all the bench's:
# local/src/bench/report.rs, COSTS_HEADING) gets a place of its own after
# the viral load's, which the docs link to; the rest is the viral load's.
costs_heading='## Cost per operation, all in'
awk -v h="$costs_heading" '$0 == h {exit} {print}' "$work/bench-all.md" > "$work/bench.md"
awk -v h="$costs_heading" '$0 == h {on = 1} on {print}' "$work/bench-all.md" > "$work/costs.md"
# The `platform` variant's section (local/src/bench/platform/report.rs,
# PLATFORM_HEADING) comes last in the bench's output, after the costs':
# when the costs' section is there it carries it along; when not, it is
# placed as the costs' would be.
platform_heading="## A platform's year, compressed"
if [ ! -s "$work/costs.md" ]; then
  awk -v h="$platform_heading" '$0 == h {exit} {print}' "$work/bench.md" > "$work/bench-only.md"
  awk -v h="$platform_heading" '$0 == h {on = 1} on {print}' "$work/bench.md" > "$work/costs.md"
  mv "$work/bench-only.md" "$work/bench.md"
fi

# How the Lambda figures come: measured now (run), from an earlier run
# (reuse), or not at all (skip).
if [ "${LAMBDA_FIGURES:-run}" = reuse ] && [ -f target/lambda-figures.json ]; then
  # The Lambda figures of an earlier `make lambda-figures` run (they state
  # their own date, source and machine), when only the load benchmark is
  # being regenerated.
  echo "benchmarks: Lambda figures reused from target/lambda-figures.json" >&2
  lambda=reuse
elif [ "${SKIP_LAMBDA:-0}" != 1 ]; then
  echo "benchmarks: Lambda figures" >&2
  scripts/lambda-figures.sh > /dev/null
  lambda=run
else
  lambda=skip
fi
if [ "$lambda" = skip ]; then
  echo "(not regenerated in this run: SKIP_LAMBDA=1)" > "$work/lambda.md"
  : > "$work/lambda-settings.tsv"
else
  python3 bench/lambda/report.py --fragment target/lambda-figures.json > "$work/lambda.md"
  python3 bench/lambda/report.py --settings target/lambda-figures.json > "$work/lambda-settings.tsv"
fi
# The bench's settings in effect, defaults included, as the bench wrote them.
python3 -c 'import json, sys
for path in sys.argv[1:]:
    for name, value in json.load(open(path))["settings"]:
        print(f"{name}\t{value}")' target/bench/ratio.json target/bench/viral.json > "$work/bench-settings.tsv"

# The reproducing command: `make benchmarks` with every setting that was
# set here (the rest are at their defaults); the Lambda figures' own
# settings only when they were measured by this run.
word() {
  case $1 in
    *[!A-Za-z0-9._,/:-]*) printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")" ;;
    *) printf '%s' "$1" ;;
  esac
}
reproduce=
set_here() {
  local name
  for name in "$@"; do
    [ -n "${!name:-}" ] && reproduce+="$name=$(word "${!name}") "
  done
  return 0
}
set_here $(cut -f1 "$work/bench-settings.tsv")
case $lambda in
  run) set_here $(cut -f1 "$work/lambda-settings.tsv") ;;
  reuse) reproduce+="LAMBDA_FIGURES=reuse " ;;
  skip) reproduce+="SKIP_LAMBDA=1 " ;;
esac
reproduce+="make benchmarks"
{
  cat <<'EOF'
# Benchmarks

Regenerated by one command, `make benchmarks` (`scripts/benchmarks.sh`); the
raw figures are in `target/bench/ratio.json`, `target/bench/viral.json` and
`target/lambda-figures.json`
after a run. Every figure below comes from that run on this machine:

EOF
  machine
  cat <<'EOF'

## Shard-sizing planner

`likes-local plan` (`make plan ARGS='...'`): the shard count from the sizing
rule, checked by a Monte-Carlo simulation of random shard choice (Poisson
arrivals per second, each like to a uniformly random shard), next to the
exact figures. `--units 1` is the published example's plain counter; this
project's like costs 2 write units on its shard (a transactional item).

EOF
  cat "$work/plan.md"
  cat <<'EOF'

## The like path against the bare SDK call

`likes-local bench ratio`: per counting mode, on one local stack (embedded
dynoxide, no fault proxy, metrics off, no schedule), the like endpoint
(`PUT /reels/{id}/like`, a fresh user each time) and the bare SDK call it is
built on, each driven by closed-loop workers for a few seconds, the two
interleaved round after round (raw rounds in `target/bench/ratio.json`).
The ratio of the medians is the figure to watch: what the product adds to
the one write it cannot avoid (request parsing and routing, the settings
cache, the exactly-once token, the count in the answer and its guard). The
machine and the emulator move both rates; a regression of the like path
moves the ratio. Transactional mode is compared with the two-item
`TransactWriteItems` the like sends (the like row's conditional `Put` and
the shard's `ADD`, with its `ClientRequestToken`; the same transaction
without a token is the third figure: the emulator's token bookkeeping,
which DynamoDB does not charge, see docs/benchmarks.md), stream mode's
unkeyed like with one conditional `PutItem` of the row (its aggregator
running as it does locally, on both sides).

Both sides share the emulator's ceiling: dynoxide applies one write at a
time, under one lock, so once both drive it flat out their rates meet and
the ratio sits near 1 (a little above it at 16 workers; in one run of one
round each, 0.96 with 4 workers, 1.01 with 8, 1.03 with 32). What the like
path costs on top of its call shows in the CPU columns: the process's CPU
per success, client, gateway and emulator included, which a busy machine
moves far less than the rates. The difference between the two is the
endpoint's own work per like (the HTTP hop and the gateway's event
included).

EOF
  cat "$work/ratio.md"
  cat <<'EOF'

## Viral load: naive counter vs fixed shards vs automatic growth vs stream mode

`likes-local bench` (`make bench`): the real handlers behind the local
gateway, embedded dynoxide behind the fault proxy's per-key capacity model
(the cap scaled down from DynamoDB's 1,000 write units per partition key so
one machine can reach it), an open-loop load of likes on one reel from
distinct users plus background likes and feed reads. `naive` is one counter
item with `UpdateItem ADD` per like through the same SDK settings. Refused
likes are retried after the load, as their clients would (the product's
with their `Idempotency-Key`), and the stored count is then compared with
the number of likes offered. Costs are on-demand, us-east-1 by default
($0.625 per million write request units, $0.125 per million read request
units; `BENCH_WRU_PRICE`, `BENCH_RRU_PRICE`), from the units the proxy
counted. Latency is local (loopback, an emulator on SQLite), not DynamoDB's.

EOF
  # The BENCH_* settings, captured whole (no `env | grep -q`, whose early exit
  # can fail `env` under pipefail).
  bench_vars=$(env | { grep '^BENCH_' || true; } | sort | tr '\n' ' ' | sed 's/ $//')
  echo "Command: \`RUST_LOG=off BENCH_OUT=target/bench/viral.json BENCH_SVG=BENCHMARKS-onset.svg $bin bench\`${bench_vars:+, with $bench_vars}."
  echo
  cat "$work/bench.md"
  cat <<'EOF'

The onset, per variant (first run): likes accepted and refused each second,
and the viral reel's shard count, drawn by the bench itself.

![Onset per variant](BENCHMARKS-onset.svg)
EOF
  cat <<'EOF'

How to read it (the figures are in the table above; nothing below is
copied from a run):

- **Sustained rate.** The sharded variants must sustain the offered rate.
  - `fixed` offers half its ceiling (10 shards × the cap ÷ 2 units a like).
    "refused %" says whether it took every like; "busiest key WCU/s" is its
    busiest shard's busiest second against the cap: random shard choice
    loads some shards above the mean, as the planner above predicts.
  - `naive` has one key: its ceiling is the cap ÷ 1 unit, and every like
    over it is refused.
  - `auto` starts at 1 shard (a ceiling of the cap ÷ 2 likes a second). The
    read path's rate observer starts a grow (the like path's contention
    observer counts conflicts on the reel's shard only, never throttles,
    and the cap here throttles), then the scheduled runs finish it; each
    resize step waits the settings cache, the request bound and a margin
    (scaled down here to about 5 s). The refusals happen before it reaches
    its size, so compare the whole run with its second half. While
    saturated (at or above its safe rate) each grow is at least
    ×`SATURATED_GROWTH` (4), since the rate it sees is only what got
    through; once all of the 75 likes/s get through, the sizing rule with
    the cap scaled, `ceil(rate × SHARD_HEADROOM ÷ SHARD_WRITES_PER_SEC)`,
    asks for `ceil(75 × 2 ÷ 12)` = 13. It can end above that: a grow
    started while the reel is still saturated is ×4 again (16 → 64).
    "Shards when the load ends" is read before the refused likes are
    retried (their burst may grow the reel again).
- **Stream mode.** `stream` offers 5× the `fixed` ceiling (BENCH_STREAM_RATE)
  with the viral reel at 1 shard and no growth: no like writes a counter
  item, so the cap applies to the like rows (one per user) and to the one
  shard the aggregator writes once per batch. Its viral likes carry no
  `Idempotency-Key` (an unkeyed like is one `PutItem`, 1 unit; a keyed one
  is a transaction of the row and the key's record, 4 units); the
  aggregator's transactions are in the reel's units, its checkpoints
  (`agg#…`) shared out over every like. Freshness is from a like's answer
  to the shard holding it, polled every 20 ms: the stream, the 1 s batching
  window, the aggregation; a reader adds up to `CACHE_TTL_MS` (2 s) on top.
  Transactional variants show 0: the shard is written before the answer.
- **Stream mode at scale.** `stream-scale` is stream mode as DynamoDB runs
  it for a viral reel: its rows' records spread over 32 stream shards, each
  aggregated by its own invocations side by side, DynamoDB's transaction
  conflicts modeled, and the reel resized under load (its settings are in
  the line above its own table, and in docs/benchmarks.md). Each stream
  shard adds to one of the reel's shards, so chunks of different stream
  shards meet on a shard item (32 stream shards on 32, then 64): a
  conflicted transaction is retried on the next shard, where its stream
  shard stays (its turn, kept on its checkpoint), and past its retries its
  batch is handed back to the event source and delivered again. Each
  virtual stream shard hands over its batches on a poll clock of its own,
  as DynamoDB's pollers do. The target is at most 1 % of the aggregator's
  transactions conflicted, no record sent to `OnFailure` (counted
  nowhere), and exact counts after the drain. `stream-scale` is the
  viral reel alone, as issue 21 sets it; `stream-scale-mixed` adds the
  background reels' likes, a few a second on each of a few reels of one
  shard, and shows what their chunks cost each other: every stream shard
  carrying such a reel's likes adds to its one item, and no turn moves
  them apart (docs/counting.md, "What a conflict is worth").
- **Exactness.** "stored − offered" counts every like once its client has
  retried it. The naive counter is exact here too, because the proxy's
  capacity model refuses before writing and the bench injects no lost
  answers; under lost answers a naive retry double counts (see
  `tests/tests/faults.rs` for the product under those faults).
- **Write units per like** are attributed by partition key from the proxy's
  per-key counts: a viral like's units are those of the viral reel's
  shards, settings and like rows, and of the `Idempotency-Key` records
  (only viral likes carry a key); a background like's are those of the
  background reels and their users' like rows. A keyed like is one
  transaction of three items at 2 units each (like row, shard, key
  record): 6 units; an unkeyed like is 4. The naive counter's bare
  increment is 1 unit, with no like row: no unlike, no deduplication, no
  truth to reconcile from. `auto` pays a little more per viral like for its
  settings writes while it resizes. Dollars per million follow from the
  units and the price.
- **Read units per feed read** divide every read unit by the number of feed
  reads, so with the cache off (`fixed-nocache`) they include the count
  every like reads back (10 shards each). "Shard reads/s" is what the
  product's batch reads fetched; "without a cache (equiv.)" is computed,
  the feed reads alone: feed reads a second × the shards they sum.
- **Noise.** Latency is loopback to an emulator on SQLite, not DynamoDB's;
  the p99 of `auto` is the function's own backoff on throttled
  transactions before it has grown. Each variant runs BENCH_RUNS times,
  interleaved; the table gives the median and the min–max over the runs.
EOF
  echo "  The machine's load average (1, 5, 15 min) was $load_start when the"
  echo "  benchmark started and $load_end when it ended."
  if [ -s "$work/costs.md" ]; then
    echo
    cat "$work/costs.md"
  fi
  cat <<'EOF'

## Lambda figures

`scripts/lambda-figures.sh`: release bootstraps, built as cargo-lambda
builds them (the workspace's release profile), each next to a minimal
`lambda_runtime` hello-world built the same way.

EOF
  cat "$work/lambda.md"
  if [ "$lambda" != skip ]; then
    echo
    cat <<'EOF'
Notes:

- Host build (x86_64-unknown-linux-gnu), same [profile.release] for every binary: opt-level 3, lto thin, codegen-units 1, strip, panic unwind. Deployed bootstraps come from `cargo lambda build --release --arm64` (aarch64-unknown-linux-gnu, linked by cargo-lambda through zig), whose absolute sizes and times differ; the ratios are the comparable figures.
- Cold start is process spawn to the first /next poll (init) and to the first response POST received (init + first invocation) on a fake Runtime API over loopback; DynamoDB is the local stack's embedded dynoxide over plain HTTP on loopback, so neither TLS to DynamoDB, network latency, Lambda's sandbox set-up nor its code download is in the figures.
- CPU ms is the CPU time of all the process's threads (/proc/<pid>/task/*/schedstat) when it polls /next after the first response: less sensitive to other work on the machine than the wall-clock columns.
- Peak memory is VmHWM of the process after its first invocation (read when it polls /next again). The Lambda memory limit is not enforced here.
- Handler overhead is bytes-in to bytes-out of one invocation (event deserialisation, handler, response serialisation), with DynamoDB answered in memory by the SDK's test HTTP client; the Runtime API exchange (the same for every function) is excluded. 'deployed' writes the functions' JSON logs at INFO and EMF metrics lines to stdout (a pipe, as on Lambda), as the template configures them; 'quiet' writes neither. The canned client's own work (matching the operation, handing back a static body) is inside the figure, and small.
EOF
  fi
  echo
  echo "## Reproducing this file"
  echo
  echo "\`$reproduce\`"
  echo
  case $lambda in
    reuse) echo "with these settings (the defaults unless set on that line; the Lambda figures' are those of the earlier run they come from):" ;;
    *) echo "with these settings (the defaults unless set on that line):" ;;
  esac
  echo
  echo "| variable | value |"
  echo "| --- | --- |"
  cat "$work/bench-settings.tsv" "$work/lambda-settings.tsv" |
    while IFS=$'\t' read -r name value; do echo "| \`$name\` | $value |"; done
} > "$out"
echo "benchmarks: wrote $out" >&2
