#!/usr/bin/env bash
# Every figure of docs/performance.md in one run: the criterion benches (guard overhead,
# scan cost), then the load program, which adds its own measurements and prints the
# table of every figure beside its budget (also saved to target/performance-table.md).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null; then
    echo "benches/run.sh: valgrind counts the instructions; install it (apt-get install valgrind)" >&2
    exit 1
fi

export CRITERION_HOME="$PWD/target/criterion"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "== busiest processes before the run" >&2
ps -eo pcpu,comm --sort=-pcpu | head -6 >&2

cargo bench --locked --bench guard
cargo bench --locked --bench load > target/performance-table.md

echo "== busiest processes after the run" >&2
ps -eo pcpu,comm --sort=-pcpu | head -6 >&2
{
    echo
    echo "Load average (1, 5, 15 min) before the criterion benches: ${load_before}."
} >> target/performance-table.md
cat target/performance-table.md
