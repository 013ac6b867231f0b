"""Tests of farm.frontend.passes.channel_affine: per-channel Mul and Add folded into the Conv before them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from farm.frontend.passes import optimize
from farm.frontend.passes.channel_affine import fold_channel_affine
from farm.ir.graph import Activation
from tests.pass_helpers import _assert_same_outputs, _f32, _load, _model, _rand


def _conv_mul_add_model(scale_shape, shift_shape, with_bias: bool = True, constant_first: bool = False):
    """Conv -> Mul(scale) -> Add(shift) -> Relu: a BatchNormalization as some exporters write it."""
    c_in, c_out = 4, 6
    params = {"W": _rand(c_out, c_in, 3, 3), "scale": _rand(*scale_shape), "shift": _rand(*shift_shape)}
    conv_inputs = ["x", "W"]
    if with_bias:
        params["B"] = _rand(c_out)
        conv_inputs.append("B")
    mul_inputs = ["scale", "c"] if constant_first else ["c", "scale"]
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", mul_inputs, ["m"], name="mul"),
        helper.make_node("Add", ["m", "shift"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    return _model(nodes, [_f32("x", [1, c_in, 7, 7])], [_f32("y", [1, c_out, 7, 7])], list(params.items())), params


@pytest.mark.parametrize(
    ("scale_shape", "shift_shape", "with_bias", "constant_first"),
    [
        ((6, 1, 1), (6, 1, 1), True, False),
        ((1, 6, 1, 1), (1, 6, 1, 1), False, True),
        ((1,), (6, 1, 1), True, False),
    ],
)
def test_channel_mul_and_add_fold_into_the_conv(onnx_model_path, scale_shape, shift_shape, with_bias, constant_first):
    """Both fold (in one sweep), the Relu then fuses: one Conv node computes what the four did."""
    model, p = _conv_mul_add_model(scale_shape, shift_shape, with_bias, constant_first)
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    conv = graph.nodes[0]
    assert conv.outputs == ["y"] and conv.activation == Activation("relu") and len(conv.inputs) == 3
    scale = np.broadcast_to(p["scale"].reshape(-1), (6,))
    np.testing.assert_allclose(graph.constants[conv.inputs[1]], p["W"] * scale[:, None, None, None], rtol=1e-6)
    bias = p.get("B", np.zeros(6, np.float32))
    np.testing.assert_allclose(graph.constants[conv.inputs[2]], bias * scale + p["shift"].reshape(-1), rtol=1e-5)
    assert "W" not in graph.constants and "c" not in graph.values and "m" not in graph.values
    _assert_same_outputs(model, graph, {"x": _rand(1, 4, 7, 7)})


@pytest.mark.parametrize("case", ["spatial-constant", "shared-output", "model-output", "broadcast-out"])
def test_channel_affine_not_folded_when_it_would_change_the_result(onnx_model_path, case):
    shapes = {"spatial-constant": ((1, 1, 7, 7), (6, 1, 1)), "broadcast-out": ((2, 6, 1, 1), (6, 1, 1))}
    model, _ = _conv_mul_add_model(*shapes.get(case, ((6, 1, 1), (6, 1, 1))))
    if case == "shared-output":
        model.graph.node.append(helper.make_node("Relu", ["c"], ["r"], name="relu2"))
        model.graph.output.append(_f32("r", None))
    if case == "model-output":
        model.graph.output.append(_f32("c", None))
    if case == "broadcast-out":  # the output is [2, 6, 7, 7], not the declared [1, 6, 7, 7]: let inference say so
        model.graph.output[0].type.tensor_type.ClearField("shape")
    graph = fold_channel_affine(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes][:2] == ["Conv", "Mul"]
