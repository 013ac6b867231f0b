"""Tests of farm.frontend.validate: the refusal of a Graph farm can't build, naming the node and value at fault."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.errors import UnsupportedError
from farm.frontend.onnx_import import import_model
from farm.frontend.passes import optimize
from farm.frontend.validate import validate
from tests.test_frontend import SUPPORTED, _conv_relu_model, _model


def test_unsupported_op_names_node_op_domain_and_opset(onnx_model_path):
    node = helper.make_node("RandomNormalLike", ["x"], ["y"], name="hm")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    graph = import_model(onnx_model_path(_model([node], [x], [y], opset=13)))
    with pytest.raises(UnsupportedError) as info:
        validate(graph, SUPPORTED)
    message = str(info.value)
    for part in ("'hm'", "'RandomNormalLike'", "ai.onnx", "opset 13", "not supported"):
        assert part in message
    assert (info.value.node, info.value.op, info.value.opset) == ("hm", "RandomNormalLike", 13)


@pytest.mark.parametrize("missing", [1, 2, 3, 4])
def test_a_required_input_left_empty_names_the_node_and_the_input(onnx_model_path, missing):
    """bench_fuzz's farm mode found a BatchNormalization whose bias was '' (an optional input's spelling) reach
    its kernel's compile (KeyError, exit 1); a required input left out is refused at validation, exit 2."""
    names = ["x", "scale", "bias", "mean", "var"]
    names[missing] = ""
    node = helper.make_node("BatchNormalization", names, ["y"], name="bn")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])
    params = [numpy_helper.from_array(np.ones(2, np.float32), name) for name in names[1:] if name]
    graph = import_model(onnx_model_path(_model([node], [x], [y], params, opset=15)))
    with pytest.raises(UnsupportedError, match=f"node 'bn' .*required input '.+' \\(input {missing}\\) is missing"):
        validate(graph, {"BatchNormalization"})


@pytest.mark.parametrize("domains", [["com.example"], []])  # also when the model forgot to import the domain
def test_custom_domain_op_names_domain(onnx_model_path, domains):
    node = helper.make_node("Relu", ["x"], ["y"], name="mine", domain="com.example")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = import_model(onnx_model_path(_model([node], [x], [y], domains=domains)))
    with pytest.raises(UnsupportedError, match="com.example") as info:
        validate(graph, SUPPORTED)
    assert info.value.domain == "com.example" and "'mine'" in str(info.value)


def test_dynamic_input_dim_fails_in_validate_not_import(onnx_model_path):
    model, _, _ = _conv_relu_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    graph = import_model(onnx_model_path(model))
    assert graph.dynamic_shapes["x"] == ("N", 3, 8, 8)
    with pytest.raises(UnsupportedError, match=r"'x' has dynamic shape \[N, 3, 8, 8\]") as info:
        validate(graph, SUPPORTED)
    assert info.value.node == "conv"


def test_unknown_intermediate_shape_names_the_value(onnx_model_path):
    relu = helper.make_node("Relu", ["x"], ["r"], name="relu")
    mystery = helper.make_node("Mystery", ["r"], ["y"], name="mystery")  # no schema: inference can't type y
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = import_model(onnx_model_path(_model([relu, mystery], [x], [y])))
    with pytest.raises(UnsupportedError, match="output 'y' has an unknown shape") as info:
        validate(graph, {"Relu", "Mystery"})
    assert info.value.node == "mystery"


def test_a_model_input_of_a_dtype_farm_has_no_buffers_for_is_unsupported(onnx_model_path):
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    x = helper.make_tensor_value_info("x", TensorProto.UINT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.UINT64, [2])
    graph = import_model(onnx_model_path(_model([relu], [x], [y])))
    with pytest.raises(UnsupportedError, match="'x' has dtype uint64"):
        validate(graph, SUPPORTED)


def test_computed_value_over_the_tensor_limit_is_refused_by_validate(onnx_model_path):
    shape = numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "shape")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["z"], name="fill"),
        helper.make_node("Add", ["x", "z"], ["y"], name="add"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [shape],
    )
    graph = optimize(import_model(onnx_model_path(model)))
    with pytest.raises(UnsupportedError, match=r"'fill'.*'z' of shape \[1048576, 1048576\] float32 needs"):
        validate(graph, SUPPORTED | {"ConstantOfShape"})


def test_a_negative_dim_is_refused_naming_the_value(onnx_model_path):
    """Inference gives a Conv whose kernel is larger than its padded input a negative dim: no tensor has that shape."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    w = numpy_helper.from_array(np.ones((2, 3, 5, 5), np.float32), "w")
    graph = import_model(
        onnx_model_path(
            _model(
                nodes,
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
                [helper.make_tensor_value_info("y", 0, None)],
                [w],
            )
        )
    )
    with pytest.raises(UnsupportedError, match=r"output 'y' has a negative dim in shape \[1, 2, -2, -2\]") as info:
        validate(graph, {"Conv"})
    assert info.value.node == "conv"


@pytest.mark.parametrize("follower", ["BatchNormalization", "Mul"])
def test_a_conv_without_its_weight_is_refused_at_validation_not_by_a_pass(onnx_model_path, follower):
    """bench_fuzz's 10,000-mutant farm run found a Conv whose weight was '' before a BatchNormalization: the pass
    that folds it into the Conv read the weight '' (KeyError, a traceback in the worker). The passes leave such a
    Conv alone, and validation names it."""
    conv = helper.make_node("Conv", ["x", ""], ["c"], name="conv", kernel_shape=[1, 1])
    params = [numpy_helper.from_array(np.ones(2, np.float32), name) for name in ("s", "b", "m", "v")]
    after = (
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn")
        if follower == "BatchNormalization"
        else helper.make_node("Mul", ["c", "s4"], ["y"], name="mul")
    )
    params.append(numpy_helper.from_array(np.ones((1, 2, 1, 1), np.float32), "s4"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])
    model = _model([conv, after], [x], [y], params, opset=15)
    model.graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 2, 3, 3]))
    graph = optimize(import_model(onnx_model_path(model)))
    with pytest.raises(UnsupportedError, match="node 'conv' .*required input 'W' \\(input 1\\) is missing"):
        validate(graph, {"Conv", "BatchNormalization", "Mul"})
