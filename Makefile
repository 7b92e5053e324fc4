# queen-locks: the two commands a user needs are `make dev` and `make test`.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

BIN := $(CURDIR)/bin
# envtest finds etcd, kube-apiserver and kubectl here.
export KUBEBUILDER_ASSETS := $(BIN)

GO_PACKAGES := ./...
CONTROLLER_GEN := $(BIN)/controller-gen
HELM := $(BIN)/helm

.PHONY: all
all: build

##@ Tools, each built once from its pinned module under hack/

.PHONY: tools control-plane
control-plane: ## Build etcd, kube-apiserver and kubectl into bin/.
	hack/build-tools.sh etcd hack/etcd go.etcd.io/etcd/server/v3
	hack/build-tools.sh kube-apiserver hack/kube k8s.io/kubernetes/cmd/kube-apiserver
	hack/build-tools.sh kubectl hack/kube k8s.io/kubernetes/cmd/kubectl

tools: control-plane ## Build every tool the project uses.
	hack/build-tools.sh controller-gen hack/tools sigs.k8s.io/controller-tools/cmd/controller-gen
	hack/build-tools.sh helm hack/tools helm.sh/helm/v4/cmd/helm
	hack/build-tools.sh golangci-lint hack/lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: handle-deps
handle-deps: ## Install from Debian's packages (as root) what tests need beyond Go: the Rust, PHP and C++ handles' toolchains, Prometheus, qemu-user-static, Chromium (one script each under hack/handles).
	@for s in hack/handles/*.sh; do bash "$$s"; done

##@ Generated code

.PHONY: generate manifests verify-gen
generate: tools ## Regenerate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

manifests: tools ## Regenerate the CRD, RBAC and webhook manifests under config/.
	$(CONTROLLER_GEN) crd rbac:roleName=queen-locks-manager webhook paths=./... \
		output:crd:artifacts:config=config/crd/bases \
		output:rbac:artifacts:config=config/rbac \
		output:webhook:artifacts:config=config/webhook
	hack/gen-chart-crd.sh
	hack/gen-chart-gate.sh

verify-gen: generate manifests ## Fail when generated files are not what the sources say.
	@untracked=$$(git ls-files --others --exclude-standard -- api config charts); \
	if ! git diff --quiet -- api config charts || [ -n "$$untracked" ]; then \
		echo "generated files are stale; run 'make generate manifests' and commit:"; \
		git diff --stat -- api config charts; echo "$$untracked"; exit 1; fi

##@ Build and check

.PHONY: build fmt vet lint
build: ## Build bin/manager and bin/queenlock (also as the kubectl plugin bin/kubectl-queen).
	go build -o $(BIN)/manager ./cmd/manager
	go build -o $(BIN)/queenlock ./cmd/queenlock
	ln -sf queenlock $(BIN)/kubectl-queen

fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go')

lint: ## go vet, a gofmt check and golangci-lint (.golangci.yml) over the root module.
	go vet $(GO_PACKAGES)
	@files=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$files" ]; then echo "not gofmt'ed:"; echo "$$files"; exit 1; fi
	hack/build-tools.sh golangci-lint hack/lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	$(BIN)/golangci-lint run $(GO_PACKAGES)

##@ Test

# Fuzz budgets are counts of runs, not durations: with a duration, Go's fuzz
# coordinator (before Go 1.27, golang/go#75804) can report its own deadline as
# a failure of the target when the machine is loaded. A count has no deadline.
FUZZ_DECODE ?= 20000x
FUZZ_HANDLER ?= 10000x
FUZZ_NAME ?= 100000x

.PHONY: test unit fuzz
test: tools verify-gen lint ## Generated files, lint, unit and envtest suites (the handles' own runners included), a short fuzz, a one-minute chaos run; CI also runs image-test and e2e.
	go test -count=1 -timeout 20m $(GO_PACKAGES)
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory chaos CHAOS_DURATION=1m

fuzz: ## Run each fuzz target for a fixed count of inputs (about ten seconds each here).
	go test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZ_DECODE) ./internal/route
	go test -run '^$$' -fuzz '^FuzzHandler$$' -fuzztime $(FUZZ_HANDLER) ./internal/route
	go test -run '^$$' -fuzz '^FuzzName$$' -fuzztime $(FUZZ_NAME) ./permit

unit: ## Unit tests alone, no control plane.
	go test -count=1 -short $(GO_PACKAGES)

##@ Measure

.PHONY: bench
bench: tools ## Throughput, latency, renew load and memory, against a Lease baseline; writes docs/development/benchmarks.md.
	go run ./test/bench -out docs/development/benchmarks.md

.PHONY: flood
flood: tools build ## Flood the webhook port and the route beside 50 live holders for 90 s: no lock lost, every review answered in time, writes admitted, manager's peak RSS under 512 MiB.
	QUEEN_LOCKS_FLOOD=1 go test -count=1 -timeout 15m -v -run TestFlood ./test/flood/

.PHONY: bench-scale
bench-scale: tools build ## Scale with many pod-held permits over many namespaces (1000 to 20000): memory, watches, expiry and pod-gone lag, route latency, restart; writes docs/development/benchmarks-scale.md.
	go run ./test/benchscale -manager $(BIN)/manager -out docs/development/benchmarks-scale.md

CHAOS_DURATION ?= 5m
CHAOS_FLAGS ?=

.PHONY: chaos
# The replicas run a manager built with the chaos tag: only that build has
# the clock offset the run skews them with (cmd/manager/testonly.go); the
# manager make build ships has none.
chaos: tools ## Fault injection for CHAOS_DURATION (5m): kills and pauses, then checks the history; exits 1 on a violation.
	go build -tags chaos -o $(BIN)/manager-chaos ./cmd/manager
	go build -o $(BIN)/chaos ./test/chaos
	$(BIN)/chaos -duration $(CHAOS_DURATION) -manager $(BIN)/manager-chaos $(CHAOS_FLAGS)

include hack/e2e.mk
# Optional fragments: the Kubernetes versions the suites are also run
# against, and the monitoring artefacts' checks.
-include hack/compat.mk hack/monitoring.mk

##@ Run

.PHONY: dev
# make dev builds only what it runs: etcd, kube-apiserver and kubectl (the
# manager is built into queen-locks-dev). controller-gen, helm and
# golangci-lint come with make test and make lint, which use them.
dev: control-plane ## A local control plane with the CRD, webhooks and manager; the route on localhost:6632.
	go build -o $(BIN)/queen-locks-dev ./cmd/dev
	exec $(BIN)/queen-locks-dev

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
