#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (make fuzz; make test runs it
# briefly, make bench longer) and prints one summary line per target.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10s}
targets=(
  "./api/kyb.ai/v1alpha1 FuzzLoadNodeConfig"
  "./api/kyb.ai/v1alpha1 FuzzLoadNodeTopology"
  "./api/kyb.ai/v1alpha1 FuzzDecodeSeatConfig"
  "./pkg/checkpoint FuzzDecode"
  "./pkg/planner FuzzPlan"
)
mkdir -p _output
for t in "${targets[@]}"; do
  set -- $t
  log=_output/fuzz-$2.log
  if ! go test -run='^$' -fuzz="^$2\$" -fuzztime="$FUZZTIME" -fuzzminimizetime=2s "$1" >"$log" 2>&1; then
    cat "$log"
    echo "fuzz $2: FAILED (the failing input is under $1/testdata/fuzz/$2)"
    exit 1
  fi
  last=$(grep 'execs:' "$log" | tail -1 | sed 's/^fuzz: //')
  echo "fuzz $2 ($FUZZTIME): ${last}"
done
