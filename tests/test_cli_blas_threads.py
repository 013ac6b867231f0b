"""farm.cli.blas_threads: the `farm` command runs numpy's OpenBLAS on one thread unless the user says otherwise, and
sets that before numpy loads (OpenBLAS reads it once, as it starts its threads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import os, sys\n"
    "import farm.cli.main\n"
    "assert 'numpy' not in sys.modules, 'numpy loaded before the command set its BLAS threads'\n"
    "print(os.environ['OPENBLAS_NUM_THREADS'])\n"
)


@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("3", "3")])
def test_the_command_runs_openblas_on_one_thread_unless_told_otherwise(given: str | None, seen: str) -> None:
    env = {name: value for name, value in os.environ.items() if name != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == seen
