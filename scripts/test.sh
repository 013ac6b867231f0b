#!/usr/bin/env bash
# Set up the checkout (scripts/setup.sh), then run the test suite. Extra arguments go to pytest.
# Exits with pytest's status; "no tests collected" (pytest's 5) counts as an error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

echo "[test] + .venv/bin/python -m pytest -q -ra $*"
status=0
.venv/bin/python -m pytest -q -ra "$@" || status=$?

if [ "$status" -eq 5 ]; then
    echo "[test] error: pytest collected no tests (exit status 5)" >&2
    exit 1
fi
exit "$status"
