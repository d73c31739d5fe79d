#!/usr/bin/env bash
# Runs exactly one named test of one integration-test target, and fails if
# the name matches no test: a filter that matches nothing would otherwise
# pass with "0 passed" once the test is renamed.
#   scripts/one-test.sh TARGET TEST_NAME   (environment passed through)
set -euo pipefail
target=$1 name=$2
cargo=${CARGO:-cargo}
listed=$("$cargo" test --locked -p likes-tests --test "$target" -- --list --exact "$name" 2>/dev/null | grep -c ': test$' || true)
if [ "$listed" != 1 ]; then
  echo "one-test: '$name' matches $listed tests in tests/tests/$target.rs, not 1" >&2
  exit 1
fi
"$cargo" test --locked -p likes-tests --test "$target" -- --exact "$name"
