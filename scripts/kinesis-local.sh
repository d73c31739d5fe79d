#!/usr/bin/env bash
# Ensure the pinned Kinesis emulator (kinesis-mock, as the npm package
# kinesis-local: local/kinesis/package.json and its package-lock.json) is
# installed in target/kinesis-local, and print the absolute path of its
# package folder (stdout holds that path only; progress goes to stderr).
# The local stack runs `node main.js` there (kinesis-mock reads its TLS
# certificate file from the working directory), and calls this
# script itself when that folder is missing, so a fresh clone needs only
# Node.js (20 or newer) and npm.
#
#   dir="$(scripts/kinesis-local.sh)" && (cd "$dir" && node main.js)
#
# `npm ci` installs exactly what the lock file says (integrity checked), in
# a folder of its own: nothing global, nothing in the source tree. Only the
# install talks to the network (the npm registry); it runs again when the
# lock file changes.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
src="$PWD/local/kinesis"
dest="$PWD/target/kinesis-local"
pkg="$dest/node_modules/kinesis-local"

command -v node >/dev/null && command -v npm >/dev/null || {
  echo "kinesis-local.sh: the local Kinesis emulator needs Node.js 20 or newer (node and npm on PATH)" >&2
  exit 1
}

if [[ ! -f "$pkg/main.js" ]] || ! cmp -s "$src/package-lock.json" "$dest/package-lock.json"; then
  echo "kinesis-local.sh: installing kinesis-local into target/kinesis-local" >&2
  mkdir -p "$dest"
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  [[ -f "$pkg/main.js" && -f "$pkg/server.json" ]] || {
    echo "kinesis-local.sh: npm ci left no $pkg/main.js" >&2
    exit 1
  }
fi

echo "$pkg"
