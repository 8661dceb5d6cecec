#!/usr/bin/env bash
# Fuzzes each cargo-fuzz target for a bounded time (nightly Rust and cargo-fuzz; not in
# CI), starting from fuzz/corpus/TARGET/ and the hand-written fuzz/seeds/TARGET/, then
# minimises the corpus. tests/fuzz_corpus.rs replays both directories on stable:
# commit the new corpus files. A crash leaves its input in fuzz/artifacts/TARGET/.
#
#   bash fuzz/run.sh            # 120 seconds per target
#   bash fuzz/run.sh 600        # 10 minutes per target
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-120}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=(probe_request flag_values fault_annotation)
status=0
for target in "${targets[@]}"; do
    echo "== $target: ${seconds}s"
    if ! cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- -max_total_time="$seconds" -rss_limit_mb=2048; then
        echo "== $target: FAILED; the input is in fuzz/artifacts/$target/"
        status=1
    fi
    cargo +nightly fuzz cmin "$target"
done
exit "$status"
