#!/usr/bin/env bash
# The loom model of the registry entry's state word (lib/tests/loom.rs): every
# interleaving of the entry's owner (ending and reusing it), a reader (copying it as a
# seqlock's reader does) and the monitor (marking it hung, asking it to stop), within
# loom's preemption bound. .ci/test runs it.
#
#   bash tests/loom.sh                          # bound 3 (the model's default)
#   LOOM_MAX_PREEMPTIONS=4 bash tests/loom.sh   # a deeper search, slower
#
# The model compiles the library's lib/src/guard/state.rs against loom's atomics, so it
# needs no `--cfg loom` build of every dependency: a debug build beside the others.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debug assertions on, as the model's own asserts need nothing more; release would
# rebuild the library's dev-dependencies for one test.
cargo test --locked -p reconcile-watchdog --test loom -- --test-threads=1
