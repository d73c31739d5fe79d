#!/usr/bin/env bash
# End-to-end check of `make serve` as a user runs it: start the local stack
# binary on free ports (FAULTS and the event sources' faults unset), first
# with COUNTING=stream, then as is, and require each first start to be quiet
# (no WARN or ERROR line in its log; a banner that lists the three tables
# and says the fault proxy injects nothing). On the second stack, once
# /healthz answers, run the README's five-minute tour against it as written
# (the curl session, the demo burst, a resize, a reconciliation), check
# `make reconcile`'s command and the admin route again on their own, then
# stop the stack with SIGTERM and require a clean, prompt exit (the first
# stack too).
#
# The tour (also described in docs/testing.md):
# - It is every ```sh block between `<!-- tour:begin -->` and
#   `<!-- tour:end -->` in README.md, in order, run as one bash script
#   (`set -euo pipefail`) from the repository root. Other blocks are not run.
# - BASE_URL and AWS_ENDPOINT_URL_DYNAMODB name the stack started here; the
#   README writes ${BASE_URL:-http://127.0.0.1:3000}, and the Makefile's
#   targets read both, so the same text works on the default ports.
# - `make` runs as a reader runs it (not as a sub-make of `make smoke`),
#   except that CARGO points to a shim: `cargo run … --bin likes-local --
#   ARGS` (what `make demo` and `make reconcile` run) runs the binary under
#   test with ARGS instead of building it again; anything else goes to cargo.
# - A command is one line, or several joined by a trailing `\`. A line
#   `# => EXPECTED` right after a command promises something about what the
#   command prints on stdout:
#     EXPECTED a JSON object: the output holds a JSON object, starting on its
#       own line, that contains it: every key with an equal value (nested
#       objects compared the same way; true is not 1); other keys ignored.
#     anything else: EXPECTED appears in the output as it is.
#   Several `# =>` lines may follow one command; each must hold.
set -euo pipefail
bin=${1:-target/debug/likes-local}
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work=$(mktemp -d)
log=$work/serve.log
pid=""
base=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT

# start_serve LOG [VAR=VALUE...]: starts `serve` (pid in $pid) with its
# stdout and stderr in LOG, and waits until it is ready (base URL in $base).
start_serve() {
  local out=$1
  shift
  env "$@" PORT=0 DYNAMODB_PORT=0 "$bin" serve >"$out" 2>&1 &
  pid=$!
  base=""
  for _ in $(seq 1 100); do
    base=$(sed -n 's#^ready: \(http://[^ ]*\)/healthz$#\1#p' "$out")
    [ -n "$base" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$out"; echo "smoke: serve exited early" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$base" ] || { cat "$out"; echo "smoke: serve never became ready" >&2; exit 1; }
}

# stop_serve: SIGTERM, then a clean, prompt exit.
stop_serve() {
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
  pid=""
}

# check_quiet_start LOG WHAT: a clean first start says nothing alarming. Its
# log (tracing's lines: time, level, target; colours stripped) has no WARN
# or ERROR line, and the banner names the template's three tables.
check_quiet_start() {
  local plain noisy
  plain=$(sed 's/\x1b\[[0-9;]*m//g' "$1")
  noisy=$(grep -E ' (WARN|ERROR) ' <<<"$plain" || true)
  if [ -n "$noisy" ]; then
    cat "$1"
    printf 'smoke: %s logged warnings or errors on a clean start:\n%s\n' "$2" "$noisy" >&2
    exit 1
  fi
  grep -qx '  tables:   CountersTable, LikesTable, ViewsTable' <<<"$plain" \
    || { cat "$1"; echo "smoke: $2: the banner does not list CountersTable, LikesTable, ViewsTable" >&2; exit 1; }
  grep -q '^  faults:   none: ' <<<"$plain" \
    || { cat "$1"; echo "smoke: $2: the banner does not say that no faults are injected" >&2; exit 1; }
}

# ---- A quiet first start, in both counting modes ----------------------------
# FAULTS unset: the banner's faults line is the no-faults one.
log=$work/serve-stream.log
start_serve "$log" -u FAULTS -u LOCAL_STREAM_FAULTS -u LOCAL_VIEWS_FAULTS COUNTING=stream
check_quiet_start "$log" "serve (COUNTING=stream)"
stop_serve

log=$work/serve.log
start_serve "$log" -u FAULTS -u LOCAL_STREAM_FAULTS -u LOCAL_VIEWS_FAULTS
check_quiet_start "$log" serve
dynamo=$(sed -n 's#^  DynamoDB: \(http://[^ ]*\) .*#\1#p' "$log")
# Output is captured first and matched with a here-string: `cmd | grep -q`
# lets grep exit at its first match, and a writer that writes again after
# that meets a closed pipe (SIGPIPE or EPIPE), which fails the pipeline
# under pipefail, depending on timing.
health=$(curl -fsS "$base/healthz")
grep -q '"ok"' <<<"$health" || { echo "$health"; echo "smoke: /healthz not ok" >&2; exit 1; }

# ---- The README tour --------------------------------------------------------
cat >"$work/cargo" <<'SHIM'
#!/usr/bin/env bash
# `cargo run … --bin likes-local -- ARGS` → the binary under test; else cargo.
if [ "${1:-}" = run ] && [[ " $* " == *" likes-local "* ]]; then
  args=("$@")
  for i in "${!args[@]}"; do
    [ "${args[$i]}" = -- ] && exec "$LIKES_LOCAL_BIN" "${args[@]:$((i + 1))}"
  done
  exec "$LIKES_LOCAL_BIN"
fi
exec cargo "$@"
SHIM
chmod +x "$work/cargo"

cat >"$work/tour.sh" <<'PREAMBLE'
set -euo pipefail
__tour_cmd=""
trap 'echo "tour: failed (exit $?): $__tour_cmd" >&2' ERR
# $1: what the command printed; stdin: one `# =>` promise (without `# => `).
__tour_expect() {
  local want
  want=$(cat)
  if [[ $want == '{'* ]]; then
    "$TOUR_PYTHON" - "$1" "$want" <<'PY' && return 0
import json, re, sys
out, want = sys.argv[1], sys.argv[2]
try:
    want = json.loads(want)
except ValueError as e:
    sys.exit(f"tour: the promise is not valid JSON ({e}): {want}")
def contains(have, want):
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            k in have and contains(have[k], v) for k, v in want.items())
    if isinstance(want, bool) or isinstance(have, bool):
        return have is want
    return have == want
decoder = json.JSONDecoder()
for m in re.finditer(r"^\{", out, re.M):
    try:
        have, _ = decoder.raw_decode(out[m.start():])
    except ValueError:
        continue
    sys.exit(0 if contains(have, want) else 1)
sys.exit(1)
PY
  elif [[ $1 == *"$want"* ]]; then
    return 0
  fi
  printf 'tour: %s\n  printed: %s\n  promised: # => %s\n' "$__tour_cmd" "$1" "$want" >&2
  return 1
}
PREAMBLE

# README.md → $work/tour.sh: each command as written; one with promises runs inside
# $(…) (on lines of its own, so a trailing comment stays a comment), its
# output is printed, then checked against each promise.
awk -v heredoc=__TOUR_TEXT__ '
  function text(s) { return "<<'\''" heredoc "'\''\n" s "\n" heredoc "\n" }
  function flush(   i) {
    if (cmd == "") return
    printf "__tour_cmd=$(cat %s)\n", text(cmd)
    printf "printf '\''$ %%s\\n'\'' \"$__tour_cmd\"\n"
    if (n == 0) {
      print cmd
    } else {
      printf "__tour_out=$(\n%s\n)\nprintf '\''%%s\\n'\'' \"$__tour_out\"\n", cmd
      for (i = 1; i <= n; i++) printf "__tour_expect \"$__tour_out\" %s", text(want[i])
    }
    cmd = ""; n = 0; cont = 0
  }
  /<!-- tour:begin -->/ { tour = 1; next }
  /<!-- tour:end -->/   { tour = 0; next }
  tour && !block && /^```sh[ \t]*$/ { block = 1; blocks++; next }
  block && /^```[ \t]*$/ { flush(); block = 0; next }
  !block { next }
  /^# => / {
    if (cmd == "" || cont) { printf "README.md:%d: a promise without a command\n", NR > "/dev/stderr"; bad = 1 }
    want[++n] = substr($0, 6); next
  }
  cont { cmd = cmd "\n" $0; cont = /\\$/; next }
  {
    flush()
    if ($0 ~ /^[ \t]*(#.*)?$/) { print; next }
    cmd = $0; cont = /\\$/
  }
  END {
    if (blocks == 0) { print "README.md: no ```sh block between the tour markers" > "/dev/stderr"; bad = 1 }
    if (block) { print "README.md: the tour ends inside a block" > "/dev/stderr"; bad = 1 }
    exit bad
  }
' README.md >>"$work/tour.sh" || { echo "smoke: cannot read the tour from README.md" >&2; exit 1; }

# The checks this smoke test used to make itself are now the tour's: fail
# loudly if an edit of the README drops one of them.
for required in 'make demo' 'make resize REEL=' 'make reconcile' 'DRY_RUN=1'; do
  grep -qF -- "$required" "$work/tour.sh" \
    || { echo "smoke: the README tour no longer runs \`$required\`" >&2; exit 1; }
done

# JSON promises are checked by python3, resolved once: a version manager's
# `python3` shim can take a fifth of a second to start, every time.
py=$(python3 -c 'import sys; print(sys.executable)')
echo "smoke: the README tour against $base"
if ! env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS \
  BASE_URL="$base" AWS_ENDPOINT_URL_DYNAMODB="$dynamo" \
  CARGO="$work/cargo" LIKES_LOCAL_BIN="$bin" TOUR_PYTHON="$py" \
  bash "$work/tour.sh"; then
  echo "smoke: the README tour failed (the stack's log follows)" >&2
  cat "$log" >&2
  exit 1
fi

# ---- The stack after the tour -----------------------------------------------
# `make reconcile` against the same stack: a complete run that finds the
# tour's and the demo's counts exact (no correction), and a dry run.
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

stop_serve
echo "make serve + README tour smoke test:"
echo "smoke: 1 passed, 0 failed"
