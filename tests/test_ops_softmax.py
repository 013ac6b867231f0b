"""farm.ops.softmax against onnxruntime: Softmax, LogSoftmax and Hardmax over axes and opsets; a sample also on
OpenCL; hostile axes refused."""

from __future__ import annotations

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


def _softmax(x: tuple[int, ...], axis: int | None, opset: int) -> OpCase:
    attrs = {} if axis is None else {"axis": axis}
    name = f"softmax-{len(x)}d-axis{'default' if axis is None else axis}-opset{opset}"
    return case(name, single_op_model("Softmax", [("x", x)], attrs, opset=opset), {"x": rand(*x, scale=3.0)})


SOFTMAX_SHAPES = [(4, 7), (2, 3, 7), (2, 3, 4, 5)]
SOFTMAX_CASES: list[OpCase] = [
    _softmax(shape, axis, opset)
    for opset in (11, 13)
    for shape in SOFTMAX_SHAPES
    for axis in sorted({0, 1, len(shape) - 1, -1}) + [None]
] + [
    _softmax((2, 3, 4, 5), -2, 11),
    _softmax((2, 3, 4, 5), -2, 13),
    _softmax((2, 3, 4, 5), 2, 9),
    _softmax((3, 1000), None, 17),
    case("softmax-large-logits", single_op_model("Softmax", [("x", (2, 50))]), {"x": rand(2, 50, scale=80.0)}),
]


def _softmax_family(op: str, x: tuple[int, ...], axis: int | None, opset: int, scale: float = 3.0) -> OpCase:
    attrs = {} if axis is None else {"axis": axis}
    name = f"{op.lower()}-{len(x)}d-axis{'default' if axis is None else axis}-opset{opset}"
    return case(name, single_op_model(op, [("x", x)], attrs, opset=opset), {"x": rand(*x, scale=scale)})


SOFTMAX_FAMILY_CASES: list[OpCase] = [
    _softmax_family(op, shape, axis, opset)
    for op in ("LogSoftmax", "Hardmax")
    for opset in (11, 13)
    for shape in SOFTMAX_SHAPES
    for axis in sorted({0, 1, len(shape) - 1, -1}) + [None]
] + [
    _softmax_family("LogSoftmax", (2, 3, 4, 5), -2, 9),
    _softmax_family("Hardmax", (2, 3, 4, 5), 2, 9),
    _softmax_family("LogSoftmax", (3, 1000), None, 17),
    _softmax_family("Softmax", (8, 16, 32), 1, 17),
    case("logsoftmax-large-logits", single_op_model("LogSoftmax", [("x", (2, 50))]), {"x": rand(2, 50, scale=80.0)}),
    case(
        "hardmax-ties-first",
        single_op_model("Hardmax", [("x", (3, 4))]),
        {"x": np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, -1, -3]], np.float32)},
    ),
]

CASES: list[OpCase] = SOFTMAX_CASES + SOFTMAX_FAMILY_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


# ------------------------------------------------------------------------------------------------- OpenCL

# The softmax family, rendered as OpenCL C and run on this host's device.
OPENCL_SAMPLE = [
    "softmax-3d-axis1-opset17",
    "logsoftmax-3d-axis1-opset13",
    "hardmax-4d-axis2-opset9",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


# Hostile attributes (issue 13): each is refused with one line naming the node, before anything is built.
HOSTILE = [
    pytest.param(
        hostile_op_model("Softmax", {"axis": 2**40}), "axis 1099511627776 is out of range for rank 4", id="softmax-axis"
    ),
    pytest.param(hostile_op_model("Hardmax", {"axis": 2**40}), "axis 1099511627776 is out of range", id="hardmax-axis"),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
