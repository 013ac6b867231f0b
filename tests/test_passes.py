"""Tests of farm.frontend.passes: pass-through removal, constant folding, BatchNormalization folding, activation fusion."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.errors import UnsupportedError
from farm.frontend.onnx_import import import_model
from farm.frontend.passes import FUSABLE_PRODUCERS, fold_batchnorm, fold_channel_affine, fold_constants, optimize
from farm.ir.graph import Activation, Graph, TensorInfo

RNG = np.random.default_rng(42)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, initializers=(), opset=13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _f32(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _load(onnx_model_path, model: onnx.ModelProto) -> Graph:
    return import_model(onnx_model_path(model))


def _node(graph: Graph, name: str):
    return next(n for n in graph.nodes if n.name == name)


def _run_onnx(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# An optimised Graph back to ONNX, activations as separate nodes, to check numerics against the original model.
_ACTIVATION_NODES = {
    "relu": lambda x, y, p, init: [helper.make_node("Relu", [x], [y])],
    "leakyrelu": lambda x, y, p, init: [helper.make_node("LeakyRelu", [x], [y], alpha=p[0])],
    "clip": lambda x, y, p, init: [
        init.extend([(y + "__lo", np.float32(p[0])), (y + "__hi", np.float32(p[1]))]),
        helper.make_node("Clip", [x, y + "__lo", y + "__hi"], [y]),
    ][1:],
}


def _graph_to_onnx(graph: Graph) -> onnx.ModelProto:
    initializers = list(graph.constants.items())
    nodes = []
    for node in graph.nodes:
        attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in node.attrs.items()}
        outputs = list(node.outputs)
        if node.activation is not None:
            outputs[0] += "__pre"
        nodes.append(helper.make_node(node.op_type, node.inputs, outputs, name=node.name, **attrs))
        if node.activation is not None:
            make = _ACTIVATION_NODES[node.activation.kind]
            nodes += make(outputs[0], node.outputs[0], node.activation.params, initializers)
    inputs = [_f32(name, graph.values[name].shape) for name in graph.inputs]
    outputs = [_f32(name, graph.values[name].shape) for name in graph.outputs]
    return _model(nodes, inputs, outputs, initializers, opset=max(graph.opset, 11))


def _assert_same_outputs(original: onnx.ModelProto, graph: Graph, feeds: dict[str, np.ndarray]) -> None:
    expected = _run_onnx(original, feeds)
    actual = _run_onnx(_graph_to_onnx(graph), feeds)
    for want, got in zip(expected, actual):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ constant folding


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_shape_chain_folds_to_constant_reshape_shape(onnx_model_path, opset):
    """x[2,3,4] -> Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) == Reshape(x, [2, -1])."""
    axes = {"axes": [0]} if opset < 13 else {}
    unsqueeze_inputs = ["g"] if opset < 13 else ["g", "axes"]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["g"], axis=0),
        helper.make_node("Unsqueeze", unsqueeze_inputs, ["u"], **axes),
        helper.make_node("Concat", ["u", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),
    ]
    initializers = [("zero", np.array(0, np.int64)), ("minus_one", np.array([-1], np.int64)),
                    ("axes", np.array([0], np.int64))]
    graph = _load(onnx_model_path, _model(nodes, [_f32("x", [2, 3, 4])], [_f32("y", None)], initializers, opset))
    graph = optimize(graph)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    reshape = graph.nodes[0]
    np.testing.assert_array_equal(graph.constants[reshape.inputs[1]], [2, -1])
    assert graph.values["y"].shape == (2, 12)
    assert set(graph.constants) == {reshape.inputs[1]}  # the folded chain's constants are gone


def test_constant_of_shape_weight_folds_and_unused_constants_go(onnx_model_path):
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.25])
    nodes = [
        helper.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    model = _model(nodes, [_f32("x", [2, 3])], [_f32("y", [2, 5])], [("w_shape", np.array([3, 5], np.int64))], 9)
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["MatMul"]
    np.testing.assert_array_equal(graph.constants["w"], np.full((3, 5), 0.25, np.float32))
    assert graph.values["w"] == TensorInfo.of_array(graph.constants["w"]) == TensorInfo((3, 5), "float32")
    assert "w_shape" not in graph.constants


def test_reshape_with_folded_shape_gets_static_output(onnx_model_path):
    """A shape only known after folding (ConstantOfShape + Add) still gives the Reshape a static output info."""
    one = helper.make_tensor("v", TensorProto.INT64, [1], [3])
    nodes = [
        helper.make_node("ConstantOfShape", ["two"], ["threes"], value=one),
        helper.make_node("Add", ["threes", "delta"], ["shape"]),
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Shape", ["r"], ["rs"]),
        helper.make_node("Reshape", ["x2", "rs"], ["y"], name="reshape2"),
    ]
    initializers = [("two", np.array([2], np.int64)), ("delta", np.array([-1, 1], np.int64))]
    model = _model(nodes, [_f32("x", [8]), _f32("x2", [2, 4])], [_f32("y", None), _f32("r", None)], initializers)
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Reshape", "Reshape"]
    assert graph.values["r"].shape == (2, 4) and graph.values["y"].shape == (2, 4)
    np.testing.assert_array_equal(graph.constants["rs"], [2, 4])


def test_folding_does_not_mutate_or_copy_shared_inputs(onnx_model_path):
    weight = _rand(4, 3)
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y1"], name="mm1"),
        helper.make_node("MatMul", ["x2", "w"], ["y2"], name="mm2"),
    ]
    model = _model(nodes, [_f32("x", [2, 3]), _f32("x2", [5, 4])], [_f32("y1", [2, 4]), _f32("y2", [5, 3])],
                   [("w", weight)])
    graph = fold_constants(_load(onnx_model_path, model))
    np.testing.assert_array_equal(graph.constants["w"], weight)
    np.testing.assert_array_equal(graph.constants["wt"], weight.T)
    assert graph.constants["wt"].flags.c_contiguous


# ---------------------------------------------------------------------------------------------- BatchNormalization


def _conv_bn_model(with_bias: bool, opset: int = 13, group: int = 1):
    c_in, c_out = 4, 6
    params = {
        "W": _rand(c_out, c_in // group, 3, 3),
        "scale": _rand(c_out), "beta": _rand(c_out), "mean": _rand(c_out),
        "var": (RNG.random(c_out) + 0.5).astype(np.float32),
    }
    conv_inputs = ["x", "W"]
    if with_bias:
        params["B"] = _rand(c_out)
        conv_inputs.append("B")
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1], group=group),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"], name="bn",
                         epsilon=1e-3),
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
    np.testing.assert_allclose(graph.constants[conv.inputs[2]], (bias - p["mean"]) * factor + p["beta"], rtol=1e-5,
                               atol=1e-6)
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


def _conv_mul_add_model(scale_shape, shift_shape, with_bias: bool = True, constant_first: bool = False):
    """Conv -> Mul(scale) -> Add(shift) -> Relu: a BatchNormalization as some exporters write it."""
    c_in, c_out = 4, 6
    params = {"W": _rand(c_out, c_in, 3, 3), "scale": _rand(*scale_shape), "shift": _rand(*shift_shape)}
    conv_inputs = ["x", "W"]
    if with_bias:
        params["B"] = _rand(c_out)
        conv_inputs.append("B")
    mul_inputs = ["scale", "c"] if constant_first else ["c", "scale"]
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", mul_inputs, ["m"], name="mul"),
             helper.make_node("Add", ["m", "shift"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    return _model(nodes, [_f32("x", [1, c_in, 7, 7])], [_f32("y", [1, c_out, 7, 7])], list(params.items())), params


@pytest.mark.parametrize(("scale_shape", "shift_shape", "with_bias", "constant_first"), [
    ((6, 1, 1), (6, 1, 1), True, False),
    ((1, 6, 1, 1), (1, 6, 1, 1), False, True),
    ((1,), (6, 1, 1), True, False),
])
def test_channel_mul_and_add_fold_into_the_conv(onnx_model_path, scale_shape, shift_shape, with_bias,
                                                constant_first):
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


# ---------------------------------------------------------------------------------------------- activation fusion


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


# ----------------------------------------------------------------------------------------------- residual adds


def _skip_connection(add: str = "Add", residual_shape=(1, 4, 6, 6), conv_attrs: dict | None = None,
                     weight_shape=(4, 4, 3, 3), relu: bool = True, outputs=("y",)) -> onnx.ModelProto:
    """y = relu(add(conv(x), r)): a ResNet block's tail."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], **(conv_attrs or {})),
             helper.make_node(add, ["r", "c"], ["s" if relu else "y"], name="add")]
    nodes += [helper.make_node("Relu", ["s"], ["y"], name="relu")] if relu else []
    inits = [("w", _rand(*weight_shape)), ("b", _rand(weight_shape[0]))]
    return _model(nodes, [_f32("x", [1, 4, 6, 6]), _f32("r", list(residual_shape))],
                  [_f32(name, [1, 4, 6, 6]) for name in outputs], inits)


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


@pytest.mark.parametrize("model, reason", [
    (_skip_connection(residual_shape=(1, 4, 1, 1)), "broadcast residual"),
    (_skip_connection(conv_attrs={"group": 4}, weight_shape=(4, 1, 3, 3)), "depthwise conv"),
    (_skip_connection(relu=False, outputs=("y", "c")), "conv output is a model output"),
])
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


# -------------------------------------------------------------------------------------------- Dropout and Identity


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
        ("Identity", ["x"], ["y"]), ("Relu", ["y"], ["z"])
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
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["d"], name="drop"),
             helper.make_node("Relu", ["d"], ["y"])]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", [3])],
                   [("ratio", np.array(0.5, np.float32)), ("train", np.array(False))])
    assert [n.op_type for n in optimize(_load(onnx_model_path, model)).nodes] == ["Relu"]


# --------------------------------------------------------------------------------------------- dead code, whole


def test_dead_nodes_removed(onnx_model_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["dead1"], name="dead1"),
        helper.make_node("Add", ["dead1", "k"], ["dead2"], name="dead2"),
        helper.make_node("Relu", ["x"], ["y"], name="live"),
    ]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", [3])], [("k", _rand(3))])
    graph = optimize(_load(onnx_model_path, model))
    assert [n.name for n in graph.nodes] == ["live"] and "k" not in graph.constants and "dead1" not in graph.values


def test_small_network_optimises_to_the_same_function(onnx_model_path):
    """Conv-BN-Relu6, Conv-BN-LeakyRelu, Identity, Dropout, a folded shape chain and Gemm, end to end."""
    inits = {
        "W1": _rand(8, 3, 3, 3), "s1": _rand(8), "b1": _rand(8), "m1": _rand(8), "v1": RNG.random(8, np.float32) + 0.5,
        "W2": _rand(8, 8, 1, 1), "B2": _rand(8), "s2": _rand(8), "b2": _rand(8), "m2": _rand(8),
        "v2": RNG.random(8, np.float32) + 0.5, "lo": np.array(0, np.float32), "hi": np.array(6, np.float32),
        "G": _rand(8 * 6 * 6, 10), "GB": _rand(10), "minus_one": np.array([-1], np.int64),
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
        ("Conv", "clip"), ("Conv", "leakyrelu"), ("Reshape", None), ("Gemm", "relu")
    ]
    _assert_same_outputs(model, graph, {"x": _rand(2, 3, 8, 8)})


def test_folding_leaves_a_too_big_constant_as_a_node(onnx_model_path):
    """Range(0, 2**28) as int64 is 2 GiB: over MAX_FOLDED_CONSTANT_BYTES, so it is not evaluated at build time."""
    nodes = [helper.make_node("Range", ["a", "b", "c"], ["r"], name="range"),
             helper.make_node("Range", ["a", "small", "c"], ["s"], name="small_range"),
             helper.make_node("Concat", ["r", "s"], ["y"], name="concat", axis=0)]
    inits = [("a", np.array(0, np.int64)), ("b", np.array(2**28, np.int64)), ("c", np.array(1, np.int64)),
             ("small", np.array(4, np.int64))]
    model = _model(nodes, [], [helper.make_tensor_value_info("y", TensorProto.INT64, None)], inits, opset=17)
    graph = fold_constants(_load(onnx_model_path, model))
    assert [n.name for n in graph.nodes] == ["range", "concat"]
    np.testing.assert_array_equal(graph.constants["s"], np.arange(4))
    assert graph.values["r"] == TensorInfo((2**28,), "int64")


def test_folding_checks_a_declared_shape_inference_could_not(onnx_model_path):
    """A value whose declared shape import had to take on trust must fold to that shape."""
    nodes = [helper.make_node("Unique", ["k"], ["u"], name="unique"),
             helper.make_node("Add", ["x", "u"], ["y"], name="add")]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", None)], [("k", np.float32([1, 1, 2]))], opset=17)
    model.graph.value_info.append(_f32("u", [3]))
    with pytest.raises(UnsupportedError, match=r"'unique'.*'u' is declared with shape \[3\] but computes to \[2\]"):
        fold_constants(_load(onnx_model_path, model))


def test_a_declared_shape_folding_makes_checkable_is_checked(onnx_model_path):
    """Reshape's shape is only known after folding; a value info declaring a bigger output must then be refused
    (the Reshape kernel would copy past its input)."""
    nodes = [helper.make_node("Max", ["k", "k"], ["shape"], name="same"),
             helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    model = _model(nodes, [_f32("x", [2, 3])], [_f32("y", None)], [("k", np.array([3, 2], np.int64))], opset=17)
    model.graph.value_info.append(_f32("r", [8, 8]))
    graph = _load(onnx_model_path, model)
    assert "r" in graph.declared_shapes
    with pytest.raises(UnsupportedError, match=r"'reshape'.*'r' is declared with shape \[8, 8\] but computes to "
                                                r"\[3, 2\]"):
        fold_constants(graph)


RUNTIME_SHAPED = {
    "reshape past its input": ("Reshape", [1, 4], [1000, 4], "doesn't fit input 'x' \\[1, 4\\]"),
    "tile to a non-multiple": ("Tile", [2, 4], [3, 4], "doesn't fit input 'x' \\[2, 4\\]"),
    "an op that has no check": ("Slice", [2, 4], [2, 4], "known only at run time"),
}


@pytest.mark.parametrize(("op", "source", "declared", "message"), RUNTIME_SHAPED.values(), ids=RUNTIME_SHAPED.keys())
def test_a_shape_only_a_declaration_gives_must_fit_the_ops_input(onnx_model_path, op: str, source: list[int],
                                                                 declared: list[int], message: str):
    """An output shape that depends on a graph input's values (a Reshape to a shape given at run time) is taken
    from the declaration only when the op's kernel then reads inside its input; otherwise it is refused, naming
    the node (the kernel would read past its input: an out-of-bounds read made by the model)."""
    nodes = [helper.make_node(op, ["x", "shape"] + (["shape"] if op == "Slice" else []), ["y"], name="rt")]
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [len(source)])
    model = _model(nodes, [_f32("x", source), shape], [_f32("y", declared)], [], opset=17)
    with pytest.raises(UnsupportedError, match=f"'rt'.*{message}"):
        fold_constants(_load(onnx_model_path, model))


def test_a_runtime_shaped_reshape_that_fits_is_built_for_its_declared_shape(onnx_model_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="rt")]
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    model = _model(nodes, [_f32("x", [1, 4]), shape], [_f32("y", [2, 2])], [], opset=17)
    assert fold_constants(_load(onnx_model_path, model)).values["y"].shape == (2, 2)


def test_an_empty_graph_input_is_a_constant_that_stays_an_input(onnx_model_path):
    """An empty `axes` input can only be fed []: it folds into the ReduceSum as "no axes" (all of them)."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum")]
    axes = helper.make_tensor_value_info("axes", TensorProto.INT64, [0])
    graph = fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [2, 3]), axes], [_f32("y", None)])))
    assert graph.inputs == ["x", "axes"]
    assert graph.constants["axes"].shape == (0,) and graph.constants["axes"].dtype == np.int64
    assert graph.values["y"] == TensorInfo((1, 1), "float32")


def test_a_node_whose_outputs_are_all_empty_folds_without_running(onnx_model_path):
    """A Slice of a graph input that selects nothing has one possible value, whatever the input holds; the Mul
    of that empty value folds in turn, and the Concat reads the empty constant."""
    nodes = [helper.make_node("Slice", ["x", "starts", "ends"], ["s"], name="slice"),
             helper.make_node("Mul", ["s", "s"], ["m"], name="mul"),
             helper.make_node("Concat", ["m", "x"], ["y"], name="concat", axis=1)]
    inits = [("starts", np.array([1], np.int64)), ("ends", np.array([1], np.int64))]
    graph = fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [2, 3])], [_f32("y", None)], inits)))
    assert [n.name for n in graph.nodes] == ["concat"]
    assert graph.constants["m"].shape == (0, 3) and graph.constants["m"].dtype == np.float32


def test_an_empty_model_output_is_still_computed_by_its_node(onnx_model_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    graph = fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [0, 3])], [_f32("y", None)])))
    assert [n.name for n in graph.nodes] == ["relu"] and "y" not in graph.constants


def test_an_empty_shape_only_a_declaration_gives_is_checked_not_folded(onnx_model_path):
    """A Reshape to a shape given at run time, declared [0, 4] on a 4-element input, does not fold to an empty
    constant: the declaration is checked against the input first, and refused."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="rt"),
             helper.make_node("Concat", ["r", "x"], ["y"], name="concat", axis=0)]
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    model = _model(nodes, [_f32("x", [1, 4]), shape], [_f32("y", None)], [], opset=17)
    model.graph.value_info.append(_f32("r", [0, 4]))
    with pytest.raises(UnsupportedError, match=r"'rt'.*doesn't fit input 'x' \[1, 4\]"):
        fold_constants(_load(onnx_model_path, model))


def test_an_empty_output_of_an_op_without_a_run_time_check_takes_its_declared_shape(onnx_model_path):
    """A Slice whose starts and ends come at run time, declared to select nothing: its output has no value, whatever
    the run gives, and the node gets no kernel (an op with a RUNTIME_SHAPE_CHECKS entry keeps its check: above)."""
    nodes = [helper.make_node("Slice", ["x", "starts", "ends"], ["y"], name="rt")]
    bounds = [helper.make_tensor_value_info(name, TensorProto.INT64, [1]) for name in ("starts", "ends")]
    model = _model(nodes, [_f32("x", [3, 4]), *bounds], [_f32("y", [3, 0])], [], opset=17)
    assert fold_constants(_load(onnx_model_path, model)).values["y"].shape == (3, 0)


@pytest.mark.parametrize(("shape", "declared", "keepdims", "builds"), [
    ([2, 0, 4], [2, 1, 4], 1, True), ([2, 0, 4], [2, 4], 0, True), ([2, 0, 4], [2, 0, 1], 1, True),
    ([2, 0, 4], [2, 4], 1, False),  # keepdims: the declared output must have the input's rank
    ([2, 3, 4], [2, 1, 4], 1, False),  # the values depend on the axes: refused
])
def test_a_reduction_of_an_empty_input_takes_its_declared_shape_with_run_time_axes(onnx_model_path, shape, declared,
                                                                                   keepdims, builds):
    """Each element of a non-empty output of a reduction of an empty tensor reduces nothing, whatever the axes: the
    declared shape stands as for RUNTIME_SHAPE_CHECKS. A non-empty input's reduction depends on the axes' values."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="rt", keepdims=keepdims)]
    axes = helper.make_tensor_value_info("axes", TensorProto.INT64, [1])
    model = _model(nodes, [_f32("x", shape), axes], [_f32("y", declared)], [], opset=17)
    if builds:
        assert fold_constants(_load(onnx_model_path, model)).values["y"].shape == tuple(declared)
    else:
        with pytest.raises(UnsupportedError, match="'rt'.*known only at run time"):
            fold_constants(_load(onnx_model_path, model))


DIRECT_FOLDS = {
    "constant-of-shape, default value": (helper.make_node("ConstantOfShape", ["s"], ["y"]),
                                          {"s": np.array([2, 3], np.int64)}, 17),
    "constant-of-shape, int32 value": (helper.make_node("ConstantOfShape", ["s"], ["y"],
                                                        value=numpy_helper.from_array(np.array([7], np.int32))),
                                        {"s": np.array([4], np.int64)}, 17),
    "constant-of-shape, a scalar": (helper.make_node("ConstantOfShape", ["s"], ["y"],
                                                     value=numpy_helper.from_array(np.array([1.5], np.float64))),
                                     {"s": np.zeros(0, np.int64)}, 17),
    "unsqueeze, axes input": (helper.make_node("Unsqueeze", ["x", "a"], ["y"]),
                              {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.array([-1, 0], np.int64)},
                              17),
    "unsqueeze, axes attribute": (helper.make_node("Unsqueeze", ["x"], ["y"], axes=[1, 3]),
                                  {"x": np.arange(6, dtype=np.int64).reshape(2, 3)}, 11),
}


@pytest.mark.parametrize("case", list(DIRECT_FOLDS))
def test_ops_folded_in_numpy_give_the_reference_evaluators_constants(case: str) -> None:
    """ConstantOfShape and Unsqueeze fold without a reference evaluator per node (passes._DIRECT_FOLDERS): the same
    values, dtypes and shapes as onnx's reference gives, which everything else still folds with."""
    from farm.frontend import passes
    from farm.ir.graph import Node

    proto, constants, opset = DIRECT_FOLDS[case]
    attrs = {a.name: numpy_helper.to_array(a.t) if a.type == onnx.AttributeProto.TENSOR
             else onnx.helper.get_attribute_value(a) for a in proto.attribute}
    node = Node("n", proto.op_type, list(proto.input), list(proto.output), attrs)
    graph = Graph("g", opset, [], ["z"], {}, dict(constants), [node])
    ours = passes._DIRECT_FOLDERS[proto.op_type](graph, node)
    reference = passes._evaluate(graph, node)
    assert ours is not None and reference is not None
    assert ours[0].dtype == reference[0].dtype and ours[0].shape == reference[0].shape
    np.testing.assert_array_equal(ours[0], reference[0])


def fills_added_model(count: int, elements: int) -> onnx.ModelProto:
    """`count` ConstantOfShape([1, elements]) of float32, each added to the running sum of input x (issue 30's
    model: a file of under 1 KB that folds `count` x `elements` x 4 bytes at plan time)."""
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    nodes, total = [], "x"
    for index in range(count):
        nodes += [helper.make_node("ConstantOfShape", ["shape"], [f"c{index}"], name=f"fill{index}", value=fill),
                  helper.make_node("Add", [total, f"c{index}"], [f"s{index}"], name=f"add{index}")]
        total = f"s{index}"
    return _model(nodes, [_f32("x", [1, elements])], [_f32(total, [1, elements])],
                  [("shape", np.array([1, elements], np.int64))], opset=17)


def test_folding_past_the_budget_fails_naming_the_node(onnx_model_path, monkeypatch):
    """FARM_MAX_FOLDED_BYTES bounds the sum of the constants one plan folds (each is under the per-constant bound):
    the fill that takes it over is named, with the budget, and nothing past it is folded."""
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str(3 << 20))
    graph = _load(onnx_model_path, fills_added_model(8, 1 << 18))  # 1 MiB a fill
    with pytest.raises(UnsupportedError) as refused:
        fold_constants(graph)
    assert refused.value.exit_status == 2 and refused.value.node == "fill3" and refused.value.op == "ConstantOfShape"
    assert "FARM_MAX_FOLDED_BYTES=3145728" in str(refused.value) and f"({4 << 20} bytes)" in str(refused.value)
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str(8 << 20))  # exactly what the model folds: it fits
    assert [n.op_type for n in fold_constants(_load(onnx_model_path, fills_added_model(8, 1 << 18))).nodes] == ["Add"] * 8


def test_a_folded_view_of_a_constant_costs_nothing_of_the_budget(onnx_model_path, monkeypatch):
    """Unsqueeze and Reshape fold to views of their input (numpy's, and the reference evaluator's): only memory that
    folding allocates counts, so a chain of them over one 1 MiB fill fits a 1 MiB budget."""
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str(1 << 20))
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill", value=fill),
             helper.make_node("Unsqueeze", ["c", "axes"], ["u"], name="unsqueeze"),
             helper.make_node("Reshape", ["u", "flat"], ["r"], name="reshape"),
             helper.make_node("Add", ["x", "r"], ["y"], name="add")]
    inits = [("shape", np.array([512, 512], np.int64)), ("axes", np.array([0], np.int64)),
             ("flat", np.array([1 << 18], np.int64))]
    graph = fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [1 << 18])], [_f32("y", [1 << 18])],
                                                         inits, opset=17)))
    assert [n.name for n in graph.nodes] == ["add"]
    np.testing.assert_array_equal(graph.constants["r"], np.full(1 << 18, 0.5, np.float32))
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str((1 << 20) - 1))  # the fill alone passes a byte less
    with pytest.raises(UnsupportedError, match="node 'fill'"):
        fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [1 << 18])], [_f32("y", [1 << 18])], inits,
                                                     opset=17)))
