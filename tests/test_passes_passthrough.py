"""Tests of farm.frontend.passes.passthrough: Dropout and Identity removal."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from farm.errors import UnsupportedError
from farm.frontend.passes import optimize
from tests.pass_helpers import _f32, _load, _model


def test_dropout_and_identity_dropped(onnx_model_path):
    nodes = [
        helper.make_node("Identity", ["x"], ["i"]),
        helper.make_node("Dropout", ["i"], ["d"], name="dropout"),
        helper.make_node("Add", ["d", "i"], ["y"], name="add"),
    ]
    graph = optimize(_load(onnx_model_path, _model(nodes, [_f32("x", [3])], [_f32("y", [3])])))
    assert [(n.op_type, n.inputs) for n in graph.nodes] == [("Add", ["x", "x"])]


@pytest.mark.parametrize("op", ["Identity", "Dropout"])
def test_passthrough_writing_a_model_output_renames_the_producer(onnx_model_path, op):
    nodes = [helper.make_node("Add", ["x", "x"], ["s"], name="add"), helper.make_node(op, ["s"], ["y"])]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", [3])], opset=11)
    graph = optimize(_load(onnx_model_path, model))
    assert [(n.name, n.outputs) for n in graph.nodes] == [("add", ["y"])]
    assert graph.outputs == ["y"] and graph.values["y"].shape == (3,) and "s" not in graph.values


def test_identity_from_model_input_to_model_output_is_kept(onnx_model_path):
    nodes = [helper.make_node("Dropout", ["x"], ["y"], name="drop"), helper.make_node("Relu", ["y"], ["z"])]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", [3]), _f32("z", [3])], opset=11)
    graph = optimize(_load(onnx_model_path, model))
    assert [(n.op_type, n.inputs, n.outputs) for n in graph.nodes] == [
        ("Identity", ["x"], ["y"]),
        ("Relu", ["y"], ["z"]),
    ]


def test_identity_to_output_shared_with_another_output_is_kept(onnx_model_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])]
    model = _model(nodes, [_f32("x", [3])], [_f32("r", [3]), _f32("y", [3])])
    graph = optimize(_load(onnx_model_path, model))
    assert [(n.op_type, n.outputs) for n in graph.nodes] == [("Relu", ["r"]), ("Identity", ["y"])]


def test_used_dropout_mask_is_unsupported(onnx_model_path):
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"], name="drop")]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", [3]), helper.make_tensor_value_info("mask", 9, [3])])
    with pytest.raises(UnsupportedError, match="'drop'.*mask"):
        optimize(_load(onnx_model_path, model))


@pytest.mark.parametrize("training", [True, None])  # a constant true, or a graph input
def test_dropout_in_training_mode_is_unsupported(onnx_model_path, training):
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="drop")]
    constants = [("ratio", np.array(0.5, np.float32))]
    inputs = [_f32("x", [3])]
    if training is None:
        inputs.append(helper.make_tensor_value_info("train", 9, []))
    else:
        constants.append(("train", np.array(training)))
    model = _model(nodes, inputs, [_f32("y", [3])], constants)
    with pytest.raises(UnsupportedError, match="'drop'.*training_mode input 'train' is not a constant false"):
        optimize(_load(onnx_model_path, model))


def test_dropout_with_training_mode_false_passes_through(onnx_model_path):
    nodes = [
        helper.make_node("Dropout", ["x", "ratio", "train"], ["d"], name="drop"),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    model = _model(
        nodes, [_f32("x", [3])], [_f32("y", [3])], [("ratio", np.array(0.5, np.float32)), ("train", np.array(False))]
    )
    assert [n.op_type for n in optimize(_load(onnx_model_path, model)).nodes] == ["Relu"]
