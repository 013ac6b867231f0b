"""ONNX's own conformance cases (collect_testcases) for every op farm supports, through the local build and the
runtime (farm.tools.conformance): each passes, or is refused with a clear UnsupportedError and listed in
docs/conformance.md with the reason. Wrong numbers, crashes and build errors always fail.

On OpenCL (PoCL), one case per supported op (its plainest case) runs the same way; the full OpenCL run is
`python3 -m farm.tools.conformance --device opencl`.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from farm.ops import SUPPORTED_OPS
from farm.tools.conformance import conformance_cases, run_case

REPORT = Path(__file__).resolve().parent.parent / "docs" / "conformance.md"


def _session_cases() -> list:
    """conformance_cases(), made once per test session: ONNX generates its cases' data by running its reference
    implementation (8-15 s), and every pytest-xdist worker collects this module. The first to get here makes them
    and leaves them pickled in the session's cache root (tests/conftest.py), the others load them."""
    folder = os.environ.get("FARM_TEST_SESSION_CACHE_DIR")
    if not folder or not os.path.isdir(folder):
        return conformance_cases()
    path = Path(folder) / "conformance-cases.pickle"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return pickle.loads(path.read_bytes())
        cases = conformance_cases()
        path.with_suffix(".part").write_bytes(pickle.dumps(cases))
        path.with_suffix(".part").rename(path)
        return cases


CASES = _session_cases()


def _listed_as_not_passing() -> set[str]:
    """Case names in the report's table of cases that did not pass."""
    text = REPORT.read_text(encoding="utf-8")
    section = text.split("## Cases that did not pass", 1)[-1]
    return set(re.findall(r"^\| (test_\w+) \|", section, flags=re.MULTILINE))


NOT_PASSING = _listed_as_not_passing()


def _first_case_per_op() -> list:
    """For each supported op, its plainest in-scope case: one that passes on the CPU where the op has one, of the
    fewest nodes, then the shortest name (test_relu for Relu, test_constantofshape_int_zeros for ConstantOfShape,
    not a 76-node attention expansion that happens to use it)."""
    chosen = {}
    for case in sorted(
        CASES, key=lambda case: (case.name in NOT_PASSING, len(case.model.graph.node), len(case.name), case.name)
    ):
        for op in {node.op_type for node in case.model.graph.node} & set(SUPPORTED_OPS):
            chosen.setdefault(op, case)
    return sorted({case.name: case for case in chosen.values()}.values(), key=lambda case: case.name)


@pytest.mark.slow  # some 1,400 whole builds: the fast lane leaves them to CI (the ops tests cover each op)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_conformance_case_on_the_cpu(case) -> None:
    outcome = run_case(case, "cpu")
    assert outcome.result != "fail", outcome.reason
    if outcome.result == "unsupported":
        assert case.name in NOT_PASSING, f"refused but not listed in {REPORT.name}: {outcome.reason}"
    else:
        assert case.name not in NOT_PASSING, f"passes now: regenerate {REPORT.name} (python3 -m farm.tools.conformance)"


@pytest.mark.parametrize("case", _first_case_per_op(), ids=lambda case: case.name)
def test_conformance_case_on_opencl(case) -> None:
    outcome = run_case(case, "opencl")
    assert outcome.result != "fail", outcome.reason


def test_the_report_covers_every_supported_op() -> None:
    text = REPORT.read_text(encoding="utf-8")
    missing = [op for op in SUPPORTED_OPS if f"| {op} |" not in text]
    assert not missing, f"{REPORT.name} has no row for {missing}: regenerate it (python3 -m farm.tools.conformance)"


def test_compare_checks_shape_dtype_nan_and_the_tolerance() -> None:
    from farm.tools.conformance import compare

    x = np.array([1.0, np.nan, np.inf, 100.0], np.float32)
    assert compare([x], [x.copy()]) == ""
    assert compare([x + np.float32(0.009)], [x]) == ""
    assert "max error" in compare([x + np.float32(0.02)], [x])
    assert "NaN" in compare([np.nan_to_num(x)], [x])
    assert "float64" in compare([x.astype(np.float64)], [x])
    assert "values differ" in compare([np.array([1, 2])], [np.array([1, 3])])
    assert "1 outputs, expected 2" in compare([x], [x, x])
