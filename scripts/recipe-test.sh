#!/usr/bin/env bash
# `make recipes`: the recipes of the docs that a user copies and that run on
# this machine, run as written. Today one: docs/deploying.md, "Function
# binaries without Docker" (cargo-lambda), the ```sh block between
# `<!-- recipe:cargo-lambda:begin -->` and `<!-- recipe:cargo-lambda:end -->`.
#
#   scripts/recipe-test.sh [target/debug/likes-local]
#
# The block, read from the doc each run:
# - A command is one line, or several joined by a trailing `\`; a `#`
#   comment at the end of its last line names its terminal.
# - The first command must be exactly `make serve` (terminal 1). It is run
#   as the binary `make serve` builds (the argument) on free loopback ports
#   (PORT=0 DYNAMODB_PORT=0), read from its banner.
# - The second (`# terminal 2`) is run in the background, in a session of
#   its own, with the DynamoDB URL it names (`http://127.0.0.1:8000`, once,
#   required) replaced by the banner's. It must run `cargo lambda watch`.
# - Every other command is run in turn (terminal 3) once the emulator
#   listens; each must exit 0 and, being a `cargo lambda invoke`, print an
#   API Gateway answer with `statusCode` 200 and a `body` with a `count`
#   (the read after the like: the like's count, at least 1).
# - `cargo` is a shim in front of the real one: `cargo lambda watch` and
#   `cargo lambda invoke` get `--invoke-port` (a free port, not 9000), and
#   watch also `--ignore-changes` (an edit of the tree during the run must
#   not rebuild a function mid-test); anything else goes to cargo as is
#   (so the `cargo run --bin <function>` that watch starts is the real one,
#   in target/ or CARGO_TARGET_DIR, dev profile).
# - The functions are built first (`cargo build --bin like --bin read`:
#   the same artifacts as watch's `cargo run --bin NAME`), so the invokes'
#   time bound (RECIPE_INVOKE_TIMEOUT, default 300 s) need not cover a
#   cold build. A function that exits (refused configuration, failed
#   build) fails its invoke at once, from the watch's log.
#
# cargo-lambda comes from PyPI, pinned, into target/cargo-lambda-venv,
# installed on first use without its `ziglang` dependency (400+ MB, only for
# cross-compiling; `watch` and `invoke` build for the host with cargo).
# Without python3 (with venv) or the package index: FAILS under CI=true;
# elsewhere prints why and exits 0 (skipped).
#
# Every process started here is stopped at the end: the stack by its pid,
# the watch command by its session (cargo-lambda's children included).
set -euo pipefail

CARGO_LAMBDA_VERSION=1.9.2
doc=${RECIPE_DOC:-docs/deploying.md}   # another copy of the page: to try an edit
begin='<!-- recipe:cargo-lambda:begin -->'
end='<!-- recipe:cargo-lambda:end -->'

bin=${1:-target/debug/likes-local}
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
t0=$SECONDS
say() { echo "recipe-test: $*"; }
fail() { echo "recipe-test: FAILED: $*" >&2; exit 1; }
unavailable() {
  if [[ ${CI:-} == true ]]; then
    fail "$1 (CI=true: the recipe test must run here)"
  fi
  say "SKIPPED: $1."
  exit 0
}

work=$(mktemp -d)
serve_pid="" watch_sid=""
stop_all() {
  if [[ -n $watch_sid ]]; then
    # The watch command, cargo-lambda and what it started (cargo, the
    # functions), by the session made for them: SIGTERM, then SIGKILL.
    local pids
    for sig in TERM KILL; do
      pids=$(ps -o pid= -s "$watch_sid" 2>/dev/null | tr -s ' \n' ' ' || true)
      [[ -z ${pids// /} ]] && break
      # shellcheck disable=SC2086
      kill -"$sig" $pids 2>/dev/null || true
      for _ in $(seq 1 50); do
        [[ -z $(ps -o pid= -s "$watch_sid" 2>/dev/null) ]] && break
        sleep 0.1
      done
    done
    watch_sid=""
  fi
  if [[ -n $serve_pid ]]; then
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
    serve_pid=""
  fi
}
# The logs stay in target/recipe-test/ (serve.log, watch.log).
logs=$root/target/recipe-test
trap 'stop_all; mkdir -p "$logs"; cp "$work"/*.log "$logs"/ 2>/dev/null || true; rm -rf "$work"' EXIT

# ---- The recipe, from the doc ------------------------------------------------
# One command per record (NUL-separated), joined lines kept with their `\`.
awk -v begin="$begin" -v end="$end" -v doc="$doc" '
  index($0, begin) { on = 1; next }
  index($0, end)   { on = 0; next }
  on && !block && /^```sh[ \t]*$/ { block = 1; blocks++; next }
  block && /^```[ \t]*$/ { if (cmd != "") printf "%s%c", cmd, 0; cmd = ""; block = 0; next }
  !block { next }
  cont { cmd = cmd "\n" $0; cont = /\\$/; next }
  /^[ \t]*(#.*)?$/ { next }
  { if (cmd != "") printf "%s%c", cmd, 0; cmd = $0; cont = /\\$/ }
  END {
    if (blocks != 1) { printf "%s: %d ```sh blocks between the recipe markers, not 1\n", doc, blocks > "/dev/stderr"; exit 1 }
    if (block || cont) { printf "%s: the recipe ends inside a block or a command\n", doc > "/dev/stderr"; exit 1 }
  }
' "$doc" >"$work/commands" || fail "cannot read the recipe from $doc"
mapfile -d '' -t cmds <"$work/commands"
((${#cmds[@]} >= 3)) || fail "$doc: the recipe has ${#cmds[@]} commands, expected make serve, the watch and invokes"

strip_comment() { sed -E 's/[[:space:]]+#[^"'\'']*$//' <<<"$1"; }
[[ $(strip_comment "${cmds[0]}") == "make serve" ]] \
  || fail "$doc: the recipe's first command is not \`make serve\`: ${cmds[0]}"
watch_cmd=${cmds[1]}
[[ $watch_cmd == *"# terminal 2"* && $watch_cmd == *"cargo lambda watch"* ]] \
  || fail "$doc: the recipe's second command is not \`cargo lambda watch\` (# terminal 2): $watch_cmd"
[[ $(grep -o 'http://127\.0\.0\.1:8000' <<<"$watch_cmd" | wc -l) == 1 ]] \
  || fail "$doc: the watch command must name the DynamoDB of make serve, http://127.0.0.1:8000, once"
invokes=("${cmds[@]:2}")
for c in "${invokes[@]}"; do
  [[ $c == "cargo lambda invoke "* ]] || fail "$doc: a terminal 3 command that is not \`cargo lambda invoke\`: $c"
done
say "the recipe of $doc: make serve, the watch, ${#invokes[@]} invokes"

# ---- Prerequisites -----------------------------------------------------------
[[ -x $bin ]] || fail "$bin is not built (make recipes builds it)"
real_cargo=$(command -v "${CARGO:-cargo}") || fail "no cargo"
python3 -c 'import venv, ensurepip' 2>/dev/null || unavailable "python3 with venv and ensurepip is needed to install cargo-lambda"
venv=$root/target/cargo-lambda-venv
installed() {
  "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("cargo-lambda"))' 2>/dev/null
}
if [[ ! -x $venv/bin/cargo-lambda || "$(installed || true)" != "$CARGO_LAMBDA_VERSION" ]]; then
  say "installing cargo-lambda $CARGO_LAMBDA_VERSION into target/cargo-lambda-venv"
  i0=$SECONDS
  rm -rf "$venv"
  python3 -m venv "$venv" || unavailable "python3 -m venv failed"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    "cargo-lambda==$CARGO_LAMBDA_VERSION" >&2 \
    || { rm -rf "$venv"; unavailable "pip could not install cargo-lambda==$CARGO_LAMBDA_VERSION"; }
  say "installed in $((SECONDS - i0)) s ($(du -sh "$venv" | cut -f1))"
fi

# `cargo` and `cargo-lambda` as the recipe finds them on PATH.
mkdir -p "$work/bin"
ln -s "$venv/bin/cargo-lambda" "$work/bin/cargo-lambda"
cat >"$work/bin/cargo" <<'SHIM'
#!/usr/bin/env bash
# The recipe's cargo: `lambda watch|invoke` on the test's port; else cargo.
if [[ ${1:-} == lambda && ${2:-} == watch ]]; then
  exec "$RECIPE_REAL_CARGO" lambda watch --invoke-port "$RECIPE_INVOKE_PORT" --ignore-changes "${@:3}"
elif [[ ${1:-} == lambda && ${2:-} == invoke ]]; then
  exec "$RECIPE_REAL_CARGO" lambda invoke --invoke-port "$RECIPE_INVOKE_PORT" "${@:3}"
fi
exec "$RECIPE_REAL_CARGO" "$@"
SHIM
chmod +x "$work/bin/cargo"

# ---- The functions, built first ------------------------------------------------
fns=()
for c in "${invokes[@]}"; do
  read -r _ _ _ fn _ <<<"$c"
  [[ -f functions/$fn/Cargo.toml ]] || fail "$doc: \`$c\` names no function of functions/ first"
  [[ " ${fns[*]} " == *" $fn "* ]] || fns+=("$fn")
done
# As watch builds them (`cargo run --bin NAME`, no -p: features resolved
# over the workspace's default members, which gives the dependencies the
# same artifacts as the likes-local build; `-p like` alone would build some
# sixty of them again with other features).
b0=$SECONDS
bins=()
for fn in "${fns[@]}"; do bins+=(--bin "$fn"); done
"$real_cargo" build --locked --quiet "${bins[@]}"
say "functions built (${fns[*]}) in $((SECONDS - b0)) s"

# ---- Terminal 1: make serve ------------------------------------------------------
PORT=0 DYNAMODB_PORT=0 "$bin" serve >"$work/serve.log" 2>&1 &
serve_pid=$!
base=""
for _ in $(seq 1 300); do
  base=$(sed -n 's#^ready: \(http://[^ ]*\)/healthz$#\1#p' "$work/serve.log")
  [[ -n $base ]] && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; fail "make serve exited early"; }
  sleep 0.1
done
[[ -n $base ]] || { cat "$work/serve.log" >&2; fail "make serve never became ready"; }
dynamo=$(sed -n 's#^  DynamoDB: \(http://127\.0\.0\.1:[0-9]*\) .*#\1#p' "$work/serve.log")
[[ -n $dynamo ]] || { cat "$work/serve.log" >&2; fail "no loopback DynamoDB URL in the banner"; }
# The names the doc tells the reader to use are the stack's.
tables=$(sed -n 's#^  tables:   \(.*\)$#, \1,#p' "$work/serve.log")
for t in $(grep -oE '[A-Z_]+_TABLE=[^ ]+' <<<"$watch_cmd" | cut -d= -f2); do
  [[ $tables == *", $t,"* ]] || { cat "$work/serve.log" >&2; fail "the recipe's table $t is not among make serve's tables"; }
done
grep -q '^  views:    Kinesis stream ViewsStream ' "$work/serve.log" \
  || { cat "$work/serve.log" >&2; fail "make serve's views stream is not ViewsStream"; }
say "make serve: $base, DynamoDB $dynamo"

# ---- Terminal 2: the watch ---------------------------------------------------------
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export RECIPE_REAL_CARGO=$real_cargo RECIPE_INVOKE_PORT=$port
export PATH=$work/bin:$PATH
{
  # Its session's id first, for stop_all (setsid may have forked).
  printf 'ps -o sid= -p $$ | tr -d " " >%q\n' "$work/watch.sid"
  printf '%s\n' "${watch_cmd//http:\/\/127.0.0.1:8000/$dynamo}"
} >"$work/terminal2.sh"
setsid bash -euo pipefail "$work/terminal2.sh" >"$work/watch.log" 2>&1 </dev/null &
for _ in $(seq 1 100); do
  [[ -s $work/watch.sid ]] && break
  sleep 0.05
done
watch_sid=$(cat "$work/watch.sid" 2>/dev/null || true)
[[ $watch_sid =~ ^[0-9]+$ ]] || { cat "$work/watch.log" >&2; fail "the watch command did not start"; }
up=""
for _ in $(seq 1 300); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
  [[ -n $(ps -o pid= -s "$watch_sid") ]] || { cat "$work/watch.log" >&2; fail "cargo lambda watch exited early"; }
  sleep 0.1
done
[[ -n $up ]] || { cat "$work/watch.log" >&2; fail "cargo lambda watch never listened on 127.0.0.1:$port"; }
say "cargo lambda watch on 127.0.0.1:$port"

# ---- Terminal 3: the invokes ----------------------------------------------------------
timeout_s=${RECIPE_INVOKE_TIMEOUT:-300}
passed=0 failed=0 last_count=""
for c in "${invokes[@]}"; do
  echo "\$ $c"
  i0=$SECONDS
  # A function that exits (a refused configuration, a failed build) leaves
  # the invoke waiting for good: watch's log says so, and the wait ends.
  exits=$(grep -c 'command exited' "$work/watch.log" || true)
  timeout "$timeout_s" bash -euo pipefail -c "$c" >"$work/invoke.out" 2>"$work/invoke.err" &
  invoke_pid=$!
  while kill -0 "$invoke_pid" 2>/dev/null; do
    if (($(grep -c 'command exited' "$work/watch.log" || true) > exits)); then
      echo "recipe-test: the function exited (the watch's log is below)" >&2
      kill -TERM "$invoke_pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  set +e
  wait "$invoke_pid"
  rc=$?
  set -e
  out=$(cat "$work/invoke.out")
  printf '%s\n' "$out"
  verdict=$(python3 - "$out" "$last_count" 2>&1 <<'PY'
import json, sys
out, last = sys.argv[1], sys.argv[2]
try:
    answer = json.loads(out)
    body = json.loads(answer["body"])
except (ValueError, KeyError, TypeError) as e:
    sys.exit(f"not an API Gateway answer with a JSON body ({e})")
if answer.get("statusCode") != 200:
    sys.exit(f"statusCode {answer.get('statusCode')}, not 200")
count = body.get("count")
if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    sys.exit(f"no count of at least 1 in the body: {body}")
if last and count != int(last):
    sys.exit(f"count {count}, not the like's {last}")
print(count)
PY
  ) && [[ $rc == 0 ]] && ok=1 || ok=""
  if [[ -n $ok ]]; then
    say "ok ($((SECONDS - i0)) s): count $verdict"
    last_count=$verdict
    passed=$((passed + 1))
  else
    ((rc == 124)) && echo "recipe-test: timed out after $timeout_s s" >&2
    echo "recipe-test: exit $rc; ${verdict:-}" >&2
    cat "$work/invoke.err" >&2
    failed=$((failed + 1))
  fi
done

if ((failed)); then
  echo "recipe-test: the watch's log:" >&2
  tail -n 60 "$work/watch.log" >&2
fi
# What watch's own `cargo run` compiled (nothing, when the build above
# matched it): a cost to know about.
say "cargo run under watch compiled $(grep -c '^ *Compiling ' "$work/watch.log" || true) crates"
stop_all
say "took $((SECONDS - t0)) s"
echo "recipe-test: $passed passed, $failed failed"
((failed == 0))
