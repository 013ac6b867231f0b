"""farm.ops.quantized_add: QLinearAdd, which the graph pass farm.frontend.passes.quantized_add makes from
DequantizeLinear(a), DequantizeLinear(b) -> Add -> [Relu] -> QuantizeLinear. Each case is such a chain in a model;
the schedule must hold the one fused kernel, and its outputs must equal ONNX's reference evaluator's bit for bit
(the kernel computes the chain's own float32 arithmetic: every operand and dtype, broadcasting, absent zero points,
quotients exactly half-way between two integers, saturation)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from numerics import OpCase, case, check_case, check_case_on_opencl, graph_model, params
from onnx import helper
from test_ops_quantize import ints, qdq_reference, scalar

from farm.frontend.onnx_import import import_model
from farm.frontend.passes import optimize


def quantized_add_model(
    a: tuple[tuple[int, ...], str],
    b: tuple[tuple[int, ...], str],
    out: str = "uint8",
    relu: bool = False,
    zero_points: bool = True,
    scales: tuple[float, float, float] = (0.05, 0.03, 0.07),
    opset: int = 13,
) -> onnx.ModelProto:
    """a and b (graph inputs of the given shapes and 8-bit dtypes) dequantized, added, [Relu], quantized to `out`."""
    zero = {"uint8": 128, "int8": -3}
    inits: dict[str, np.ndarray] = {
        "a_s": scalar(scales[0]),
        "b_s": scalar(scales[1]),
        "y_s": scalar(scales[2]),
        "y_z": scalar(zero[out] // 2, out),
    }
    if zero_points:
        inits |= {"a_z": scalar(zero[a[1]], a[1]), "b_z": scalar(zero[b[1]] + 7, b[1])}
    zeros = ["a_z", "b_z"] if zero_points else [None, None]
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "a_s", *zeros[:1]] if zeros[0] else ["a", "a_s"], ["af"]),
        helper.make_node("DequantizeLinear", ["b", "b_s", *zeros[1:]] if zeros[1] else ["b", "b_s"], ["bf"]),
        helper.make_node("Add", ["af", "bf"], ["sum"]),
    ]
    if relu:
        nodes.append(helper.make_node("Relu", ["sum"], ["relu"]))
    nodes.append(helper.make_node("QuantizeLinear", ["relu" if relu else "sum", "y_s", "y_z"], ["y"]))
    return graph_model(nodes, [("a", a[0], a[1]), ("b", b[0], b[1])], initializers=inits, opset=opset)


def _case(id: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> OpCase:
    return case(id, model, feeds, schedule=("QLinearAdd",), reference=qdq_reference(model))


def _feeds(a: tuple[tuple[int, ...], str], b: tuple[tuple[int, ...], str]) -> dict[str, np.ndarray]:
    return {"a": ints(a[0], a[1], 1), "b": ints(b[0], b[1], 2)}


PLANE = ((1, 8, 16, 16), "uint8")
SIGNED = ((1, 8, 16, 16), "int8")
HALF_WAY = ((64,), "uint8")

CASES: list[OpCase] = [
    _case("u8-u8-to-u8", quantized_add_model(PLANE, PLANE), _feeds(PLANE, PLANE)),
    _case("s8-s8-to-s8", quantized_add_model(SIGNED, SIGNED, "int8"), _feeds(SIGNED, SIGNED)),
    _case("u8-s8-to-s8-relu", quantized_add_model(PLANE, SIGNED, "int8", relu=True), _feeds(PLANE, SIGNED)),
    _case("relu-opset21", quantized_add_model(PLANE, PLANE, relu=True, opset=21), _feeds(PLANE, PLANE)),
    _case(
        "broadcast-per-channel",
        quantized_add_model(PLANE, ((8, 1, 1), "uint8")),
        _feeds(PLANE, ((8, 1, 1), "uint8")),
    ),
    _case("no-zero-points", quantized_add_model(PLANE, PLANE, zero_points=False), _feeds(PLANE, PLANE)),
    # Saturation: a large sum against a small output scale.
    _case(
        "saturating",
        quantized_add_model(SIGNED, SIGNED, "int8", scales=(0.5, 0.5, 0.01)),
        _feeds(SIGNED, SIGNED),
    ),
    # Every sum an odd multiple of 0.5 output steps: rounding half to even decides each element.
    _case(
        "half-way",
        quantized_add_model(HALF_WAY, HALF_WAY, zero_points=False, scales=(0.25, 0.25, 0.5)),
        {"a": np.arange(64, dtype=np.uint8), "b": np.full(64, 1, np.uint8)},
    ),
]


@pytest.mark.parametrize("c", params(CASES))
def test_matches_the_reference(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in ("u8-s8-to-s8-relu", "half-way", "saturating")))
def test_opencl_matches_the_reference(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_a_model_may_not_use_the_fused_op(tmp_path) -> None:
    """QLinearAdd is farm's own (onnxruntime's is com.microsoft's): a default-domain node of it is refused as the
    model is read, naming the node."""
    model = quantized_add_model(PLANE, PLANE)
    node = helper.make_node("QLinearAdd", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"], name="mine")
    del model.graph.node[:]
    model.graph.node.append(node)
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(Exception, match="node 'mine' \\(op 'QLinearAdd'.*a model may not"):
        optimize(import_model(tmp_path / "model.onnx"))
