"""Tests of farm.frontend.passes.dequantize_fusion: MatMulInteger -> Cast to float32 -> Mul by a scale -> [Add of
a bias] becomes one MatMulIntegerToFloat where its kernel computes the chain exactly, and stays as it is wherever
the fused kernel would compute something else or drop a value another reader needs. (tests/test_ops_dequantized_
matmul.py checks the fused kernel's outputs.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from pass_helpers import op_types, optimized
from test_ops_dequantized_matmul import B_S8, BIAS, PER_COLUMN, K, N, dequantized_matmul_model


def test_the_chain_becomes_one_node_named_as_the_product(tmp_path: Path) -> None:
    graph = optimized(dequantized_matmul_model((4, K), B_S8, bias=BIAS), tmp_path)
    assert op_types(graph) == ["MatMulIntegerToFloat"]
    node = graph.nodes[0]
    assert (node.name, node.outputs) == ("product", ["y"])
    assert node.inputs[:2] == ["a", "b"] and node.inputs[2:4] == ["", ""] and node.inputs[4] == "s"
    assert graph.constants[node.inputs[5]].tolist() == BIAS.tolist()


def test_a_chain_without_an_add_ends_at_the_mul(tmp_path: Path) -> None:
    graph = optimized(dequantized_matmul_model((4, K), B_S8, scale=PER_COLUMN), tmp_path)
    assert op_types(graph) == ["MatMulIntegerToFloat"] and graph.nodes[0].inputs[5] == ""


def test_zero_points_are_kept_in_place(tmp_path: Path) -> None:
    zeros = (np.array(3, np.uint8), np.arange(N, dtype=np.int8))
    graph = optimized(dequantized_matmul_model((4, K), B_S8, bias=BIAS, zero_points=zeros), tmp_path)
    assert [bool(name) for name in graph.nodes[0].inputs[:4]] == [True, True, True, True]


def _sums_are_an_output(model: onnx.ModelProto) -> None:
    model.graph.output.append(helper.make_tensor_value_info("sums", TensorProto.INT32, None))


def _cast_to_double(model: onnx.ModelProto) -> None:
    cast = next(node for node in model.graph.node if node.op_type == "Cast")
    cast.attribute[0].i = TensorProto.DOUBLE


def _sums_read_twice(model: onnx.ModelProto) -> None:
    model.graph.node.append(helper.make_node("Identity", ["sums"], ["copy"]))
    model.graph.output.append(helper.make_tensor_value_info("copy", TensorProto.INT32, None))


@pytest.mark.parametrize(
    "change",
    [_sums_are_an_output, _cast_to_double, _sums_read_twice],
    ids=["sums-are-an-output", "cast-to-double", "sums-read-twice"],
)
def test_a_chain_the_kernel_cant_compute_stays(change: Callable[[onnx.ModelProto], None], tmp_path: Path) -> None:
    model = dequantized_matmul_model((4, K), B_S8, bias=BIAS)
    change(model)
    graph = optimized(model, tmp_path)
    assert "MatMulIntegerToFloat" not in op_types(graph) and "MatMulInteger" in op_types(graph)


def test_a_scale_that_grows_the_rank_stays(tmp_path: Path) -> None:
    """A scale of shape [1, 1, 1] makes the Mul's output [1, 4, 80] of [4, 80] sums: not a per-column scale."""
    model = dequantized_matmul_model((4, K), B_S8, scale=np.full((1, 1, 1), 0.01, np.float32), bias=BIAS)
    assert "MatMulIntegerToFloat" not in op_types(optimized(model, tmp_path))


def test_a_scaled_value_read_twice_keeps_its_add(tmp_path: Path) -> None:
    """The Mul's output read by the Add and by a graph output: the chain ends at the Mul, the Add stays."""
    model = dequantized_matmul_model((4, K), B_S8, bias=BIAS)
    model.graph.output.append(helper.make_tensor_value_info("scaled", TensorProto.FLOAT, None))
    graph = optimized(model, tmp_path)
    assert op_types(graph) == ["MatMulIntegerToFloat", "Add"]
    assert graph.nodes[0].outputs == ["scaled"] and graph.nodes[0].inputs[5] == ""
