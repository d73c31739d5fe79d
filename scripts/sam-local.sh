#!/usr/bin/env bash
# `make sam-local`: every function under `sam local invoke` (the Lambda
# Runtime Interface Emulator, in Docker), with every sample event of
# events/, against a local DynamoDB and a local Kinesis; each answer and
# what it changed in the tables and the views stream checked by
# scripts/sam-local.py (its docstring says what runs).
#
# Phases (each timed):
#   1. Docker. With DOCKER_HOST set, that daemon (Linux: containers on the
#      host network must reach 127.0.0.1 here). Otherwise a private dockerd
#      of our own, as root (Debian's docker.io, installed if missing):
#      data and exec roots under target/sam-local/docker, NO bridge network,
#      no iptables, no forwarding: containers get the host's network only,
#      so every connection stays on 127.0.0.1. It is stopped (by its pid)
#      and what it leaves mounted is unmounted when this script ends.
#   2. The functions' bootstraps: a debug host build of their packages
#      (x86_64 here; the template's Architecture parameter says so to SAM),
#      in CARGO_TARGET_DIR if set.
#   2'. The Kinesis emulator for the views stream: kinesis-mock
#      (scripts/kinesis-local.sh; Node.js), in memory, on a free port,
#      started while the rest gets ready; sam-local.py makes the stream.
#      Its own, not the one `likes-local serve` would start: that one's
#      event source would feed the views aggregator in-process, behind the
#      invokes' backs (so serve runs with LOCAL_VIEWS=off).
#   3. The pinned SAM CLI (scripts/sam-cli.sh).
#   4. The invoke image: no registry is reachable, so SAM's base image is
#      made from this host's own files (/bin/sh, mv and chmod for the
#      Dockerfile SAM derives from it, the loader and libraries the
#      bootstraps link, the CA bundle) with `docker import`, named by its
#      content; SAM adds its bundled emulator on top (--invoke-image,
#      --skip-pull-image).
#   5. The local DynamoDB: `likes-local serve` on free loopback ports, its
#      tables made from template.yaml (ViewsTable too), no schedules, no
#      views stream of its own.
#   6. scripts/sam-local.py: the invokes and their checks.
#
# No Docker (or no Node.js for the emulator): fails under CI=true;
# elsewhere prints why and exits 0 (skipped). On a laptop with an
# ordinary Docker see docs/deploying.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
out=$root/target/sam-local
mkdir -p "$out/logs"
t_all=$SECONDS
t_phase=$SECONDS
phase() {
  printf 'sam-local: %-44s %4d s\n' "$1" $((SECONDS - t_phase))
  t_phase=$SECONDS
}

unavailable() {
  if [[ ${CI:-} == true ]]; then
    echo "sam-local: FAILED: $1 (CI=true: Docker is required here)" >&2
    exit 1
  fi
  echo "sam-local: SKIPPED: $1."
  echo "sam-local: run as root (a private dockerd is started), or with DOCKER_HOST naming a Docker"
  echo "sam-local: daemon on this Linux host; docs/deploying.md, \"sam local invoke with Docker\"."
  exit 0
}

# ---- Cleanup: everything this script started, by pid -------------------------
dockerd_pid=""
serve_pid=""
kinesis_pid=""
dockerd_root=$out/docker
exec_root=$dockerd_root/run
cleanup() {
  local rc=$?
  set +e
  if [[ -n $serve_pid ]]; then
    kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  fi
  if [[ -n $kinesis_pid ]]; then
    kill -TERM "$kinesis_pid" 2>/dev/null && wait "$kinesis_pid" 2>/dev/null
  fi
  if [[ -n $dockerd_pid ]]; then
    # SAM removes its containers; any left (an interrupted invoke) go first.
    mapfile -t left < <(docker ps -aq 2>/dev/null)
    ((${#left[@]})) && docker rm -f "${left[@]}" >/dev/null 2>&1
    kill -TERM "$dockerd_pid" 2>/dev/null
    for _ in $(seq 1 100); do
      kill -0 "$dockerd_pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -0 "$dockerd_pid" 2>/dev/null && kill -KILL "$dockerd_pid"
    wait "$dockerd_pid" 2>/dev/null
    unmount_leftovers
    rm -rf "$exec_root"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# What a dockerd leaves mounted under its roots (its network namespace
# file, <exec-root>/netns/default, at least), deepest first.
unmount_leftovers() {
  local m
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done < <(awk -v a="$dockerd_root/" -v b="$exec_root/" \
    'index($5, a) == 1 || index($5, b) == 1 {print $5}' /proc/self/mountinfo | sort -r)
}

# ---- 1. Docker -------------------------------------------------------------------
if [[ -n ${DOCKER_HOST:-} ]]; then
  docker info >/dev/null 2>&1 || unavailable "DOCKER_HOST=$DOCKER_HOST does not answer"
  echo "sam-local: Docker at DOCKER_HOST=$DOCKER_HOST"
else
  [[ $(id -u) == 0 ]] || unavailable "not root: cannot start a private dockerd"
  if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
    command -v apt-get >/dev/null || unavailable "no dockerd, and no apt-get to install docker.io"
    echo "sam-local: installing Debian's docker.io (dockerd and the docker CLI)"
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >"$out/logs/apt.log" 2>&1; }
    apt_install || { apt-get update -qq >>"$out/logs/apt.log" 2>&1 && apt_install; } \
      || { tail -20 "$out/logs/apt.log" >&2; unavailable "apt-get install docker.io failed"; }
    phase "docker.io installed"
  fi
  if [[ -f $dockerd_root/dockerd.pid ]]; then
    old=$(cat "$dockerd_root/dockerd.pid")
    if kill -0 "$old" 2>/dev/null; then
      echo "sam-local: a dockerd of an earlier run still runs (pid $old); stop it: kill $old" >&2
      exit 1
    fi
    rm -f "$dockerd_root/dockerd.pid"
  fi
  unmount_leftovers
  rm -rf "$exec_root"
  # containerd's sockets live in the exec root, and a unix socket's path
  # has at most 107 bytes: in a deep checkout, a short one in /tmp.
  ((${#exec_root} <= 60)) || exec_root=$(mktemp -d /tmp/likes-dockerd.XXXXXX)
  mkdir -p "$dockerd_root/data" "$exec_root"
  echo '{}' >"$dockerd_root/daemon.json" # not the machine's /etc/docker/daemon.json
  export DOCKER_HOST=unix://$dockerd_root/docker.sock
  dockerd --config-file "$dockerd_root/daemon.json" \
    --data-root "$dockerd_root/data" --exec-root "$exec_root" \
    --pidfile "$dockerd_root/dockerd.pid" -H "$DOCKER_HOST" \
    --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    --userland-proxy=false >"$out/logs/dockerd.log" 2>&1 &
  dockerd_pid=$!
  echo "sam-local: dockerd (pid $dockerd_pid) starting, log in target/sam-local/logs/dockerd.log"
fi

# ---- 2. The bootstraps (while dockerd starts) --------------------------------------
CARGO=${CARGO:-cargo}
mapfile -t packages < <(sed -n 's#^ *CodeUri: functions/\([A-Za-z0-9_-]*\) *$#\1#p' template.yaml)
((${#packages[@]})) || { echo "sam-local: no CodeUri functions/<package> in template.yaml" >&2; exit 1; }
"$CARGO" build --locked --quiet -p likes-local "${packages[@]/#/-p}"
bin=${CARGO_TARGET_DIR:-$root/target}/debug
case $bin in /*) ;; *) bin=$root/$bin ;; esac
phase "bootstraps built (${packages[*]})"

# ---- 2'. The Kinesis emulator (answers some 3 s later) ---------------------------------
command -v node >/dev/null || unavailable "no Node.js (node) for the Kinesis emulator"
kinesis_dir=$(scripts/kinesis-local.sh 2>"$out/logs/kinesis-install.log") \
  || { cat "$out/logs/kinesis-install.log" >&2; unavailable "scripts/kinesis-local.sh failed (log above)"; }
read -r kinesis_port kinesis_tls < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
# As local/src/kinesis/emulator.rs starts it: in memory, quiet, quick.
(cd "$kinesis_dir" && exec env -i PATH="$PATH" HOME="$HOME" \
  KINESIS_MOCK_PLAIN_PORT="$kinesis_port" KINESIS_MOCK_TLS_PORT="$kinesis_tls" \
  SHOULD_PERSIST_DATA=false LOAD_DATA_IF_EXISTS=false LOG_LEVEL=WARN ROOT_LOG_LEVEL=ERROR \
  CREATE_STREAM_DURATION=100ms SPLIT_SHARD_DURATION=100ms MERGE_SHARDS_DURATION=100ms \
  node main.js) >"$out/logs/kinesis.log" 2>&1 </dev/null &
kinesis_pid=$!
kinesis=http://127.0.0.1:$kinesis_port
echo "sam-local: kinesis-mock (pid $kinesis_pid) starting on $kinesis, log in target/sam-local/logs/kinesis.log"

# ---- 3. SAM CLI ---------------------------------------------------------------------
sam=$(scripts/sam-cli.sh)
python=$(dirname "$sam")/python
# SAM's config dir: telemetry off, its weekly version check (a call to the
# package index) not due before 2100; as scripts/lint-template.sh does.
home=$root/target/sam-venv/home
mkdir -p "$home/.aws-sam"
printf '{"telemetryEnabled": false, "lastVersionCheck": 4102444800.0}\n' >"$home/.aws-sam/metadata.json"
phase "SAM CLI ready"

# ---- 1'. Docker up ------------------------------------------------------------------
if [[ -n $dockerd_pid ]]; then
  for _ in $(seq 1 150); do
    docker version >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 0.2
  done
  if ! docker version >/dev/null 2>&1; then
    tail -20 "$out/logs/dockerd.log" >&2
    unavailable "dockerd did not start (log above)"
  fi
  phase "dockerd up (no bridge, host network only)"
fi

# ---- 4. The invoke image --------------------------------------------------------------
stage=$out/base-rootfs
rm -rf "$stage"
mkdir -p "$stage/tmp" "$stage/var/task" "$stage/var/runtime" "$stage/opt"
chmod 1777 "$stage/tmp"
tools=(/bin/sh /bin/mv /bin/chmod)
for t in "${tools[@]}"; do [[ -x $t ]] || { echo "sam-local: no $t on this host" >&2; exit 1; }; done
ca=""
for c in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
  [[ -f $c ]] && { ca=$c; break; }
done
[[ -n $ca ]] || { echo "sam-local: no CA bundle on this host" >&2; exit 1; }
mapfile -t files < <(
  for b in "${tools[@]}" "${packages[@]/#/$bin/}"; do
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
  done
  printf '%s\n' "${tools[@]}" "$ca"
)
mapfile -t files < <(printf '%s\n' "${files[@]#/}" | sort -u)
tar -c --dereference --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
  -f "$out/base.tar" -C / "${files[@]}" -C "$stage" tmp var opt
sam_version=$("$python" -c 'import importlib.metadata as m; print(m.version("aws-sam-cli"))')
# Named by content (and SAM's version: SAM caches the image it derives, with
# its emulator, under this name's repository).
hash=$({ sha256sum <"$out/base.tar"; echo "$sam_version"; } | sha256sum | cut -c1-12)
image=likes-sam-base-$hash:latest
if ! docker image inspect "$image" >/dev/null 2>&1; then
  docker import "$out/base.tar" "$image" >/dev/null
  mapfile -t stale < <(docker images --format '{{.Repository}}:{{.Tag}}' |
    grep '^likes-sam-base-' | grep -v "^likes-sam-base-$hash:" || true)
  ((${#stale[@]})) && docker rmi "${stale[@]}" >/dev/null
fi
phase "invoke image $image ($(($(stat -c %s "$out/base.tar") / 1024 / 1024)) MB)"

# ---- 5. The local DynamoDB -----------------------------------------------------------
serve_log=$out/logs/serve.log
env -i PATH="$PATH" HOME="$HOME" PORT=0 DYNAMODB_PORT=0 HOST=127.0.0.1 DYNAMODB_HOST=127.0.0.1 \
  LOCAL_SCHEDULE_SECS=0 COUNTERS_TABLE=CountersTable LIKES_TABLE=LikesTable VIEWS_TABLE=ViewsTable \
  LOCAL_VIEWS=off COUNTING=transactional \
  "$bin/likes-local" serve >"$serve_log" 2>&1 &
serve_pid=$!
endpoint=""
for _ in $(seq 1 100); do
  endpoint=$(sed -n 's#^  DynamoDB: \(http://127\.0\.0\.1:[0-9]*\) .*#\1#p' "$serve_log")
  grep -q '^ready: ' "$serve_log" && [[ -n $endpoint ]] && break
  kill -0 "$serve_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q '^ready: ' "$serve_log" && [[ -n $endpoint ]] \
  || { cat "$serve_log" >&2; echo "sam-local: the local stack did not start" >&2; exit 1; }
phase "local DynamoDB at $endpoint"
kill -0 "$kinesis_pid" 2>/dev/null \
  || { cat "$out/logs/kinesis.log" >&2; echo "sam-local: kinesis-mock exited (log above)" >&2; exit 1; }

# ---- 6. The invokes ------------------------------------------------------------------
rc=0
"$python" scripts/sam-local.py --endpoint "$endpoint" --kinesis-endpoint "$kinesis" \
  --image "$image" --bin "$bin" \
  --out "$out" --home "$home" || rc=$?
phase "invokes"
echo "sam-local: $((SECONDS - t_all)) s in all; logs in target/sam-local/logs/"
exit "$rc"
