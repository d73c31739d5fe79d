#!/usr/bin/env bash
# Ensure the pinned AWS SAM CLI is installed in target/sam-venv, and print the
# absolute path of its `sam` (stdout holds that path only; progress goes to
# stderr). One venv and one version for every caller: scripts/lint-template.sh
# (`sam validate`), and `sam local invoke`.
#
#   SAM="$(scripts/sam-cli.sh)" && "$SAM" --version
#
# The venv also holds the cfn-lint SAM CLI lints with (`sam validate --lint`
# imports it), pinned here too: target/sam-venv/bin/cfn-lint is the one
# scripts/lint-template.sh runs, so the template is checked by one cfn-lint.
#
# Only the install talks to the network (the Python package index). Running
# `sam` does too unless told not to: telemetry (SAM_CLI_TELEMETRY=0 stops it)
# and a weekly version check against pypi.org (no switch; see how
# scripts/lint-template.sh keeps it from running).
set -euo pipefail

SAM_CLI_VERSION=1.170.0
# Within what aws-sam-cli 1.170.0 accepts (>=1.52.0,<1.59): a newer cfn-lint
# brings new rules, so it is a deliberate bump, not a fresh clone's surprise.
CFN_LINT_VERSION=1.58.0

cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="$PWD/target/sam-venv"
reqs=("aws-sam-cli==$SAM_CLI_VERSION" "cfn-lint==$CFN_LINT_VERSION")
want="${reqs[*]}"

installed() {
  # What the venv holds, without running (and importing all of) the CLI.
  "$venv/bin/python" -c '
import importlib.metadata as m
print(" ".join(f"{d}=={m.version(d)}" for d in ("aws-sam-cli", "cfn-lint")))' 2>/dev/null
}

if [[ ! -x "$venv/bin/sam" || "$(installed || true)" != "$want" ]]; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "sam-cli.sh: aws-sam-cli $SAM_CLI_VERSION needs Python 3.10 or newer as python3" >&2
    exit 1
  }
  echo "sam-cli.sh: installing $want into target/sam-venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${reqs[@]}" >&2
  got="$(installed || true)"
  [[ "$got" == "$want" ]] || {
    echo "sam-cli.sh: target/sam-venv holds '$got', not '$want'" >&2
    exit 1
  }
fi

echo "$venv/bin/sam"
