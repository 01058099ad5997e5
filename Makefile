# kyb-dra-driver. `make help` lists the targets.

GO        ?= go
BIN       ?= bin
CGO_ENABLED ?= 1
export CGO_ENABLED
# go-nvml dlopens libnvidia-ml at run time; linking must not need it.
LDFLAGS   ?= -extldflags=-Wl,--unresolved-symbols=ignore-in-object-files
PRESET    ?= dgx-h100
GOFILES    = $(shell git ls-files '*.go' 2>/dev/null)

.PHONY: help build test unit lint fmt vet demo plan clean

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build the binaries into bin/
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

plan: build ## print the plan of a simulated node (PRESET=dgx-h100)
	$(BIN)/kyb-dra-plugin plan --simulate $(PRESET)

test: unit ## run every test (unit tests with -race)

unit: ## unit tests of the product module, with the race detector
	$(GO) test -race -count=1 ./...

lint: fmt vet ## gofmt and go vet

fmt: ## fail if gofmt would change a file
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet: ## go vet
	$(GO) vet ./...

clean: ## remove build outputs
	rm -rf $(BIN)
