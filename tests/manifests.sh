#!/usr/bin/env bash
# Offline checks of manifests/ and the Dockerfile (tests/manifests.py) in the test venv.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash tests/support/venv.sh)"
# The Deployment's flags are checked against the binary they will run.
cargo build --quiet --locked --bin reconcile-watchdog
RECONCILE_WATCHDOG_BIN="${CARGO_TARGET_DIR:-target}/debug/reconcile-watchdog"
export RECONCILE_WATCHDOG_BIN
exec "$venv/bin/python" tests/manifests.py
