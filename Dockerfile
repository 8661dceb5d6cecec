# syntax=docker/dockerfile:1
# The reference operator in a minimal non-root image:
#   docker build -t reconcile-watchdog:0.1.0 .        (docs/install.md)
#
# The image runs the build CI tests: x86_64 (or the build machine's architecture)
# Linux with glibc, unwound by libgcc. Both stages are Debian 13 (trixie), so the
# binary runs on the glibc it was linked against (2.41): no musl, whose libunwind and
# signal trampoline the stack capture is not tested with (docs/stack-capture.md).
#
# Build stage: the official Rust image on Debian trixie carries gcc and the glibc
# headers, all that ring (kube's rustls backend, the only C compiled) needs.
FROM rust:1.95-slim-trixie AS build
# llvm-gsymutil and llvm-objcopy make the shipped layout (tools/ship-symbols.sh): the
# binary without debug sections and its GSYM symbol file, which hang reports' stacks are
# resolved from in a few pages of memory (docs/stack-capture.md, "Symbols"). Debian 13's
# llvm is LLVM 19, the version CI's release-binary tests make the symbol file with.
# Not pinned (DL3008): the base image's Debian release fixes the version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends llvm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The caches speed up rebuilds; the binary is copied out of the cached target dir.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin reconcile-watchdog \
    && bash tools/ship-symbols.sh target/release/reconcile-watchdog /shipped

# Run stage: distroless "cc" is glibc, libgcc_s and CA certificates, no shell and no
# package manager; the same Debian release as the build stage.
FROM gcr.io/distroless/cc-debian13:nonroot
# The symbol file must lie beside the binary, named after it.
COPY --from=build /shipped/reconcile-watchdog /shipped/reconcile-watchdog.gsym /usr/local/bin/
# Numeric, so that the kubelet can enforce runAsNonRoot without reading /etc/passwd.
USER 65532:65532
# 8081: probes (/healthz, /readyz); 8080: Prometheus /metrics.
EXPOSE 8081 8080
# checkov:skip=CKV_DOCKER_2:the kubelet probes /healthz and /readyz (manifests/deployment.yaml); the image has no HTTP client to run a Docker HEALTHCHECK with
ENTRYPOINT ["/usr/local/bin/reconcile-watchdog"]
CMD ["run"]
