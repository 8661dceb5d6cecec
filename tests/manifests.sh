#!/usr/bin/env bash
# Offline checks of manifests/ and the Dockerfile (tests/manifests.py) in the test venv.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bash tests/support/venv.sh)"
exec "$venv/bin/python" tests/manifests.py
