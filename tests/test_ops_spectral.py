"""farm.ops.spectral against ONNX's reference evaluator (numpy.fft underneath): DFT at opsets 17 and 20, forward
and inverse, onesided (rfft, and irfft for an inverse transform), dft_length padding and truncating, real and
complex input, axis as an attribute, a constant input or a graph input read at run time; long transforms against
numpy.fft; a sample on OpenCL; refusals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import (
    OpCase,
    assert_close,
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
from onnx import TensorProto, helper, save
from test_ops_tensor import onnx_reference

from farm.build.assembly import plan_model


def _dft(
    id: str, x_shape: Sequence[int], axis: int, opset: int = 20, length: int | None = None, **attrs: int
) -> OpCase:
    """A DFT of input x along `axis` (an attribute at opset 17, a constant input from 20)."""
    inits = {"n": np.array(length, np.int64)} if length is not None else {}
    node_inputs = ["x", "n" if length is not None else ""]
    if opset >= 20:
        inits["axis"] = np.array(axis, np.int64)
        node_inputs.append("axis")
    else:
        attrs["axis"] = axis
    model = single_op_model("DFT", [("x", x_shape)], attrs, inits, opset=opset, node_inputs=node_inputs)
    return case(f"dft-{id}", model, {"x": rand(*x_shape, seed=1)}, reference=onnx_reference(model))


CASES: list[OpCase] = [
    _dft("real-axis1", (2, 7, 5, 1), 1),
    _dft("complex-axis2", (2, 7, 5, 2), 2),
    _dft("complex-negative-axis", (3, 8, 2), -2),
    _dft("inverse-complex", (2, 6, 4, 2), 1, inverse=1),
    _dft("inverse-real", (2, 6, 1), 1, inverse=1),
    _dft("rfft-even", (2, 8, 3, 1), 1, onesided=1),
    _dft("rfft-odd", (2, 9, 1), -2, onesided=1),
    _dft("irfft-default-length", (2, 5, 3, 2), 1, inverse=1, onesided=1),
    _dft("irfft-odd-length", (2, 5, 2), 1, length=9, inverse=1, onesided=1),
    _dft("irfft-truncating", (1, 6, 2), 1, length=6, inverse=1, onesided=1),
    _dft("length-padding", (2, 5, 2), 1, length=8),
    _dft("length-truncating", (2, 7, 3, 1), 2, length=2),
    _dft("rfft-length", (2, 7, 1), 1, length=12, onesided=1),
    _dft("batch-axis0", (4, 3, 2), 0),
    _dft("opset17-default-axis", (2, 6, 1), 1, opset=17),
    _dft("opset17-inverse-axis2", (2, 3, 5, 2), 2, opset=17, inverse=1),
    _dft("opset17-rfft-negative-axis", (2, 6, 3, 1), -3, opset=17, onesided=1),
]


@pytest.mark.parametrize("c", params(CASES))
def test_matches_the_onnx_reference(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


def _run(model, tmp_path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    path = tmp_path / "m.onnx"
    save(model, str(path))
    _, farm_model = build_and_load(path, tmp_path / "out")
    return farm_model.run(feeds)["y"]


@pytest.mark.parametrize("length", [256, 300, 1000])
def test_long_transforms_match_numpy_fft(length: int, tmp_path) -> None:
    """The O(n^2) sum in float32 stays within the tolerance of numpy's float64 FFT on long signals."""
    x = rand(2, length, 2, seed=length)
    model = single_op_model("DFT", [("x", x.shape)], {"axis": 1}, opset=17)
    spectrum = np.fft.fft(x[..., 0] + 1j * x[..., 1], axis=1)
    assert_close(_run(model, tmp_path, {"x": x}), np.stack([spectrum.real, spectrum.imag], -1).astype(np.float32))


def test_an_axis_given_at_run_time_picks_its_branch(tmp_path) -> None:
    """Every axis whose transform has the declared shape runs as its value says; other values give NaN."""
    x = rand(2, 7, 5, 2, seed=3)
    model = single_op_model("DFT", [("x", x.shape), ("axis", (), "int64")], {}, opset=20, node_inputs=["x", "", "axis"])
    path = tmp_path / "m.onnx"
    save(model, str(path))
    _, farm_model = build_and_load(path, tmp_path / "out")
    reference = onnx_reference(model)
    for axis in (0, 1, 2, -2, -3, -4):
        feeds = {"x": x, "axis": np.array(axis, np.int64)}
        assert_close(farm_model.run(feeds)["y"], reference(feeds)["y"], f"axis {axis}")
    assert np.isnan(farm_model.run({"x": x, "axis": np.array(3, np.int64)})["y"]).all()


def _declared_runtime_axis_model(declared: list[int]):
    """A DFT whose axis is a graph input, its output declared with `declared` (shape inference can't give it)."""
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"], name="victim", onesided=1)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 4, 1]),
            helper.make_tensor_value_info("axis", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=8)


@pytest.mark.parametrize(
    "declared, message",
    [
        ([2, 4, 3, 2], "doesn't fit input 'x'"),
        ([2, 5, 4, 2], "no DFT axis of length >= 1 gives the output shape \\[2, 5, 4, 2\\]"),
    ],
    ids=["two-axes-changed", "no-axis-fits"],
)
def test_a_declared_shape_no_axis_gives_is_refused(declared: list[int], message: str, tmp_path) -> None:
    """With the axis known only at run time the output shape comes from the model's declaration, which some axis
    must give exactly (else the kernel would index past its input or output)."""
    assert_refused(_declared_runtime_axis_model(declared), message, tmp_path)


def test_a_declared_shape_some_axis_gives_is_built(tmp_path) -> None:
    model = _declared_runtime_axis_model([2, 4, 4, 2])
    x = rand(2, 6, 4, 1, seed=5)
    feeds = {"x": x, "axis": np.array(1, np.int64)}
    assert_close(_run(model, tmp_path, feeds), onnx_reference(model)(feeds)["y"])


OPENCL_SAMPLE = ["dft-complex-axis2", "dft-irfft-odd-length", "dft-rfft-odd"]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_the_onnx_reference(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


UNSUPPORTED = [
    pytest.param(
        single_op_model("DFT", [("x", (2, 6, 1)), ("n", (), "int64")], {}, opset=20, node_inputs=["x", "n"]),
        "must be a constant|dynamic shape",
        id="runtime-length",
    ),
]


@pytest.mark.parametrize("model, message", UNSUPPORTED)
def test_unsupported_variants_are_refused_clearly(model, message: str, tmp_path) -> None:
    assert_unsupported(model, message, tmp_path)


HOSTILE = [
    pytest.param(
        hostile_op_model("DFT", {"axis": 3}, x=(2, 6, 4, 1), opset=17),
        "out of range|inconsistent|unknown shape",
        id="axis-complex-dim",
    ),
    pytest.param(
        hostile_op_model("DFT", {"axis": 2**40}, x=(2, 6, 1), opset=17),
        "out of range|inconsistent|unknown shape",
        id="axis-huge",
    ),
    pytest.param(
        hostile_op_model("DFT", {}, x=(2, 6, 3), opset=17),
        "must end in an axis of 1|inconsistent|unknown shape",
        id="last-axis-3",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)


def test_a_zero_length_transform_is_an_empty_output_and_no_kernel(tmp_path) -> None:
    """dft_length 0 gives an empty output (shape inference says so): a node whose outputs are all empty folds
    without a kernel, so nothing reads or writes out of bounds."""

    path = tmp_path / "zero.onnx"
    onnx.save(hostile_op_model("DFT", {}, {"n": np.array(0, np.int64)}, x=(2, 6, 1), opset=17), path)
    plan = plan_model(path)
    assert plan.steps == [] and plan.graph.values["y"].shape == (2, 0, 2)
