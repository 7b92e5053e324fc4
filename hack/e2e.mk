# Targets for the manager image and the end-to-end run on a real node.
# Included by the Makefile.

##@ Image and end-to-end

IMAGE_REPOSITORY ?= ghcr.io/queen-locks/queen-locks
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/queen-locks/Chart.yaml)
IMAGE := $(IMAGE_REPOSITORY):$(IMAGE_TAG)
IMAGE_ARCHIVE := $(BIN)/queen-locks-image.tar
# Static, stripped and without paths or build IDs of this machine, so the
# same sources and Go give the same image, byte for byte.
IMAGE_GOFLAGS := -trimpath -buildvcs=false -ldflags='-s -w -buildid='

.PHONY: image image-test
image: ## Build the manager image without Docker: bin/queen-locks-image.tar, an OCI archive (/manager, /queenlock, user 65532).
	mkdir -p $(BIN)/image
	CGO_ENABLED=0 go build $(IMAGE_GOFLAGS) -o $(BIN)/image/manager ./cmd/manager
	CGO_ENABLED=0 go build $(IMAGE_GOFLAGS) -o $(BIN)/image/queenlock ./cmd/queenlock
	cd hack/image && go build -o $(BIN)/image-tool .
	$(BIN)/image-tool -out $(IMAGE_ARCHIVE) -name $(IMAGE) -entrypoint /manager \
		-file /manager=$(BIN)/image/manager -file /queenlock=$(BIN)/image/queenlock
	@echo "wrote $(IMAGE_ARCHIVE) ($(IMAGE))"

image-test: tools image ## Check the image: reproducible, and its entrypoint, unpacked and run as uid 65532, serves the local control plane.
	cd hack/image && go test -count=1 ./...
	QUEEN_LOCKS_IMAGE=$(IMAGE_ARCHIVE) go test -count=1 -v ./test/e2e/image/
