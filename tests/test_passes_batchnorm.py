"""Tests of farm.frontend.passes.batchnorm: BatchNormalization folded into the Conv before it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from farm.frontend.passes import optimize
from farm.frontend.passes.batchnorm import fold_batchnorm
from tests.pass_helpers import RNG, _assert_same_outputs, _f32, _load, _model, _node, _rand


def _conv_bn_model(with_bias: bool, opset: int = 13, group: int = 1):
    c_in, c_out = 4, 6
    params = {
        "W": _rand(c_out, c_in // group, 3, 3),
        "scale": _rand(c_out),
        "beta": _rand(c_out),
        "mean": _rand(c_out),
        "var": (RNG.random(c_out) + 0.5).astype(np.float32),
    }
    conv_inputs = ["x", "W"]
    if with_bias:
        params["B"] = _rand(c_out)
        conv_inputs.append("B")
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1], group=group),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"], name="bn", epsilon=1e-3),
    ]
    model = _model(nodes, [_f32("x", [2, c_in, 7, 7])], [_f32("y", None)], list(params.items()), opset)
    return model, params


@pytest.mark.parametrize(("with_bias", "group", "opset"), [(True, 1, 13), (False, 1, 9), (False, 2, 15)])
def test_batchnorm_folds_into_conv(onnx_model_path, with_bias, group, opset):
    model, p = _conv_bn_model(with_bias, opset, group)
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    conv = graph.nodes[0]
    assert conv.outputs == ["y"] and len(conv.inputs) == 3 and "c" not in graph.values

    factor = p["scale"].astype(np.float64) / np.sqrt(p["var"].astype(np.float64) + 1e-3)
    bias = p.get("B", np.zeros(6, np.float32)).astype(np.float64)
    np.testing.assert_allclose(graph.constants[conv.inputs[1]], p["W"] * factor[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(
        graph.constants[conv.inputs[2]], (bias - p["mean"]) * factor + p["beta"], rtol=1e-5, atol=1e-6
    )
    assert graph.constants[conv.inputs[1]].dtype == np.float32
    _assert_same_outputs(model, graph, {"x": _rand(2, 4, 7, 7)})


def test_batchnorm_not_folded_when_conv_output_is_shared(onnx_model_path):
    model, _ = _conv_bn_model(with_bias=True)
    model.graph.node.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
    model.graph.output.append(_f32("r", None))
    graph = fold_batchnorm(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Conv", "BatchNormalization", "Relu"]


def test_batchnorm_fold_leaves_a_shared_weight_alone(onnx_model_path):
    model, p = _conv_bn_model(with_bias=True)
    model.graph.node.append(helper.make_node("Conv", ["x", "W"], ["c2"], name="conv2", pads=[1, 1, 1, 1]))
    model.graph.output.append(_f32("c2", None))
    graph = optimize(_load(onnx_model_path, model))
    conv, conv2 = _node(graph, "conv"), _node(graph, "conv2")
    assert conv.inputs[1] != "W" and conv2.inputs[1] == "W"
    np.testing.assert_array_equal(graph.constants["W"], p["W"])
    _assert_same_outputs(model, graph, {"x": _rand(2, 4, 7, 7)})
