#!/usr/bin/env bash
# Bounded fuzz run of the request parsing and validation
# (fuzz/fuzz_targets/request.rs, which drives `likes::http::parse`, the code
# every handler runs before any I/O). Exits non-zero if the fuzzer finds a
# crash; the input that crashed is left in fuzz/artifacts/request/.
#
#   scripts/fuzz.sh                        # 60 s of fuzzing after the build
#   FUZZ_SECONDS=3600 scripts/fuzz.sh      # an hour
#   FUZZ_PROFILE=dev scripts/fuzz.sh       # unoptimised (faster to build, slower to run)
#   FUZZ_JOBS=2 FUZZ_SECONDS=3600 scripts/fuzz.sh   # both cores
#   scripts/fuzz.sh -only_ascii=1          # extra arguments go to libFuzzer
#
# A crash, replayed from fuzz/ (LIKES_FUZZ_SHOW=1 prints what the input
# parsed to):
#   cargo fuzz run --sanitizer none request artifacts/request/crash-<hash>
#
# Works with the stable toolchain alone, as a fresh CI machine has it:
# cargo-fuzz is installed from crates.io when missing, and the target is built
# without a sanitizer (`--sanitizer none`: the code under test is safe Rust),
# which needs nothing unstable: libFuzzer's coverage instrumentation is plain
# rustc codegen options (-Cpasses=sancov-module, -Cllvm-args=...).
# FUZZ_SANITIZER=address adds AddressSanitizer (-Zsanitizer): with a nightly
# toolchain when one is installed (or FUZZ_TOOLCHAIN names one), else on
# stable through RUSTC_BOOTSTRAP=1.
#
# The build has its own target directory (fuzz/target), since everything is
# compiled with coverage instrumentation. It builds the `likes` library
# without its `dynamodb` feature, so no AWS SDK: a clean optimised build took
# 100 s on a 2-core machine (the SDK's alone used to take ~20 CPU minutes),
# later ones are incremental. The corpus the run grows
# is kept in fuzz/target/corpus/request (so a later run on the same machine
# goes on from it); the committed seeds in fuzz/corpus/request are only read.
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_JOBS=${FUZZ_JOBS:-1}
FUZZ_SANITIZER=${FUZZ_SANITIZER:-none}
FUZZ_TOOLCHAIN=${FUZZ_TOOLCHAIN:-}
FUZZ_PROFILE=${FUZZ_PROFILE:-release}
TARGET=request

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz"

command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
# Matched on captured output, never `cmd | grep -q`: grep leaving at its
# first match can fail the writer (and, under pipefail, the test) by timing.
if ! grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION" <<<"$(cargo fuzz --version 2>/dev/null || true)"; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io" >&2
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

if [ "$FUZZ_SANITIZER" != none ] && [ -z "$FUZZ_TOOLCHAIN" ]; then
    if command -v rustup >/dev/null && grep -q '^nightly' <<<"$(rustup toolchain list)"; then
        FUZZ_TOOLCHAIN=nightly
    else
        # -Zsanitizer on a stable toolchain.
        export RUSTC_BOOTSTRAP=1
    fi
fi
cargo_cmd=(cargo)
if [ -n "$FUZZ_TOOLCHAIN" ]; then
    cargo_cmd=(cargo "+$FUZZ_TOOLCHAIN")
fi
# The fuzz workspace's own Cargo.lock is authoritative: fail rather than
# re-resolve (cargo fuzz has no --locked of its own).
"${cargo_cmd[@]}" fetch --locked --quiet

fuzz_args=(--sanitizer "$FUZZ_SANITIZER" --target-dir "$root/fuzz/target")
# Optimised by default (cargo fuzz's --release): with no SDK to compile the
# build is short, and an optimised target runs several times more
# executions a second. FUZZ_PROFILE=dev builds unoptimised.
if [ "$FUZZ_PROFILE" = dev ]; then
    fuzz_args+=(--dev)
fi
work_corpus="$root/fuzz/target/corpus/$TARGET"
mkdir -p "$work_corpus" "$root/fuzz/corpus/$TARGET"

started=$SECONDS
"${cargo_cmd[@]}" fuzz build "${fuzz_args[@]}" "$TARGET"
build_secs=$((SECONDS - started))

libfuzzer_args=(-max_total_time="$FUZZ_SECONDS" -timeout=5 -rss_limit_mb=4096 -print_final_stats=1
    -dict="$root/fuzz/$TARGET.dict")
if [ "$FUZZ_JOBS" -gt 1 ]; then
    # Parallel workers log to fuzz-<n>.log in fuzz/ instead of the terminal.
    libfuzzer_args+=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
fi

started=$SECONDS
# -rss_limit_mb: inputs may ask for 64 KiB bodies and 10,000-id queries,
# well within it. -timeout: a request takes well under a millisecond; 5 s
# flags a hang without flaking on a loaded machine.
"${cargo_cmd[@]}" fuzz run "${fuzz_args[@]}" "$TARGET" "$work_corpus" "$root/fuzz/corpus/$TARGET" -- \
    "${libfuzzer_args[@]}" "$@"
run_secs=$((SECONDS - started))

echo "fuzz: build ${build_secs}s, run ${run_secs}s (FUZZ_SECONDS=$FUZZ_SECONDS), corpus $(find "$work_corpus" -type f | wc -l) inputs, no crash"
