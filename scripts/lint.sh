#!/usr/bin/env bash
# Lint the checkout as CI does: scripts/test.sh (which .ci/run runs) calls this before the tests, and
# .pre-commit-config.yaml runs it on commit. ruff's rules (pyproject.toml, [tool.ruff]) over every Python folder.
# Needs the .venv that scripts/setup.sh makes; exits non-zero when ruff finds something.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "[lint] + .venv/bin/ruff check farm tests benchmarks scripts tasks workers deploy"
.venv/bin/ruff check farm tests benchmarks scripts tasks workers deploy
