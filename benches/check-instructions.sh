#!/usr/bin/env bash
# The guard's hot path, held in place: callgrind counts the instructions of one reconcile
# under the guard (as `run` ships it, and with each diagnostic off) and compares each
# count with the figure recorded in benches/guard-instructions.txt; a count more than
# 10 % above its figure fails. Callgrind counts instructions, not time, so the machine's
# load does not move them. Raising a figure is a commit of its own that says why.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null; then
    echo "check-instructions.sh: installing valgrind (Debian's package)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >&2
fi
# `--workspace`: features unified across the workspace, as in CI's release build of the
# binaries, which then serves this bench too (the counts are the same either way).
cargo bench --locked --workspace --bench load -- check-instructions benches/guard-instructions.txt
