#!/usr/bin/env bash
# End-to-end check of `make serve` as a user runs it: start the local stack
# binary on free ports, wait for /healthz, fire the demo burst at it, then
# stop it with SIGTERM and require a clean, prompt exit.
set -euo pipefail
bin=${1:-target/debug/likes-local}
log=$(mktemp)
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT

PORT=0 DYNAMODB_PORT=0 "$bin" serve >"$log" 2>&1 &
pid=$!
base=""
for _ in $(seq 1 100); do
  base=$(sed -n 's#^ready: \(http://[^ ]*\)/healthz$#\1#p' "$log")
  [ -n "$base" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "smoke: serve exited early" >&2; exit 1; }
  sleep 0.1
done
[ -n "$base" ] || { cat "$log"; echo "smoke: serve never became ready" >&2; exit 1; }
dynamo=$(sed -n 's#^  DynamoDB: \(http://[^ ]*\) .*#\1#p' "$log")
# Output is captured first and matched with a here-string: `cmd | grep -q`
# lets grep exit at its first match, and a writer that writes again after
# that meets a closed pipe (SIGPIPE or EPIPE), which fails the pipeline
# under pipefail, depending on timing.
health=$(curl -fsS "$base/healthz")
grep -q '"ok"' <<<"$health" || { echo "$health"; echo "smoke: /healthz not ok" >&2; exit 1; }

BASE_URL=$base AWS_ENDPOINT_URL_DYNAMODB=$dynamo DEMO_USERS=${DEMO_USERS:-1000} "$bin" demo

# `make reconcile` against the same stack: a complete run that finds the
# demo's counts exact (no correction), and a dry run.
summary=$(AWS_ENDPOINT_URL_DYNAMODB=$dynamo "$bin" reconcile)
grep -q '"complete": true' <<<"$summary" || { echo "$summary"; echo "smoke: reconcile incomplete" >&2; exit 1; }
grep -q '"reels_corrected": 0' <<<"$summary" || { echo "$summary"; echo "smoke: reconcile corrected the demo" >&2; exit 1; }
dry=$(AWS_ENDPOINT_URL_DYNAMODB=$dynamo DRY_RUN=1 "$bin" reconcile)
grep -q '"dry_run": true' <<<"$dry" || { echo "$dry"; echo "smoke: dry run not reported" >&2; exit 1; }

# The admin route of the reshard function answers too (open in dev mode).
started=$(curl -fsS -X POST -H 'content-type: application/json' -d '{"shards": 4}' \
  "$base/admin/reels/smoke/shards")
grep -q '"phase":"growing"' <<<"$started" || { echo "$started"; echo "smoke: resize not started" >&2; exit 1; }
state=$(curl -fsS "$base/admin/reels/smoke/shards")
grep -q '"read_shards":4' <<<"$state" || { echo "$state"; echo "smoke: resize state wrong" >&2; exit 1; }

kill -TERM "$pid"
for _ in $(seq 1 50); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  echo "smoke: serve did not stop on SIGTERM" >&2
  exit 1
fi
wait "$pid" || { cat "$log"; echo "smoke: serve exited non-zero" >&2; exit 1; }
echo "make serve + demo smoke test:"
echo "smoke: 1 passed, 0 failed"
