"""ONNX's own conformance cases (onnx.backend.test.case.node.collect_testcases) run through farm.

A case is in scope when every op of its model is one farm supports (Constant included: the frontend folds it).
Each in-scope case is built with farm's local build, run by farm's runtime on each of its data sets, and
compared with the expected outputs: same shape and dtype, NaN where they have NaN, integers and bools exact,
floats within max|farm - expected| <= 1e-4 * max(1, max|expected|) (the spine's tolerance). Its outcome is
"pass", "unsupported" (farm refused it with an UnsupportedError, which names the node and what is missing) or
"fail" (any other error, or different numbers: never acceptable).

`python3 -m farm.tools.conformance [--device cpu|opencl] [--markdown FILE]` runs them all and prints the pass count per
op; docs/conformance.md is its output.
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
import onnx

from farm.backends.registry import BACKENDS
from farm.errors import UnsupportedError
from farm.ops import SUPPORTED_OPS

if TYPE_CHECKING:
    from onnx.backend.test.case.test_case import TestCase

RELATIVE_TOLERANCE = 1e-4
FRONTEND_OPS = frozenset({"Constant"})


@dataclass(frozen=True)
class Outcome:
    """How one case went: "pass", "unsupported" or "fail", with the reason when it didn't pass."""

    case: str
    ops: tuple[str, ...]
    result: str
    reason: str = ""


def model_ops(model: onnx.ModelProto) -> tuple[str, ...]:
    """The op types of the model's main graph (a case with a subgraph op is out of scope anyway)."""
    return tuple(
        sorted(
            {node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx")}
            | {f"{node.domain}.{node.op_type}" for node in model.graph.node if node.domain not in ("", "ai.onnx")}
        )
    )


def in_scope(model: onnx.ModelProto) -> bool:
    return all(op in SUPPORTED_OPS or op in FRONTEND_OPS for op in model_ops(model))


def _case_model(case: TestCase) -> onnx.ModelProto:
    """A node case's model (only the model zoo's cases, which collect_testcases doesn't give, lack one)."""
    assert case.model is not None, f"node case {case.name} has a model"
    return case.model


def conformance_cases() -> list[Any]:
    """ONNX's node conformance cases whose ops farm supports, in name order."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # generating some cases overflows casts on purpose
        cases = collect_testcases()
    return sorted((case for case in cases if in_scope(_case_model(case))), key=lambda case: case.name)


def run_case(case: Any, device: str = "cpu") -> Outcome:
    """Build and run one case on `device` and compare every data set with its expected outputs."""
    from farm.tools.onnx_backend import FarmBackend

    ops = model_ops(case.model)
    try:
        prepared = FarmBackend.prepare(case.model, device.upper())
        for index, (inputs, expected) in enumerate(case.data_sets):
            mismatch = compare(prepared.run(_arrays(inputs)), _arrays(expected))
            if mismatch:
                return Outcome(case.name, ops, "fail", f"data set {index}: {mismatch}")
    except UnsupportedError as error:
        return Outcome(case.name, ops, "unsupported", str(error))
    except Exception as error:  # noqa: BLE001 - any other error is a failure, recorded with its message
        return Outcome(case.name, ops, "fail", f"{type(error).__name__}: {error}")
    return Outcome(case.name, ops, "pass")


def _arrays(values: Sequence[Any]) -> list[Any]:
    """A data set's values as numpy arrays: some cases (casts with special values) give TensorProtos."""
    return [onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v for v in values]


def compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> str:
    """ "" when every output matches, else what differs first."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for index, (got, want) in enumerate(zip(actual, expected)):
        problem = _difference(np.asarray(got), np.asarray(want))
        if problem:
            return f"output {index}: {problem}"
    return ""


def _difference(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if want.dtype == ml_dtypes.bfloat16:  # a float that numpy doesn't count as one (its kind is "V")
        got, want = got.astype(np.float32), want.astype(np.float32)
    if want.dtype.kind != "f":
        return "" if np.array_equal(got, want) else f"values differ at {int(np.argmax(got != want))} (flat)"
    nan = np.isnan(want)
    if not np.array_equal(np.isnan(got), nan):
        return "NaN where the expected output has none, or the other way round"
    finite = ~nan & np.isfinite(want)
    if not np.array_equal(got[~nan & ~finite], want[~nan & ~finite]):
        return "infinities differ"
    if not finite.any():
        return ""
    error = np.abs(got[finite].astype(np.float64) - want[finite]).max()
    scale = max(1.0, float(np.abs(want[finite]).max()))
    return (
        "" if error <= RELATIVE_TOLERANCE * scale else f"max error {error:.3g} > {RELATIVE_TOLERANCE:g} x {scale:.3g}"
    )


def run_all(device: str = "cpu") -> Iterator[Outcome]:
    for case in conformance_cases():
        yield run_case(case, device)


def per_op(outcomes: Sequence[Outcome]) -> dict[str, collections.Counter]:
    """For each supported op, how many of the cases that use it ended in each result."""
    counts: dict[str, collections.Counter] = {op: collections.Counter() for op in SUPPORTED_OPS}
    for outcome in outcomes:
        for op in outcome.ops:
            if op in counts:
                counts[op][outcome.result] += 1
    return counts


def markdown(outcomes: Sequence[Outcome], device: str, path: str = "docs/conformance.md") -> str:
    """The report docs/conformance.md holds (written to `path`): totals, a row per supported op, every case that
    didn't pass."""
    totals = collections.Counter(outcome.result for outcome in outcomes)
    lines = [
        f"# ONNX conformance cases on farm ({device})",
        "",
        f"Generated by `python3 -m farm.tools.conformance --device {device} --markdown {path}` with "
        f"onnx {onnx.__version__}. In scope: the {len(outcomes)} cases of "
        "`onnx.backend.test.case.node.collect_testcases()` whose ops farm all supports. "
        f"Passed {totals['pass']}, refused with a clear UnsupportedError {totals['unsupported']}, "
        f"failed {totals['fail']}.",
        "",
        "| op | cases | passed | unsupported | failed |",
        "|---|---:|---:|---:|---:|",
    ]
    for op, counts in per_op(outcomes).items():
        lines.append(
            f"| {op} | {sum(counts.values())} | {counts['pass']} | {counts['unsupported']} | {counts['fail']} |"
        )
    lines += ["", "## Cases that did not pass", "", "| case | result | reason |", "|---|---|---|"]
    for outcome in outcomes:
        if outcome.result != "pass":
            reason = outcome.reason.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {outcome.case} | {outcome.result} | {reason} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run ONNX's conformance cases for farm's supported ops.")
    parser.add_argument("--device", choices=list(BACKENDS), default="cpu")
    parser.add_argument("--markdown", help="write the report to this file")
    args = parser.parse_args(argv)
    outcomes = []
    for outcome in run_all(args.device):
        outcomes.append(outcome)
        print(f"{outcome.result:12s} {outcome.case} {outcome.reason[:160]}", flush=True)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as report:
            report.write(markdown(outcomes, args.device, args.markdown))
    return 1 if any(outcome.result == "fail" for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
