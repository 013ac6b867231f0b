"""Tests of farm.frontend.passes.quantized_maxpool: DequantizeLinear -> MaxPool -> QuantizeLinear of one scale and
zero point becomes a MaxPool of the bytes, whose outputs equal ONNX's reference evaluator's on the chain bit for
bit; a chain whose round trip would not be the identity stays as it is."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import assert_matches_onnxruntime, graph_model
from onnx import helper, numpy_helper
from test_ops_quantize import ints, qdq_reference, scalar
from test_passes_quantized_add import op_types, optimized

X_SHAPE = (1, 4, 9, 9)


def quantized_maxpool_model(
    dtype: str = "uint8", scale: float = 0.037, zero: int = 3, opset: int = 13
) -> onnx.ModelProto:
    """x (bytes) -> DequantizeLinear -> MaxPool 3x3 stride 2, padded -> QuantizeLinear, the same scale and zero point
    on both sides, as quantize_static writes a ResNet's stem."""
    inits = {"s": scalar(scale), "z": scalar(zero, dtype)}
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
        helper.make_node("MaxPool", ["xf"], ["pooled"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["pooled", "s", "z"], ["y"]),
    ]
    return graph_model(nodes, [("x", X_SHAPE, dtype)], initializers=inits, opset=opset)


@pytest.mark.parametrize(
    ("dtype", "scale", "zero"),
    [("uint8", 0.037, 3), ("int8", 0.25, -7), ("uint8", 3.0e-20, 0), ("int8", 1.7e18, 100)],
    ids=["uint8", "int8", "tiny-scale", "huge-scale"],
)
def test_the_chain_is_one_maxpool_of_the_bytes(dtype: str, scale: float, zero: int, tmp_path: Path) -> None:
    model = quantized_maxpool_model(dtype, scale, zero)
    graph = optimized(model, tmp_path)
    assert op_types(graph) == ["MaxPool"] and graph.nodes[0].inputs == ["x"] and graph.nodes[0].outputs == ["y"]
    feeds = {"x": ints(X_SHAPE, dtype, 5)}
    assert_matches_onnxruntime(model, tmp_path / "build", feeds, reference=qdq_reference(model))


def _rescaled(model: onnx.ModelProto) -> None:
    """The QuantizeLinear's scale differs from the DequantizeLinear's."""
    model.graph.initializer.append(numpy_helper.from_array(scalar(0.04), "s2"))
    model.graph.node[2].input[1] = "s2"


def _other_zero(model: onnx.ModelProto) -> None:
    model.graph.initializer.append(numpy_helper.from_array(scalar(4, "uint8"), "z2"))
    model.graph.node[2].input[2] = "z2"


def _pooled_is_an_output(model: onnx.ModelProto) -> None:
    model.graph.output.append(helper.make_tensor_value_info("pooled", onnx.TensorProto.FLOAT, None))


def _subnormal_scale(model: onnx.ModelProto) -> None:
    """A scale so small that (m - z) * s loses bits: the round trip is no longer the identity."""
    for init in model.graph.initializer:
        if init.name == "s":
            init.CopyFrom(numpy_helper.from_array(scalar(1e-40), "s"))


@pytest.mark.parametrize(
    "change",
    [_rescaled, _other_zero, _pooled_is_an_output, _subnormal_scale],
    ids=["other-scale", "other-zero-point", "pooled-is-an-output", "subnormal-scale"],
)
def test_chains_that_are_no_round_trip_stay(change: Callable[[onnx.ModelProto], None], tmp_path: Path) -> None:
    model = quantized_maxpool_model()
    change(model)
    assert op_types(optimized(model, tmp_path)) == ["DequantizeLinear", "MaxPool", "QuantizeLinear"]


def test_a_dequantized_input_other_nodes_read_stays_for_them(tmp_path: Path) -> None:
    model = quantized_maxpool_model()
    model.graph.output.append(helper.make_tensor_value_info("xf", onnx.TensorProto.FLOAT, None))
    graph = optimized(model, tmp_path)
    assert op_types(graph) == ["DequantizeLinear", "MaxPool"] and graph.nodes[1].inputs == ["x"]
    assert np.dtype(graph.values["y"].dtype) == np.uint8
