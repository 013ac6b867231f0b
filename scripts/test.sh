#!/usr/bin/env bash
# Set up the checkout (scripts/setup.sh), then run the test suite. Extra arguments go to pytest.
# Exits with pytest's status; "no tests collected" (pytest's 5) counts as an error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# First line of the log: this host's CPU and its vector ISA, so that a failure can be tied to the kind of host it
# happened on (AVX2-only and AVX-512 hosts both run this suite; docs/architecture.md, "Hosts the suite runs on").
host_line() {
    local cpuinfo flags isa=() pair
    cpuinfo="$(cat /proc/cpuinfo 2>/dev/null || true)"
    field() { printf '%s\n' "$cpuinfo" | grep -m1 "^$1[[:space:]]*:" | cut -d: -f2- | sed 's/^ *//' || true; }
    flags=" $(field flags)$(field Features) "
    for pair in avx2:AVX2 avx512f:AVX-512 avx512_vnni:VNNI avx_vnni:VNNI amx_tile:AMX asimd:NEON sve:SVE; do
        if [[ $flags == *" ${pair%%:*} "* && " ${isa[*]} " != *" ${pair#*:} "* ]]; then
            isa+=("${pair#*:}")
        fi
    done
    echo "[test] host: $(field 'model name') ($(field vendor_id) family $(field 'cpu family') model" \
         "$(field model)), $(uname -m), $(nproc) CPUs; vector ISA: ${isa[*]:-baseline only}"
}
host_line

bash scripts/setup.sh

# Lint first (scripts/lint.sh); a lint failure fails the run, but the tests still run, so one report shows both.
lint_status=0
bash scripts/lint.sh || lint_status=$?

# Three pytest-xdist workers, a test file each at a time (--dist loadfile: a module's fixtures are built once). The
# service tests and the production-timeout tests mostly wait (the tuning lock test waits its 120 s), so on two cores
# a third worker fills what a second leaves idle: 15m03s with -n 2, 11m36s with -n 3 on a 2-core Zen 4 (5,407 tests).
# Files go to the workers in collection order (--no-loadscope-reorder, not xdist's most-tests-first): tests/conftest.py
# puts the longest files first (SLOWEST_FILES), so that none of them starts last and runs alone at the end.
# --durations=25 lists the slowest tests in every log, the figures SLOWEST_FILES and the suite's time budget go by.
# Arguments given later win: `bash scripts/test.sh -n 0` runs it in one process.
PYTEST_ARGS=(-q -ra -n 3 --dist loadfile --no-loadscope-reorder --durations=25)
echo "[test] + .venv/bin/python -m pytest ${PYTEST_ARGS[*]} $*"
status=0
.venv/bin/python -m pytest "${PYTEST_ARGS[@]}" "$@" || status=$?

if [ "$status" -eq 5 ]; then
    echo "[test] error: pytest collected no tests (exit status 5)" >&2
    exit 1
fi
if [ "$status" -eq 0 ] && [ "$lint_status" -ne 0 ]; then
    echo "[test] error: the tests passed but scripts/lint.sh failed (see [lint] above)" >&2
    exit 1
fi
exit "$status"
