"""Tests of farm.frontend.passes.residual_fusion: a skip connection's Add fused into the Conv."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from farm.frontend.passes import optimize
from farm.ir.graph import Activation
from tests.pass_helpers import _f32, _load, _model, _rand


def _skip_connection(
    add: str = "Add",
    residual_shape=(1, 4, 6, 6),
    conv_attrs: dict | None = None,
    weight_shape=(4, 4, 3, 3),
    relu: bool = True,
    outputs=("y",),
) -> onnx.ModelProto:
    """y = relu(add(conv(x), r)): a ResNet block's tail."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], **(conv_attrs or {})),
        helper.make_node(add, ["r", "c"], ["s" if relu else "y"], name="add"),
    ]
    nodes += [helper.make_node("Relu", ["s"], ["y"], name="relu")] if relu else []
    inits = [("w", _rand(*weight_shape)), ("b", _rand(weight_shape[0]))]
    return _model(
        nodes,
        [_f32("x", [1, 4, 6, 6]), _f32("r", list(residual_shape))],
        [_f32(name, [1, 4, 6, 6]) for name in outputs],
        inits,
    )


@pytest.mark.parametrize("add", ["Add", "Sum"])
def test_residual_add_and_its_relu_fuse_into_the_conv(onnx_model_path, add):
    graph = optimize(_load(onnx_model_path, _skip_connection(add)))
    [conv] = graph.nodes
    assert (conv.op_type, conv.residual, conv.activation) == ("Conv", True, Activation("relu"))
    assert conv.inputs[0] == "x" and conv.inputs[-1] == "r" and conv.outputs == ["y"]
    assert "c" not in graph.values and "s" not in graph.values


def test_residual_of_a_conv_without_bias_leaves_the_bias_slot_empty(onnx_model_path):
    model = _skip_connection()
    model.graph.node[0].input.pop()
    graph = optimize(_load(onnx_model_path, model))
    assert graph.nodes[0].inputs == ["x", "w", "", "r"] and graph.nodes[0].residual


@pytest.mark.parametrize(
    "model, reason",
    [
        (_skip_connection(residual_shape=(1, 4, 1, 1)), "broadcast residual"),
        (_skip_connection(conv_attrs={"group": 4}, weight_shape=(4, 1, 3, 3)), "depthwise conv"),
        (_skip_connection(relu=False, outputs=("y", "c")), "conv output is a model output"),
    ],
)
def test_residual_add_stays_where_the_conv_cannot_absorb_it(onnx_model_path, model, reason):
    graph = optimize(_load(onnx_model_path, model))
    assert "Conv" in [n.op_type for n in graph.nodes] and len(graph.nodes) > 1, reason
    assert not any(node.residual for node in graph.nodes), reason


def test_a_residual_attribute_in_the_model_file_is_not_a_fusion(onnx_model_path):
    """Only the pass sets Node.residual: a Conv attribute of that name in a hostile file changes nothing."""
    model = _skip_connection(relu=False)
    model.graph.node[0].attribute.append(helper.make_attribute("residual", 1))
    model.graph.node.pop()
    model.graph.output[0].name = "c"
    graph = _load(onnx_model_path, model)
    assert not graph.nodes[0].residual
