"""farm.ops.normalization against onnxruntime: LRN, BatchNormalization, the normalisations (Layer, Instance, Group,
MeanVariance, Lp) over their attribute variants, and RMSNormalization over every axis with scales that broadcast to the
normalised shape; on CPU and (a sample) OpenCL; hostile attributes, scales that don't broadcast and other stash types
are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numerics import (
    IR_VERSION,
    OpCase,
    assert_close,
    assert_refused,
    case,
    check_case,
    check_case_on_opencl,
    graph_model,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)
from onnx import TensorProto, helper, numpy_helper

# ---------------------------------------------------------------------------------------------- LRN and BN


def lrn_reference(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    """The ONNX spec's LRN: channels max(0, c - floor((size-1)/2)) .. min(C-1, c + ceil((size-1)/2)); in float64.

    onnxruntime refuses even sizes (it asserts size % 2 == 1) although the spec defines them, so the even case is
    checked against this (itself checked against onnxruntime on odd sizes below)."""
    channels, before = x.shape[1], (size - 1) // 2
    after = size - 1 - before
    square = x.astype(np.float64) ** 2
    out = np.empty(x.shape, dtype=np.float64)
    for c in range(channels):
        window = square[:, max(0, c - before) : min(channels - 1, c + after) + 1].sum(axis=1)
        out[:, c] = x[:, c] / (bias + alpha / size * window) ** beta
    return out.astype(np.float32)


def _lrn_even_reference(feeds):
    return {"y": lrn_reference(feeds["x"], 4, alpha=0.1, beta=0.5)}


def _lrn_huge_reference(feeds):
    return {"y": lrn_reference(feeds["x"], 2**62, alpha=2.0**61, beta=0.75)}


LRN_CASES: list[OpCase] = [
    case("lrn-size3", single_op_model("LRN", [("x", (1, 8, 5, 5))], {"size": 3})),
    case(
        "lrn-size5",
        single_op_model("LRN", [("x", (2, 8, 5, 5))], {"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 2.0}),
    ),
    case(
        "lrn-size4-even",
        single_op_model("LRN", [("x", (1, 7, 4, 6))], {"size": 4, "alpha": 0.1, "beta": 0.5}),
        reference=_lrn_even_reference,
    ),
    case("lrn-size1", single_op_model("LRN", [("x", (1, 3, 4, 4))], {"size": 1, "alpha": 0.5, "bias": 1.5})),
    case(
        "lrn-size-larger-than-channels",
        single_op_model("LRN", [("x", (1, 3, 4, 4))], {"size": 7, "alpha": 0.3, "beta": 1.0}),
    ),
    # A hostile window of 2**62 channels (issue 13): the kernel loops over the channels it covers, not 2**62 times;
    # onnxruntime can't run it (it pads its buffer by the window), so the spec's formula is the reference.
    case(
        "lrn-size-2**62",
        single_op_model("LRN", [("x", (1, 5, 3, 3))], {"size": 2**62, "alpha": 2.0**61}),
        reference=_lrn_huge_reference,
    ),
    case(
        "lrn-alexnet",
        single_op_model("LRN", [("x", (1, 16, 6, 6))], {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}),
        {"x": rand(1, 16, 6, 6, scale=30.0)},
    ),
]


def _bn(id: str, x: tuple[int, ...], attrs: dict | None = None, opset: int = 17) -> OpCase:
    c = x[1]
    initializers = {
        "scale": rand(c, seed=1),
        "bias": rand(c, seed=2),
        "mean": rand(c, seed=3),
        "var": rand(c, seed=4, positive=True),
    }
    return case(f"batchnorm-{id}", single_op_model("BatchNormalization", [("x", x)], attrs or {}, initializers, opset))


BN_CASES: list[OpCase] = [
    _bn("4d", (2, 8, 5, 6)),
    _bn("3d", (2, 6, 9)),
    _bn("2d", (4, 5)),
    _bn("epsilon", (1, 3, 4, 4), {"epsilon": 0.1}),
    _bn("opset9", (1, 3, 4, 4), opset=9),
    _bn("opset14", (1, 3, 4, 4), opset=14),
    _bn("5d", (1, 2, 3, 4, 5)),
]


# --------------------------------------------------------------------------------------------- normalisations


def _layernorm(
    id: str,
    x: tuple[int, ...],
    axis: int | None = None,
    scale: tuple[int, ...] | None = None,
    bias: bool = True,
    attrs: dict | None = None,
    graph_params: bool = False,
) -> OpCase:
    """LayerNormalization with scale (and bias) of shape `scale` (default: the normalised shape) as initializers,
    or as graph inputs with graph_params."""
    attrs = {**(attrs or {}), **({} if axis is None else {"axis": axis})}
    param_shape = scale or x[(axis if axis is not None else -1) :]
    params = {"scale": rand(*param_shape, seed=1), **({"bias": rand(*param_shape, seed=2)} if bias else {})}
    if graph_params:
        model = single_op_model("LayerNormalization", [("x", x), *[(n, a.shape) for n, a in params.items()]], attrs)
        feeds = {"x": rand(*x, scale=2.0) + 1.0, **params}
    else:
        model = single_op_model("LayerNormalization", [("x", x)], attrs, params)
        feeds = {"x": rand(*x, scale=2.0) + 1.0}
    return case(f"layernorm-{id}", model, feeds)


def _layernorm_statistics(outputs: list[str], axis: int) -> OpCase:
    """LayerNormalization with its optional Mean and InvStdDev outputs ("" for one left out) as graph outputs."""
    x = (2, 3, 4, 5)
    params = {"scale": rand(*x[axis:], seed=1), "bias": rand(*x[axis:], seed=2)}
    node = helper.make_node("LayerNormalization", ["x", *params], outputs, axis=axis)
    present = [name for name in outputs if name]
    return case(f"layernorm-statistics-{'-'.join(present[1:])}", graph_model([node], [("x", x)], present, params))


def _same_shape_model(
    op: str, inputs: list[tuple[str, tuple[int, ...]]], attrs: dict, initializers: dict, opset: int
) -> onnx.ModelProto:
    """One `op` node whose output y is declared with x's shape: ONNX shape inference leaves GroupNormalization's
    output untyped. (The checker refuses GroupNormalization-18, deprecated since opset 21 though models use it.)"""
    node = helper.make_node(op, [n for n, _ in inputs] + list(initializers), ["y"], name=f"{op.lower()}_0", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n, shape in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(inputs[0][1]))],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    if (op, opset) != ("GroupNormalization", 18):
        onnx.checker.check_model(model)
    return model


def _norm(
    op: str,
    id: str,
    x: tuple[int, ...],
    attrs: dict | None = None,
    params: dict | None = None,
    opset: int = 17,
    graph_params: bool = False,
) -> OpCase:
    params = params or {}
    inputs = [("x", x)] + ([(n, a.shape) for n, a in params.items()] if graph_params else [])
    model = _same_shape_model(op, inputs, attrs or {}, {} if graph_params else params, opset)
    return case(f"{op.lower()}-{id}", model, {"x": rand(*x, scale=2.0) + 0.5, **(params if graph_params else {})})


def _channel_params(c: int) -> dict:
    return {"scale": rand(c, seed=1), "bias": rand(c, seed=2)}


NORM_CASES: list[OpCase] = [
    _layernorm("last-axis", (2, 5, 16)),
    _layernorm("axis1", (2, 3, 4, 5), axis=1),
    _layernorm("axis0", (3, 4), axis=0),
    _layernorm("negative-axis", (2, 3, 4, 5), axis=-2),
    _layernorm("no-bias", (4, 32), bias=False),
    _layernorm("epsilon", (4, 8), attrs={"epsilon": 0.5}),
    _layernorm("scale-broadcast", (2, 3, 4, 5), axis=2, scale=(5,)),
    _layernorm("scale-leading-ones", (2, 6, 8), scale=(1, 1, 8)),
    _layernorm("graph-input-params", (2, 3, 10), graph_params=True),
    _layernorm("transformer-row", (1, 16, 768)),
    _layernorm_statistics(["y", "mean", "inv_std"], 1),
    _layernorm_statistics(["y", "mean"], -1),
    _layernorm_statistics(["y", "", "inv_std"], 2),
    _norm("InstanceNormalization", "4d", (2, 3, 5, 6), params=_channel_params(3)),
    _norm("InstanceNormalization", "3d-epsilon", (2, 4, 7), {"epsilon": 0.01}, _channel_params(4)),
    _norm("InstanceNormalization", "graph-input-params", (1, 3, 4, 4), params=_channel_params(3), graph_params=True),
    _norm("InstanceNormalization", "opset9", (1, 2, 3, 3), params=_channel_params(2), opset=9),
    _norm("GroupNormalization", "opset21-per-channel", (2, 6, 4, 5), {"num_groups": 3}, _channel_params(6), opset=21),
    _norm(
        "GroupNormalization",
        "opset21-one-group",
        (2, 4, 3, 3),
        {"num_groups": 1, "epsilon": 0.01},
        _channel_params(4),
        opset=21,
    ),
    _norm("GroupNormalization", "opset21-channel-groups", (1, 4, 6), {"num_groups": 4}, _channel_params(4), opset=21),
    _norm("GroupNormalization", "opset18-per-group", (2, 6, 4, 5), {"num_groups": 3}, _channel_params(3), opset=18),
    _norm("MeanVarianceNormalization", "default-axes", (2, 3, 4, 5)),
    _norm("MeanVarianceNormalization", "axes-2-3", (2, 3, 4, 5), {"axes": [2, 3]}),
    _norm("MeanVarianceNormalization", "axes-1", (2, 3, 4, 5), {"axes": [1]}),
    _norm("MeanVarianceNormalization", "opset9", (2, 3, 4, 5), opset=9),
    _norm("LpNormalization", "default", (3, 4, 5)),
    _norm("LpNormalization", "p1-axis1", (3, 4, 5), {"p": 1, "axis": 1}),
    _norm("LpNormalization", "p2-axis0", (3, 4), {"p": 2, "axis": 0}),
    _norm("LpNormalization", "p1-negative-axis", (2, 3, 4), {"p": 1, "axis": -3}),
    case(
        "lpnormalization-zero-row",
        single_op_model("LpNormalization", [("x", (3, 4))]),
        {"x": np.array([[0, 0, 0, 0], [1, 2, 3, 4], [0, -1, 0, 0]], np.float32)},
    ),
]

# -------------------------------------------------------------------------------------------- RMSNormalization

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


RMS_CASES: list[OpCase] = [
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

CASES: list[OpCase] = LRN_CASES + BN_CASES + NORM_CASES + RMS_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


@pytest.mark.parametrize("size", [1, 3, 5, 7])
def test_lrn_reference_matches_onnxruntime_on_odd_sizes(size: int) -> None:
    """lrn_reference (used for the even size onnxruntime refuses) agrees with onnxruntime where it runs.

    (onnx.reference's LRN can't serve as the reference: onnx 1.23's op_lrn loops over the batch axis, not the
    channels, so only the first N channels get their square sums.)"""
    model = single_op_model("LRN", [("x", (2, 7, 3, 4))], {"size": size, "alpha": 0.2, "beta": 0.6, "bias": 1.5})
    x = rand(2, 7, 3, 4, seed=size)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_close(lrn_reference(x, size, alpha=0.2, beta=0.6, bias=1.5), session.run(None, {"x": x})[0])


def test_lrn_reference_even_window() -> None:
    """For size 4 the window of channel c is c-1 .. c+2 (floor((size-1)/2) before, ceil((size-1)/2) after)."""
    x = np.ones((1, 7, 1, 1), dtype=np.float32)
    counts = np.array([3, 4, 4, 4, 4, 3, 2], dtype=np.float64)
    expected = (1.0 / (1.0 + 0.1 / 4 * counts) ** 0.5).astype(np.float32).reshape(1, 7, 1, 1)
    assert_close(lrn_reference(x, 4, alpha=0.1, beta=0.5), expected)


OPENCL_SAMPLE = [
    "layernorm-scale-broadcast",
    "layernorm-statistics-mean-inv_std",
    "instancenormalization-4d",
    "groupnormalization-opset21-per-channel",
    "meanvariancenormalization-axes-1",
    "lpnormalization-p1-axis1",
    "rmsnorm-default-axis",
    "rmsnorm-axis1",
    "rmsnorm-scale-broadcast-first",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


_F = np.float32
HOSTILE = [
    pytest.param(
        hostile_op_model("LayerNormalization", {"axis": 2**40}, {"scale": np.ones(4, np.float32)}),
        "axis 1099511627776 is out of range",
        id="layernorm-axis",
    ),
    pytest.param(
        hostile_op_model("LpNormalization", {"axis": 2**40}), "axis 1099511627776 is out of range", id="lpnorm-axis"
    ),
    pytest.param(
        hostile_op_model("RMSNormalization", {}, {"scale": np.ones(3, _F)}, opset=OPSET),
        r"scale of shape \[3\] doesn't broadcast to \[4\]",
        id="rmsnorm-scale-mismatch",
    ),
    pytest.param(
        hostile_op_model("RMSNormalization", {"axis": 2}, {"scale": np.ones((2, 4, 4), _F)}, opset=OPSET),
        "doesn't broadcast",
        id="rmsnorm-scale-too-long",
    ),
    pytest.param(
        hostile_op_model("RMSNormalization", {"axis": 2**40}, {"scale": np.ones(4, _F)}, opset=OPSET),
        "axis 1099511627776 is out of range",
        id="rmsnorm-axis",
    ),
    pytest.param(
        hostile_op_model("RMSNormalization", {"stash_type": 11}, {"scale": np.ones(4, _F)}, opset=OPSET),
        "stash_type 11 is not supported",
        id="rmsnorm-stash-type",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
