#!/usr/bin/env bash
# Property-based check of openapi.yaml against the real local stack: starts
# the already-built `likes-local serve` binary ($1, default
# target/debug/likes-local) on free ports (API and embedded DynamoDB), waits
# for /healthz, and runs schemathesis (a pinned version, installed into a
# venv on first use: only python3 with venv/pip is needed) over every
# operation of openapi.yaml. It fails on any 5xx, any response whose status,
# content type, headers or body the document does not describe, and any
# request the document says is invalid that the API accepts.
#
#   scripts/schemathesis.sh [path/to/likes-local]
#
# Environment: SCHEMATHESIS_VENV (default target/schemathesis-venv),
# SCHEMATHESIS_MAX_EXAMPLES (default 100 per operation and phase),
# SCHEMATHESIS_ARGS (extra arguments for `schemathesis run`).
set -euo pipefail

SCHEMATHESIS_VERSION=4.32.5

bin=${1:-target/debug/likes-local}
[ -x "$bin" ] || { echo "schemathesis: $bin is not an executable (build it: cargo build -p likes-local)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

venv=${SCHEMATHESIS_VENV:-target/schemathesis-venv}
st="$venv/bin/schemathesis"
if [ "$("$st" --version 2>/dev/null || true)" != "schemathesis, version $SCHEMATHESIS_VERSION" ]; then
  echo "schemathesis: installing schemathesis==$SCHEMATHESIS_VERSION into $venv" >&2
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
venv=$(cd "$venv" && pwd)
st="$venv/bin/schemathesis"

work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The local stack as `make serve` runs it (dev auth mode), on free ports,
# with an in-memory emulator: every run starts from empty tables. The
# reshard schedule is off so that answers depend on the requests alone and
# a run is reproducible (with it, resizes advance on the clock, statuses
# change, and the stateful phase takes other paths); tests/tests/reshard.rs
# covers the schedule. Every request comes from one user, so the
# per-caller write bounds, and its read units a minute, are set too wide to
# meet: they would answer most of its likes and reads 429
# (tests/tests/callers.rs and tests/tests/read_budget.rs cover them).
RUST_LOG=${RUST_LOG:-warn} LOCAL_SCHEDULE_SECS=0 PORT=0 DYNAMODB_PORT=0 \
  USER_WRITES_PER_SEC=100000 USER_WRITE_BURST=10000 REEL_TOGGLES_PER_MIN=10000 \
  USER_REELS_PER_HOUR=100000 USER_KEYS_PER_MIN=100000 CALLER_READ_UNITS_PER_MIN=0 \
  "$bin" serve >"$work/serve.log" 2>&1 &
pid=$!
base=""
for _ in $(seq 1 300); do
  base=$(sed -n 's#^ready: \(http://[^ ]*\)/healthz$#\1#p' "$work/serve.log")
  [ -n "$base" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; echo "schemathesis: serve exited early" >&2; exit 1; }
  sleep 0.1
done
[ -n "$base" ] || { cat "$work/serve.log"; echo "schemathesis: serve never became ready" >&2; exit 1; }
"$venv/bin/python" - "$base/healthz" <<'EOF' || { cat "$work/serve.log"; echo "schemathesis: /healthz is not ok" >&2; exit 1; }
import json, sys, time, urllib.request
for _ in range(50):
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
            if json.load(r).get("status") == "ok":
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(1)
EOF

# The checks, all named in the configuration file (a per-operation setting
# does not override a check named with --checks):
# - not_a_server_error: no 5xx;
# - status_code_conformance, content_type_conformance,
#   response_schema_conformance, response_headers_conformance: every answer
#   (status, Content-Type, body, Retry-After / Cache-Control) is one the
#   document describes;
# - negative_data_rejection: what the document calls invalid is refused
#   (413, a body over 1 KiB, is a refusal too). Off for GET /likes: its
#   limit is 100 *distinct* ids (duplicates are merged), which JSON Schema
#   cannot say; `maxItems: 100` is what clients must send, not exactly what
#   the API refuses (tests/tests/openapi.rs covers that route's refusals);
# - positive_data_acceptance: what the document calls valid is accepted;
# - unsupported_method, allow_header_conformance: an undocumented method is
#   405 with an Allow header naming the documented ones.
# Left out: ignored_auth (dev mode has no authorizer: reads and admin routes
# are open by design), use_after_free and ensure_resource_availability (an
# unlike is not the deletion of a resource), missing_required_header (no
# operation has a required header parameter).
cat >"$work/schemathesis.toml" <<'EOF'
[checks]
enabled = false
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_schema_conformance.enabled = true
response_headers_conformance.enabled = true
positive_data_acceptance.enabled = true
unsupported_method.enabled = true
allow_header_conformance.enabled = true

[checks.negative_data_rejection]
enabled = true
expected-statuses = ["400", "401", "403", "404", "405", "409", "413", "422", "429", "5xx"]

[[operations]]
include-path = "/likes"
checks.negative_data_rejection.enabled = false

# Erasure's user id is documented narrower than what the API accepts (any
# valid JWT `sub`), so an id outside the pattern is not refused.
[[operations]]
include-path = "/admin/users/{user_id}/likes"
checks.negative_data_rejection.enabled = false
EOF

# Run from the scratch directory so Hypothesis and schemathesis leave their
# caches there, not in the work tree.
set +e
(
  cd "$work"
  # shellcheck disable=SC2086 # SCHEMATHESIS_ARGS is split on purpose
  "$st" --config-file "$work/schemathesis.toml" run "$root/openapi.yaml" \
    --url "$base" \
    --header 'x-user-id: schemathesis' \
    --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-100}" \
    --generation-deterministic \
    --generation-with-security-parameters false \
    --request-timeout 15 \
    --workers 1 \
    --no-color \
    ${SCHEMATHESIS_ARGS:-}
)
status=$?
set -e
if ! kill -0 "$pid" 2>/dev/null; then
  cat "$work/serve.log"
  echo "schemathesis: the local stack died during the run" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "--- local stack log (last 50 lines) ---"
  tail -n 50 "$work/serve.log"
  echo "schemathesis: 0 passed, 1 failed"
  exit "$status"
fi
echo "schemathesis: 1 passed, 0 failed"
