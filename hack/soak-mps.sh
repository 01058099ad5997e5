#!/usr/bin/env bash
# make soak-mps: the MPS soak. Random prepares and releases of MPS (sized
# ones among them) and time-sliced claims, plugin restarts, profile changes
# between mps, timeSlicing and sized mps, daemons killed, and a tenant's
# tampering with a read-write pipe directory (control socket removed or
# replaced by a link to another group's, daemon stopped with SIGSTOP and
# continued later), over the
# simulated node and the simulated nvidia-cuda-mps-control. It ends with
# the daemons leaked, the daemons of another group touched and the GPUs in
# the wrong compute mode after a final settle: all three must be 0.
#
# ITERATIONS (default 500) and SEED (default: the clock) repeat a run.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p _output
log=_output/soak-mps.log
export KYB_MPS_SOAK_ITERATIONS=${ITERATIONS:-500}
[[ -n "${SEED:-}" ]] && export KYB_MPS_SOAK_SEED=$SEED
start=$(date +%s)
status=0
$GO test -count=1 -timeout 60m -run '^TestMPSSoak$' -v ./pkg/draplugin >"$log" 2>&1 || status=$?
grep -E 'mps soak:|^(--- |ok|FAIL)' "$log" | sed 's/^ *mpssoak_socket_test.go:[0-9]*: //'
echo "soak-mps: $(( $(date +%s) - start )) s; log in $log"
if [[ $status -ne 0 ]]; then
	grep -E 'mpssoak_socket_test.go' "$log" | tail -20
	exit $status
fi
