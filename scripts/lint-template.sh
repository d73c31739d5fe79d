#!/usr/bin/env bash
# Lint template.yaml, offline, with the pinned SAM CLI and the cfn-lint it
# lints with (both in target/sam-venv, installed by scripts/sam-cli.sh on
# first use; python3 >= 3.10 is all it needs):
#
#   1. cfn-lint: CloudFormation's resource schemas and rules, and SAM's
#      resource schemas (Globals merged in);
#   2. `sam validate --lint`: the same cfn-lint, as SAM CLI runs it;
#   3. `sam validate`: the SAM transform itself (aws-sam-translator), which
#      cfn-lint no longer runs (since 1.54 it checks SAM resources against
#      schemas instead), so only this step refuses what the transform would
#      refuse at deploy time: an AuthorizationScopes that is not a literal
#      list, an undefined DefaultAuthorizer, and the like.
#
# Fails (non-zero) if any of them reports an error or a warning; all three
# run, so one run shows every finding.
#
# Nothing here may reach the network, and nothing does (checked with
# `unshare -n` and strace: no connection is even attempted):
#   - telemetry: SAM_CLI_TELEMETRY=0;
#   - SAM CLI's weekly version check against pypi.org (no switch turns it
#     off): SAM's config dir is in a HOME of our own, whose config says the
#     last check is not due before 2100 (a float: SAM ignores an integer
#     there, and checks);
#   - the transform looks up in IAM (ListPolicies) a managed policy given by
#     a name it does not know (AWS managed policies it knows, and ARNs, need
#     no lookup; the template names none): there are no credentials here
#     (config files /dev/null, instance metadata off), so such a lookup fails
#     at once with "AWS Credentials are required" instead of calling AWS.
#     Give the policy's ARN instead;
#   - anything else over HTTP(S) goes to a proxy on 127.0.0.1:9 (the discard
#     port, closed) and fails at once.
# A fixed region (us-east-1) for the transform's ARNs and cfn-lint's
# region-specific rules, and a clean environment (`env -i`), so that results
# do not depend on the caller's AWS profile or ~/.cfnlintrc.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

sam="$(scripts/sam-cli.sh)"
cfn_lint="$(dirname "$sam")/cfn-lint"

home="$PWD/target/sam-venv/home"
mkdir -p "$home/.aws-sam"
printf '{"telemetryEnabled": false, "lastVersionCheck": 4102444800.0}\n' \
  >"$home/.aws-sam/metadata.json"

offline=(
  env -i
  "PATH=$PATH" "HOME=$home" "TMPDIR=${TMPDIR:-/tmp}" LC_ALL=C.UTF-8
  SAM_CLI_TELEMETRY=0
  AWS_DEFAULT_REGION=us-east-1
  AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
  AWS_EC2_METADATA_DISABLED=true
  HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9
  https_proxy=http://127.0.0.1:9 http_proxy=http://127.0.0.1:9
)

failed=()
step() {
  local name=$1
  shift
  echo "== $name" >&2
  if "${offline[@]}" "$@"; then
    echo "$name: template.yaml OK"
  else
    failed+=("$name")
  fi
}

"${offline[@]}" "$cfn_lint" --version
"${offline[@]}" "$sam" --version
step cfn-lint "$cfn_lint" template.yaml
step "sam validate --lint" "$sam" validate --lint --region us-east-1 -t template.yaml
step "sam validate" "$sam" validate --region us-east-1 -t template.yaml

if ((${#failed[@]})); then
  printf 'lint-template: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
