#!/usr/bin/env bash
# make soak: the crash soak. The plugin runs in a child process that is
# SIGKILLed at random steps of random prepares and unprepares, and now and
# then both copies of its checkpoint are lost with only some claims'
# statuses written; after every restart the node's files are checked
# against the kubelet's view. It ends with the seats given to two live
# claims (doubled) and the seats a live claim's container was given that
# the checkpoint does not hold for it (lost): both must be 0.
#
# ITERATIONS (default 1000) and SEED (default: the clock) repeat a run.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p _output
log=_output/soak.log
export KYB_CRASH_ITERATIONS=${ITERATIONS:-1000}
[[ -n "${SEED:-}" ]] && export KYB_CRASH_SEED=$SEED
start=$(date +%s)
status=0
$GO test -count=1 -timeout 60m -run '^TestRandomCrashes$' -v ./pkg/draplugin >"$log" 2>&1 || status=$?
grep -E 'seed|iterations|seats doubled|^(--- |ok|FAIL)' "$log" | sed 's/^ *crash_test.go:[0-9]*: //'
echo "soak: $(( $(date +%s) - start )) s; log in $log"
if [[ $status -ne 0 ]]; then
	grep -E 'crash_test.go' "$log" | tail -20
	exit $status
fi
