#!/usr/bin/env bash
# make soak: the crash soak. The plugin runs in a child process that is
# SIGKILLed at random steps of random prepares and unprepares, and now and
# then both copies of its checkpoint are lost with only some claims'
# statuses written; after every restart the node's files are checked
# against the kubelet's view. A second run does the same on a node with
# MIG seats beside whole-GPU seats, killing the plugin between the NVML
# calls that make and destroy instances too, beside an administrator's
# instances. It ends with the seats given to two live claims (doubled),
# the seats a live claim's container was given that the node does not
# hold for it (lost), the MIG instances no live claim holds (leaked) and
# the administrator's instances destroyed: all must be 0.
#
# ITERATIONS (default 1000), MIG_ITERATIONS (default 300) and SEED
# (default: the clock) repeat a run.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p _output
log=_output/soak.log
export KYB_CRASH_ITERATIONS=${ITERATIONS:-1000}
export KYB_MIG_CRASH_ITERATIONS=${MIG_ITERATIONS:-300}
[[ -n "${SEED:-}" ]] && export KYB_CRASH_SEED=$SEED
start=$(date +%s)
status=0
$GO test -count=1 -timeout 60m -run '^(TestRandomCrashes|TestRandomMIGCrashes)$' -v ./pkg/draplugin >"$log" 2>&1 || status=$?
grep -E 'seed|iterations|fenced|seats doubled|^(--- |ok|FAIL)' "$log" | sed -E 's/^ *(crash|migsoak_crash)_test.go:[0-9]*: //'
# The two runs' counts, summed; a run that stopped early printed none.
read -r runs doubled lost leaked destroyed < <(grep -E 'seats doubled: [0-9]+' "$log" | awk '
	{ runs++
	  for (i = 1; i <= NF; i++) {
		v = $(i + 1); sub(/,$/, "", v)
		if ($i == "doubled:") d += v
		if ($i == "lost:") l += v
		if ($i == "leaked:") k += v
		if ($i == "destroyed:") x += v
	  } }
	END { print runs + 0, d + 0, l + 0, k + 0, x + 0 }')
summary="seats doubled: $doubled, seats lost: $lost, MIG instances leaked: $leaked, foreign instances destroyed: $destroyed"
[[ $runs -eq 2 ]] || summary="$summary (only $runs of 2 runs finished)"
echo "soak: $(( $(date +%s) - start )) s; $summary; log in $log"
if [[ $status -eq 0 && ( $runs -ne 2 || $doubled -ne 0 || $lost -ne 0 || $leaked -ne 0 || $destroyed -ne 0 ) ]]; then
	status=1
fi
if [[ $status -ne 0 ]]; then
	grep -E '(crash|migsoak_crash)_test.go' "$log" | tail -20
	exit $status
fi
