#!/usr/bin/env bash
# Makes the test suite's Python venv from tests/requirements.txt (only when missing or
# stale) and prints its path on stdout; everything else goes to stderr.
# Usage: venv="$(bash tests/support/venv.sh)"; "$venv/bin/python" ...
# The venv lives in target/test-venv unless RECONCILE_WATCHDOG_TEST_VENV names another;
# it is made with python3 (3.11 or newer) unless PYTHON names another interpreter.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
requirements="$root/tests/requirements.txt"
venv="${RECONCILE_WATCHDOG_TEST_VENV:-$root/target/test-venv}"
python="${PYTHON:-python3}"

mkdir -p "$(dirname "$venv")"
# Tests may call this in parallel: one of them builds, the others wait for it.
exec 9>"$venv.lock"
flock 9

# A copy of the requirements it was built from marks a complete venv; one whose
# interpreter is gone (Python upgraded under it) is made again.
if ! cmp -s "$requirements" "$venv/requirements.txt" || ! "$venv/bin/python" -c '' 2>/dev/null; then
    command -v "$python" >/dev/null || { echo "venv.sh: $python not found" >&2; exit 1; }
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        { echo "venv.sh: $python is older than 3.11, which kmock needs" >&2; exit 1; }
    echo "venv.sh: installing tests/requirements.txt into $venv (checkov takes a minute)" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
    cp "$requirements" "$venv/requirements.txt"
fi
echo "$venv"
