#!/usr/bin/env bash
# The library as an embedder gets it (.ci/test runs this): each documented feature
# combination builds on its own (the kube integration on each supported kube major),
# the crate packages and its .crate builds by itself, and its public API is the one
# listed in lib/public-api.txt.
#
#   bash tests/library.sh                      # the checks
#   bash tests/library.sh --update-public-api  # rewrite lib/public-api.txt after a
#                                              # deliberate change of the public API
#
# The downstream example (examples/downstream/) is a workspace member, so the
# workspace-wide clippy of .ci/run and build of .ci/test already compile it as an
# operator would; nothing here builds it again.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"

# The library enables no k8s-openapi version feature (kube-rs asks that of libraries: the
# operator's binary picks the Kubernetes version), so building it alone needs one named:
# 1.35, which the k8s-openapi of each supported kube major knows (0.27: 1.31 to 1.35,
# 0.28: 1.32 to 1.36, 0.29: 1.33 to 1.37). Only the library's own builds below see it.
export K8S_OPENAPI_ENABLED_VERSION=1.35

public_api() {
    # rustdoc's JSON output is unstable: tests/support/rustdoc-json.sh runs rustdoc with
    # RUSTC_BOOTSTRAP, and cargo builds the dependencies as the `default` combination
    # below does (same target dir, features and profile), so they are not built again.
    # Default features, as `reconcile-watchdog = "0.1"` builds.
    RUSTDOC="$PWD/tests/support/rustdoc-json.sh" cargo rustdoc --quiet --locked \
        -p reconcile-watchdog --lib -- -Z unstable-options --output-format json
    python3 tests/public_api.py "$target/doc/reconcile_watchdog.json"
}

if [[ "${1:-}" == "--update-public-api" ]]; then
    public_api > lib/public-api.txt
    echo "lib/public-api.txt: $(wc -l < lib/public-api.txt) public items"
    exit 0
fi

# A check proves that a combination compiles; warnings are errors for the library alone
# (`cargo rustc` passes -D warnings to it, not to its dependencies, whose builds stay
# shared), so an import unused without some feature fails here.
# Every combination is tried, so one run names all that fail.
failed=()
while read -r features; do
    echo "library features: ${features:-default}"
    # shellcheck disable=SC2086 # the flags are words
    cargo rustc --quiet --locked -p reconcile-watchdog --lib --profile check $features \
        -- -D warnings || failed+=("${features:-default}")
done <<'EOF'
--no-default-features
--no-default-features --features kube
--no-default-features --features kube-4
--no-default-features --features kube-3
--no-default-features --features metrics
--no-default-features --features stack-capture
--no-default-features --features clap

--all-features
EOF
if ((${#failed[@]})); then
    printf 'the library does not build with: %s\n' "${failed[@]}" >&2
    exit 1
fi

# The check above cannot see a version feature enabled by the library or anything it
# pulls in (the variable and the feature would agree on 1.35): the resolved features can.
k8s_features="$(cargo tree --locked -p reconcile-watchdog --all-features -e normal \
    --prefix none -f '{p}|{f}' | grep '^k8s-openapi ' | sort -u)"
if grep -qE '[|,](v1_[0-9]+|latest|earliest)' <<<"$k8s_features"; then
    echo "the library enables a k8s-openapi version feature: $k8s_features" >&2
    exit 1
fi

# The crate as a user's cargo gets it from the registry: `cargo package` packs it (with
# its Cargo.lock), and the .crate, unpacked outside the repository, must build by itself
# with default features. It is checked as the combinations above are, not built:
# `cargo package`'s own verification build compiled much of the library's dependency
# tree in debug once more (59 of its 185 crates, k8s-openapi, kube, tokio and serde
# among them, differ in features, or depend on one that does, from the workspace's
# build: `cargo tree`), where this check reuses the `default` combination's (same
# features, versions and target dir) and compiles the library alone. For a library the
# two differ only in code generation.
# --allow-dirty: what is packaged is the working tree under test.
package_log="$(mktemp)"
unpacked="$(mktemp -d)"
trap 'rm -rf "$package_log" "$unpacked"' EXIT
if ! cargo package --locked -p reconcile-watchdog --allow-dirty --no-verify \
    >"$package_log" 2>&1; then
    cat "$package_log" >&2
    exit 1
fi
tar -xzf "$target"/package/reconcile-watchdog-*.crate -C "$unpacked"
if ! CARGO_TARGET_DIR="$(cd "$target" && pwd)" cargo rustc --quiet --locked --lib \
    --profile check --manifest-path "$unpacked"/reconcile-watchdog-*/Cargo.toml \
    -- -D warnings; then
    echo "the packaged crate does not build by itself (unpacked in $unpacked)" >&2
    trap - EXIT
    exit 1
fi
echo "packaged: $(ls "$target"/package/reconcile-watchdog-*.crate)"

# The public API: an item made `pub` by accident fails here until the listing says so.
listed="$(mktemp)"
trap 'rm -rf "$package_log" "$unpacked" "$listed"' EXIT
public_api > "$listed"
if ! diff -u lib/public-api.txt "$listed"; then
    echo "the library's public API differs from lib/public-api.txt (diff above: - listed," \
        "+ built). If the change is meant, regenerate the listing with" \
        "'bash tests/library.sh --update-public-api' and commit it." >&2
    exit 1
fi
echo "public API: as listed in lib/public-api.txt ($(wc -l < lib/public-api.txt) items)"
