# syntax=docker/dockerfile:1
#
# The kyb-dra-driver image holds the four commands under cmd/ in
# /usr/local/bin: kyb-dra-plugin (the DRA kubelet plugin and its `plan` and
# `doctor` subcommands; the entrypoint), kyb-device-plugin (the
# device-plugin shim, for clusters without DRA), kyb-cuda-probe (what the
# CUDA driver shows a process; `doctor --probe` runs it in a sandbox) and
# kyb-scheduler (kube-scheduler with the placement score for seats; a
# Deployment runs it with command /usr/local/bin/kyb-scheduler).
# kubectl-kyb, the kubectl plugin, runs on operators' machines, not in
# the image. Nothing else: no shell, no study tools (those
# live in the test/ module, which the build context leaves out). `make image`
# builds it; `make image-check` checks offline what can be checked without a
# Docker engine (hack/image-check.sh). Without a Docker engine, `make
# image-oci` builds the same image as an OCI archive (test/productimage):
# it runs this file's go build line and reads the runtime stage, which may
# hold only what that build reproduces (ARG, LABEL, ENV, USER, ENTRYPOINT
# in exec form, the COPY from the build stage); it says so if not.
#
# Multi-arch: build per platform (docker buildx --platform linux/amd64,linux/arm64).
# The build stage runs on the target platform, not $BUILDPLATFORM, because
# cgo cross-compiling would need a cross C toolchain per target.

ARG GO_VERSION=1.26
# The driver's version; hack/image-check.sh keeps it equal to the chart's appVersion.
ARG VERSION=0.1.0

FROM golang:${GO_VERSION}-bookworm AS build
# golang:*-bookworm carries gcc and the glibc headers that cgo needs.
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY pkg/ pkg/
# kyb-scheduler's patches and the script that applies them to copies of
# the scheduler and its allocator (.dockerignore lets these two in).
COPY hack/kyb-scheduler-patch.sh hack/
COPY test/allocpatch/ test/allocpatch/
# go-nvml needs cgo to build, but not libnvidia-ml to link: NVML is dlopened
# at run time from the node's driver, so its symbols stay unresolved here
# (the same flags as the Makefile's LDFLAGS). -trimpath and -buildvcs=false
# keep the binaries free of the build machine's paths and of .git.
# grpcnotrace: as the Makefile's TAGS, a third off the plugin's memory.
ARG LDFLAGS="-s -w -extldflags=-Wl,--unresolved-symbols=ignore-in-object-files"
# kyb-scheduler is a module of its own (cmd/kyb-scheduler) that builds
# against patched copies of k8s.io/kubernetes and
# k8s.io/dynamic-resource-allocation, which hack/kyb-scheduler-patch.sh
# makes under _output from the module cache (it needs git and the module
# proxy); static, as kube-scheduler is, and reporting the Kubernetes
# version it is (hack/image-check.sh keeps that equal to its go.mod's).
ARG SCHEDULER_LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=v1.37.1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
# One RUN line with every go build: make image-oci (test/productimage) and
# hack/image-check.sh run it as written.
RUN CGO_ENABLED=1 go build -tags grpcnotrace -trimpath -buildvcs=false -ldflags "${LDFLAGS}" -o /out/ ./cmd/kyb-dra-plugin ./cmd/kyb-device-plugin ./cmd/kyb-cuda-probe && hack/kyb-scheduler-patch.sh && cd cmd/kyb-scheduler && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "${SCHEDULER_LDFLAGS}" -o /out/ .

# The runtime is distroless "cc": glibc (the binaries use cgo, and the node's
# libnvidia-ml.so needs glibc, libdl, libpthread, libm, librt) plus libgcc_s,
# which glibc loads when a thread of a C library is cancelled; no shell, no
# package manager. "static" lacks glibc; "base" lacks libgcc_s. debian-slim
# would work too, with a shell and apt that nothing here needs.
FROM gcr.io/distroless/cc-debian12 AS runtime
ARG VERSION
LABEL org.opencontainers.image.title="kyb-dra-driver" \
      org.opencontainers.image.description="Kubernetes DRA driver gpu.kyb.ai: NVIDIA GPUs as GPU groups and seats (kyb-dra-plugin, kyb-device-plugin)" \
      org.opencontainers.image.source="https://github.com/kyb-ai/kyb-dra-driver" \
      org.opencontainers.image.url="https://github.com/kyb-ai/kyb-dra-driver" \
      org.opencontainers.image.vendor="kyb.ai" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/ /usr/local/bin/
# Non-root by default, which is all `kyb-dra-plugin plan` needs. The node
# plugins run as root (the Helm chart sets runAsUser 0, without any
# capability) because the kubelet's directories on the host are writable by
# root alone; override with --user or the pod's securityContext.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kyb-dra-plugin"]
