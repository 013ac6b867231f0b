"""Tests of farm.frontend.passes.quantized_add: DequantizeLinear(a) + DequantizeLinear(b) -> [Relu] ->
QuantizeLinear becomes one QLinearAdd where its kernel computes the chain exactly, and stays as it is wherever the
fused kernel would compute something else or drop a value another reader needs. (tests/test_ops_quantized_add.py
checks the fused kernel's outputs.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from pass_helpers import op_types, optimized
from test_ops_quantized_add import PLANE, quantized_add_model

from farm.ir.graph import Activation


def test_the_chain_becomes_one_node_named_as_the_add(tmp_path: Path) -> None:
    graph = optimized(quantized_add_model(PLANE, PLANE), tmp_path)
    assert op_types(graph) == ["QLinearAdd"]
    node = graph.nodes[0]
    assert (node.name, node.outputs, node.activation) == ("Add_2", ["y"], None)  # the importer's name for the Add
    assert node.inputs == ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"]


def test_a_relu_before_the_quantize_is_the_nodes_activation(tmp_path: Path) -> None:
    graph = optimized(quantized_add_model(PLANE, PLANE, relu=True), tmp_path)
    assert op_types(graph) == ["QLinearAdd"] and graph.nodes[0].activation == Activation("relu")


def test_absent_zero_points_stay_absent(tmp_path: Path) -> None:
    graph = optimized(quantized_add_model(PLANE, PLANE, zero_points=False), tmp_path)
    assert graph.nodes[0].inputs == ["a", "a_s", "", "b", "b_s", "", "y_s", "y_z"]


def _per_axis_a(model: onnx.ModelProto) -> None:
    """a dequantized with one scale per channel."""
    scales = {init.name: init for init in model.graph.initializer}
    scales["a_s"].CopyFrom(numpy_helper.from_array(np.linspace(0.01, 0.08, 8, dtype=np.float32), "a_s"))
    scales["a_z"].CopyFrom(numpy_helper.from_array(np.full(8, 128, np.uint8), "a_z"))


def _sum_is_an_output(model: onnx.ModelProto) -> None:
    model.graph.output.append(helper.make_tensor_value_info("sum", onnx.TensorProto.FLOAT, None))


def _sum_read_twice(model: onnx.ModelProto) -> None:
    model.graph.node.append(helper.make_node("Neg", ["sum"], ["negated"]))
    model.graph.output.append(helper.make_tensor_value_info("negated", onnx.TensorProto.FLOAT, None))


def _scale_is_an_input(model: onnx.ModelProto) -> None:
    """y's scale given at run time, not a constant."""
    model.graph.initializer.remove(next(init for init in model.graph.initializer if init.name == "y_s"))
    model.graph.input.append(helper.make_tensor_value_info("y_s", onnx.TensorProto.FLOAT, []))


@pytest.mark.parametrize(
    "change",
    [_per_axis_a, _sum_is_an_output, _sum_read_twice, _scale_is_an_input],
    ids=["per-axis-operand", "sum-is-an-output", "sum-read-twice", "scale-not-constant"],
)
def test_chains_the_kernel_would_change_stay(change: Callable[[onnx.ModelProto], None], tmp_path: Path) -> None:
    model = quantized_add_model(PLANE, PLANE)
    change(model)
    graph = optimized(model, tmp_path)
    assert "QLinearAdd" not in op_types(graph) and "Add" in op_types(graph)


def test_a_dequantized_operand_other_nodes_read_stays_for_them(tmp_path: Path) -> None:
    model = quantized_add_model(PLANE, PLANE)
    model.graph.output.append(helper.make_tensor_value_info("af", onnx.TensorProto.FLOAT, None))
    graph = optimized(model, tmp_path)
    assert op_types(graph) == ["DequantizeLinear", "QLinearAdd"] and graph.nodes[0].outputs == ["af"]
