#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU and its driver, run what
# must meet real hardware (hack/gpucheck): NVML discovery and the plan, the
# doctor, the doctor's CUDA probe through the real libcuda, a claim
# prepared over the plugin's sockets and its container probed, a process
# holding a CUDA context as the per-pod usage sampler sees it, an MPS seat
# (compute mode kept) whose container is refused more than its share and
# granted less, the health monitor's events, the NVML conformance suite the
# simulated node's tests run, the MIG geometry beside nvidia-smi's and the
# plan of a MIG profile. One report:
# _output/gpu-check/report.md. It changes no setting of the GPUs (see
# docs/doctor.md, "Checking a real GPU"); run it as root, on the host.
#
# Without a GPU it says so in one line and exits 2; 1 when a step failed.
# Arguments go to the check (--driver-root, --node-name, --hold). Its own
# test runs every step on a simulated node:
#   go test -tags gpucheck ./hack/gpucheck
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TAGS=${TAGS:-grpcnotrace}
# go-nvml dlopens libnvidia-ml at run time; linking must not need it.
LDFLAGS=${LDFLAGS:--extldflags=-Wl,--unresolved-symbols=ignore-in-object-files}
out=_output/gpu-check
mkdir -p "$out/bin"
$GO build -tags "$TAGS" -ldflags "$LDFLAGS" -o "$out/bin/" ./cmd/kyb-dra-plugin ./cmd/kyb-cuda-probe
$GO build -tags "gpucheck,$TAGS" -ldflags "$LDFLAGS" -o "$out/bin/gpu-check" ./hack/gpucheck
exec "$out/bin/gpu-check" --bin "$out/bin" --out "$out" "$@"
