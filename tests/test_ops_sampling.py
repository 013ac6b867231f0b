"""farm.ops.sampling against ONNX's reference evaluator (onnxruntime at opset 16): GridSample in every mode (nearest, linear, cubic), padding
mode (zeros, border, reflection) and align_corners, 4-D, 5-D and 3-D, opset 16's mode names, grids reaching past the
input and grids of exact ties (nearest rounds half to even). onnxruntime is not the reference: its cubic border
padding differs from ONNX's reference (by 0.06 on random data) and it has no 5-D cubic. A sample on OpenCL;
refusals."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from numerics import (
    OpCase,
    assert_refused,
    assert_unsupported,
    build_and_load,
    case,
    check_case,
    check_case_on_opencl,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)
from onnx import save
from test_ops_tensor import onnx_reference

OPSET = 20
TIES = np.array([-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, -1.5, 2.0], np.float32)


def grid(shape: Sequence[int], seed: int = 0, reach: float = 1.6) -> np.ndarray:
    """Grid points uniform in [-reach, reach] (past the input for reach > 1), every third one an exact tie."""
    rng = np.random.default_rng(seed)
    points = rng.uniform(-reach, reach, shape).astype(np.float32)
    flat = points.reshape(-1)
    flat[::3] = rng.choice(TIES, flat[::3].size)
    return points


def _model(x_shape: Sequence[int], grid_shape: Sequence[int], attrs: dict, opset: int = OPSET):
    return single_op_model("GridSample", [("x", x_shape), ("grid", grid_shape)], attrs, opset=opset)


def _grid_sample(
    id: str,
    x_shape: Sequence[int],
    grid_shape: Sequence[int],
    attrs: dict,
    opset: int = OPSET,
    points: np.ndarray | None = None,
    reference_attrs: dict | None = None,
) -> OpCase:
    """A case against ONNX's reference (run with `reference_attrs` instead where given), or against onnxruntime
    at opset 16, whose mode names the reference doesn't know."""
    model = _model(x_shape, grid_shape, attrs, opset)
    feeds = {"x": rand(*x_shape, seed=1), "grid": grid(grid_shape) if points is None else points}
    reference = _model(x_shape, grid_shape, reference_attrs, opset) if reference_attrs else model
    return case(f"gridsample-{id}", model, feeds, reference=None if opset < 20 else onnx_reference(reference))


X4, GRID4 = (2, 3, 4, 5), (2, 3, 6, 2)
X5, GRID5 = (1, 2, 3, 4, 5), (1, 2, 3, 4, 3)

CASES: list[OpCase] = [
    *[
        _grid_sample(
            f"{mode}-{padding}-ac{align}", X4, GRID4, {"mode": mode, "padding_mode": padding, "align_corners": align}
        )
        for mode, padding, align in itertools.product(
            ("nearest", "linear", "cubic"), ("zeros", "border", "reflection"), (0, 1)
        )
    ],
    *[
        _grid_sample(f"5d-{mode}-{padding}", X5, GRID5, {"mode": mode, "padding_mode": padding, "align_corners": 1})
        for mode, padding in (("linear", "zeros"), ("nearest", "reflection"), ("cubic", "border"))
    ],
    *[
        _grid_sample(f"3d-{mode}-{padding}", (2, 3, 7), (2, 5, 1), {"mode": mode, "padding_mode": padding})
        for mode, padding in (("linear", "reflection"), ("nearest", "zeros"), ("cubic", "border"))
    ],
    _grid_sample("defaults", X4, GRID4, {}),
    _grid_sample("opset16-bilinear", X4, GRID4, {"mode": "bilinear", "padding_mode": "border"}, opset=16),
    _grid_sample("opset16-bicubic", X4, GRID4, {"mode": "bicubic", "padding_mode": "reflection"}, opset=16),
    _grid_sample("opset22-nearest", X4, GRID4, {"mode": "nearest"}, opset=22),
    # A one-pixel axis under align_corners reflects about a zero-width range (ONNX's reference divides by zero):
    # every tap maps to the one pixel, as under border padding (which gives the same along the other axis, where
    # the points stay inside).
    _grid_sample(
        "one-pixel-axis-reflection-ac1",
        (1, 2, 1, 4),
        (1, 3, 5, 2),
        {"mode": "linear", "padding_mode": "reflection", "align_corners": 1},
        points=np.random.default_rng(7).uniform(-1, 1, (1, 3, 5, 2)).astype(np.float32),
        reference_attrs={"mode": "linear", "padding_mode": "border", "align_corners": 1},
    ),
    _grid_sample("far-outside-zeros", X4, GRID4, {"mode": "cubic"}, points=grid(GRID4, seed=5, reach=1e30)),
    _grid_sample(
        "far-outside-border",
        X4,
        GRID4,
        {"mode": "linear", "padding_mode": "border"},
        points=grid(GRID4, seed=6, reach=1e30),
    ),
]


@pytest.mark.parametrize("c", params(CASES))
def test_matches_the_onnx_reference(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


def test_nan_grid_points_read_inside_the_input(tmp_path) -> None:
    """A NaN point becomes an index only through a guard (ONNX's reference raises on one): the kernel runs and the
    points that are numbers still match."""
    model = _model(X4, GRID4, {"mode": "nearest", "padding_mode": "border"})
    points = grid(GRID4)
    points[0, 0, 0] = np.nan
    reference = onnx_reference(model)({"x": rand(*X4, seed=1), "grid": np.nan_to_num(points)})["y"]
    save(model, str(tmp_path / "m.onnx"))
    _, farm_model = build_and_load(tmp_path / "m.onnx", tmp_path / "out")
    got = farm_model.run({"x": rand(*X4, seed=1), "grid": points})["y"]
    np.testing.assert_array_equal(got[:, :, 1:], reference[:, :, 1:])


OPENCL_SAMPLE = ["gridsample-cubic-reflection-ac0", "gridsample-nearest-zeros-ac1", "gridsample-5d-linear-zeros"]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_the_onnx_reference(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


UNSUPPORTED = [
    pytest.param(
        single_op_model("GridSample", [("x", X5), ("grid", GRID5)], {"mode": "bilinear"}, opset=16),
        "rank-5 input is not supported at opset 16",
        id="opset16-5d",
    ),
    pytest.param(
        single_op_model("GridSample", [("x", X4), ("grid", GRID4)], {"mode": "bilinear"}, opset=20),
        "mode 'bilinear' is not supported at opset 20",
        id="opset20-old-mode-name",
    ),
    pytest.param(
        _model((1, 1, 2, 2, 2, 2, 2), (1, 1, 1, 1, 1, 2, 5), {"mode": "cubic"}),
        "cubic sampling in 5 spatial dimensions reads more than 256 taps",
        id="7d-cubic",
    ),
]


@pytest.mark.parametrize("model, message", UNSUPPORTED)
def test_unsupported_variants_are_refused_clearly(model, message: str, tmp_path) -> None:
    assert_unsupported(model, message, tmp_path)


HOSTILE = [
    pytest.param(
        hostile_op_model(
            "GridSample",
            {"padding_mode": "wrap"},
            {"g": np.zeros((1, 3, 3, 2), np.float32)},
            x=(1, 2, 4, 4),
            opset=OPSET,
        ),
        "padding_mode 'wrap' is not supported|inconsistent",
        id="padding-mode",
    ),
    pytest.param(
        hostile_op_model("GridSample", {}, {"g": np.zeros((1, 3, 3, 3), np.float32)}, x=(1, 2, 4, 4), opset=OPSET),
        "does not fit|inconsistent|unknown shape",
        id="grid-components",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
