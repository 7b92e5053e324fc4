# The control-plane suites against the older Kubernetes releases the README
# claims, not only hack/kube's. Included by the Makefile (-include). See
# docs/development/compat.md.

##@ Compatibility with older Kubernetes

# Each version has its tools module hack/kube-<version>, pinning the newest
# patch release of it that the Go module proxy serves; its kube-apiserver
# goes to bin/compat/<version>/, with links to bin/etcd and bin/kubectl.
COMPAT_VERSIONS ?= 1.35 1.36
# The suites whose behaviour rests on the API server: the permit webhook,
# the controllers, locks and the route.
COMPAT_PACKAGES ?= ./webhook ./controllers ./controllers/gate ./internal/manager ./locks ./internal/route
COMPAT_TESTFLAGS ?=
COMPAT_DIR := $(BIN)/compat

.PHONY: compat compat-tools
compat-tools: control-plane ## Build the kube-apiserver of each of COMPAT_VERSIONS (1.35 1.36) into bin/compat/<version>/.
	@for v in $(COMPAT_VERSIONS); do hack/compat-build.sh $$v; done

# Every version runs even when one fails; a summary of each package's
# result and time closes the run, and bin/compat/<version>/test.log keeps
# the whole output. TEST_ASSET_* would override KUBEBUILDER_ASSETS in
# envtest, so they are unset.
compat: compat-tools ## Run the webhook, controller, manager, locks and route suites against each of COMPAT_VERSIONS: make compat COMPAT_VERSIONS=1.35 for one.
	@failed=""; \
	for v in $(COMPAT_VERSIONS); do \
		dir=$(COMPAT_DIR)/$$v; \
		echo ">> $$($$dir/kube-apiserver --version): $(COMPAT_PACKAGES)"; \
		start=$$(date +%s); \
		if env -u TEST_ASSET_KUBE_APISERVER -u TEST_ASSET_ETCD -u TEST_ASSET_KUBECTL KUBEBUILDER_ASSETS=$$dir \
			go test -count=1 -timeout 20m $(COMPAT_TESTFLAGS) $(COMPAT_PACKAGES) 2>&1 | tee $$dir/test.log; then \
			result=passed; \
		else \
			result=FAILED; failed="$$failed $$v"; \
		fi; \
		echo "$$v $$result in $$(( $$(date +%s) - start ))s" > $$dir/result; \
	done; \
	echo ">> compat summary"; \
	for v in $(COMPAT_VERSIONS); do \
		dir=$(COMPAT_DIR)/$$v; \
		echo "$$($$dir/kube-apiserver --version): $$(cat $$dir/result)"; \
		grep -E '^(ok|FAIL|---)[[:space:]]' $$dir/test.log | sed 's/^/    /' || true; \
	done; \
	if [ -n "$$failed" ]; then echo "compat failed on:$$failed"; exit 1; fi
