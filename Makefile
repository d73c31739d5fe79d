# The two commands of the README:
#   make serve   run the product locally (embedded DynamoDB + every route)
#   make test    run every test (what CI runs, through .ci/run)
# Everything else here is optional tooling.

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: check-cargo lint serve kinesis-local test demo resize reconcile plan bench lambda-figures benchmarks unit lint-template smoke recipes playground-test sam-local schemathesis fuzz fmt clippy lambda-build sam-build deploy help

## This list: each target with a `##` comment above it, and the comment.
help:
	@awk '/^## /{doc = doc (doc ? "\n                     " : "") substr($$0, 4); next} \
	  /^[a-z][a-z-]*:/{if (doc) printf "make %-15s %s\n", substr($$1, 1, length($$1) - 1), doc; doc = ""; next} \
	  /^$$/{doc = ""}' $(MAKEFILE_LIST)

check-cargo:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }

## Local stack on http://127.0.0.1:3000 (or $PORT); Ctrl-C stops it.
serve: check-cargo
	$(CARGO) run --locked --quiet -p likes-local --bin likes-local -- serve

## The viral-burst demo against a running `make serve`.
demo: check-cargo
	$(CARGO) run --locked --quiet -p likes-local --bin likes-local -- demo

## Resize a reel on a running `make serve`: make resize REEL=r1 SHARDS=20
## (the local schedule completes it; `make resize REEL=r1` shows the state).
BASE_URL ?= http://127.0.0.1:$(or $(PORT),3000)
resize:
	@test -n "$(REEL)" || { echo "usage: make resize REEL=<reel_id> [SHARDS=<n>]" >&2; exit 2; }
	@if [ -n "$(SHARDS)" ]; then \
	  curl -sS -X POST -H 'content-type: application/json' -d '{"shards": $(SHARDS)}' "$(BASE_URL)/admin/reels/$(REEL)/shards"; \
	else \
	  curl -sS "$(BASE_URL)/admin/reels/$(REEL)/shards"; \
	fi; echo

## One full reconciliation pass against the DynamoDB of `make serve` (or
## AWS_ENDPOINT_URL_DYNAMODB); prints the JSON summary. DRY_RUN=1 only reports.
reconcile: check-cargo
	DRY_RUN=$(DRY_RUN) $(CARGO) run --locked --quiet -p likes-local --bin likes-local -- reconcile

## All tests: fmt, clippy and rustdoc with warnings as errors, the
## template lint, unit + integration tests (the HTTP
## contract in both counting modes), an end-to-end run of the `make serve`
## binary with the README's tour against it, the docs' cargo-lambda recipe
## run as written, the playground page in headless
## Chromium, every function under `sam local invoke` with every sample
## event, schemathesis against the `make serve` binary in both modes, and a
## bounded fuzz run (FUZZ_SECONDS, default 60).
test: check-cargo lint lint-template smoke recipes playground-test unit sam-local schemathesis fuzz

## Formatting, clippy (warnings are errors) and rustdoc (warnings are
## errors) on the whole workspace, as CI enforces them.
lint: check-cargo
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --locked

## The fast loop: the workspace's unit and integration tests, and the HTTP
## contract and the exactly-once fault test once more in stream mode.
unit:
	$(CARGO) test --workspace --locked
	# The HTTP contract once more in stream mode (COUNTING=stream).
	LIKES_TEST_COUNTING=stream $(CARGO) test --locked -p likes-tests --test openapi --test validation --test hostile
	LIKES_TEST_COUNTING=stream CARGO=$(CARGO) scripts/one-test.sh faults every_like_counts_once_under_every_fault

## cfn-lint, `sam validate --lint` and `sam validate` on template.yaml,
## offline (SAM CLI pinned in target/sam-venv, installed on first use).
lint-template:
	scripts/lint-template.sh

## The `make serve` binary end to end, with the README's tour run as written.
smoke:
	$(CARGO) build --locked --quiet -p likes-local --bin likes-local
	scripts/smoke-serve.sh target/debug/likes-local

## The docs' recipes a user copies, run as written: docs/deploying.md's
## cargo-lambda one (`make serve`, `cargo lambda watch`, invokes of like and
## read), with cargo-lambda pinned in target/cargo-lambda-venv (installed on
## first use). Skipped without python3, except under CI=true.
recipes: check-cargo
	$(CARGO) build --locked --quiet -p likes-local --bin likes-local
	CARGO=$(CARGO) scripts/recipe-test.sh target/debug/likes-local

## The pinned Kinesis emulator (kinesis-mock) in target/kinesis-local, with
## npm ci; `make serve` and the tests install it themselves on first use.
kinesis-local:
	scripts/kinesis-local.sh >/dev/null

## The playground (the page `make serve` serves at /) in headless Chromium
## over WebDriver (apt-get installs chromium and chromium-driver if missing):
## the heart, a burst, a lost shard. Skipped without Chromium, except under
## CI=true. Screenshots in target/playground/; PLAYGROUND_DOCS_SCREENSHOT=1
## also refreshes docs/playground.png.
playground-test: check-cargo
	$(CARGO) build --locked --quiet -p likes-local --bin likes-local
	scripts/playground-test.sh target/debug/likes-local

## Every function under `sam local invoke` (Docker; a private dockerd as
## root) with every event in events/, against a local DynamoDB: answers and
## table changes checked. Skipped without Docker, except under CI=true.
sam-local: check-cargo
	CARGO=$(CARGO) scripts/sam-local.sh

## openapi.yaml against the running product (installs schemathesis in a venv).
schemathesis:
	$(CARGO) build --locked --quiet -p likes-local --bin likes-local
	scripts/schemathesis.sh target/debug/likes-local
	COUNTING=stream scripts/schemathesis.sh target/debug/likes-local

## A bounded fuzz run of request parsing; FUZZ_SECONDS=3600 make fuzz for longer.
fuzz: check-cargo
	scripts/fuzz.sh

## The shard-sizing planner: make plan ARGS='--peak 14000 --cap 1000 --units 1 --shards 20'
ARGS ?= --peak 14000 --cap 1000 --headroom 0.3
plan: check-cargo
	$(CARGO) run --locked --quiet -p likes-local --bin likes-local -- plan $(ARGS)

## The viral-load benchmark (release build; BENCH_* variables, see docs/benchmarks.md).
## Release builds of the benchmarks share target/bench-release, not target/.
bench: check-cargo
	CARGO_TARGET_DIR=target/bench-release $(CARGO) run --locked --quiet --release -p likes-local --bin likes-local -- bench

## The Lambda figures alone: bootstrap size, cold start, peak memory and warm
## overhead against a lambda_runtime hello-world (RUNS=, SKIP_BUILD=1).
lambda-figures: check-cargo
	scripts/lambda-figures.sh

## Every figure of BENCHMARKS.md, regenerated.
benchmarks: check-cargo
	scripts/benchmarks.sh

## Formats the workspace.
fmt:
	$(CARGO) fmt --all

## Clippy alone (part of `make lint`).
clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## Release bootstraps for Lambda (arm64); needs `pip install cargo-lambda`.
lambda-build:
	$(CARGO) lambda build --release --arm64 -p like -p read -p reshard -p reconcile -p aggregate -p view -p aggregate-views -p warm

## SAM build/deploy (rust-cargolambda is a beta build method in SAM CLI).
sam-build:
	sam build --beta-features

## `sam deploy --guided` after a SAM build.
deploy: sam-build
	sam deploy --guided
