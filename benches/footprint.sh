#!/usr/bin/env bash
# The release binary's footprint beside its budgets (docs/performance.md, "Binary size and
# resident memory"): the file's size, how much of it is debug info, and the resident
# memory and threads of `demo` at rest (its synthetic workload, no hang), sampled after
# 10, 20 and 30 seconds; and, unbudgeted, its resident memory once a hang report has
# captured a stack.
# Usage: bash benches/footprint.sh [BINARY]
# Without BINARY it builds the release binary (`cargo build --release --locked`) and
# measures that.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -gt 0 ]]; then
    binary="$1"
else
    cargo build --quiet --release --locked --bin reconcile-watchdog
    binary="${CARGO_TARGET_DIR:-target}/release/reconcile-watchdog"
fi
[[ -x "$binary" ]] || { echo "footprint.sh: $binary is not an executable" >&2; exit 2; }

size=$(stat -c %s "$binary")
# The .debug_* sections' sizes in the file (compressed when they are).
# readelf -SW: "[Nr] Name Type Address Off Size ES Flg ..."; not the loaded (A) ones.
debug=0 compressed=no
while read -r name bytes flags; do
    debug=$((debug + 16#$bytes))
    [[ $name == .debug_line && $flags == *C* ]] && compressed=zlib
done < <(readelf -SW "$binary" | sed 's/^ *\[ *[0-9]*\]//' |
         awk '$1 ~ /^\.debug_/ && $7 !~ /A/ { print $1, $5, $7 }')

"$binary" demo --hang-kind none --health-probe-bind-address 127.0.0.1:0 \
    --metrics-bind-address 127.0.0.1:0 --duration 45s >/dev/null 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
rss_max=0 threads=0 samples=""
for at in 10 20 30; do
    sleep 10
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
    threads=$(awk '/^Threads:/ { print $2 }' "/proc/$pid/status")
    samples+="${samples:+, }${rss} KiB at ${at}s"
    (( rss > rss_max )) && rss_max=$rss
done

# Not budgeted, for the record: resident memory some seconds after a stack capture.
# Its peak, and the shipped layout's (the binary without debug sections beside its
# symbol file), are tests/release_binary.rs's (docs/performance.md, "Stack symbols and
# capture memory"); an unshipped binary names frames from its symbol table only.
"$binary" demo --hang-kind block --hang-after 1s --reconcile-deadline 1s \
    --watchdog-interval 100ms --stack-capture-after 1s --health-probe-bind-address 127.0.0.1:0 \
    --metrics-bind-address 0 --duration 30s >/dev/null 2>&1 &
captured=$!
trap 'kill "$pid" "$captured" 2>/dev/null || true' EXIT
sleep 10
rss_captured=$(awk '/^VmRSS:/ { print $2 }' "/proc/$captured/status")

mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
verdict() { (( $1 <= $2 )) && echo yes || echo NO; }
echo "binary: $binary"
echo "| figure | measured | budget | met |"
echo "|---|---|---|---|"
echo "| release binary size | $(mb "$size") ($size bytes; debug info $(mb "$debug"), compressed: $compressed) | ≤ 40 MB | $(verdict "$size" 40000000) |"
echo "| \`demo\` resident at rest | $(mb $((rss_max * 1024))) ($samples; $threads threads) | ≤ 16 MB | $(verdict $((rss_max * 1024)) 16000000) |"
echo "| \`demo\` resident after its first stack capture | $(mb $((rss_captured * 1024))) | none | — |"
