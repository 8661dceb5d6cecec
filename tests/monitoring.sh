#!/usr/bin/env bash
# Checks of manifests/monitoring/ (tests/monitoring.py) in the test venv: promtool on the
# alert rules, the dashboard against its generator, and the metrics they name against
# the binary's /metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash tests/support/venv.sh)"
# promtool ships in Debian's prometheus package (the server is installed too, not started).
command -v promtool >/dev/null || {
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus
}
cargo build --quiet --locked --bin reconcile-watchdog
RECONCILE_WATCHDOG_BIN="${CARGO_TARGET_DIR:-target}/debug/reconcile-watchdog"
export RECONCILE_WATCHDOG_BIN
exec "$venv/bin/python" tests/monitoring.py
