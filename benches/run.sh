#!/usr/bin/env bash
# The core figures of docs/performance.md in one run: the criterion benches of
# benches/guard.rs (guard overhead per variant, scan cost), then the load program
# (benches/load/: the guard in alternating turns, instruction counts, registration
# during scans, the mass-failure scan, detection latency, probe latency under load,
# memory), which prints those figures beside their budgets (also saved to
# target/performance-table.md). The other figures (HTTP surface and soak, waits, watch
# layer, task dump, the runtime rescue, footprint, capture memory) have commands of
# their own, named in docs/performance.md.
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
