"""Tests of farm.frontend.passes.quantize_folding: QuantizeLinear and DequantizeLinear of constants fold, at every
opset, into the very bits farm's own kernels compute for the same node, and a QDQ Conv model of opset 17 (as
onnxruntime's quantize_static writes it) keeps no weight's DequantizeLinear."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numerics import build_and_load, graph_model, rand
from onnx import TensorProto, helper

from farm.frontend.onnx_import import import_model
from farm.frontend.passes import optimize
from farm.frontend.passes.constant_folding import fold_constants
from farm.ir.graph import Graph

F16 = np.float16


def ints(shape: tuple[int, ...], dtype: str, seed: int = 0, low: int | None = None, high: int | None = None):
    """Deterministic integers over `dtype`'s whole range (or [low, high])."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(info.min if low is None else low, (info.max if high is None else high) + 1, shape).astype(dtype)


def halfway(count: int, scale: float, seed: int = 0) -> np.ndarray:
    """float32 x whose quotients x / scale sit at half-way points k + 0.5 (or one float32 step from them), where
    rounding half to even, or a quotient one ulp off, decides the result."""
    k = np.random.default_rng(seed).integers(-150, 150, count)
    return ((k + 0.5) * np.float64(np.float32(scale))).astype(np.float32)


SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 3e38, 0.0, -0.0, 1e-45, 2.5, -2.5, 3.5, 1e5], np.float32)


@dataclass(frozen=True)
class FoldCase:
    """One Quantize- or DequantizeLinear node: its inputs x, scale and zero point (None: absent), attributes and
    opset."""

    id: str
    op: str
    x: np.ndarray
    scale: np.ndarray
    zero: np.ndarray | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    opset: int = 17

    def feeds(self) -> dict[str, np.ndarray]:
        present = {"x": self.x, "s": self.scale, "z": self.zero}
        return {name: np.asarray(value) for name, value in present.items() if value is not None}


def _dq(id: str, dtype: str, scale, zero=None, shape=(2, 3, 4, 5), **kwargs) -> FoldCase:
    return FoldCase(id, "DequantizeLinear", ints(shape, dtype), np.asarray(scale), zero, **kwargs)


def _q(id: str, x, scale, zero=None, **kwargs) -> FoldCase:
    return FoldCase(id, "QuantizeLinear", np.asarray(x), np.asarray(scale), zero, **kwargs)


X = rand(2, 3, 4, 5, scale=3.0)

CASES = [
    _dq("dequantize-int8-per-tensor-opset10", "int8", np.float32(0.02), np.int8(-3), opset=10),
    _dq("dequantize-uint8-no-zero-point", "uint8", np.float32(0.0173)),
    _dq(
        "dequantize-uint8-per-axis",
        "uint8",
        np.array([0.1, 0.02, 0.3], np.float32),
        np.array([0, 128, 255], np.uint8),
        attrs={"axis": 1},
        opset=13,
    ),
    _dq(
        "dequantize-int8-per-axis-negative",
        "int8",
        rand(4, positive=True, scale=0.01),
        ints((4,), "int8"),
        attrs={"axis": -2},
    ),
    _dq("dequantize-int16", "int16", np.float32(3e-4), np.int16(-1000), opset=21),
    _dq(
        "dequantize-uint16-per-axis",
        "uint16",
        rand(5, positive=True),
        ints((5,), "uint16"),
        attrs={"axis": 3},
        opset=21,
    ),
    _dq("dequantize-int32-past-2**24", "int32", np.float32(1e-3), np.int32(-123456), opset=13),
    _dq(
        "dequantize-blocked",
        "int8",
        rand(2, 3, 4, 3, positive=True),
        ints((2, 3, 4, 3), "int8"),
        attrs={"axis": 3, "block_size": 2},
        opset=21,
    ),
    _dq("dequantize-float16-scale", "uint8", np.float16(0.0123), np.uint8(7), opset=19),
    _dq(
        "dequantize-float16-overflow-and-subnormals",
        "int16",
        np.array([3e-9, 1e-4, 3.0], np.float32),
        attrs={"axis": 1, "output_dtype": TensorProto.FLOAT16},
        opset=23,
    ),
    _dq(
        "dequantize-output-float16",
        "int16",
        np.float32(0.0123),
        attrs={"output_dtype": TensorProto.FLOAT16},
        opset=23,
    ),
    _q("quantize-halfway-opset10", halfway(4096, 0.3), np.float32(0.3), np.uint8(128), opset=10),
    _q("quantize-saturation-and-nan", SPECIAL, np.float32(1.0), np.int8(3)),
    _q("quantize-no-zero-point", X, np.float32(0.01)),
    _q("quantize-zero-scale", SPECIAL, np.float32(0.0), np.uint8(3)),
    _q(
        "quantize-per-axis",
        X,
        np.array([0.01, 0.02, 0.05], np.float32),
        np.array([-3, 0, 9], np.int8),
        attrs={"axis": 1},
        opset=13,
    ),
    _q("quantize-int16", X, np.float32(1e-4), np.int16(-300), opset=21),
    _q("quantize-uint16", X * 4, np.float32(1e-4), np.uint16(30000), opset=21),
    _q(
        "quantize-blocked-output-dtype",
        X,
        rand(2, 3, 4, 3, positive=True, scale=0.02),
        attrs={"axis": -1, "block_size": 2, "output_dtype": TensorProto.UINT16},
        opset=21,
    ),
    _q("quantize-float16-x", X.astype(F16), np.float32(0.01), np.uint8(5), opset=19),
    _q("quantize-float16-division", halfway(4096, 0.3).astype(F16), np.float16(0.3), opset=19),
    _q(
        "quantize-int32-x",
        np.concatenate([ints((32,), "int32", low=-900, high=900), ints((32,), "int32", seed=1)]),
        np.float32(3.0),
        np.int8(1),
    ),
    _q(
        "quantize-precision-float16",
        halfway(4096, 0.3),
        np.float32(0.3),
        attrs={"precision": TensorProto.FLOAT16},
        opset=25,
    ),
    _q(
        "quantize-precision-float16-overflow",
        np.array([65519.0, 65520.0, -7e4, 1e-8, 3e-5], np.float32),
        np.float32(0.5),
        np.uint16(3),
        attrs={"precision": TensorProto.FLOAT16},
        opset=25,
    ),
    _q(
        "quantize-precision-float32",
        halfway(4096, 0.3).astype(F16),
        np.float16(0.3),
        np.uint8(100),
        attrs={"precision": TensorProto.FLOAT},
        opset=25,
    ),
]


def _one_node_model(c: FoldCase, as_constants: bool) -> onnx.ModelProto:
    """c's node with its inputs as graph inputs (the kernel runs it) or as initializers (it folds, writing a value
    that an Identity passes on to the graph output, since a node writing a graph output is never folded)."""
    feeds = c.feeds()
    node = helper.make_node(c.op, list(feeds), ["q" if as_constants else "y"], **dict(c.attrs))
    if as_constants:
        return graph_model([node, helper.make_node("Identity", ["q"], ["y"])], [], ["y"], feeds, c.opset)
    inputs = [(name, value.shape, value.dtype) for name, value in feeds.items()]
    return graph_model([node], inputs, ["y"], None, c.opset)


def _folded(c: FoldCase, tmp_path: Path) -> np.ndarray:
    path = tmp_path / "folded.onnx"
    onnx.save(_one_node_model(c, as_constants=True), path)
    graph = fold_constants(import_model(path))
    assert [node.op_type for node in graph.nodes] == ["Identity"], f"{c.op} did not fold"
    return graph.constants["q"]


def _computed_by_kernel(c: FoldCase, tmp_path: Path) -> np.ndarray:
    path = tmp_path / "kernel.onnx"
    onnx.save(_one_node_model(c, as_constants=False), path)
    _, model = build_and_load(path, tmp_path / "out")
    return model.run(c.feeds())["y"]


def assert_same_bits(actual: np.ndarray, expected: np.ndarray) -> None:
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
    unsigned = np.dtype(f"u{actual.dtype.itemsize}")
    np.testing.assert_array_equal(actual.view(unsigned), expected.view(unsigned))


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES])
def test_folds_to_the_kernels_bits(c: FoldCase, tmp_path: Path) -> None:
    assert_same_bits(_folded(c, tmp_path), _computed_by_kernel(c, tmp_path))


def test_a_node_the_kernel_refuses_stays(tmp_path: Path) -> None:
    """Per-axis scales at opset 10, which has no axis: the kernel's normalisation refuses the node, so folding
    leaves it for the planner to refuse naming it."""
    c = _dq("per-axis-opset10", "int8", np.array([0.1, 0.2, 0.3], np.float32), shape=(3,), opset=10)
    path = tmp_path / "model.onnx"
    model = _one_node_model(c, as_constants=True)
    onnx.save(model, path)
    assert [node.op_type for node in fold_constants(import_model(path)).nodes] == ["DequantizeLinear", "Identity"]


# ----------------------------------------------------------------------------------------------- a QDQ Conv

X_SCALE, OUT_SCALE = np.float32(0.02), np.float32(0.05)


def _per_channel_int8(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 values and one scale per output channel, as quantize_static's per_channel option makes."""
    scale = (np.abs(weights).reshape(len(weights), -1).max(axis=1) / 127).astype(np.float32)
    shape = (-1,) + (1,) * (weights.ndim - 1)
    return np.clip(np.rint(weights / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def qdq_conv_model() -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv (int8 weight, int32 bias, each through DequantizeLinear) -> BatchNormalization (its scale
    int8 through DequantizeLinear) -> Q -> DQ, at opset 17."""
    weight, weight_scale = _per_channel_int8(rand(8, 3, 3, 3, seed=1))
    gamma, gamma_scale = _per_channel_int8(rand(8, seed=5, positive=True))
    bias_scale = (X_SCALE * weight_scale).astype(np.float32)
    inits = {
        "x_s": X_SCALE,
        "x_z": np.uint8(128),
        "w": weight,
        "w_s": weight_scale,
        "w_z": np.zeros(8, np.int8),
        "b": np.rint(rand(8, seed=3) / bias_scale).astype(np.int32),
        "b_s": bias_scale,
        "b_z": np.zeros(8, np.int32),
        "g": gamma,
        "g_s": gamma_scale,
        "g_z": np.zeros(8, np.int8),
        "beta": rand(8, seed=6, scale=0.1),
        "mean": rand(8, seed=7, scale=0.1),
        "var": rand(8, seed=8, positive=True),
        "o_s": OUT_SCALE,
        "o_z": np.uint8(128),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["wd"], axis=0),
        helper.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["bd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("DequantizeLinear", ["g", "g_s", "g_z"], ["gd"], axis=0),
        helper.make_node("BatchNormalization", ["c", "gd", "beta", "mean", "var"], ["n"]),
        helper.make_node("QuantizeLinear", ["n", "o_s", "o_z"], ["nq"]),
        helper.make_node("DequantizeLinear", ["nq", "o_s", "o_z"], ["y"]),
    ]
    return graph_model(nodes, [("x", (1, 3, 10, 10))], ["y"], inits, opset=17)


def _optimized(model: onnx.ModelProto, tmp_path: Path) -> Graph:
    path = tmp_path / "qdq.onnx"
    onnx.save(model, path)
    return optimize(import_model(path))


def test_qdq_conv_keeps_no_weight_dequantize(tmp_path: Path) -> None:
    """The weight's, bias's and BatchNormalization scale's DequantizeLinear fold, the BatchNormalization then folds
    into the Conv, and only the activations' Q -> DQ pairs run."""
    graph = _optimized(qdq_conv_model(), tmp_path)
    ops = [node.op_type for node in graph.nodes]
    assert ops == ["QuantizeLinear", "DequantizeLinear", "Conv", "QuantizeLinear", "DequantizeLinear"]
    conv = graph.nodes[2]
    assert all(name in graph.constants for name in conv.inputs[1:])
    assert graph.constants[conv.inputs[1]].dtype == np.float32


def _onnxruntime_unfused(path: Path, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """onnxruntime's answer with its graph optimisations off: each DequantizeLinear, the float Conv and each
    QuantizeLinear run as written, not fused into its integer kernels (whose uint8 x int8 pair sums saturate on x86
    CPUs without VNNI), so the answer is the spec's on every CPU up to the float sums' order."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["y"], dict(feeds))[0]


def test_qdq_conv_builds_and_matches_onnxruntime(tmp_path: Path) -> None:
    """Within one quantization step of the output: the float Conv's sums (and the folded BatchNormalization)
    round differently from onnxruntime's, which can move a quotient across a half-way point."""
    path = tmp_path / "qdq.onnx"
    onnx.save(qdq_conv_model(), path)
    _, model = build_and_load(path, tmp_path / "out")
    feeds = {"x": rand(1, 3, 10, 10, seed=4)}
    difference = np.abs(model.run(feeds)["y"] - _onnxruntime_unfused(path, feeds))
    assert difference.max() <= OUT_SCALE * (1 + 1e-6)
