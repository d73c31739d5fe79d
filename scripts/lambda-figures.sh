#!/usr/bin/env bash
# Lambda figures (docs/benchmarks.md): per function, the release bootstrap's size, the cold start
# (process start to the first /next poll, and to the first response with the
# SDK client built and a real first request served), the peak memory, and
# the warm per-request handler overhead without network; each next to a
# minimal lambda_runtime hello-world built the same way, as a ratio.
#
#   scripts/lambda-figures.sh            build, measure, report
#   RUNS=20 scripts/lambda-figures.sh    cold starts per binary (default 10)
#   SKIP_BUILD=1 scripts/lambda-figures.sh   measure what is built
#
# Other knobs: WARMUP (1: discarded cold starts before the measured ones),
# BENCH_MEASURE_MS (3000), BENCH_WARMUP_MS (1000).
#
# Everything builds into target/bench-release, the CARGO_TARGET_DIR of every
# release build of the benchmarks (not target/, so these long builds never
# hold the lock the tests need). Writes target/lambda-figures.json (the
# record: figures, machine, settings, exact commands) and
# target/lambda-figures.md, and prints the Markdown; `make benchmarks`
# includes the figures from the JSON (bench/lambda/report.py --fragment).
# See bench/lambda/README.md for what is and is not measured.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

export CARGO_TARGET_DIR="$ROOT/target/bench-release"
export CARGO_TERM_COLOR=never
RUNS=${RUNS:-10}
WARMUP=${WARMUP:-1}
BENCH_MEASURE_MS=${BENCH_MEASURE_MS:-3000}
BENCH_WARMUP_MS=${BENCH_WARMUP_MS:-1000}
SKIP_BUILD=${SKIP_BUILD:-0}
BIN="$CARGO_TARGET_DIR/release"
WORK="$CARGO_TARGET_DIR/figures"
OUT_JSON="$ROOT/target/lambda-figures.json"
OUT_MD="$ROOT/target/lambda-figures.md"

for tool in cargo python3; do
  command -v "$tool" >/dev/null || { echo "lambda-figures: $tool not found" >&2; exit 1; }
done

mkdir -p "$WORK"
# No ~/.aws for the SDK to read, as on Lambda.
EMPTY_HOME="$WORK/home"
rm -rf "$EMPTY_HOME"
mkdir -p "$EMPTY_HOME"
rm -f "$WORK"/cold-*.json "$WORK"/bench-meta-*.json
rm -rf "$WORK/logs" "$CARGO_TARGET_DIR/criterion/handler-deployed" "$CARGO_TARGET_DIR/criterion/handler-quiet"
COMMANDS="$WORK/commands.txt"
: >"$COMMANDS"

# Runs a command, recording it (relative to the repository) for the report.
run() {
  local line
  line=$(printf '%q ' "$@" | sed "s#$ROOT/##g")
  printf '%s\n' "${line% }" >>"$COMMANDS"
  printf '+ %s\n' "${line% }" >&2
  "$@"
}

now() { date +%s.%N; }
echo "CARGO_TARGET_DIR=target/bench-release" >>"$COMMANDS"

# ---------------------------------------------------------------- build
build_start=$(now)
if [ "$SKIP_BUILD" != 1 ]; then
  # The functions, exactly as the workspace builds them.
  run cargo build --release --locked -p like -p read -p reshard -p reconcile -p aggregate -p view -p aggregate-views
  # The local stack, only for its embedded DynamoDB (dynoxide) and tables.
  run cargo build --release --locked -p likes-local
  # The baselines: own workspaces, same release profile, lock seeded from
  # the workspace's.
  run cargo build --release --locked --manifest-path bench/lambda/hello/Cargo.toml
  run cargo build --release --locked --manifest-path bench/lambda/hello-http/Cargo.toml
  run cargo bench --locked --manifest-path bench/lambda/overhead/Cargo.toml --no-run
fi
build_end=$(now)
for b in like read reshard reconcile aggregate view aggregate-views hello hello-http likes-local; do
  [ -x "$BIN/$b" ] || { echo "lambda-figures: $BIN/$b missing (run without SKIP_BUILD)" >&2; exit 1; }
done

# -------------------------------------------------------------- measure
measure_start=$(now)
cat /proc/loadavg >"$WORK/loadavg-measure-start.txt" 2>/dev/null || true

# DynamoDB for the functions' first requests: the local stack's embedded
# dynoxide with the template's tables, on free ports, schedule off.
LOCAL_OUT="$WORK/local.out"
LOCAL_PID=
cleanup() {
  if [ -n "$LOCAL_PID" ]; then
    kill "$LOCAL_PID" 2>/dev/null || true
    wait "$LOCAL_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
echo "PORT=0 DYNAMODB_PORT=0 LOCAL_SCHEDULE_SECS=0 target/bench-release/release/likes-local serve   # DynamoDB for the cold starts" >>"$COMMANDS"
env -u AWS_ENDPOINT_URL_DYNAMODB -u AWS_ENDPOINT_URL -u FAULTS \
  PORT=0 DYNAMODB_PORT=0 LOCAL_SCHEDULE_SECS=0 RUST_LOG=warn \
  "$BIN/likes-local" serve >"$LOCAL_OUT" 2>"$WORK/local.err" &
LOCAL_PID=$!
for _ in $(seq 1 600); do
  grep -q '^ready:' "$LOCAL_OUT" 2>/dev/null && break
  kill -0 "$LOCAL_PID" 2>/dev/null || { cat "$WORK/local.err" >&2; echo "lambda-figures: the local stack exited" >&2; exit 1; }
  sleep 0.1
done
grep -q '^ready:' "$LOCAL_OUT" || { echo "lambda-figures: the local stack did not start" >&2; exit 1; }
DYNAMODB=$(sed -n 's/^ *DynamoDB: *\(http:[^ ]*\).*/\1/p' "$LOCAL_OUT")
TABLES=$(sed -n 's/^ *tables: *//p' "$LOCAL_OUT")
# The banner lists the template's tables in its order: counters, likes, views.
COUNTERS_TABLE=$(echo "$TABLES" | cut -d, -f1 | tr -d ' ')
LIKES_TABLE=$(echo "$TABLES" | cut -d, -f2 | tr -d ' ')
# Stream mode's writer items live in the views table (WRITERS_TABLE, as
# the template wires it): the aggregate function's batch writes there.
VIEWS_TABLE=$(echo "$TABLES" | cut -d, -f3 | tr -d ' ')
# The views stream (kinesis-mock) the stack started: the view functions'
# first requests put on it and list its shards.
KINESIS=$(sed -n 's/^ *views: .* on \(http:[^ ]*\) .*/\1/p' "$LOCAL_OUT")
[ -n "$DYNAMODB" ] && [ -n "$COUNTERS_TABLE" ] && [ -n "$LIKES_TABLE" ] && [ -n "$KINESIS" ] ||
  { cat "$LOCAL_OUT" >&2; echo "lambda-figures: could not read the local stack's endpoint and tables" >&2; exit 1; }
echo "DynamoDB: $DYNAMODB ($COUNTERS_TABLE, $LIKES_TABLE)" >&2

# cold <label> <binary> <event> <memory MB> [runtime_api.py options...]
cold() {
  local label=$1 binary=$2 event=$3 memory=$4
  shift 4
  local file
  file="$WORK/cold-$(printf '%s' "$label" | sed 's#[^A-Za-z0-9._-]\{1,\}#-#g').json"
  run python3 bench/lambda/runtime_api.py --bin "$BIN/$binary" --event "$event" --runs "$RUNS" --warmup "$WARMUP" \
    --label "$label" --out "$file" --log-dir "$WORK/logs" \
    --env AWS_LAMBDA_FUNCTION_NAME="likes-$binary" \
    --env AWS_LAMBDA_FUNCTION_MEMORY_SIZE="$memory" \
    --env AWS_LAMBDA_FUNCTION_VERSION='$LATEST' \
    --env AWS_LAMBDA_LOG_GROUP_NAME="/aws/lambda/likes-$binary" \
    --env AWS_LAMBDA_LOG_STREAM_NAME=bench \
    --env AWS_LAMBDA_LOG_FORMAT=JSON \
    --env AWS_REGION=us-east-1 --env AWS_DEFAULT_REGION=us-east-1 \
    --env AWS_ACCESS_KEY_ID=AKIDLAMBDAFIGURES --env AWS_SECRET_ACCESS_KEY=lambda-figures \
    --env AWS_SESSION_TOKEN=lambda-figures \
    --env HOME="$EMPTY_HOME" \
    --env AWS_ENDPOINT_URL_DYNAMODB="$DYNAMODB" \
    --env COUNTERS_TABLE="$COUNTERS_TABLE" --env LIKES_TABLE="$LIKES_TABLE" \
    --env WRITERS_TABLE="$VIEWS_TABLE" \
    --env SHARD_KEY=lambda-figures-shard-key-0123456789abcdef \
    "$@"
}

# Baselines first, then the functions (memory sizes as in template.yaml;
# informational only, nothing enforces them here).
cold hello hello events/read.json 256
cold hello-http hello-http events/read.json 256 --expect-status 200
# Every run is the first like of a fresh user with a fresh key.
cold like like events/like.json 256 --expect-status 200 \
  --vary requestContext.authorizer.jwt.claims.sub --vary headers.idempotency-key
cold read read events/read.json 256 --expect-status 200
cold "read /healthz" read events/healthz.json 256 --expect-status 200
# The SDK's HTTPS client (rustls) loads the system's root certificates when
# the client is built, a file and a directory: the same /healthz cold start
# with only the CA bundle file shows that part of init on this host, whose
# certificate directory (Debian's: one file per CA) is costlier to read.
CA_BUNDLE=
for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
  [ -f "$f" ] && { CA_BUNDLE=$f; break; }
done
if [ -n "$CA_BUNDLE" ]; then
  mkdir -p "$WORK/empty-cert-dir"
  cold "read /healthz, CA bundle only" read events/healthz.json 256 --expect-status 200 \
    --env SSL_CERT_FILE="$CA_BUNDLE" --env SSL_CERT_DIR="$WORK/empty-cert-dir"
fi
cold reshard reshard events/reshard-schedule.json 256
cold reconcile reconcile events/reconcile-dry-run.json 1024
# The aggregate function exists in stream mode only (the template makes it
# when its Counting parameter is stream, and sets COUNTING from that): its
# writer items go to WRITERS_TABLE.
cold aggregate aggregate events/aggregate.json 256 --env COUNTING=stream
# Views: a batch put on the local stream (a fresh viewer each run), and
# the aggregator applying a sample batch (checkpoint and seen-id reads,
# parents listed, one chunk; later runs find it applied).
cold view view events/views.json 256 --expect-status 202 \
  --vary requestContext.authorizer.jwt.claims.sub \
  --env VIEWS_STREAM=ViewsStream --env AWS_ENDPOINT_URL_KINESIS="$KINESIS"
cold aggregate-views aggregate-views events/aggregate-views.json 256 \
  --env VIEWS_STREAM=ViewsStream --env VIEWS_TABLE=ViewsTable \
  --env AWS_ENDPOINT_URL_KINESIS="$KINESIS"
cleanup
LOCAL_PID=

# Warm per-request overhead. In the `deployed` output the functions write
# their JSON logs and EMF lines to stdout, a pipe as on Lambda; only
# criterion's own lines are kept. Its figures are read from its JSON files.
for output in deployed quiet; do
  echo "HOME=target/bench-release/figures/home LAMBDA_BENCH_OUTPUT=$output LAMBDA_BENCH_MEASURE_MS=$BENCH_MEASURE_MS LAMBDA_BENCH_WARMUP_MS=$BENCH_WARMUP_MS LAMBDA_BENCH_META=target/bench-release/figures/bench-meta-$output.json cargo bench --locked --manifest-path bench/lambda/overhead/Cargo.toml" >>"$COMMANDS"
  echo "+ LAMBDA_BENCH_OUTPUT=$output cargo bench --locked --manifest-path bench/lambda/overhead/Cargo.toml" >&2
  env -u AWS_ENDPOINT_URL_DYNAMODB -u AWS_ENDPOINT_URL -u RUST_LOG -u AWS_LAMBDA_LOG_LEVEL \
    LAMBDA_BENCH_OUTPUT="$output" LAMBDA_BENCH_MEASURE_MS="$BENCH_MEASURE_MS" \
    LAMBDA_BENCH_WARMUP_MS="$BENCH_WARMUP_MS" LAMBDA_BENCH_META="$WORK/bench-meta-$output.json" \
    HOME="$EMPTY_HOME" CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" \
    cargo bench --locked --manifest-path bench/lambda/overhead/Cargo.toml |
    awk -v sample="$WORK/bench-$output.sample" \
      'NR <= 30 && /^\{/ { print > sample } /^(handler-| +(time|change|thrpt):|Found )/ { print; fflush() }' \
      >"$WORK/bench-$output.stdout"
  grep -E '^handler-| time:' "$WORK/bench-$output.stdout" >&2 || true
  [ -s "$WORK/bench-meta-$output.json" ] || { echo "lambda-figures: the $output benchmark did not run" >&2; exit 1; }
done
measure_end=$(now)

python3 bench/lambda/report.py --work "$WORK" --bin-dir "$BIN" --criterion "$CARGO_TARGET_DIR/criterion" \
  --json "$OUT_JSON" --md "$OUT_MD" --runs "$RUNS" --warmup "$WARMUP" --commands "$COMMANDS" --dynamodb "$DYNAMODB" \
  --measure-ms "$BENCH_MEASURE_MS" --warmup-ms "$BENCH_WARMUP_MS" \
  --build-seconds "$(awk "BEGIN { print $build_end - $build_start }")" \
  --measure-seconds "$(awk "BEGIN { print $measure_end - $measure_start }")"
echo "wrote ${OUT_JSON#"$ROOT"/} and ${OUT_MD#"$ROOT"/}" >&2
