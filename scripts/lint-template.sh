#!/usr/bin/env bash
# Lint template.yaml with cfn-lint (includes the SAM transform).
# Uses cfn-lint from PATH when it works, otherwise installs it into ./.venv.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if command -v cfn-lint >/dev/null 2>&1 && cfn-lint --version >/dev/null 2>&1; then
  CFN_LINT=cfn-lint
else
  if [[ ! -x .venv/bin/cfn-lint ]]; then
    echo "cfn-lint not found on PATH; installing it into .venv" >&2
    python3 -m venv .venv
    .venv/bin/pip install --quiet 'cfn-lint>=1.51,<2'
  fi
  CFN_LINT=.venv/bin/cfn-lint
fi

"$CFN_LINT" --version
"$CFN_LINT" template.yaml
echo "cfn-lint: template.yaml OK"
