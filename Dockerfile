# Both binaries, static, on a distroless non-root base.
#   docker build -t ghcr.io/queen-locks/queen-locks:0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cli/ cli/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY handle/ handle/
COPY internal/ internal/
COPY locks/ locks/
COPY manager/ manager/
COPY permit/ permit/
COPY route/ route/
COPY webhook/ webhook/
COPY wire/ wire/
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags='-s -w' -o /out/manager ./cmd/manager && \
    go build -trimpath -ldflags='-s -w' -o /out/queenlock ./cmd/queenlock

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/manager /manager
COPY --from=build /out/queenlock /queenlock
USER 65532:65532
ENTRYPOINT ["/manager"]
