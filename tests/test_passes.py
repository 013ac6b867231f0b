"""Tests of farm.frontend.passes: the pipeline `optimize` runs, end to end."""

from __future__ import annotations

import numpy as np
from onnx import helper

from farm.frontend.passes import optimize
from tests.pass_helpers import RNG, _assert_same_outputs, _f32, _load, _model, _rand


def test_small_network_optimises_to_the_same_function(onnx_model_path):
    """Conv-BN-Relu6, Conv-BN-LeakyRelu, Identity, Dropout, a folded shape chain and Gemm, end to end."""
    inits = {
        "W1": _rand(8, 3, 3, 3),
        "s1": _rand(8),
        "b1": _rand(8),
        "m1": _rand(8),
        "v1": RNG.random(8, np.float32) + 0.5,
        "W2": _rand(8, 8, 1, 1),
        "B2": _rand(8),
        "s2": _rand(8),
        "b2": _rand(8),
        "m2": _rand(8),
        "v2": RNG.random(8, np.float32) + 0.5,
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
        "G": _rand(8 * 6 * 6, 10),
        "GB": _rand(10),
        "minus_one": np.array([-1], np.int64),
        "zero": np.array([0], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["c1"]),
        helper.make_node("BatchNormalization", ["c1", "s1", "b1", "m1", "v1"], ["n1"]),
        helper.make_node("Clip", ["n1", "lo", "hi"], ["a1"]),
        helper.make_node("Identity", ["a1"], ["i1"]),
        helper.make_node("Conv", ["i1", "W2", "B2"], ["c2"]),
        helper.make_node("BatchNormalization", ["c2", "s2", "b2", "m2", "v2"], ["n2"]),
        helper.make_node("LeakyRelu", ["n2"], ["a2"], alpha=0.1),
        helper.make_node("Dropout", ["a2"], ["d2"]),
        helper.make_node("Shape", ["d2"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"]),
        helper.make_node("Concat", ["batch", "minus_one"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["d2", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "G", "GB"], ["g"]),
        helper.make_node("Relu", ["g"], ["y"]),
    ]
    model = _model(nodes, [_f32("x", [2, 3, 8, 8])], [_f32("y", None)], list(inits.items()))
    graph = optimize(_load(onnx_model_path, model))
    assert [(n.op_type, n.activation and n.activation.kind) for n in graph.nodes] == [
        ("Conv", "clip"),
        ("Conv", "leakyrelu"),
        ("Reshape", None),
        ("Gemm", "relu"),
    ]
    _assert_same_outputs(model, graph, {"x": _rand(2, 3, 8, 8)})
