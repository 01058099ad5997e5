# kyb-dra-driver. `make help` lists the targets.

GO        ?= go
BIN       ?= bin
CGO_ENABLED ?= 1
export CGO_ENABLED
# go-nvml dlopens libnvidia-ml at run time; linking must not need it.
LDFLAGS   ?= -extldflags=-Wl,--unresolved-symbols=ignore-in-object-files
# grpcnotrace leaves out grpc's golang.org/x/net/trace, whose html/template
# makes the linker keep every exported method of every type: the plugin's
# binary is a third smaller without it, and so is its resident memory
# (docs/performance.md). hack/deps-check.sh keeps it that way.
TAGS      ?= grpcnotrace
PRESET    ?= dgx-h100
NODES     ?= dgx-h100
KEEP      ?=
GOFILES    = $(shell git ls-files '*.go' 2>/dev/null)
CHART     := deployments/helm/kyb-dra-driver
# The image; its tag is the chart's appVersion (hack/image-check.sh keeps the
# Dockerfile and the chart in step with these).
IMAGE     ?= ghcr.io/kyb-ai/kyb-dra-driver
VERSION   ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' $(CHART)/Chart.yaml)
DOCKER    ?= docker
# helm for the chart tests, built from the Go module proxy (no binary downloads).
HELM_VERSION ?= v4.3.1
HELM      ?= $(CURDIR)/_output/bin/helm
# The linters, built from the Go module proxy into _output/bin, once per version.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT ?= $(CURDIR)/_output/bin/golangci-lint
LOGCHECK_VERSION ?= v0.11.0
LOGCHECK  ?= $(CURDIR)/_output/bin/logcheck

.PHONY: help build test unit fuzz soak soak-mps bench e2e patched-bench e2e-node node-tools lint fmt vet deps-check golangci-lint logcheck lint-tools demo plan clean generate helm chart-test image image-oci image-check dashboard-picture

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build the binaries into bin/ (kyb-scheduler too)
	$(GO) build -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...
	@$(MAKE) --no-print-directory $(BIN)/kyb-scheduler

# kyb-scheduler, a module of its own (cmd/kyb-scheduler): kube-scheduler of
# the version the test module pins, built against the allocator and
# scheduler patched by hack/kyb-scheduler-patch.sh under _output (the
# module's go.mod replaces both with those copies; without them its build
# fails). Built with the flags of the test module's builds, so that the two
# share the compiled k8s.io packages; rebuilt only when what goes into it
# changes.
SCHEDULER_DIR := cmd/kyb-scheduler
SCHEDULER_SOURCES = go.mod go.sum hack/kyb-scheduler-patch.sh $(wildcard test/allocpatch/*.patch) \
	$(shell find $(SCHEDULER_DIR) api pkg -type f ! -name '*_test.go' ! -path '*/testdata/*' 2>/dev/null)

.PHONY: kyb-scheduler scheduler-patch
kyb-scheduler: $(BIN)/kyb-scheduler ## build bin/kyb-scheduler (kube-scheduler with the placement score; docs/kyb-scheduler.md)

$(BIN)/kyb-scheduler: $(SCHEDULER_SOURCES)
	@GO=$(GO) hack/kyb-scheduler-patch.sh
	cd $(SCHEDULER_DIR) && $(GO) build -ldflags '$(E2E_LDFLAGS)' -o $(abspath $(BIN))/kyb-scheduler .

# The patched copies kyb-scheduler's module builds against (for its tests and linters).
scheduler-patch:
	@GO=$(GO) hack/kyb-scheduler-patch.sh

demo: ## run the product on a simulated cluster (NODES=dgx-h100[,pcie-8gpu] KEEP=1 to keep it running)
	NODES=$(NODES) KEEP=$(KEEP) hack/demo.sh

dashboard-picture: ## draw docs/img/dashboard.png: the chart's Grafana dashboard over the demo's metrics, via Prometheus (installs prometheus, chromium)
	NODES=$(or $(NODES_PICTURE),dgx-h100,pcie-8gpu) hack/dashboard-picture.sh

plan: build ## print the plan of a simulated node (PRESET=dgx-h100)
	$(BIN)/kyb-dra-plugin plan --simulate $(PRESET)

# The in-process API server and kubectl report this version; without it they
# report v0.0.0-master and version checks fail.
E2E_LDFLAGS := -X k8s.io/component-base/version.gitVersion=v1.37.1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37

test: unit fuzz chart-test e2e e2e-node ## run every test: unit (-race), fuzz (briefly), chart, end-to-end, real node

# Empty: each target's own number of executions (about 10 s each); a
# duration (FUZZTIME=1m) or a count (FUZZTIME=100000x) applies to every target.
FUZZTIME ?=
fuzz: ## run every fuzz target briefly (FUZZTIME=1m for longer)
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh

soak: ## 1,000 random crashes with lost checkpoints among them, then 300 on a node with MIG seats beside an administrator's instances; reports seats doubled and lost, MIG instances leaked and foreign instances destroyed (all must be 0)
	GO=$(GO) hack/soak.sh

soak-mps: ## 500 random MPS prepares, releases, restarts, profile changes and tenant tampering; reports daemons leaked, daemons of another group touched, GPUs in the wrong compute mode (all must be 0)
	GO=$(GO) hack/soak-mps.sh

bench: ## every benchmark of docs/performance.md in one run (ROUNDS=3); tables in _output/bench/report.md
	ROUNDS=$(or $(ROUNDS),3) hack/bench.sh

e2e: helm patched-bench kyb-scheduler scheduler-patch ## end-to-end tests against etcd, kube-apiserver, kube-scheduler (and kyb-scheduler) and the kubelet's DRA manager, in-process
	cd test && HELM=$(HELM) KYB_PATCHED_BENCH=$(abspath $(BIN))/kyb-bench-patched KYB_SCHEDULER=$(abspath $(BIN))/kyb-scheduler $(GO) test -count=1 -timeout 25m -ldflags '$(E2E_LDFLAGS)' $$($(GO) list ./... | grep -v /e2enode)

# kyb-bench built against the allocator patches of test/allocpatch, applied
# to a copy of the stock module under _output (hack/allocator-patch.sh).
patched-bench:
	cd test && modfile=$$(GO=$(GO) ../hack/allocator-patch.sh) && $(GO) build -modfile=$$modfile -ldflags '$(E2E_LDFLAGS)' -o $(abspath $(BIN))/kyb-bench-patched ./cmd/kyb-bench

# containerd, the kubelet, runc and podman, built or installed once into
# $(NODE_TOOLS) (hack/node-tools.sh); the tests run real pods (as root).
NODE_TOOLS ?= $(CURDIR)/_output/node
CONTAINERD_VERSION ?= v2.2.9
node-tools: ## build containerd (CONTAINERD_VERSION), the kubelet and kube-proxy, install runc, podman, the CNI plugins and nft: what e2e-node needs
	GO=$(GO) CONTAINERD_VERSION=$(CONTAINERD_VERSION) E2E_LDFLAGS='$(E2E_LDFLAGS)' hack/node-tools.sh $(NODE_TOOLS)

e2e-node: build node-tools image-oci helm ## real pods on real nodes: kubelet + containerd + runc (and podman), the driver's binaries and image, the chart installed with helm (root)
	cd test && KYB_NODE_TOOLS=$(NODE_TOOLS) KYB_BIN=$(abspath $(BIN)) KYB_IMAGE_ARCHIVE=$(abspath $(IMAGE_ARCHIVE)) KYB_IMAGE=$(IMAGE):$(VERSION) HELM=$(HELM) $(GO) test -count=1 -timeout 20m -ldflags '$(E2E_LDFLAGS)' ./e2enode

.PHONY: gpu-check
GPU_CHECK_ARGS ?=
gpu-check: ## on a machine with an NVIDIA GPU (root): plan, doctor, CUDA probe, a claim prepared and probed, a CUDA process sampled, an MPS seat held to its share, the health events, NVML conformance, MIG geometry beside nvidia-smi, a MIG plan; changes no GPU setting; report in _output/gpu-check/report.md
	@GO=$(GO) TAGS='$(TAGS)' LDFLAGS='$(LDFLAGS)' hack/gpu-check.sh $(GPU_CHECK_ARGS)

unit: scheduler-patch ## unit tests of the product module and kyb-scheduler's, with the race detector
	$(GO) test -race -count=1 ./...
	cd $(SCHEDULER_DIR) && $(GO) test -race -count=1 ./...

lint: fmt vet deps-check golangci-lint logcheck ## gofmt, go vet, what the binaries link, golangci-lint and logcheck (every module)

fmt: ## fail if gofmt would change a file
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet: scheduler-patch ## go vet, every module
	$(GO) vet ./...
	cd test && $(GO) vet ./...
	cd $(SCHEDULER_DIR) && $(GO) vet ./...

deps-check: ## fail if a binary links what it must not (the shim: client-go, the DRA helpers; both: text/template, test helpers)
	TAGS='$(TAGS)' hack/deps-check.sh

golangci-lint: lint-tools scheduler-patch ## golangci-lint over every module (.golangci.yml)
	$(GOLANGCI_LINT) run ./...
	cd test && $(GOLANGCI_LINT) run ./...
	cd $(SCHEDULER_DIR) && $(GOLANGCI_LINT) run ./...

# The product logs only through loggers from contexts (contextual logging,
# as Kubernetes components do), kyb-scheduler's own code too; the test
# module drives upstream components that log through klog's globals, so it
# gets the structured checks only.
logcheck: lint-tools scheduler-patch ## Kubernetes' logcheck: structured, contextual logging
	$(LOGCHECK) -check-contextual -check-with-helpers ./...
	cd test && $(LOGCHECK) ./...
	cd $(SCHEDULER_DIR) && $(LOGCHECK) -check-contextual -check-with-helpers ./...

lint-tools: ## build golangci-lint and logcheck (pinned versions) into _output/bin, once
	@hack/go-tool.sh $(GOLANGCI_LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint $(GOLANGCI_LINT_VERSION)
	@hack/go-tool.sh $(LOGCHECK) sigs.k8s.io/logtools/logcheck $(LOGCHECK_VERSION)

clean: ## remove build outputs (keeps the tools in _output/bin)
	rm -rf $(BIN) _output/image _output/kyb-scheduler

helm: ## build helm (HELM_VERSION, v4.3.1) from the Go module proxy into _output/bin, once
	@hack/go-tool.sh $(HELM) helm.sh/helm/v4/cmd/helm $(HELM_VERSION)

chart-test: helm ## lint and render the Helm chart over several value sets and check what it renders
	HELM=$(HELM) $(GO) test -tags charttest -count=1 ./deployments/helm/charttest/

image: ## build the image IMAGE:VERSION: docker build where `docker info` answers, else the OCI archive of image-oci
	@if $(DOCKER) info >/dev/null 2>&1; then \
		echo "$(DOCKER) build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) ."; \
		$(DOCKER) build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .; \
	else \
		echo "image: no Docker engine ($(DOCKER) info fails): building the OCI archive $(IMAGE_ARCHIVE)"; \
		$(MAKE) --no-print-directory image-oci; \
	fi

# The image without a container engine (test/cmd/kyb-image): the
# Dockerfile's own go build line, on Debian's glibc and libgcc_s at the
# machine's installed versions in place of distroless, as an OCI archive
# for `ctr -n k8s.io images import` or `podman load`. Rebuilt only when
# what goes into it changes; SOURCE_DATE_EPOCH (default 0) is its time.
IMAGE_ARCHIVE ?= _output/image/kyb-dra-driver-$(VERSION).oci.tar
IMAGE_SOURCES = Dockerfile go.mod go.sum hack/kyb-scheduler-patch.sh $(wildcard test/allocpatch/*.patch) $(shell find api cmd pkg -type f ! -name '*_test.go' ! -path '*/testdata/*' 2>/dev/null) \
	$(wildcard test/go.mod test/go.sum test/ociimage/*.go test/productimage/*.go test/cmd/kyb-image/*.go /var/lib/dpkg/status)

image-oci: $(IMAGE_ARCHIVE) ## build IMAGE:VERSION without Docker into _output/image/kyb-dra-driver-VERSION.oci.tar (ctr/podman import it)

$(IMAGE_ARCHIVE): $(IMAGE_SOURCES)
	cd test && $(GO) run ./cmd/kyb-image build -context $(CURDIR) -image $(IMAGE):$(VERSION) -build-arg VERSION=$(VERSION) \
		-debs $(CURDIR)/_output/image/debs -o $(abspath $@)

image-check: image-oci ## check the Dockerfile offline (context, go build, libraries, versions) and that image-oci builds the same image
	hack/image-check.sh $(IMAGE) $(VERSION) $(IMAGE_ARCHIVE)

generate: build ## regenerate the checked-in DeviceClasses
	{ echo "# DeviceClasses of the default profiles: one per seat profile, each mapping its"; \
	  echo "# extended resource so that pods asking for kyb.ai/gpu-1x-seat are served by DRA."; \
	  echo "# Generated by: kyb-dra-plugin plan --simulate dgx-h100 -o deviceclasses (make generate)"; \
	  $(BIN)/kyb-dra-plugin plan --simulate dgx-h100 -o deviceclasses; } > deployments/static/deviceclasses.yaml
