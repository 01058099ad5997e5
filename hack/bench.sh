#!/usr/bin/env bash
# make bench: every performance measurement of docs/performance.md in one
# run, each part timed, the tables gathered in _output/bench/report.md and
# printed at the end. Figures are ratios taken within this run; the
# absolute times drift with the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
ROUNDS=${ROUNDS:-3}
BENCH_FUZZTIME=${BENCH_FUZZTIME:-10s}
out=_output/bench
mkdir -p "$out"
report=$out/report.md
start=$(date +%s)

part() { # name, then the command; its stdout goes to $out/<name>.md
  local name=$1; shift
  local t0=$(date +%s)
  echo "== $name" >&2
  if ! "$@" >"$out/$name.md" 2>"$out/$name.log"; then
    tail -40 "$out/$name.log" >&2
    echo "bench: $name FAILED (log: $out/$name.log)" >&2
    exit 1
  fi
  echo "   $name: $(( $(date +%s) - t0 )) s" >&2
  echo "| $name | $(( $(date +%s) - t0 )) s |" >>"$out/times.md"
}

: >"$out/times.md"
make build GO="$GO"
part shim $GO test -run '^$' -bench 'GetPreferredAllocation' -benchtime 20000x -benchmem ./pkg/deviceplugin
part placement bash -c "cd test && $GO run ./cmd/kyb-sim -svg ../$out/placement.svg"
# The same study through the real schedulers (docs/placement-study.md,
# "Through the real scheduler"): a control plane, the in-process
# kube-scheduler and bin/kyb-scheduler; a shorter stream, beside the model
# rows over the same stream.
make kyb-scheduler GO="$GO"
sched_policies=best-fit,topology-aware,dra-pack,sched-stock,kyb-pack,kyb-topology,kyb-spread
part placement-sched bash -c "cd test && for load in 0.7 1; do
  $GO run ./cmd/kyb-sim -requests 1500 -load \$load -policies $sched_policies -kyb-scheduler ../bin/kyb-scheduler -log ../$out/placement-sched-\$load.log || exit 1
done"
# Defragmentation (docs/placement-study.md, "Defragmentation"): the same
# stream at full load, with 4x requests and with 8x ones, through
# kyb-scheduler with and without --defragmentation=on.
part placement-defrag bash -c "cd test && n=0 && for mix in 1x:0.6,2x:0.3,4x:0.1 1x:0.5,2x:0.25,4x:0.15,8x:0.1; do
  n=\$((n+1))
  $GO run ./cmd/kyb-sim -requests 1500 -load 1 -mix \$mix -policies best-fit,topology-aware,kyb-pack,kyb-pack-defrag,kyb-topology,kyb-topology-defrag \
    -kyb-scheduler ../bin/kyb-scheduler -log ../$out/placement-defrag-\$n.log || exit 1
done"
(cd test && $GO build -ldflags "-X k8s.io/component-base/version.gitVersion=v1.37.1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" \
  -o ../bin/kyb-bench ./cmd/kyb-bench)
# Stock kube-scheduler of the test module's Kubernetes, as a binary: the
# kyb-scheduler studies compare processes with processes.
(cd test && $GO build -ldflags "-X k8s.io/component-base/version.gitVersion=v1.37.1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" \
  -o ../bin/kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler)
make kyb-scheduler GO="$GO"
make patched-bench GO="$GO"
part kube bin/kyb-bench -rounds "$ROUNDS" -patched bin/kyb-bench-patched -log "$out/control-plane.log" \
  -studies alloc,allocpatch,allocsized,prepare,burst,footprint,shim-footprint
# The kube-scheduler study runs in a process of its own: after the other
# studies in the same process, its in-process scheduler once ran our shape
# at a third of the pace it has alone, cause not yet found
# (docs/performance.md, "kube-scheduler throughput").
part sched bin/kyb-bench -rounds "$ROUNDS" -studies sched -log "$out/sched-control-plane.log"
# kyb-scheduler and stock kube-scheduler as processes, one at a time, on a
# control plane that serves the PodGroup API (kyb-scheduler waits for it).
part kybsched bin/kyb-bench -rounds "$ROUNDS" -studies kybsched -kyb-scheduler bin/kyb-scheduler -kube-scheduler bin/kube-scheduler \
  -log "$out/kybsched-control-plane.log"
part kybburst bin/kyb-bench -rounds "$ROUNDS" -studies kybburst -kyb-scheduler bin/kyb-scheduler -kube-scheduler bin/kube-scheduler \
  -log "$out/kybburst-control-plane.log"
# Preemption for a 4x seat on 100 nodes full of low-priority seats: time
# to binding and victims against the fewest possible (stock preempts none).
part kybpreempt bin/kyb-bench -rounds "$ROUNDS" -studies kybpreempt -kyb-scheduler bin/kyb-scheduler -kube-scheduler bin/kube-scheduler \
  -log "$out/kybpreempt-control-plane.log"
# Sized seats: the memory a stream of mixed sizes leaves unusable under
# first fit, a random node and kyb-scheduler's pack and spread (the real
# allocator, patched as kyb-scheduler builds it), and a sized seat's
# prepare beside a seat of equal shares, with the simulated MPS daemons.
part sized-stream bash -c "cd cmd/kyb-scheduler && $GO test -run '^\$' -bench SizedStream -benchtime 1x ./placement"
part sized-prepare $GO test -run '^$' -bench SizedPrepare -benchtime 200x ./pkg/draplugin
part fuzz env FUZZTIME="$BENCH_FUZZTIME" hack/fuzz.sh

{
  echo "# make bench, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(go env GOVERSION)"
  echo
  echo "## Shim: GetPreferredAllocation"
  echo
  echo '```'
  grep -E '^Benchmark' "$out/shim.md"
  echo '```'
  cat "$out/kube.md"
  echo
  cat "$out/sched.md"
  echo
  echo "## kyb-scheduler"
  cat "$out/kybsched.md"
  echo
  cat "$out/kybburst.md"
  echo
  cat "$out/kybpreempt.md"
  echo
  echo "## Sized seats"
  echo
  echo '```'
  grep -E '^Benchmark' "$out/sized-stream.md"
  grep -E '^Benchmark' "$out/sized-prepare.md"
  echo '```'
  echo
  echo "## Placement study"
  cat "$out/placement.md"
  echo
  echo "## Placement through the real scheduler"
  cat "$out/placement-sched.md"
  echo
  echo "## Defragmentation in the placement study"
  cat "$out/placement-defrag.md"
  echo
  echo "## Fuzzing"
  echo
  echo '```'
  cat "$out/fuzz.md"
  echo '```'
  echo
  echo "## Time per part"
  echo
  echo "| part | time |"
  echo "| --- | --- |"
  cat "$out/times.md"
  echo "| total | $(( $(date +%s) - start )) s |"
} >"$report"
cat "$report"
