# The manager image for those with Docker: /manager and /queenlock, static,
# on an empty base plus what they need to run as the non-root user 65532
# (/etc/passwd and /etc/group entries, CA certificates, /tmp). hack/image
# writes those files: the same tool and files as `make image`, which builds
# the image as an OCI archive without a Docker engine.
#   docker build -t ghcr.io/queen-locks/queen-locks:0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY hack/image/go.mod hack/image/go.sum hack/image/
RUN cd hack/image && go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY handle/ handle/
COPY internal/ internal/
COPY locks/ locks/
COPY permit/ permit/
COPY routeapi/ routeapi/
COPY hack/image/ hack/image/
ENV CGO_ENABLED=0
# The flags of make image, so both give the same binaries.
RUN go build -trimpath -buildvcs=false -ldflags='-s -w -buildid=' -o /out/manager ./cmd/manager && \
    go build -trimpath -buildvcs=false -ldflags='-s -w -buildid=' -o /out/queenlock ./cmd/queenlock && \
    cd hack/image && go run . -rootfs /rootfs -file /manager=/out/manager -file /queenlock=/out/queenlock

FROM scratch
COPY --from=build /rootfs/ /
# COPY makes everything root's: give the user its home back.
COPY --from=build --chown=65532:65532 /rootfs/home/nonroot/ /home/nonroot/
ENV PATH=/ SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
WORKDIR /
USER 65532:65532
ENTRYPOINT ["/manager"]
