#!/usr/bin/env bash
# Builds and runs the local demo (make demo). The demo links the real
# kube-apiserver, kube-scheduler and kubelet DRA manager, so its first build
# compiles a large part of Kubernetes: several minutes on two cores. The
# progress line counts the packages compiled so far.
set -euo pipefail
cd "$(dirname "$0")/.."

NODES=${NODES:-dgx-h100}
KEEP=${KEEP:-}
LDF="-X k8s.io/component-base/version.gitVersion=v1.37.1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
mkdir -p bin _output

build() { # build <what> <output> <package>
  local what=$1 out=$2 pkg=$3 log=_output/build-$(basename "$2").log start=$SECONDS
  (cd test && go build -v -ldflags "$LDF" -o "../$out" "$pkg") >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    printf '\r  building %s: %d packages compiled, %ds ' "$what" "$(grep -vc '^#' "$log" || true)" $((SECONDS - start))
    sleep 2
  done
  if ! wait "$pid"; then
    printf '\n'; cat "$log"; exit 1
  fi
  printf '\r  built %s in %ds%40s\n' "$what" $((SECONDS - start)) ''
}

echo "Building (the first build compiles Kubernetes' own components: several minutes; later ones take seconds)"
build "the demo" bin/kyb-demo ./cmd/kyb-demo
if [ -n "$KEEP" ]; then
  build kubectl bin/kubectl k8s.io/kubernetes/cmd/kubectl
  # kubectl finds its plugins on PATH: kubectl kyb seats runs bin/kubectl-kyb.
  go build -o bin/kubectl-kyb ./cmd/kubectl-kyb
  PATH="$PWD/bin:$PATH" exec bin/kyb-demo --nodes "$NODES" --keep --kubectl bin/kubectl
fi
exec bin/kyb-demo --nodes "$NODES"
