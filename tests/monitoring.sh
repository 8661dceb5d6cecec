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
# The binary RECONCILE_WATCHDOG_BIN names (.ci/test gives the one its tests built), else
# a debug build.
if [[ -z "${RECONCILE_WATCHDOG_BIN:-}" ]]; then
    cargo build --quiet --locked --bin reconcile-watchdog
    RECONCILE_WATCHDOG_BIN="${CARGO_TARGET_DIR:-target}/debug/reconcile-watchdog"
fi
export RECONCILE_WATCHDOG_BIN
exec "$venv/bin/python" tests/monitoring.py
