# syntax=docker/dockerfile:1
# The reference operator as one static binary in a minimal non-root image:
#   docker build -t reconcile-watchdog:0.1.0 .        (docs/install.md)
#
# Build stage: Rust on Alpine targets musl (for the build machine's architecture), and
# Rust links musl statically by default, so the binary needs no libc at run time (a
# static glibc build would still want NSS libraries for name lookups). The only C it
# compiles is ring (kube's rustls backend), which needs gcc and musl-dev.
FROM rust:1.95-alpine AS build
# Unpinned on purpose: Alpine drops superseded package versions, so pins would break the
# build; these two only compile, nothing of them reaches the image.
# hadolint ignore=DL3018
RUN apk add --no-cache gcc musl-dev bash
WORKDIR /src
COPY . .
# The caches speed up rebuilds; the binary is copied out of the cached target dir.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin reconcile-watchdog \
    && cp target/release/reconcile-watchdog /reconcile-watchdog

# Run stage: no shell, no package manager; CA certificates and tzdata only.
FROM gcr.io/distroless/static-debian13:nonroot
COPY --from=build /reconcile-watchdog /usr/local/bin/reconcile-watchdog
# Numeric, so that the kubelet can enforce runAsNonRoot without reading /etc/passwd.
USER 65532:65532
# 8081: probes (/healthz, /readyz); 8080: Prometheus /metrics.
EXPOSE 8081 8080
# checkov:skip=CKV_DOCKER_2:the kubelet probes /healthz and /readyz (manifests/deployment.yaml); the image has no HTTP client to run a Docker HEALTHCHECK with
ENTRYPOINT ["/usr/local/bin/reconcile-watchdog"]
CMD ["run"]
