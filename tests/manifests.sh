#!/usr/bin/env bash
# Offline checks of manifests/ and the Dockerfile (tests/manifests.py) in the test venv.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash tests/support/venv.sh)"
# The Deployment's flags are checked against the binary they will run.
# The binary RECONCILE_WATCHDOG_BIN names (.ci/test gives the one its tests built), else
# a debug build.
if [[ -z "${RECONCILE_WATCHDOG_BIN:-}" ]]; then
    cargo build --quiet --locked --bin reconcile-watchdog
    RECONCILE_WATCHDOG_BIN="${CARGO_TARGET_DIR:-target}/debug/reconcile-watchdog"
fi
export RECONCILE_WATCHDOG_BIN
exec "$venv/bin/python" tests/manifests.py
