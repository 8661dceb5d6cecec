# syntax=docker/dockerfile:1
# The reference operator in a minimal non-root image:
#   docker build -t reconcile-watchdog:0.1.0 .        (docs/install.md)
#
# The image runs the build CI tests: x86_64 (or the build machine's architecture)
# Linux with glibc, unwound by libgcc. Both stages are Debian 13 (trixie), so the
# binary runs on the glibc it was linked against (2.41): no musl, whose libunwind and
# signal trampoline the stack capture is not tested with (docs/diagnostics.md).
#
# Build stage: the official Rust image on Debian trixie carries gcc and the glibc
# headers, all that ring (kube's rustls backend, the only C compiled) needs.
FROM rust:1.95-slim-trixie AS build
WORKDIR /src
COPY . .
# The caches speed up rebuilds; the binary is copied out of the cached target dir.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin reconcile-watchdog \
    && cp target/release/reconcile-watchdog /reconcile-watchdog

# Run stage: distroless "cc" is glibc, libgcc_s and CA certificates, no shell and no
# package manager; the same Debian release as the build stage.
FROM gcr.io/distroless/cc-debian13:nonroot
COPY --from=build /reconcile-watchdog /usr/local/bin/reconcile-watchdog
# Numeric, so that the kubelet can enforce runAsNonRoot without reading /etc/passwd.
USER 65532:65532
# 8081: probes (/healthz, /readyz); 8080: Prometheus /metrics.
EXPOSE 8081 8080
# checkov:skip=CKV_DOCKER_2:the kubelet probes /healthz and /readyz (manifests/deployment.yaml); the image has no HTTP client to run a Docker HEALTHCHECK with
ENTRYPOINT ["/usr/local/bin/reconcile-watchdog"]
CMD ["run"]
