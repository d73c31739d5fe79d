#!/usr/bin/env bash
# The playground (the page `make serve` serves at /) in a real browser:
# headless Chromium from Debian's packages, driven over WebDriver by a pinned
# Python selenium (scripts/playground/requirements.txt, in
# target/playground-venv), against the `likes-local serve` binary given as
# $1 (default target/debug/likes-local) on free ports. What it checks is in
# scripts/playground/browser_test.py.
#
# Chromium and chromium-driver are installed with apt-get when missing (CI
# starts on a fresh machine; needs root). When Chromium cannot be installed
# or cannot start: under CI=true the test FAILS; elsewhere it is SKIPPED
# with the reason, exit 0.
#
# Artifacts in target/playground/: burst.png (the burst, the chart and the
# counters), watch.png (views, unique viewers, windowed counts),
# lost-shard.png, failure.png on a failure, serve.log.
# PLAYGROUND_DOCS_SCREENSHOT=1 also copies burst.png to docs/playground.png.
set -euo pipefail
bin=${1:-target/debug/likes-local}
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
out=$root/target/playground
venv=$root/target/playground-venv
requirements=$root/scripts/playground/requirements.txt
mkdir -p "$out"
t0=$SECONDS

unavailable() {
  if [[ ${CI:-} == true ]]; then
    echo "playground-test: FAILED: $1 (CI=true: the browser test must run here)" >&2
    exit 1
  fi
  echo "playground-test: SKIPPED: $1."
  echo "playground-test: install Debian's chromium and chromium-driver (as root:"
  echo "playground-test: apt-get install -y chromium chromium-driver) to run it."
  exit 0
}

# ---- Chromium and its driver ------------------------------------------------
if ! [[ -x /usr/lib/chromium/chromium && -x /usr/bin/chromedriver ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "playground-test: installing chromium and chromium-driver (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get install -y chromium chromium-driver >"$out/apt.log" 2>&1 ||
      { apt-get update >>"$out/apt.log" 2>&1 &&
        apt-get install -y chromium chromium-driver >>"$out/apt.log" 2>&1; }; }; then
      tail -5 "$out/apt.log" >&2
      unavailable "apt-get could not install chromium and chromium-driver (log: $out/apt.log)"
    fi
  else
    unavailable "chromium or chromedriver is not installed, and this is not a root shell with apt-get"
  fi
fi
[[ -x /usr/lib/chromium/chromium && -x /usr/bin/chromedriver ]] ||
  unavailable "chromium or chromedriver is still missing after apt-get"

# ---- The WebDriver client, pinned -------------------------------------------
want=$(sha256sum "$requirements" | cut -c1-16)
if [[ ! -x $venv/bin/python || "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]]; then
  echo "playground-test: installing selenium into target/playground-venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  echo "$want" >"$venv/.requirements"
fi

# ---- The stack ----------------------------------------------------------------
serve_pid=""
cleanup() {
  [[ -z $serve_pid ]] || kill "$serve_pid" 2>/dev/null || true
  [[ -z $serve_pid ]] || wait "$serve_pid" 2>/dev/null || true
}
trap cleanup EXIT
log=$out/serve.log
# The schedule every second and a 1 s settings cache, so that a resize
# completes within seconds of being started.
PORT=0 DYNAMODB_PORT=0 LOCAL_SCHEDULE_SECS=1 SETTINGS_TTL_MS=1000 "$bin" serve >"$log" 2>&1 &
serve_pid=$!
base=""
for _ in $(seq 1 100); do
  base=$(sed -n 's#^ready: \(http://[^ ]*\)/healthz$#\1#p' "$log")
  [[ -n $base ]] && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$log"; echo "playground-test: serve exited early" >&2; exit 1; }
  sleep 0.1
done
[[ -n $base ]] || { cat "$log"; echo "playground-test: serve never became ready" >&2; exit 1; }
dynamo=$(sed -n 's#^  DynamoDB: \(http://[^ ]*\) .*#\1#p' "$log")

# ---- The browser ----------------------------------------------------------------
rm -f "$out"/*.png
set +e
SE_OFFLINE=true "$venv/bin/python" "$root/scripts/playground/browser_test.py" "$base" "$dynamo" "$out"
rc=$?
set -e
case $rc in
  0) ;;
  3) unavailable "Chromium or chromedriver did not start" ;;
  *) echo "playground-test: FAILED (artifacts in $out)" >&2; exit 1 ;;
esac
if [[ ${PLAYGROUND_DOCS_SCREENSHOT:-} == 1 ]]; then
  cp "$out/burst.png" "$root/docs/playground.png"
  echo "playground-test: docs/playground.png updated"
fi
echo "playground-test: ok in $((SECONDS - t0)) s (screenshots: $out/burst.png, $out/watch.png, $out/lost-shard.png)"
