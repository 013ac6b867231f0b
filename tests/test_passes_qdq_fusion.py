"""Tests of farm.frontend.passes.qdq_fusion: a QDQ Conv or MatMul as onnxruntime's quantize_static writes it runs
as QLinearConv or QLinearMatMul (requantizing into its QuantizeLinear's output), or as ConvInteger or MatMulInteger
rescaled in float32 where something else stands before the QuantizeLinear, and its quantized output stays within
one quantization step of onnxruntime's float path; a product the fusion would change otherwise stays a float one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import build_and_load, graph_model, rand, run_onnxruntime, scheduled_ops
from onnx import helper

from farm.frontend.onnx_import import import_model
from farm.frontend.passes import optimize
from farm.frontend.passes.qdq_fusion import fuse_qdq
from farm.ir.graph import Graph

X_SCALE, Y_SCALE = np.float32(0.02), np.float32(0.05)
X_SHAPE = (1, 3, 10, 10)


def per_axis_int8(weights: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 values and one scale per index along `axis`, as quantize_static's per_channel option makes."""
    moved = np.moveaxis(weights, axis, 0)
    scale = (np.abs(moved).reshape(len(moved), -1).max(axis=1) / 127).astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(weights.ndim)]
    return np.clip(np.rint(weights / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def qdq_conv_model(
    opset: int = 17,
    bias: bool = True,
    relu: bool = True,
    weight_axis: int = 0,
    conv_is_output: bool = False,
    x_scale_is_input: bool = False,
    quantized_output: bool = True,
    float_bias: bool = False,
    **attrs,
) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv (int8 weight per `weight_axis`, [int32 bias], each through DequantizeLinear) -> [Relu]
    -> Q -> DQ -> y; the Conv's output also a graph output if `conv_is_output`, x's scale a graph input if
    `x_scale_is_input`, no Q -> DQ after the Conv (or its Relu) unless `quantized_output`, and the bias a float32
    constant if `float_bias`."""
    weight, weight_scale = per_axis_int8(rand(8, 3, 3, 3, seed=1), weight_axis)
    inits = {
        "x_z": np.uint8(128),
        "w": weight,
        "w_s": weight_scale,
        "w_z": np.zeros(len(weight_scale), np.int8),
        "y_s": Y_SCALE,
        "y_z": np.uint8(128),
    }
    inputs: list = [("x", X_SHAPE)]
    if x_scale_is_input:
        inputs.append(("x_s", ()))
    else:
        inits["x_s"] = X_SCALE
    conv_inputs = ["xd", "wd"]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["wd"], axis=weight_axis),
    ]
    if float_bias:
        inits["bf"] = rand(8, seed=3)
        conv_inputs.append("bf")
    elif bias:
        bias_scale = (X_SCALE * weight_scale).astype(np.float32)
        inits |= {"b": np.rint(rand(8, seed=3) / bias_scale).astype(np.int32), "b_s": bias_scale}
        nodes.append(helper.make_node("DequantizeLinear", ["b", "b_s"], ["bd"], axis=0))
        conv_inputs.append("bd")
    nodes.append(helper.make_node("Conv", conv_inputs, ["c"], **attrs))
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
    result = "r" if relu else "c"
    if quantized_output:
        nodes += [
            helper.make_node("QuantizeLinear", [result, "y_s", "y_z"], ["yq"]),
            helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"]),
        ]
    outputs = ["y" if quantized_output else result] + (["c"] if conv_is_output else [])
    return graph_model(nodes, inputs, outputs, inits, opset)


def qdq_matmul_model(opset: int = 13, per_column: bool = True, add: bool = True) -> onnx.ModelProto:
    """x -> Q -> DQ -> MatMul (int8 B through DequantizeLinear, per column or per tensor) -> [Add (a float32 bias)]
    -> Q -> DQ -> y."""
    b = rand(16, 12, seed=2)
    if per_column:
        b_q, b_scale = per_axis_int8(b, 1)
        b_zero = np.zeros(12, np.int8)
    else:
        b_scale = np.float32(np.abs(b).max() / 127)
        b_q, b_zero = np.clip(np.rint(b / b_scale), -127, 127).astype(np.int8), np.int8(0)
    inits = {
        "x_s": X_SCALE,
        "x_z": np.uint8(128),
        "b": b_q,
        "b_s": b_scale,
        "b_z": b_zero,
        "bias": rand(12, seed=5),
        "y_s": np.float32(0.1),
        "y_z": np.uint8(128),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["b", "b_s", "b_z"], ["bd"], axis=1),
        helper.make_node("MatMul", ["xd", "bd"], ["m"]),
        *([helper.make_node("Add", ["m", "bias"], ["a"])] if add else []),
        helper.make_node("QuantizeLinear", ["a" if add else "m", "y_s", "y_z"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"]),
    ]
    return graph_model(nodes, [("x", (2, 5, 16))], ["y"], inits, opset)


def qdq_gemm_model(
    trans_b: bool = True, bias: bool = True, alpha: float = 1.0, per_column: bool = True
) -> onnx.ModelProto:
    """x -> Q -> DQ -> Gemm (int8 B through DequantizeLinear, stored [N, K] with transB as torch's Linear exports it,
    per output column; an int32 bias through DequantizeLinear, as quantize_static writes a classifier) -> Q -> DQ
    -> y."""
    w = rand(12, 16, seed=2) if trans_b else rand(16, 12, seed=2)
    axis = 0 if trans_b else 1
    if per_column:
        w_q, w_scale = per_axis_int8(w, axis)
    else:
        w_scale = np.float32(np.abs(w).max() / 127)
        w_q = np.clip(np.rint(w / w_scale), -127, 127).astype(np.int8)
    inits = {
        "x_s": X_SCALE,
        "x_z": np.uint8(128),
        "w": w_q,
        "w_s": w_scale,
        "w_z": np.zeros(12, np.int8) if per_column else np.int8(0),
        "b": np.rint(rand(12, seed=5) / (X_SCALE * w_scale)).astype(np.int32),
        "b_s": (X_SCALE * w_scale).astype(np.float32),
        "y_s": np.float32(0.1),
        "y_z": np.uint8(128),
    }
    gemm_inputs = ["xd", "wd", "bd"] if bias else ["xd", "wd"]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["wd"], axis=axis),
        helper.make_node("DequantizeLinear", ["b", "b_s"], ["bd"], axis=0),
        helper.make_node("Gemm", gemm_inputs, ["g"], transB=int(trans_b), alpha=alpha),
        helper.make_node("QuantizeLinear", ["g", "y_s", "y_z"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["y"]),
    ]
    if not bias:
        del nodes[3]
        del inits["b"], inits["b_s"]
    return graph_model(nodes, [("x", (3, 16))], ["y"], inits, 13)


def _imported(model: onnx.ModelProto, tmp_path: Path) -> Graph:
    path = tmp_path / "qdq.onnx"
    onnx.save(model, path)
    return import_model(path)


def _ops(graph: Graph) -> list[str]:
    return [node.op_type for node in graph.nodes]


def assert_within_one_step(model: onnx.ModelProto, tmp_path: Path, step: float) -> list[str]:
    """Build `model` with farm, run it on seeded x and compare y with onnxruntime's unoptimised float path: at most
    one quantization step apart (the float rounding of onnxruntime's sums can move a quotient across a half-way
    point). Returns the artifact's scheduled ops."""
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    result, built = build_and_load(path, tmp_path / "out")
    x = model.graph.input[0].type.tensor_type.shape
    feeds = {"x": rand(*(d.dim_value for d in x.dim), seed=4, scale=1.5)}
    difference = np.abs(built.run(feeds)["y"] - run_onnxruntime(path, feeds, optimized=False)["y"])
    assert difference.max() <= step * (1 + 1e-6)
    return scheduled_ops(result)


REQUANTIZED_CONVS = {
    "bias-relu-opset17": (qdq_conv_model(pads=[1, 1, 1, 1]), True),
    "bias-relu-opset13": (qdq_conv_model(opset=13, pads=[1, 1, 1, 1]), True),
    "no-bias": (qdq_conv_model(bias=False, relu=False), False),
    "no-bias-relu": (qdq_conv_model(bias=False, auto_pad="SAME_UPPER"), True),
    "strided-padded": (qdq_conv_model(strides=[2, 2], pads=[1, 0, 2, 1], dilations=[1, 2], group=1), True),
}


@pytest.mark.parametrize(("model", "relu"), REQUANTIZED_CONVS.values(), ids=REQUANTIZED_CONVS.keys())
def test_a_qdq_conv_runs_as_one_requantizing_kernel(model: onnx.ModelProto, relu: bool, tmp_path: Path) -> None:
    """x's, the weight's and the bias's DequantizeLinear, the Conv, its Relu and its QuantizeLinear are one
    QLinearConv (x_q, w_q and the int32 bias as they are; the Relu its activation), within one step of
    onnxruntime's output."""
    graph = optimize(_imported(model, tmp_path))
    assert _ops(graph) == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    fused = graph.nodes[1]
    dtypes = ["uint8", "float32", "uint8", "int8", "float32", "int8", "float32", "uint8"]
    assert [graph.values[name].dtype for name in fused.inputs[:8]] == dtypes
    assert (fused.activation is not None) == relu
    assert fused.outputs == ["yq"]
    assert "QLinearConv" in assert_within_one_step(model, tmp_path, Y_SCALE)


def test_a_float_bias_is_rescaled_in_float(tmp_path: Path) -> None:
    """A bias that isn't int32 quantized with the scales' product can't be the QLinearConv's: ConvInteger, Cast,
    Mul by the scales and Add of the bias compute the float result, the Relu fused into the Add."""
    model = qdq_conv_model(float_bias=True, pads=[1, 1, 1, 1])
    graph = optimize(_imported(model, tmp_path))
    products = ["ConvInteger", "Cast", "Mul", "Add"]
    assert _ops(graph) == ["QuantizeLinear", *products, "QuantizeLinear", "DequantizeLinear"]
    integer, last = graph.nodes[1], graph.nodes[len(products)]
    assert [graph.values[name].dtype for name in integer.inputs] == ["uint8", "int8", "uint8", "int8"]
    assert last.activation is not None
    assert "ConvInteger" in assert_within_one_step(model, tmp_path, Y_SCALE)


def test_the_rescaling_constants_are_per_output_channel(tmp_path: Path) -> None:
    """Mul by x_scale * w_scale and Add of b_q * b_scale, both [1, C, 1, 1] float32; Conv's attributes carried
    over."""
    model = qdq_conv_model(strides=[2, 2], pads=[1, 0, 2, 1], float_bias=True)
    graph = fuse_qdq(_imported(model, tmp_path))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    conv, _, mul, add = graph.nodes[1:5]
    assert conv.attrs == {"strides": [2, 2], "pads": [1, 0, 2, 1]}
    np.testing.assert_array_equal(graph.constants[mul.inputs[1]], (X_SCALE * inits["w_s"]).reshape(1, 8, 1, 1))
    np.testing.assert_array_equal(graph.constants[add.inputs[1]], inits["bf"].reshape(1, 8, 1, 1))
    assert add.outputs == ["c"]


RESCALED_MATMUL = ["QuantizeLinear", "MatMulIntegerToFloat", "QuantizeLinear", "DequantizeLinear"]
"""A product on its integers rescaled in float32, its bias added, then quantized: what a QDQ MatMul with a float
Add after it, or a Gemm with a bias, becomes (MatMulInteger -> Cast -> Mul -> Add, which the dequantize fusion
makes one kernel)."""


@pytest.mark.parametrize("per_column", [True, False], ids=["per-column", "per-tensor"])
def test_a_qdq_matmul_runs_on_its_integers(per_column: bool, tmp_path: Path) -> None:
    model = qdq_matmul_model(per_column=per_column)
    graph = optimize(_imported(model, tmp_path))
    assert _ops(graph) == RESCALED_MATMUL
    assert graph.constants[graph.nodes[1].inputs[4]].shape == (12,)
    assert "MatMulIntegerToFloat" in assert_within_one_step(model, tmp_path, 0.1)


@pytest.mark.parametrize("per_column", [True, False], ids=["per-column", "per-tensor"])
def test_a_qdq_matmul_into_its_quantize_is_one_requantizing_kernel(per_column: bool, tmp_path: Path) -> None:
    model = qdq_matmul_model(per_column=per_column, add=False)
    graph = optimize(_imported(model, tmp_path))
    assert _ops(graph) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"]
    assert "QLinearMatMul" in assert_within_one_step(model, tmp_path, 0.1)


GEMMS = {
    "trans-b-bias": qdq_gemm_model(),
    "bias-per-tensor": qdq_gemm_model(per_column=False),
    "b-as-stored-bias": qdq_gemm_model(trans_b=False),
}


@pytest.mark.parametrize("model", GEMMS.values(), ids=GEMMS.keys())
def test_a_qdq_gemm_with_a_bias_runs_on_its_integers(model: onnx.ModelProto, tmp_path: Path) -> None:
    """A Gemm that is a MatMul plus a bias (a classifier as quantize_static writes it): MatMulInteger on [K, N]
    integers (transB's weight copied transposed) -> Cast -> Mul -> Add of the bias (one MatMulIntegerToFloat), one
    step within onnxruntime."""
    graph = optimize(_imported(model, tmp_path))
    assert _ops(graph) == RESCALED_MATMUL
    assert graph.constants[graph.nodes[1].inputs[1]].shape == (16, 12)
    assert graph.constants[graph.nodes[1].inputs[5]].shape == (12,)
    assert "MatMulIntegerToFloat" in assert_within_one_step(model, tmp_path, 0.1)


def test_a_qdq_gemm_without_a_bias_is_one_requantizing_kernel(tmp_path: Path) -> None:
    model = qdq_gemm_model(bias=False)
    graph = optimize(_imported(model, tmp_path))
    assert _ops(graph) == ["QuantizeLinear", "QLinearMatMul", "DequantizeLinear"]
    assert "QLinearMatMul" in assert_within_one_step(model, tmp_path, 0.1)


def test_a_scaled_gemm_stays_float(tmp_path: Path) -> None:
    """alpha != 1 scales the product: not a MatMul, so the Gemm stays as it is."""
    assert "Gemm" in _ops(optimize(_imported(qdq_gemm_model(alpha=0.5), tmp_path)))


def test_a_shared_dequantize_of_x_stays(tmp_path: Path) -> None:
    """x's DequantizeLinear also feeds a graph output: the Conv fuses, the DequantizeLinear stays for the other
    reader."""
    model = qdq_conv_model(pads=[1, 1, 1, 1])
    model.graph.output.append(helper.make_tensor_value_info("xd", onnx.TensorProto.FLOAT, list(X_SHAPE)))
    graph = optimize(_imported(model, tmp_path))
    assert "QLinearConv" in _ops(graph) and "Conv" not in _ops(graph)
    assert [node.outputs for node in graph.nodes if node.op_type == "DequantizeLinear"][0] == ["xd"]


UNFUSED = {
    "conv-output-is-a-graph-output": qdq_conv_model(conv_is_output=True),
    "x-scale-is-not-a-constant": qdq_conv_model(x_scale_is_input=True),
    "weight-scale-along-input-channels": qdq_conv_model(weight_axis=1, bias=False),
    "no-quantize-after": qdq_conv_model(quantized_output=False),
}


@pytest.mark.parametrize("model", UNFUSED.values(), ids=UNFUSED.keys())
def test_a_product_the_fusion_would_change_stays_float(model: onnx.ModelProto, tmp_path: Path) -> None:
    ops = _ops(optimize(_imported(model, tmp_path)))
    assert "Conv" in ops and "ConvInteger" not in ops
