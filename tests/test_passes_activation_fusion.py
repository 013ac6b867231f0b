"""Tests of farm.frontend.passes.activation_fusion: Relu, LeakyRelu and Clip fused into their producer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from farm.frontend.passes import optimize
from farm.frontend.passes.activation_fusion import FUSABLE_PRODUCERS
from farm.ir.graph import Activation
from tests.pass_helpers import _assert_same_outputs, _f32, _load, _model, _rand


def _producer_then(activation_nodes, extra_inits=(), opset=13, outputs=("y",)):
    """x -> Conv (name 'conv') -> activation nodes; the activation writes y."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv"), *activation_nodes]
    inits = [("W", _rand(3, 2, 1, 1)), ("B", _rand(3)), *extra_inits]
    return _model(nodes, [_f32("x", [1, 2, 4, 4])], [_f32(name, None) for name in outputs], inits, opset)


def test_relu_fuses_into_conv(onnx_model_path):
    model = _producer_then([helper.make_node("Relu", ["c"], ["y"], name="relu")])
    graph = optimize(_load(onnx_model_path, model))
    assert len(graph.nodes) == 1
    conv = graph.nodes[0]
    assert conv.activation == Activation("relu") and conv.outputs == ["y"] and "c" not in graph.values
    _assert_same_outputs(model, graph, {"x": _rand(1, 2, 4, 4)})


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_clip_0_6_fuses_with_its_bounds(onnx_model_path, opset):
    if opset < 11:
        clip, inits = helper.make_node("Clip", ["c"], ["y"], name="clip", min=0.0, max=6.0), []
    else:
        clip = helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")
        inits = [("lo", np.array(0, np.float32)), ("hi", np.array(6, np.float32))]
    model = _producer_then([clip], inits, opset)
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    assert graph.nodes[0].activation == Activation("clip", (0.0, 6.0))
    assert not {"lo", "hi"} & set(graph.constants)
    _assert_same_outputs(model, graph, {"x": 5 * _rand(1, 2, 4, 4)})


def test_clip_with_absent_max_is_unbounded(onnx_model_path):
    clip = helper.make_node("Clip", ["c", "lo"], ["y"], name="clip")
    graph = optimize(_load(onnx_model_path, _producer_then([clip], [("lo", np.array(0.5, np.float32))])))
    assert graph.nodes[0].activation == Activation("clip", (0.5, float("inf")))


def test_leaky_relu_fuses_with_alpha(onnx_model_path):
    model = _producer_then([helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2)])
    graph = optimize(_load(onnx_model_path, model))
    assert graph.nodes[0].activation == Activation("leakyrelu", (pytest.approx(0.2),))


def test_activation_not_fused_when_producer_output_has_two_consumers(onnx_model_path):
    nodes = [helper.make_node("Relu", ["c"], ["y"], name="relu"), helper.make_node("Clip", ["c"], ["z"], name="clip")]
    graph = optimize(_load(onnx_model_path, _producer_then(nodes, opset=13, outputs=("y", "z"))))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "Clip"]
    assert graph.nodes[0].activation is None


def test_activation_not_fused_when_producer_output_is_a_model_output(onnx_model_path):
    model = _producer_then([helper.make_node("Relu", ["c"], ["y"])], outputs=("y", "c"))
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu"]


def test_clip_with_non_constant_bound_is_not_fused(onnx_model_path):
    clip = helper.make_node("Clip", ["c", "lo"], ["y"], name="clip")
    model = _producer_then([clip])
    model.graph.input.append(helper.make_tensor_value_info("lo", TensorProto.FLOAT, []))
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Clip"]


def test_activation_after_non_fusable_op_or_fused_op_stays(onnx_model_path):
    nodes = [
        helper.make_node("Relu", ["c"], ["r"], name="relu1"),
        helper.make_node("Relu", ["r"], ["m"], name="relu2"),  # its producer already carries an activation
        helper.make_node("MaxPool", ["m"], ["p"], kernel_shape=[2, 2]),
        helper.make_node("Relu", ["p"], ["y"], name="relu3"),  # MaxPool is not a fusable producer
    ]
    graph = optimize(_load(onnx_model_path, _producer_then(nodes)))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "MaxPool", "Relu"]
    assert "MaxPool" not in FUSABLE_PRODUCERS
