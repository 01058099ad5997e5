#!/usr/bin/env bash
# make deps-check: what each binary may link.
#
# Both node daemons: no text/template (html/template, which
# golang.org/x/net/trace brings in through grpc unless built with
# grpcnotrace, and text/template call methods by name through reflect, so
# the linker keeps every exported method of every type that reaches an
# interface: a third of the plugin's binary, and of its resident memory),
# no informer factory (it links an informer and a lister for every API
# group), and none of the packages that exist for tests and studies.
#
# The device-plugin shim never talks to the API server: it links no
# client-go, none of the DRA kubelet plugin's helpers, and none of the DRA
# plugin's own packages (docs/performance.md: 759 packages and 40 MB when it
# did).
#
# The CUDA probe runs inside the doctor's sandbox, where it stands for a
# container's process: the standard library, x/sys, and its own two
# packages, nothing of Kubernetes, gRPC or CDI.
#
# kubectl-kyb runs on an operator's machine and reads the API: client-go,
# none of the node's code (no NVML, no kubelet plugin helper, no plugin
# packages). kyb-scheduler: see below.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TAGS=${TAGS:-grpcnotrace}
module=github.com/kyb-ai/kyb-dra-driver

# Test helpers are the packages named *test (schedulertest, sockettest, ...).
both='^(text/template|html/template|golang.org/x/net/trace|k8s.io/client-go/informers|'$module'/pkg/([a-z]+/)*[a-z]+test)$'
declare -A banned=(
	[kyb-dra-plugin]=$both
	[kyb-device-plugin]=$both'|^k8s.io/client-go(/.*)?$|^k8s.io/dynamic-resource-allocation/(kubeletplugin|resourceslice)(/.*)?$|^'$module'/pkg/(draplugin|draresources|seatledger|seatkind|migseats|sharedseats|containerclaims|podusage)(/.*)?$'
	[kubectl-kyb]=$both'|^k8s.io/dynamic-resource-allocation/(kubeletplugin|resourceslice)(/.*)?$|^github.com/NVIDIA/|^google.golang.org/grpc$|^'$module'/pkg/(draplugin|draresources|seatledger|planner|inventory|gpuhost|health|checkpoint|cdi)(/.*)?$'
	[kyb-cuda-probe]='^(k8s.io|sigs.k8s.io|google.golang.org|tags.cncf.io|github.com/NVIDIA)/|^'$module'/(api|pkg)/'
)
# Exceptions to a binary's bans.
declare -A allowed=(
	[kyb-cuda-probe]='^'$module'/pkg/(sandbox|cudaprobe|cudaprobe/driverapi)$'
)
status=0
for cmd in kyb-dra-plugin kyb-device-plugin kyb-cuda-probe kubectl-kyb; do
	deps=$($GO list -tags "$TAGS" -deps "./cmd/$cmd")
	found=$(grep -E "${banned[$cmd]}" <<<"$deps" | grep -vE "${allowed[$cmd]:-^$}" || true)
	for pkg in $found; do
		importers=$($GO list -tags "$TAGS" -deps -f '{{.ImportPath}}: {{join .Imports " "}}' "./cmd/$cmd" |
			awk -v p="$pkg" '{for (i = 2; i <= NF; i++) if ($i == p) {sub(/:$/, "", $1); print $1}}' | tr '\n' ' ')
		echo "deps-check: cmd/$cmd links $pkg (imported by: $importers); see hack/deps-check.sh for why it must not" >&2
		status=1
	done
	echo "deps-check: cmd/$cmd links $(wc -l <<<"$deps") packages"
done
# kyb-scheduler is kube-scheduler, a module of its own (cmd/kyb-scheduler),
# and links what kube-scheduler links; of the driver it reads only the
# names of what the plugin publishes and the pure measure of fragmentation
# it shares with kubectl kyb seats: no node code, no NVML (it is built
# without cgo), no test helpers. Its module builds against the patched
# copies hack/kyb-scheduler-patch.sh makes.
GO=$GO hack/kyb-scheduler-patch.sh
deps=$(cd cmd/kyb-scheduler && $GO list -deps .)
found=$(grep -E '^github.com/NVIDIA/|^'$module'/(pkg|api)/' <<<"$deps" | grep -vE '^'$module'/(pkg/driver|pkg/fragmentation|api/kyb.ai/v1alpha1)$' || true)
for pkg in $found; do
	echo "deps-check: cmd/kyb-scheduler links $pkg; see hack/deps-check.sh for why it must not" >&2
	status=1
done
echo "deps-check: cmd/kyb-scheduler links $(wc -l <<<"$deps") packages"
[[ $status == 0 ]] && echo "deps-check: no binary links a package banned for it (tags: $TAGS)"
exit $status
