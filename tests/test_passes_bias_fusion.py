"""Tests of farm.frontend.passes.bias_fusion: a linear layer's bias Add fused into the MatMul, and the fused
MatMul's outputs against onnxruntime's on a CPU and on OpenCL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import OpCase, assert_matches_onnxruntime, check_case_on_opencl
from onnx import helper

from farm.frontend.passes import optimize
from farm.ir.graph import Activation
from tests.pass_helpers import _f32, _load, _model, _rand


def _linear(
    x_shape=(2, 5, 8),
    bias_shape=(6,),
    relu: bool = True,
    bias_first: bool = False,
    outputs=("y",),
    weight_shape=(8, 6),
) -> onnx.ModelProto:
    """y = relu(MatMul(x, W) + b): a transformer's linear layer as torch exports it."""
    add_inputs = ["b", "m"] if bias_first else ["m", "b"]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
        helper.make_node("Add", add_inputs, ["s" if relu else "y"], name="add"),
    ]
    nodes += [helper.make_node("Relu", ["s"], ["y"], name="relu")] if relu else []
    out_shape = [*x_shape[:-1], weight_shape[-1]]
    return _model(
        nodes,
        [_f32("x", list(x_shape))],
        [_f32(name, out_shape) for name in outputs],
        [("w", _rand(*weight_shape)), ("b", _rand(*bias_shape))],
    )


@pytest.mark.parametrize("bias_first", [False, True])
def test_a_bias_add_and_its_relu_fuse_into_the_matmul(onnx_model_path, bias_first):
    graph = optimize(_load(onnx_model_path, _linear(bias_first=bias_first)))
    [matmul] = graph.nodes
    assert (matmul.op_type, matmul.bias, matmul.activation) == ("MatMul", True, Activation("relu"))
    assert matmul.inputs[:2] == ["x", "w"] and matmul.outputs == ["y"]
    assert graph.constants[matmul.inputs[2]].shape == (6,)
    assert "m" not in graph.values and "s" not in graph.values


def test_a_bias_with_leading_axes_of_one_is_taken_as_its_columns(onnx_model_path):
    graph = optimize(_load(onnx_model_path, _linear(bias_shape=(1, 1, 6))))
    assert graph.nodes[0].bias and graph.constants[graph.nodes[0].inputs[2]].shape == (6,)


@pytest.mark.parametrize(
    "model, reason",
    [
        (_linear(bias_shape=(5, 6)), "a bias per row and column"),
        (_linear(bias_shape=(1,)), "a scalar broadcast"),
        (_linear(relu=False, outputs=("y", "m")), "the MatMul's output is a model output"),
        (_linear(weight_shape=(2, 8, 6), x_shape=(2, 5, 8)), "a weight per batch"),
    ],
)
def test_the_add_stays_where_the_matmul_cannot_absorb_it(onnx_model_path, model, reason):
    graph = optimize(_load(onnx_model_path, model))
    assert "Add" in [n.op_type for n in graph.nodes], reason
    assert not any(node.bias for node in graph.nodes), reason


def test_a_bias_attribute_in_the_model_file_is_not_a_fusion(onnx_model_path):
    """Only the pass sets Node.bias: a MatMul attribute of that name in a hostile file changes nothing."""
    model = _linear(relu=False)
    model.graph.node[0].attribute.append(helper.make_attribute("bias", 1))
    model.graph.node.pop()
    model.graph.output[0].name = "m"
    graph = _load(onnx_model_path, model)
    assert not graph.nodes[0].bias


@pytest.mark.parametrize(
    "x_shape, relu", [((2, 5, 8), True), ((7, 8), False), ((1, 3, 4, 8), True)], ids=["3d-relu", "2d", "4d-relu"]
)
def test_a_fused_linear_layer_matches_onnxruntime(tmp_path: Path, x_shape, relu) -> None:
    assert_matches_onnxruntime(_linear(x_shape=x_shape, relu=relu), tmp_path, name="linear")


def test_a_fused_linear_layer_matches_onnxruntime_on_opencl(tmp_path: Path, fingerprint: str) -> None:
    check_case_on_opencl(OpCase("linear", _linear()), fingerprint, tmp_path)


def test_the_fused_bias_is_applied_once(tmp_path: Path) -> None:
    """Two layers in a row, a wide one (several column tiles and an edge): every value gets its bias once."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["m2"]),
        helper.make_node("Add", ["b2", "m2"], ["y"]),
    ]
    inits = [
        ("w1", rng.standard_normal((40, 100)).astype(np.float32)),
        ("b1", rng.standard_normal(100).astype(np.float32) * 10),
        ("w2", rng.standard_normal((100, 70)).astype(np.float32)),
        ("b2", rng.standard_normal(70).astype(np.float32) * 10),
    ]
    model = _model(nodes, [_f32("x", [1, 33, 40])], [_f32("y", [1, 33, 70])], inits)
    result = assert_matches_onnxruntime(model, tmp_path, name="two")
    assert result.artifact
