"""Tests of farm.frontend.passes.dead_nodes: nodes no output depends on removed."""

from __future__ import annotations

from onnx import helper

from farm.frontend.passes import optimize
from tests.pass_helpers import _f32, _load, _model, _rand


def test_dead_nodes_removed(onnx_model_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["dead1"], name="dead1"),
        helper.make_node("Add", ["dead1", "k"], ["dead2"], name="dead2"),
        helper.make_node("Relu", ["x"], ["y"], name="live"),
    ]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", [3])], [("k", _rand(3))])
    graph = optimize(_load(onnx_model_path, model))
    assert [n.name for n in graph.nodes] == ["live"] and "k" not in graph.constants and "dead1" not in graph.values
