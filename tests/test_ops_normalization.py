"""farm.ops.normalization against onnxruntime: RMSNormalization over every axis, with scales that broadcast to the
normalised shape, on CPU and (a sample) OpenCL; scales that don't broadcast and other stash types are refused."""

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

OPSET = 23
X = (2, 3, 4, 5)


def _rms(id: str, shape=X, scale_shape=None, attrs=None, scale_input: bool = False, data_scale: float = 1.0) -> OpCase:
    """RMSNormalization of x; the scale is an initializer (or a graph input) of `scale_shape` (default: the
    normalised shape)."""
    attrs = dict(attrs or {})
    axis = attrs.get("axis", -1) % len(shape)
    scale_shape = tuple(shape[axis:]) if scale_shape is None else scale_shape
    scale = rand(*scale_shape, seed=1)
    x = rand(*shape, scale=data_scale)
    if scale_input:
        model = single_op_model("RMSNormalization", [("x", shape), ("scale", scale_shape)], attrs, opset=OPSET)
        return case(f"rmsnorm-{id}", model, {"x": x, "scale": scale})
    model = single_op_model("RMSNormalization", [("x", shape)], attrs, {"scale": scale}, opset=OPSET)
    return case(f"rmsnorm-{id}", model, {"x": x})


CASES: list[OpCase] = [
    _rms("default-axis"),
    *[_rms(f"axis{axis}", attrs={"axis": axis}) for axis in (0, 1, 2, -2, -3)],
    _rms("epsilon", attrs={"epsilon": 0.5}),
    _rms("scale-input", attrs={"axis": 2}, scale_input=True),
    _rms("scale-broadcast-last", attrs={"axis": 2}, scale_shape=(1, 5)),
    _rms("scale-broadcast-first", attrs={"axis": 1}, scale_shape=(3, 1, 1)),
    _rms("scale-one-element", attrs={"axis": 1}, scale_shape=(1,)),
    _rms("scale-leading-ones", scale_shape=(1, 1, 5)),
    _rms("2d", shape=(6, 32)),
    _rms("large-values", shape=(4, 16), data_scale=1e15),
    _rms("tiny-values", shape=(4, 16), data_scale=1e-6),
]


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


OPENCL_SAMPLE = ["rmsnorm-default-axis", "rmsnorm-axis1", "rmsnorm-scale-broadcast-first"]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


_F = np.float32
HOSTILE = [
    pytest.param(hostile_op_model("RMSNormalization", {}, {"scale": np.ones(3, _F)}, opset=OPSET),
                 r"scale of shape \[3\] doesn't broadcast to \[4\]", id="rmsnorm-scale-mismatch"),
    pytest.param(hostile_op_model("RMSNormalization", {"axis": 2}, {"scale": np.ones((2, 4, 4), _F)}, opset=OPSET),
                 "doesn't broadcast", id="rmsnorm-scale-too-long"),
    pytest.param(hostile_op_model("RMSNormalization", {"axis": 2**40}, {"scale": np.ones(4, _F)}, opset=OPSET),
                 "axis 1099511627776 is out of range", id="rmsnorm-axis"),
    pytest.param(hostile_op_model("RMSNormalization", {"stash_type": 11}, {"scale": np.ones(4, _F)}, opset=OPSET),
                 "stash_type 11 is not supported", id="rmsnorm-stash-type"),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
