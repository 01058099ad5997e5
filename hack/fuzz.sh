#!/usr/bin/env bash
# Runs every fuzz target and prints one summary line per target.
#
# make test gives each target a number of executions (its own, below) rather
# than a duration: Go 1.26's fuzzing coordinator can fail a target with a
# bare "context deadline exceeded" when a -fuzztime duration runs out while
# a worker is busy (golang/go#75804, fixed in Go 1.27), and a count has no
# deadline to race. FUZZTIME=10s (make bench) runs each target for that
# long instead; there, a failure that wrote no failing input and says only
# "context deadline exceeded" is that race, reported and run once more.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-}
# package, target, executions for make test (about 10 s each on 2 vCPUs)
targets=(
  "./api/kyb.ai/v1alpha1 FuzzLoadNodeConfig 30000"
  "./api/kyb.ai/v1alpha1 FuzzLoadNodeTopology 30000"
  "./api/kyb.ai/v1alpha1 FuzzDecodeSeatConfig 50000"
  "./pkg/checkpoint FuzzDecode 150000"
  "./pkg/checkpoint FuzzDecodeContent 60000"
  "./pkg/seatledger FuzzRebuildFromStatus 2000"
  "./pkg/planner FuzzPlan 40000"
)
mkdir -p _output

# corpus lists a target's checked-in inputs: a failure writes a new one.
corpus() { ls "$1/testdata/fuzz/$2" 2>/dev/null | sort || true; }

# run fuzzes one target into its log; 0 passed, 1 failed, 2 the race.
run() {
  local pkg=$1 target=$2 budget=$3 log=$4 before
  before=$(corpus "$pkg" "$target")
  if go test -run='^$' -fuzz="^$target\$" -fuzztime="$budget" -fuzzminimizetime=2s "$pkg" >"$log" 2>&1; then
    return 0
  fi
  if [[ "$budget" != *x && "$(corpus "$pkg" "$target")" == "$before" ]] &&
    grep -q '^    context deadline exceeded$' "$log" && ! grep -q 'Failing input written' "$log"; then
    return 2
  fi
  return 1
}

for t in "${targets[@]}"; do
  set -- $t
  pkg=$1 target=$2 budget=${FUZZTIME:-${3}x}
  log=_output/fuzz-$target.log
  rc=0
  run "$pkg" "$target" "$budget" "$log" || rc=$?
  if [ "$rc" -eq 2 ]; then
    echo "fuzz $target: the run ended with Go's fuzztime race (golang/go#75804, no failing input); running it again"
    rc=0
    run "$pkg" "$target" "$budget" "$log" || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    cat "$log"
    echo "fuzz $target: FAILED (a failing input, if one was found, is under $pkg/testdata/fuzz/$target)"
    exit 1
  fi
  # The last progress line: a target whose corpus takes longer than
  # FUZZTIME to replay ends before its first "execs:" line, and says so.
  last=$(grep '^fuzz: ' "$log" | tail -1 | sed 's/^fuzz: //' || true)
  echo "fuzz $target ($budget): ${last}"
done
