"""farm.ops.linalg against onnxruntime: Det of single and batched matrices, ones that need row swaps, singular
ones (a zero pivot), on CPU and (a sample) OpenCL; non-square inputs are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numerics import (
    OpCase,
    assert_refused,
    case,
    check_case,
    check_case_on_opencl,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)


def _det(id: str, x: np.ndarray) -> OpCase:
    return case(f"det-{id}", single_op_model("Det", [("x", x.shape)]), {"x": np.asarray(x, np.float32)})


def _permutation(order: list[int]) -> np.ndarray:
    return np.eye(len(order), dtype=np.float32)[order]


SINGULAR = np.array([[1, 2, 3], [2, 4, 6], [0, 1, 5]], np.float32)
ZERO_COLUMN = np.array([[0, 2, 3], [0, 4, 1], [0, 1, 5]], np.float32)
NEEDS_PIVOT = np.array([[0, 1, 2], [3, 0, 1], [1, 5, 0]], np.float32)

CASES: list[OpCase] = [
    _det("2x2", rand(2, 2)),
    _det("3x3", rand(3, 3, seed=1)),
    _det("1x1", rand(1, 1, seed=2)),
    _det("8x8", rand(8, 8, seed=3)),
    _det("16x16-diagonal-heavy", rand(16, 16, seed=4) + 4 * np.eye(16, dtype=np.float32)),
    _det("batched", rand(2, 3, 4, 4, seed=5)),
    _det("batch-of-one", rand(1, 5, 5, seed=6)),
    _det("needs-pivot", NEEDS_PIVOT),
    _det("permutation-odd", _permutation([1, 0, 2, 3])),
    _det("permutation-even", _permutation([2, 0, 1, 4, 3][::-1])),
    _det("singular", SINGULAR),
    _det("zero-column", ZERO_COLUMN),
    _det("mixed-batch", np.stack([SINGULAR, NEEDS_PIVOT, ZERO_COLUMN, np.eye(3, dtype=np.float32)])),
]


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


OPENCL_SAMPLE = ["det-batched", "det-mixed-batch", "det-8x8"]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


HOSTILE = [
    pytest.param(hostile_op_model("Det", x=(2, 3, 4)), "square matrices|shape", id="det-not-square"),
    pytest.param(hostile_op_model("Det", x=(4,)), "square matrices|shape", id="det-vector"),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
