"""Seeded fuzzing of the model front half (import, passes, validate, plan): a few hundred mutated example models,
each of which must plan or be refused with a one-line BadInputError, within time and memory limits (issue 13). The
mutants come from farm/tools/fuzz.py, which benchmarks/bench_fuzz.py also draws thousands from for the whole CLI.

The loop runs in a child process under an address-space limit, so that a runaway allocation is a failed case
(MemoryError) instead of the test machine's OOM killer; the child prints its findings as JSON.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from farm.tools.fuzz import mutants

SEED = 13
CASES = 300
MEMORY_LIMIT_BYTES = 4 << 30
CASE_SECONDS = 10.0
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_case(path: str) -> str | None:
    """None when the model plans or is refused with a one-line BadInputError; else what went wrong."""
    from farm.build.assembly import plan_model
    from farm.errors import BadInputError

    try:
        plan_model(path)
    except BadInputError as error:
        return None if "\n" not in str(error) else f"multi-line refusal: {error!r}"
    except Exception as error:  # noqa: BLE001 - the point is to catch anything that isn't a clean refusal
        return f"{type(error).__name__}: {str(error)[:300]}"
    return None


def fuzz(seed: int = SEED, count: int = CASES) -> dict:
    """Run `count` mutants; the report lists failures and slow cases by kind and index."""
    rng = random.Random(seed)
    failures, slow, kinds = [], [], {}
    with tempfile.TemporaryDirectory() as folder:
        for index, (kind, data) in enumerate(mutants(rng, count)):
            path = os.path.join(folder, f"case{index}.onnx")
            with open(path, "wb") as f:
                f.write(data)
            started = time.monotonic()
            problem = _run_case(path)
            elapsed = time.monotonic() - started
            kinds[kind] = kinds.get(kind, 0) + 1
            if problem:
                failures.append({"index": index, "kind": kind, "problem": problem})
            if elapsed > CASE_SECONDS:
                slow.append({"index": index, "kind": kind, "seconds": round(elapsed, 1)})
    return {"failures": failures, "slow": slow, "kinds": kinds}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def test_mutated_models_plan_or_are_refused_cleanly():
    code = "import json; from tests.test_fuzz import fuzz; print(json.dumps(fuzz()))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=CHECKOUT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_memory,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert sum(report["kinds"].values()) == CASES
    assert report["failures"] == [] and report["slow"] == [], json.dumps(report, indent=1)
