#!/usr/bin/env bash
# Set up the checkout (scripts/setup.sh), then run the test suite. Extra arguments go to pytest.
# Exits with pytest's status; "no tests collected" (pytest's 5) counts as an error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

# Two pytest-xdist workers, a test file each at a time (--dist loadfile: a module's fixtures are built once):
# the suite's service tests mostly wait on processes, so two workers save a third on two cores (22 -> 15 minutes).
# Arguments given later win: `bash scripts/test.sh -n 0` runs it in one process.
echo "[test] + .venv/bin/python -m pytest -q -ra -n 2 --dist loadfile $*"
status=0
.venv/bin/python -m pytest -q -ra -n 2 --dist loadfile "$@" || status=$?

if [ "$status" -eq 5 ]; then
    echo "[test] error: pytest collected no tests (exit status 5)" >&2
    exit 1
fi
exit "$status"
