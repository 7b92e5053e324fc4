# Targets for the manager image and the end-to-end run on a real node.
# Included by the Makefile.

##@ Image and end-to-end

IMAGE_REPOSITORY ?= ghcr.io/queen-locks/queen-locks
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/queen-locks/Chart.yaml)
IMAGE := $(IMAGE_REPOSITORY):$(IMAGE_TAG)
IMAGE_ARCHIVE := $(BIN)/queen-locks-image.tar
# The platforms of the image index, each cross-compiled into
# bin/image/OS-ARCH/; the SPDX SBOM of each binary of each platform goes
# into IMAGE_SBOM_DIR as well as into the archive (docs/image.md).
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_SBOM_DIR := $(BIN)/sbom
# Static, stripped and without paths or build IDs of this machine, so the
# same sources and Go give the same image, byte for byte.
IMAGE_GOFLAGS := -trimpath -buildvcs=false -ldflags='-s -w -buildid='

.PHONY: image image-test
image: ## Build the manager image without Docker: bin/queen-locks-image.tar, an OCI archive of one image index (linux/amd64, linux/arm64; /manager, /queenlock, user 65532) with SPDX SBOMs, also in bin/sbom/.
	for p in $$(tr , ' ' <<<'$(IMAGE_PLATFORMS)'); do \
		mkdir -p $(BIN)/image/$${p//\//-}; \
		CGO_ENABLED=0 GOOS=$${p%%/*} GOARCH=$${p#*/} go build $(IMAGE_GOFLAGS) -o $(BIN)/image/$${p//\//-}/ ./cmd/manager ./cmd/queenlock; \
	done
	cd hack/image && go build -o $(BIN)/image-tool .
	rm -rf $(IMAGE_SBOM_DIR)
	$(BIN)/image-tool -out $(IMAGE_ARCHIVE) -name $(IMAGE) -entrypoint /manager \
		-platforms $(IMAGE_PLATFORMS) -sbom $(IMAGE_SBOM_DIR) \
		-file '/manager=$(BIN)/image/{os}-{arch}/manager' -file '/queenlock=$(BIN)/image/{os}-{arch}/queenlock'
	@echo "wrote $(IMAGE_ARCHIVE) ($(IMAGE): $(IMAGE_PLATFORMS)) and its SBOMs in $(IMAGE_SBOM_DIR)"

# The image again from the same binaries, to compare byte for byte.
IMAGE_AGAIN := $(BIN)/image-again

image-test: tools image ## Check the image: every platform's binaries and SBOMs, reproducible, and each platform's entrypoint (arm64 under qemu-user-static), unpacked and run as uid 65532, serves the local control plane.
	cd hack/image && go test -count=1 ./...
	rm -rf $(IMAGE_AGAIN)
	$(MAKE) --no-print-directory image IMAGE_ARCHIVE=$(IMAGE_AGAIN)/queen-locks-image.tar IMAGE_SBOM_DIR=$(IMAGE_AGAIN)/sbom
	cmp $(IMAGE_ARCHIVE) $(IMAGE_AGAIN)/queen-locks-image.tar
	diff -r $(IMAGE_SBOM_DIR) $(IMAGE_AGAIN)/sbom
	rm -rf $(IMAGE_AGAIN)
	QUEEN_LOCKS_IMAGE=$(IMAGE_ARCHIVE) QUEEN_LOCKS_IMAGE_SBOM=$(IMAGE_SBOM_DIR) go test -count=1 -v ./test/e2e/image/

# The rest of the control plane and the node, from hack/node: the same
# Kubernetes release as hack/kube's kube-apiserver, in a module of their own
# so that a change here never rebuilds kube-apiserver.
NODE_TOOLS := kube-controller-manager kube-scheduler kube-proxy kubelet

.PHONY: node-tools
node-tools: ## Build kube-controller-manager, kube-scheduler, kube-proxy and the kubelet into bin/ (make e2e's node).
	for t in $(NODE_TOOLS); do hack/build-tools.sh $$t hack/node k8s.io/kubernetes/cmd/$$t; done

# The node's sandbox (pause) image, the image examples/cronjob runs in
# the e2e test (queenlock and a report that sleeps) and
# examples/fenced-controller's, built like the manager's: nothing can be
# pulled on the node.
E2E_DIR := $(BIN)/e2e

.PHONY: e2e-images e2e
e2e-images: image
	mkdir -p $(E2E_DIR)
	cd hack/image && CGO_ENABLED=0 go build $(IMAGE_GOFLAGS) -o $(E2E_DIR)/pause ./pause
	CGO_ENABLED=0 go build $(IMAGE_GOFLAGS) -o $(E2E_DIR)/report ./test/e2e/report
	$(BIN)/image-tool -out $(E2E_DIR)/pause.tar -name queen-locks.test/e2e/pause:1 -entrypoint /pause \
		-file /pause=$(E2E_DIR)/pause
	$(BIN)/image-tool -out $(E2E_DIR)/report.tar -name queen-locks.test/e2e/report:1 -entrypoint /queenlock \
		-file '/queenlock=$(BIN)/image/{os}-{arch}/queenlock' -file /report=$(E2E_DIR)/report
	CGO_ENABLED=0 go build $(IMAGE_GOFLAGS) -o $(E2E_DIR)/fenced-controller ./examples/fenced-controller
	$(BIN)/image-tool -out $(E2E_DIR)/fenced-controller.tar -name queen-locks.test/e2e/fenced-controller:1 -entrypoint /fenced-controller \
		-file /fenced-controller=$(E2E_DIR)/fenced-controller

E2E_FLAGS ?=

e2e: tools node-tools e2e-images ## A whole cluster with a real node (as root; containerd, runc, CNI plugins, iptables from Debian): helm install, failover, examples/cronjob, upgrade, uninstall. Leaves nothing running.
	hack/node/runtime.sh
	go test -c -o $(E2E_DIR)/cluster.test ./test/e2e/cluster
	cd test/e2e/cluster && QUEEN_LOCKS_E2E=1 $(E2E_DIR)/cluster.test -test.v -test.timeout 45m $(E2E_FLAGS)
