# syntax=docker/dockerfile:1
#
# The kyb-dra-driver image holds the three commands under cmd/ in
# /usr/local/bin: kyb-dra-plugin (the DRA kubelet plugin and its `plan` and
# `doctor` subcommands; the entrypoint), kyb-device-plugin (the
# device-plugin shim, for clusters without DRA) and kyb-cuda-probe (what the
# CUDA driver shows a process; `doctor --probe` runs it in a sandbox).
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
# go-nvml needs cgo to build, but not libnvidia-ml to link: NVML is dlopened
# at run time from the node's driver, so its symbols stay unresolved here
# (the same flags as the Makefile's LDFLAGS). -trimpath and -buildvcs=false
# keep the binaries free of the build machine's paths and of .git.
# grpcnotrace: as the Makefile's TAGS, a third off the plugin's memory.
ARG LDFLAGS="-s -w -extldflags=-Wl,--unresolved-symbols=ignore-in-object-files"
RUN CGO_ENABLED=1 go build -tags grpcnotrace -trimpath -buildvcs=false -ldflags "${LDFLAGS}" -o /out/ ./cmd/kyb-dra-plugin ./cmd/kyb-device-plugin ./cmd/kyb-cuda-probe

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
