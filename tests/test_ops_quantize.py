"""farm.ops.quantize against a reference: Quantize- and DequantizeLinear per tensor, per axis and blocked on every
quantized dtype, DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv; quotients at
half-way points, where a reciprocal multiply instead of the division would round the other way; float16 scales; a
QDQ model as onnxruntime's quantize_static writes it; and the refusals.

The reference is onnxruntime for the elementwise ops, ONNX's reference evaluator where onnxruntime has no kernel,
and ONNX's reference evaluator for everything that accumulates integers (`_integer_case`, the QDQ model): its
integer arithmetic is exact, so its answer is the same on every CPU, which onnxruntime's is not on x86 CPUs without
VNNI (issue 28)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from native_helpers import host, kernel_module_ir
from numerics import (
    OpCase,
    Reference,
    assert_refused,
    assert_unsupported,
    case,
    check_case,
    check_case_on_opencl,
    graph_model,
    hostile_op_model,
    params,
    rand,
    random_feeds,
    scheduled_ops,
    single_op_model,
)
from onnx import TensorProto, helper, numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator
from test_ops_tensor import onnx_reference

import farm.runtime
import farm.runtime.model as runtime_model
from farm.build.assembly import plan_model
from farm.ir import loopir as L
from farm.ops import lower_kernel
from farm.ops.quantize import round_to_half

F16 = np.float16


def ints(
    shape: Sequence[int],
    dtype: str,
    seed: int = 0,
    low: int | None = None,
    high: int | None = None,
) -> np.ndarray:
    """Deterministic integers over `dtype`'s whole range (or [low, high])."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(info.min if low is None else low, (info.max if high is None else high) + 1, shape).astype(dtype)


def scalar(value, dtype: str = "float32") -> np.ndarray:
    return np.array(value, dtype=dtype)


def halfway(shape: Sequence[int], scale: float, seed: int = 0) -> np.ndarray:
    """x whose quotient x / scale is at (or one float32 step from) a half-way point k + 0.5: where dividing and
    multiplying by the reciprocal round differently (about one in four for scale 0.3)."""
    k = np.random.default_rng(seed).integers(-150, 150, shape)
    return ((k + 0.5) * np.float64(np.float32(scale))).astype(np.float32)


def _case(
    id: str,
    op: str,
    inputs,
    feeds: Mapping[str, np.ndarray] | None = None,
    attrs=None,
    initializers=None,
    opset: int = 21,
    *,
    onnxruntime: bool = True,
    **kwargs,
) -> OpCase:
    """A one-op case fed `feeds` (random float32 for float inputs not given), against onnxruntime or, where it has
    no kernel, ONNX's reference evaluator."""
    model = single_op_model(op, inputs, attrs, initializers, opset, **kwargs)
    all_feeds = {
        name: feeds[name] if feeds and name in feeds else rand(*shape, seed=i)
        for i, (name, shape, *_) in enumerate(inputs)
    }
    return case(id, model, all_feeds, reference=None if onnxruntime else onnx_reference(model))


def _integer_case(id: str, op: str, inputs, feeds: Mapping[str, np.ndarray], attrs=None, opset: int = 10) -> OpCase:
    """A case of an op that sums integer products, against ONNX's reference evaluator. It sums in int32 numpy
    arithmetic, which is exact here (no case sums 2**31 / 255**2 products), and requantizes as the spec says (the
    int32 sum times the scales' multiplier in float64, which holds the product exactly; then rint), so its answer
    is the same on every CPU.

    onnxruntime is no reference for these ops: on x86 CPUs without AVX-512 VNNI or AVX-VNNI, its uint8 x int8
    kernels add pairs of products in 16 bits (vpmaddubsw), which saturate: under QEMU's EPYC-Milan (a Zen 3, AVX2
    only) its matmul-integer-uint8-int8 is off by up to 6,106 (issue 28)."""
    return _case(id, op, inputs, feeds, attrs, opset=opset, onnxruntime=False)


X = ("x", (2, 3, 4, 5), "float32")

# -------------------------------------------------------------------------------------------- QuantizeLinear

_SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 3e38, 0.0, -0.0, 1e-45, 2.5, -2.5, 3.5], np.float32)

QUANTIZE_CASES: list[OpCase] = [
    _case(
        "quantize-uint8-opset10",
        "QuantizeLinear",
        [X],
        initializers={"s": scalar(0.02), "z": scalar(128, "uint8")},
        opset=10,
    ),
    _case(
        "quantize-int8-inputs",
        "QuantizeLinear",
        [X, ("s", (), "float32"), ("z", (), "int8")],
        {"s": scalar(0.03), "z": scalar(-7, "int8")},
        opset=13,
    ),
    *[
        _case(
            f"quantize-halfway-{scale}",
            "QuantizeLinear",
            [("x", (4096,), "float32"), ("s", (), "float32"), ("z", (), "uint8")],
            {"x": halfway((4096,), scale), "s": scalar(scale), "z": scalar(128, "uint8")},
            opset=13,
        )
        for scale in (0.3, 0.0123)
    ],
    _case(
        "quantize-special-values",
        "QuantizeLinear",
        [("x", (12,), "float32")],
        {"x": _SPECIAL},
        initializers={"s": scalar(1.0), "z": scalar(3, "int8")},
        opset=13,
    ),
    _case("quantize-no-zero-point", "QuantizeLinear", [X], initializers={"s": scalar(0.01)}, opset=13),
    _case(
        "quantize-per-axis",
        "QuantizeLinear",
        [X],
        attrs={"axis": 1},
        initializers={"s": np.array([0.01, 0.02, 0.05], np.float32), "z": np.array([-3, 0, 9], np.int8)},
        opset=13,
    ),
    _case(
        "quantize-per-axis-last",
        "QuantizeLinear",
        [X, ("s", (5,), "float32"), ("z", (5,), "uint8")],
        {"s": np.linspace(0.005, 0.05, 5).astype(np.float32), "z": ints((5,), "uint8")},
        {"axis": -1},
        opset=19,
    ),
    _case("quantize-int16", "QuantizeLinear", [X], initializers={"s": scalar(1e-4), "z": scalar(-300, "int16")}),
    _case(
        "quantize-uint16",
        "QuantizeLinear",
        [X],
        {"x": rand(2, 3, 4, 5, scale=4.0)},
        initializers={"s": scalar(1e-4), "z": scalar(30000, "uint16")},
    ),
    _case(
        "quantize-output-dtype",
        "QuantizeLinear",
        [X],
        attrs={"output_dtype": TensorProto.INT8},
        initializers={"s": scalar(0.02)},
    ),
    _case(
        "quantize-blocked",
        "QuantizeLinear",
        [X, ("s", (2, 2, 4, 5), "float32"), ("z", (2, 2, 4, 5), "int8")],
        {"s": rand(2, 2, 4, 5, positive=True, scale=0.02), "z": ints((2, 2, 4, 5), "int8", low=-20, high=20)},
        {"axis": 1, "block_size": 2},
        onnxruntime=False,
    ),
    _case(
        "quantize-blocked-last",
        "QuantizeLinear",
        [X, ("s", (2, 3, 4, 3), "float32")],
        {"s": rand(2, 3, 4, 3, positive=True, scale=0.02)},
        {"axis": -1, "block_size": 2, "output_dtype": TensorProto.UINT16},
        onnxruntime=False,
    ),
    _case(
        "quantize-float16-x",
        "QuantizeLinear",
        [("x", (4, 5), "float16")],
        {"x": rand(4, 5).astype(F16)},
        initializers={"s": scalar(0.01), "z": scalar(5, "uint8")},
        onnxruntime=False,
    ),
    _case(
        "quantize-float16-division",
        "QuantizeLinear",
        [("x", (4096,), "float16"), ("s", (), "float16")],
        {"x": halfway((4096,), 0.3).astype(F16), "s": scalar(0.3, "float16")},
        onnxruntime=False,
    ),
    _case(
        "quantize-int32-x",
        "QuantizeLinear",
        [("x", (4, 5), "int32")],
        {"x": ints((4, 5), "int32", low=-900, high=900)},
        initializers={"s": scalar(3.0), "z": scalar(1, "int8")},
        onnxruntime=False,
    ),
    _case(
        "quantize-precision-float16",
        "QuantizeLinear",
        [("x", (4096,), "float32")],
        {"x": halfway((4096,), 0.3)},
        {"precision": TensorProto.FLOAT16},
        {"s": scalar(0.3)},
        opset=25,
        onnxruntime=False,
    ),
]

# ------------------------------------------------------------------------------------------ DequantizeLinear


def _dequantize(
    id: str,
    dtype: str,
    shape=(2, 3, 4, 5),
    attrs=None,
    scale=None,
    zero=None,
    opset: int = 21,
    *,
    as_inputs: bool = False,
    **kwargs,
) -> OpCase:
    scale = scalar(0.02) if scale is None else scale
    params = {"s": scale, **({} if zero is None else {"z": zero})}
    if as_inputs:
        inputs = [("x", shape, dtype), *[(name, value.shape, value.dtype) for name, value in params.items()]]
        return _case(id, "DequantizeLinear", inputs, {"x": ints(shape, dtype), **params}, attrs, opset=opset, **kwargs)
    return _case(
        id, "DequantizeLinear", [("x", shape, dtype)], {"x": ints(shape, dtype)}, attrs, params, opset, **kwargs
    )


DEQUANTIZE_CASES: list[OpCase] = [
    _dequantize("dequantize-uint8-opset10", "uint8", zero=scalar(131, "uint8"), opset=10),
    _dequantize("dequantize-int8-inputs", "int8", zero=scalar(-3, "int8"), as_inputs=True, opset=13),
    _dequantize("dequantize-no-zero-point", "int8", opset=13),
    _dequantize("dequantize-int16", "int16", zero=scalar(-1000, "int16")),
    _dequantize("dequantize-uint16", "uint16", zero=scalar(40000, "uint16"), as_inputs=True),
    _dequantize("dequantize-int32", "int32", scale=scalar(1e-6), opset=13),
    _dequantize(
        "dequantize-int32-zero-point", "int32", scale=scalar(1e-3), zero=scalar(123456, "int32"), onnxruntime=False
    ),
    _dequantize(
        "dequantize-per-axis",
        "uint8",
        attrs={"axis": 1},
        scale=np.array([0.1, 0.02, 0.3], np.float32),
        zero=np.array([0, 128, 255], np.uint8),
        opset=13,
    ),
    _dequantize(
        "dequantize-per-axis-negative",
        "int8",
        attrs={"axis": -2},
        scale=rand(4, positive=True),
        zero=ints((4,), "int8"),
        as_inputs=True,
        opset=19,
    ),
    _dequantize(
        "dequantize-blocked",
        "int8",
        attrs={"axis": 3, "block_size": 2},
        scale=rand(2, 3, 4, 3, positive=True),
        zero=ints((2, 3, 4, 3), "int8"),
        onnxruntime=False,
    ),
    _dequantize(
        "dequantize-float16-scale", "uint8", scale=scalar(0.0123, "float16"), zero=scalar(7, "uint8"), opset=19
    ),
    _dequantize(
        "dequantize-output-float16",
        "int8",
        attrs={"output_dtype": TensorProto.FLOAT16},
        scale=scalar(0.0123),
        opset=23,
        onnxruntime=False,
    ),
]

# ------------------------------------------------------------------------------------- DynamicQuantizeLinear


def _extremes_at(x: np.ndarray, low: int, high: int) -> np.ndarray:
    """x with its smallest value at flat index `low` and its largest at `high`."""
    flat = x.reshape(-1).copy()
    flat[low], flat[high] = flat.min() - 1, flat.max() + 1
    return flat.reshape(x.shape)


DYNAMIC_CASES: list[OpCase] = [
    _case(
        f"dynamic-quantize-{id}",
        "DynamicQuantizeLinear",
        [("x", (3, 4, 5), "float32")],
        {"x": x},
        opset=11,
        outputs=("y", "y_scale", "y_zero_point"),
    )
    for id, x in [
        ("random", rand(3, 4, 5, scale=3.0)),
        ("positive", rand(3, 4, 5, positive=True)),
        ("negative", -rand(3, 4, 5, positive=True, scale=7.0)),
        ("zeros", np.zeros((3, 4, 5), np.float32)),
        ("halfway", halfway((3, 4, 5), 0.3) * np.float32(0.01)),
    ]
] + [
    # 259 elements: 16 blocks of MIN_MAX_LANES and a tail of 3, the minimum in a block's last lane, the maximum in
    # the tail.
    _case(
        "dynamic-quantize-blocks-and-tail",
        "DynamicQuantizeLinear",
        [("x", (7, 37), "float32")],
        {"x": _extremes_at(rand(7, 37, scale=2.0), low=31, high=257)},
        opset=11,
        outputs=("y", "y_scale", "y_zero_point"),
    )
]

# ------------------------------------------------------------------------------ MatMulInteger, QLinearMatMul


def _matmul_integer(
    id: str, a_shape, b_shape, a_dtype: str = "uint8", b_dtype: str = "uint8", b_zero_shape=(), zero_points: bool = True
) -> OpCase:
    inputs = [("A", a_shape, a_dtype), ("B", b_shape, b_dtype)]
    if zero_points:
        inputs += [("a_zero_point", (), a_dtype), ("b_zero_point", b_zero_shape, b_dtype)]
    feeds = {name: ints(shape, dtype, seed) for seed, (name, shape, dtype) in enumerate(inputs)}
    return _integer_case(id, "MatMulInteger", inputs, feeds)


MATMUL_INTEGER_CASES: list[OpCase] = [
    _matmul_integer("matmul-integer-uint8", (4, 7), (7, 5)),
    _matmul_integer("matmul-integer-int8", (4, 7), (7, 5), "int8", "int8"),
    _matmul_integer("matmul-integer-uint8-int8", (4, 7), (7, 5), "uint8", "int8"),
    _matmul_integer("matmul-integer-per-column", (4, 7), (7, 5), b_zero_shape=(5,)),
    _matmul_integer("matmul-integer-batched", (2, 3, 4, 7), (7, 5), "uint8", "int8"),
    _matmul_integer("matmul-integer-no-zero-points", (3, 4, 7), (3, 7, 5), zero_points=False),
    _matmul_integer("matmul-integer-vector", (7,), (7, 5)),
    # Through IntGemm (k whole groups of four, columns whole vectors): units of 64, 32 and 16 columns, edge rows,
    # k past whole vectors of row sums, every signedness, zero points per column and none.
    _matmul_integer("int-gemm-uint8", (2, 9, 64), (64, 128), b_zero_shape=(128,)),
    _matmul_integer("int-gemm-int8", (13, 36), (36, 96), "int8", "int8", b_zero_shape=(96,)),
    _matmul_integer("int-gemm-uint8-int8", (7, 132), (132, 48), "uint8", "int8"),
    _matmul_integer("int-gemm-int8-uint8", (1, 4), (4, 16), "int8", "uint8"),
    _matmul_integer("int-gemm-no-zero-points", (3, 5, 8), (8, 32), "uint8", "int8", zero_points=False),
    _matmul_integer("int-gemm-rest-columns", (5, 12), (12, 100), "int8", "int8", b_zero_shape=(100,)),
]


def _qlinear_matmul(
    id: str,
    a_shape,
    b_shape,
    dtype: str = "uint8",
    scale_dtype: str = "float32",
    per_column: bool = False,
    opset: int = 10,
) -> OpCase:
    columns = b_shape[-1]
    column_shape = (columns,) if per_column else ()
    inputs = [
        ("a", a_shape, dtype),
        ("a_scale", (), scale_dtype),
        ("a_zero_point", (), dtype),
        ("b", b_shape, dtype),
        ("b_scale", column_shape, scale_dtype),
        ("b_zero_point", column_shape, dtype),
        ("y_scale", (), scale_dtype),
        ("y_zero_point", (), dtype),
    ]
    feeds = {
        "a": ints(a_shape, dtype, 0),
        "a_scale": scalar(0.0213, scale_dtype),
        "a_zero_point": ints((), dtype, 1),
        "b": ints(b_shape, dtype, 2),
        "b_scale": rand(*column_shape, positive=True, scale=0.01).astype(scale_dtype),
        "b_zero_point": ints(column_shape, dtype, 3),
        "y_scale": scalar(0.9, scale_dtype),
        "y_zero_point": ints((), dtype, 4),
    }
    return _integer_case(id, "QLinearMatMul", inputs, feeds, opset=opset)


QLINEAR_MATMUL_CASES: list[OpCase] = [
    _qlinear_matmul("qlinear-matmul-uint8", (4, 16), (16, 6)),
    _qlinear_matmul("qlinear-matmul-int8", (4, 16), (16, 6), "int8"),
    _qlinear_matmul("qlinear-matmul-per-column", (4, 16), (16, 6), "int8", per_column=True),
    _qlinear_matmul("qlinear-matmul-batched", (2, 5, 16), (16, 6)),
    _qlinear_matmul("qlinear-matmul-float16-scales", (3, 4, 16), (3, 16, 6), "int8", "float16", opset=21),
    # Through IntGemm, requantizing as it stores: units of 64 and a rest of columns, per-column scales.
    _qlinear_matmul("qlinear-int-gemm-per-column", (2, 7, 36), (36, 100), "int8", per_column=True),
]

# ------------------------------------------------------------------------------------ ConvInteger, QLinearConv


def _conv_integer(
    id: str, x_shape, w_shape, attrs=None, dtype: str = "uint8", w_dtype: str = "uint8", w_zero_shape=(1,)
) -> OpCase:
    inputs = [
        ("x", x_shape, dtype),
        ("w", w_shape, w_dtype),
        ("x_zero_point", (), dtype),
        ("w_zero_point", w_zero_shape, w_dtype),
    ]
    feeds = {name: ints(shape, dtype, seed) for seed, (name, shape, dtype) in enumerate(inputs)}
    return _integer_case(id, "ConvInteger", inputs, feeds, attrs)


CONV_INTEGER_CASES: list[OpCase] = [
    _conv_integer("conv-integer-pads", (1, 3, 7, 7), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv_integer(
        "conv-integer-strides-dilations",
        (2, 3, 9, 8),
        (4, 3, 3, 2),
        {"strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 2, 0]},
    ),
    _conv_integer("conv-integer-group", (1, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "auto_pad": "SAME_UPPER"}),
    _conv_integer(
        "conv-integer-per-channel", (1, 3, 6, 6), (4, 3, 1, 1), dtype="uint8", w_dtype="int8", w_zero_shape=(4,)
    ),
    # Through IntGemm (k = channels x taps whole groups of four): units of 64 pixels, all pixels in one partial
    # unit (5x5, 2x2), row blocks of 64 output channels, batches, every signedness, per-channel zero points.
    _conv_integer(
        "int-conv-uint8-int8",
        (1, 4, 8, 8),
        (128, 4, 3, 3),
        {"pads": [1, 1, 1, 1]},
        w_dtype="int8",
        w_zero_shape=(128,),
    ),
    _conv_integer(
        "int-conv-strided-batched",
        (2, 8, 10, 9),
        (6, 8, 3, 3),
        {"strides": [2, 2], "pads": [1, 0, 1, 1]},
        dtype="int8",
        w_dtype="int8",
    ),
    _conv_integer(
        "int-conv-pointwise", (1, 16, 2, 2), (64, 16, 1, 1), dtype="int8", w_dtype="uint8", w_zero_shape=(64,)
    ),
    _conv_integer("int-conv-dilated", (1, 4, 9, 9), (5, 4, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    _conv_integer(
        "int-conv-pixels-as-rows",
        (2, 12, 3, 3),
        (80, 12, 3, 3),
        {"pads": [1, 1, 0, 0]},
        dtype="int8",
        w_dtype="int8",
        w_zero_shape=(80,),
    ),
    _conv_integer("int-conv-7x7-rgb", (1, 3, 12, 12), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    _conv_integer(
        "int-conv-rest-pixels", (2, 4, 14, 14), (8, 4, 1, 1), dtype="uint8", w_dtype="int8", w_zero_shape=(8,)
    ),
]


def _qlinear_conv(
    id: str, x_shape, w_shape, attrs=None, dtype: str = "uint8", per_channel: bool = False, bias: bool = True
) -> OpCase:
    channels = w_shape[0]
    channel_shape = (channels,) if per_channel else ()
    inputs = [
        ("x", x_shape, dtype),
        ("x_scale", (), "float32"),
        ("x_zero_point", (), dtype),
        ("w", w_shape, dtype),
        ("w_scale", channel_shape, "float32"),
        ("w_zero_point", channel_shape, dtype),
        ("y_scale", (), "float32"),
        ("y_zero_point", (), dtype),
    ] + ([("B", (channels,), "int32")] if bias else [])
    feeds = {
        "x": ints(x_shape, dtype, 0),
        "x_scale": scalar(0.0213),
        "x_zero_point": ints((), dtype, 1),
        "w": ints(w_shape, dtype, 2),
        "w_scale": rand(*channel_shape, positive=True, scale=0.01),
        "w_zero_point": ints(channel_shape, dtype, 3),
        "y_scale": scalar(0.9),
        "y_zero_point": ints((), dtype, 4),
        "B": ints((channels,), "int32", 5, -3000, 3000),
    }
    return _integer_case(id, "QLinearConv", inputs, feeds, attrs)


QLINEAR_CONV_CASES: list[OpCase] = [
    _qlinear_conv("qlinear-conv-uint8", (1, 3, 7, 7), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    _qlinear_conv(
        "qlinear-conv-int8-per-channel", (2, 3, 8, 9), (5, 3, 3, 3), {"strides": [2, 2]}, "int8", per_channel=True
    ),
    # Through IntGemm, requantizing as it stores: output channels as rows (per-channel scales per row), and
    # pixels as rows (per-channel scales per column, the output written transposed).
    _qlinear_conv("qlinear-int-conv-rows", (1, 16, 9, 9), (70, 16, 3, 3), {"pads": [1, 1, 1, 1]}, per_channel=True),
    _qlinear_conv(
        "qlinear-int-conv-pixels-as-rows", (2, 20, 4, 4), (72, 20, 3, 3), {"strides": [2, 2]}, "int8", per_channel=True
    ),
    _qlinear_conv(
        "qlinear-conv-depthwise",
        (1, 4, 6, 6),
        (4, 1, 3, 3),
        {"group": 4, "pads": [1, 1, 1, 1]},
        per_channel=True,
        bias=False,
    ),
]

# ------------------------------------------------------------------------------------------ a QDQ model


def _quantized_weights(weights: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights and per-channel scales along `axis`, as quantize_static's per_channel option makes."""
    others = tuple(i for i in range(weights.ndim) if i != axis)
    scale = (np.abs(weights).max(axis=others) / 127).astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(weights.ndim)]
    return np.clip(np.rint(weights / scale.reshape(shape)), -127, 127).astype(np.int8), scale


def qdq_model(opset: int) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv (int8 weights and int32 bias through DequantizeLinear) -> Relu -> Q -> DQ -> Flatten ->
    Q -> DQ -> MatMul (int8 weights through DequantizeLinear) -> Q -> DQ: QuantFormat.QDQ's layout."""
    conv_w, conv_w_scale = _quantized_weights(rand(8, 3, 3, 3, seed=1), 0)
    fc_w, fc_w_scale = _quantized_weights(rand(8 * 6 * 6, 10, seed=2, scale=0.1), 1)
    x_scale, act_scale, out_scale = np.float32(0.02), np.float32(0.05), np.float32(0.1)
    conv_b = np.rint(rand(8, seed=3) / (x_scale * conv_w_scale)).astype(np.int32)
    inits = {
        "x_s": scalar(x_scale),
        "x_z": scalar(128, "uint8"),
        "cw": conv_w,
        "cw_s": conv_w_scale,
        "cw_z": np.zeros(8, np.int8),
        "cb": conv_b,
        "cb_s": (x_scale * conv_w_scale).astype(np.float32),
        "cb_z": np.zeros(8, np.int32),
        "a_s": scalar(act_scale),
        "a_z": scalar(0, "uint8"),
        "fw": fc_w,
        "fw_s": fc_w_scale,
        "fw_z": np.zeros(10, np.int8),
        "o_s": scalar(out_scale),
        "o_z": scalar(128, "uint8"),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["cw", "cw_s", "cw_z"], ["cwd"], axis=0),
        helper.make_node("DequantizeLinear", ["cb", "cb_s", "cb_z"], ["cbd"], axis=0),
        helper.make_node("Conv", ["xd", "cwd", "cbd"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "a_s", "a_z"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "a_s", "a_z"], ["rd"]),
        helper.make_node("Flatten", ["rd"], ["f"]),
        helper.make_node("QuantizeLinear", ["f", "a_s", "a_z"], ["fq"]),
        helper.make_node("DequantizeLinear", ["fq", "a_s", "a_z"], ["fd"]),
        helper.make_node("DequantizeLinear", ["fw", "fw_s", "fw_z"], ["fwd"], axis=1),
        helper.make_node("MatMul", ["fd", "fwd"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "o_s", "o_z"], ["mq"]),
        helper.make_node("DequantizeLinear", ["mq", "o_s", "o_z"], ["y"]),
    ]
    return graph_model(nodes, [("x", (2, 3, 12, 12))], ["y"], inits, opset=opset)


REFERENCE_OPSET = 21
"""ONNX's reference evaluator implements DequantizeLinear from opset 19 on, so a QDQ model is evaluated at this opset,
where ONNX's version converter takes it (QuantizeLinear and DequantizeLinear mean the same there for uint8 and int8
with float32 scales)."""


def qdq_reference(model: onnx.ModelProto) -> Reference:
    """The spec's answer for a QDQ model: ONNX's reference evaluator, at REFERENCE_OPSET. Not onnxruntime, which
    fuses each DequantizeLinear -> Conv/MatMul -> QuantizeLinear into its integer kernels: those saturate on CPUs
    without VNNI (`_integer_case`)."""
    return onnx_reference(version_converter.convert_version(model, REFERENCE_OPSET))


def _qdq_case(opset: int) -> OpCase:
    model = qdq_model(opset)
    return case(
        f"qdq-conv-matmul-opset{opset}", model, {"x": rand(2, 3, 12, 12, seed=4)}, reference=qdq_reference(model)
    )


# A small plane of many channels, its pixels the columns: its im2col's rows unrolled at lowering
# (integer_gemm._unrolled_row_copies_im2col), padding on every side, asymmetric.
UNROLLED_IM2COL_CASES: list[OpCase] = [
    _conv_integer(
        f"int-conv-unrolled-rows-{id}", (1, 16, 8, 8), (24, 16, 3, 3), attrs, w_dtype="int8", w_zero_shape=(24,)
    )
    for id, attrs in [("pads", {"pads": [1, 1, 1, 1]}), ("asymmetric-pads", {"pads": [2, 0, 0, 2]})]
]

# Constant weights, which a CPU build packs into IntGemm panels (L.IntGemm.b_panels): a conv with its pixels as
# rows, a MatMulInteger of uint8 weights (flipped as packed).
PACKED_WEIGHT_CASES: list[OpCase] = [
    _case(
        "int-conv-packed-weights",
        "ConvInteger",
        [("x", (1, 16, 4, 4), "uint8"), ("x_zero_point", (), "uint8")],
        {"x": ints((1, 16, 4, 4), "uint8", 0), "x_zero_point": ints((), "uint8", 1)},
        {"pads": [1, 1, 1, 1]},
        {"w": ints((32, 16, 3, 3), "int8", 2), "w_zero_point": ints((32,), "int8", 3)},
        opset=10,
        onnxruntime=False,
        node_inputs=["x", "w", "x_zero_point", "w_zero_point"],
    ),
    _case(
        "int-gemm-packed-weights",
        "MatMulInteger",
        [("A", (3, 5, 32), "uint8"), ("a_zero_point", (), "uint8")],
        {"A": ints((3, 5, 32), "uint8", 0), "a_zero_point": ints((), "uint8", 1)},
        initializers={"B": ints((32, 48), "uint8", 2), "b_zero_point": ints((48,), "uint8", 3)},
        opset=10,
        onnxruntime=False,
        node_inputs=["A", "B", "a_zero_point", "b_zero_point"],
    ),
    # Several units of whole panels: a CPU reads each unit's panels from its first column times k, OpenCL reads B as
    # stored (it read the panels' offsets, wrong sums, until the twelfth session of issue 32).
    _case(
        "int-gemm-packed-weights-units",
        "MatMulInteger",
        [("A", (2, 7, 96), "uint8")],
        {"A": ints((2, 7, 96), "uint8", 0)},
        initializers={"B": ints((96, 80), "int8", 2)},
        opset=10,
        onnxruntime=False,
        node_inputs=["A", "B"],
    ),
]

QDQ_CASES: list[OpCase] = [_qdq_case(opset) for opset in (13, 21)]

CASES: list[OpCase] = (
    QUANTIZE_CASES
    + DEQUANTIZE_CASES
    + DYNAMIC_CASES
    + MATMUL_INTEGER_CASES
    + QLINEAR_MATMUL_CASES
    + CONV_INTEGER_CASES
    + QLINEAR_CONV_CASES
    + PACKED_WEIGHT_CASES
    + UNROLLED_IM2COL_CASES
    + QDQ_CASES
)


@pytest.mark.parametrize("c", params(CASES))
def test_matches_the_reference(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


@pytest.mark.parametrize(
    "c", params(CONV_INTEGER_CASES + QLINEAR_CONV_CASES + MATMUL_INTEGER_CASES + UNROLLED_IM2COL_CASES + QDQ_CASES)
)
def test_every_launch_split_across_threads_gives_the_same_bytes(
    c: OpCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integer kernels' launches (im2col rows, IntGemm units) cut into ranges on two threads, however small:
    the same outputs as one thread. Only the thresholds that decide whether to split are lowered, so that these
    small cases split at all (a model's launches split with the defaults)."""
    result = check_case(c, tmp_path)
    monkeypatch.setattr(runtime_model, "MIN_SPLIT_WORK_FOR_THREADS", 0)
    monkeypatch.setattr(runtime_model, "MIN_WORK_PER_RANGE", 1)
    feeds = dict(c.feeds) if c.feeds is not None else random_feeds(c.model)
    one = farm.runtime.load(result.artifact, cache_dir=tmp_path / "cache", threads=1).run(feeds)
    split = farm.runtime.load(result.artifact, cache_dir=tmp_path / "cache", threads=2)
    assert split._pool is not None, "the launches were not split"
    for _ in range(3):
        outputs = split.run(feeds)
        assert all(np.array_equal(outputs[name], one[name]) for name in one)


# One case per op, and the exact divisions (OpenCL renders them in double: its float division may be 2.5 ulp off).
OPENCL_SAMPLE = [
    "quantize-halfway-0.3",
    "quantize-blocked",
    "dequantize-per-axis",
    "dynamic-quantize-halfway",
    "matmul-integer-per-column",
    "int-gemm-int8",
    "int-gemm-packed-weights-units",
    "conv-integer-group",
    "int-conv-strided-batched",
    "int-conv-pixels-as-rows",
    "qlinear-int-conv-pixels-as-rows",
    "qlinear-int-gemm-per-column",
    "qlinear-matmul-float16-scales",
    "qlinear-conv-int8-per-channel",
    "qdq-conv-matmul-opset21",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_the_reference(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


@pytest.mark.parametrize("c", params(QDQ_CASES))
def test_qdq_model_runs_activation_quantization(c: OpCase, tmp_path) -> None:
    """The Conv (with its Relu) and the MatMul run on their integers, requantizing into their QuantizeLinear's
    output (farm.frontend.passes.qdq_fusion): only x's and the Flatten's QuantizeLinear and the DequantizeLinear
    before the Flatten and the output's run as kernels of their own."""
    ops = scheduled_ops(check_case(c, tmp_path))
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 2
    assert ops.count("QLinearConv") == 1 and ops.count("QLinearMatMul") == 1


@pytest.mark.parametrize("c", params(MATMUL_INTEGER_CASES))
def test_the_integer_reference_is_exact(c: OpCase) -> None:
    """The premise of `_integer_case`: ONNX's reference gives the exact sums of integer products (int64 numpy)."""

    def shifted(data: str, zero_point: str) -> np.ndarray:
        return c.feeds[data].astype(np.int64) - (c.feeds[zero_point] if zero_point in c.feeds else 0)

    exact = shifted("A", "a_zero_point") @ shifted("B", "b_zero_point")
    np.testing.assert_array_equal(c.reference(c.feeds)["y"], exact)


UNIT_ROUNDOFF = 2.0**-24
"""float32's unit roundoff u: an operation's rounding moves its result by at most u times its magnitude."""


@pytest.mark.parametrize("c", params(QDQ_CASES))
def test_qdq_cases_quantize_alike_in_any_summation_order(c: OpCase) -> None:
    """What lets a QDQ case be compared with its reference exactly, on every CPU. farm's float32 Conv and MatMul sum
    in another order than the reference's BLAS does (and in another on each ISA: vector width, FMA, GEMM tiles), so
    their outputs differ in the last bits, and the QuantizeLinear after each gives the same integers only where its
    input is further from a rounding boundary than that. The case's data keeps every element so: anything within the
    summation error bound of the reference's value quantizes as the value does. (The other QuantizeLinear inputs are
    elementwise results, rounded once each as IEEE arithmetic says, so the same everywhere.)"""
    model = version_converter.convert_version(c.model, REFERENCE_OPSET)
    names = [name for node in model.graph.node for name in node.output]
    values = {
        **dict(c.feeds),
        **{t.name: numpy_helper.to_array(t) for t in model.graph.initializer},
        **dict(zip(names, ReferenceEvaluator(model).run(names, dict(c.feeds)))),
    }
    producers = {name: node for node in model.graph.node for name in node.output}
    checked = 0
    for quantize in (node for node in model.graph.node if node.op_type == "QuantizeLinear"):
        relu = producers.get(quantize.input[0])
        relu = relu if relu is not None and relu.op_type == "Relu" else None
        accumulation = producers.get(relu.input[0] if relu else quantize.input[0])
        if accumulation is None or accumulation.op_type not in ("Conv", "MatMul"):
            continue
        value, bound = values[accumulation.output[0]], summation_error_bound(accumulation, values)
        scale, zero_point = values[quantize.input[1]], values[quantize.input[2]]
        low, high = (_quantize(value + sign * bound, scale, zero_point, relu is not None) for sign in (-1, 1))
        assert np.array_equal(low, high), f"{quantize.input[0]}: {int((low != high).sum())} elements near a boundary"
        checked += 1
    assert checked == 2


def summation_error_bound(node: onnx.NodeProto, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """How far two float32 evaluations of a Conv or MatMul output, summing their n terms in any orders, with FMA or
    without, may lie apart: twice gamma_n * sum |terms|, gamma_n = n u / (1 - n u), each one's bound from the exact
    sum (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5). The sums of magnitudes are the
    node run in float64 on its inputs' magnitudes, and n, per output, the node run on ones."""
    magnitudes = {name: np.abs(values[name]).astype(np.float64) for name in node.input}
    single = onnx_reference(
        graph_model([node], [(name, v.shape, v.dtype) for name, v in magnitudes.items()], list(node.output))
    )
    sums = single(magnitudes)[node.output[0]]
    terms = single({name: np.ones_like(v) for name, v in magnitudes.items()})[node.output[0]]
    return 2 * terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF) * sums


def _quantize(value: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, relu: bool) -> np.ndarray:
    """QuantizeLinear (after Relu where `relu`) of `value` rounded to float32, as the spec computes it: each step is
    monotonic, so what lies between two values quantizes between their results."""
    x = np.float32(np.maximum(value, 0) if relu else value)
    info = np.iinfo(zero_point.dtype)
    return np.clip(np.rint(x / scale) + zero_point.astype(np.int64), info.min, info.max)


def test_round_to_half_matches_numpy() -> None:
    """round_to_half rounds every float32 as numpy's float16 conversion does (ties, subnormals, overflow)."""
    from farm.ops import mathfns as M

    values = np.concatenate(
        [
            rand(2000, scale=1000.0),
            rand(2000, scale=1e-5),
            halfway((500,), 2.0**-8),
            np.float32([65504, 65519.99, 65520, 1e9, -1e9, 2.0**-25, 3 * 2.0**-26, 0.0]),
        ]
    )
    scope = M.Scope(L.Names())
    x = L.Var("x", L.F32)
    expr = round_to_half(scope, x)
    results = [_evaluate(scope.stmts, expr, float(value)) for value in values]
    np.testing.assert_array_equal(np.float32(results), values.astype(F16).astype(np.float32))


def _evaluate(stmts: list[L.Stmt], expr: L.Expr, x: float) -> float:
    """A float32 interpretation of straight-line loop IR (assignments, then an expression) at x."""
    env = {"x": np.float32(x)}
    for stmt in stmts:
        env[stmt.var.name] = _value(stmt.value, env)
    return _value(expr, env)


def _value(e: L.Expr, env: dict) -> np.float32:
    f32 = np.float32
    if isinstance(e, L.Const):
        return f32(e.value)
    if isinstance(e, L.Var):
        return env[e.name]
    if isinstance(e, L.Call):
        return f32(np.floor(_value(e.arg, env)))
    if isinstance(e, L.Select):
        return _value(e.if_true, env) if _value(e.cond, env) else _value(e.if_false, env)
    lhs, rhs = _value(e.lhs, env), _value(e.rhs, env)
    ops = {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "div": np.divide,
        "lt": np.less,
        "le": np.less_equal,
        "gt": np.greater,
        "ge": np.greater_equal,
        "eq": np.equal,
        "or": np.logical_or,
        "and": np.logical_and,
    }
    with np.errstate(all="ignore"):
        return ops[e.op](lhs, rhs)


# ------------------------------------------------------------------------------------------------ refusals

UNSUPPORTED = [
    pytest.param(
        single_op_model("QuantizeLinear", [X], {"output_dtype": TensorProto.INT4}, {"s": scalar(0.1)}, opset=21),
        "int4",
        id="quantize-int4",
    ),
    pytest.param(
        single_op_model(
            "QuantizeLinear", [X], {"axis": 1, "block_size": 2}, {"s": rand(2, 3, 4, 5, positive=True)}, opset=21
        ),
        "block_size 2 on axis 1 of \\[2, 3, 4, 5\\] needs \\[2, 2, 4, 5\\]",
        id="quantize-blocked-shape",
    ),
    pytest.param(
        single_op_model("QuantizeLinear", [X], {"precision": TensorProto.BFLOAT16}, {"s": scalar(0.1)}, opset=25),
        "a division in bfloat16 is not supported",
        id="quantize-precision-bfloat16",
    ),
    pytest.param(
        single_op_model(
            "DequantizeLinear", [("x", (4, 5), "int8")], {"axis": 1}, {"s": rand(4, positive=True)}, opset=13
        ),
        "per-axis quantization on axis 1 of \\[4, 5\\] needs \\[5\\]",
        id="dequantize-axis-length",
    ),
    pytest.param(
        single_op_model(
            "MatMulInteger",
            [("A", (4, 7), "uint8"), ("B", (7, 5), "uint8")],
            {},
            {"a_zero_point": ints((4,), "uint8")},
            opset=10,
        ),
        "farm takes one value",
        id="matmul-integer-per-row",
    ),
    pytest.param(
        single_op_model("ConvInteger", [("x", (1, 3, 7), "uint8"), ("w", (2, 3, 3), "uint8")], {}, opset=10),
        "must be 4-D tensors",
        id="conv-integer-1d",
    ),
    pytest.param(
        single_op_model(
            "ConvInteger",
            [("x", (1, 3, 7, 7), "uint8"), ("w", (2, 3, 3, 3), "uint8")],
            {"kernel_shape": [2, 2]},
            opset=10,
        ),
        "kernel_shape \\[2, 2\\] differs from the weight's \\[3, 3\\]",
        id="conv-integer-kernel-shape",
    ),
    pytest.param(
        single_op_model(
            "QLinearMatMul",
            [("a", (4, 7), "uint8"), ("b", (7, 5), "uint8")],
            {},
            {
                "a_scale": rand(4, positive=True),
                "a_zero_point": scalar(0, "uint8"),
                "b_scale": scalar(0.1),
                "b_zero_point": scalar(0, "uint8"),
                "y_scale": scalar(1.0),
                "y_zero_point": scalar(0, "uint8"),
            },
            opset=10,
            node_inputs=["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"],
        ),
        "farm takes one value",
        id="qlinear-matmul-per-row",
    ),
]


@pytest.mark.parametrize("model, message", UNSUPPORTED)
def test_unsupported_variants_are_refused_clearly(model, message: str, tmp_path) -> None:
    assert_unsupported(model, message, tmp_path)


def test_hostile_axis_is_refused(tmp_path) -> None:
    assert_refused(
        hostile_op_model("QuantizeLinear", {"axis": 2**40}, {"s": rand(2, positive=True)}, opset=13),
        "axis 1099511627776 is out of range",
        tmp_path,
    )


def test_quantized_values_convert_from_float_to_int32(tmp_path: Path) -> None:
    """saturate's values (every quantized range fits int32) convert to int32: AVX2 has a vector instruction for
    that and none for int64, to which LLVM converted a QuantizeLinear's values one at a time."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    y = helper.make_tensor_value_info("y", TensorProto.UINT8, [4, 64])
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    graph = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s"], ["y"])], "q", [x], [y], [scale])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), tmp_path / "q.onnx")
    [spec] = [spec for spec in plan_model(tmp_path / "q.onnx").kernels().values() if spec.op == "QuantizeLinear"]
    text = kernel_module_ir([("farm_k_test", lower_kernel(spec))], host())
    assert re.findall(r"fptosi \S+ %\S+ to (\S+)", text) == ["i32"]
