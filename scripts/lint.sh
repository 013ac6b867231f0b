#!/usr/bin/env bash
# Lint the checkout as CI does: scripts/test.sh (which .ci/run runs) calls this before the tests, and
# .pre-commit-config.yaml runs it on commit. ruff's rules and its formatter (pyproject.toml, [tool.ruff]) over every
# Python folder, then mypy over farm/ ([tool.mypy]); all three pinned in the test extras, so CI and a laptop agree.
# Needs the .venv that scripts/setup.sh makes; exits non-zero at the first check that finds something.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

FOLDERS=(farm tests benchmarks scripts tasks workers deploy)

run() {
    echo "[lint] + $*"
    "$@"
}

run .venv/bin/ruff check "${FOLDERS[@]}"
run .venv/bin/ruff format --check "${FOLDERS[@]}"
run .venv/bin/mypy
