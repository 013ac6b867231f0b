"""farm.ops.nn against onnxruntime: Conv, ConvTranspose, Gemm, MatMul, pools, LRN, BatchNormalization, the
softmax family (Softmax, LogSoftmax, Hardmax) and the normalisations (Layer, Instance, Group, MeanVariance, Lp), one
op per model over their attribute variants; then activations fused into their producer by the passes; a sample
also on OpenCL."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numerics import (
    IR_VERSION,
    OpCase,
    assert_close,
    assert_refused,
    case,
    check_case,
    check_case_on_opencl,
    graph_model,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)
from onnx import TensorProto, helper, numpy_helper

from farm.build.assembly import plan_model
from farm.ir.specs import KernelSpec
from farm.ops import LOWERINGS, nn

# ---------------------------------------------------------------------------------------------------------- Conv


def _conv(id: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict | None = None, bias: bool = True,
          opset: int = 17) -> OpCase:
    initializers = {"w": rand(*w, seed=1, scale=1.0 / np.sqrt(np.prod(w[1:])))}
    if bias:
        initializers["b"] = rand(w[0], seed=2)
    return case(f"conv-{id}", single_op_model("Conv", [("x", x)], attrs or {}, initializers, opset))


CONV_CASES: list[OpCase] = [
    _conv("1x1", (1, 8, 10, 10), (16, 8, 1, 1), bias=False),
    _conv("1x1-bias", (1, 8, 10, 10), (16, 8, 1, 1)),
    _conv("1x1-stride2", (1, 8, 9, 9), (4, 8, 1, 1), {"strides": [2, 2]}),
    _conv("1x1-padded", (1, 3, 5, 5), (4, 3, 1, 1), {"pads": [1, 1, 1, 1]}),
    _conv("1x1-groups2", (1, 8, 6, 6), (6, 4, 1, 1), {"group": 2}),
    _conv("3x3-pads", (1, 8, 10, 10), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("3x3-no-pads", (1, 4, 9, 7), (5, 4, 3, 3), bias=False),
    _conv("3x3-kernel-shape-attr", (1, 4, 8, 8), (5, 4, 3, 3), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    _conv("3x3-stride2", (1, 8, 11, 11), (12, 8, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv("3x3-stride2-asymmetric-pads", (2, 8, 11, 11), (20, 8, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),
    _conv("3x3-asymmetric-pads", (1, 3, 7, 9), (4, 3, 3, 3), {"pads": [0, 2, 1, 0]}),
    _conv("3x3-strides-1-2", (1, 3, 9, 9), (4, 3, 3, 3), {"strides": [1, 2], "pads": [1, 1, 1, 1]}),
    _conv("3x3-dilation2", (1, 8, 10, 10), (5, 8, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 2, 1]}, bias=False),
    _conv("3x3-dilation-2-3", (1, 3, 12, 13), (4, 3, 3, 3), {"dilations": [2, 3], "pads": [2, 3, 2, 3]}),
    _conv("3x3-dilation2-stride2", (1, 3, 13, 13), (4, 3, 3, 3), {"dilations": [2, 2], "strides": [2, 2]}),
    _conv("3x3-groups2", (1, 8, 10, 10), (6, 4, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, bias=False),
    _conv("3x3-groups2-bias-stride2", (2, 6, 9, 9), (10, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
    _conv("3x3-groups4", (1, 8, 6, 6), (8, 2, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    _conv("depthwise-bias", (1, 8, 10, 10), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    _conv("depthwise-no-bias", (1, 8, 10, 10), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, bias=False),
    _conv("depthwise-stride2", (1, 8, 10, 10), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    _conv("depthwise-5x5-batch2", (2, 6, 9, 9), (6, 1, 5, 5), {"group": 6, "pads": [2, 2, 2, 2]}),
    _conv("depthwise-dilated-uneven-pads", (1, 4, 13, 11), (4, 1, 3, 3),
          {"group": 4, "pads": [2, 1, 0, 3], "dilations": [2, 2]}),
    _conv("depthwise-stride3-no-interior", (1, 3, 5, 4), (3, 1, 3, 3), {"group": 3, "pads": [2, 2, 2, 2],
                                                                        "strides": [3, 3]}),
    _conv("depthwise-multiplier2", (1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    _conv("depthwise-multiplier2-no-bias", (1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "strides": [2, 2]}, bias=False),
    _conv("auto-pad-same-upper", (1, 3, 10, 10), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER"}),
    _conv("auto-pad-same-upper-stride2", (1, 3, 11, 10), (4, 3, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    _conv("auto-pad-same-lower-stride2", (1, 3, 11, 10), (4, 3, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    _conv("auto-pad-same-lower-even-kernel", (1, 3, 8, 8), (4, 3, 2, 2), {"auto_pad": "SAME_LOWER"}),
    _conv("auto-pad-valid", (1, 3, 10, 9), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    _conv("batch2", (2, 4, 8, 8), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("batch3-1x1", (3, 4, 5, 5), (6, 4, 1, 1)),
    _conv("5x5", (1, 3, 12, 12), (6, 3, 5, 5), {"pads": [2, 2, 2, 2]}),
    _conv("7x7-stride2", (1, 3, 32, 32), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    _conv("1x3", (1, 4, 7, 9), (5, 4, 1, 3), {"pads": [0, 1, 0, 1]}),
    _conv("3x1", (1, 4, 7, 9), (5, 4, 3, 1), {"pads": [1, 0, 1, 0]}),
    _conv("2x5-stride-2-1", (1, 3, 10, 11), (4, 3, 2, 5), {"strides": [2, 1], "pads": [0, 2, 1, 2]}),
    _conv("kernel-covers-input", (1, 3, 4, 4), (4, 3, 4, 4)),
    _conv("opset9", (1, 3, 6, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, opset=9),
    _conv("large-64-channels", (1, 64, 17, 17), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("depthwise-dilation2", (1, 4, 9, 9), (4, 1, 3, 3), {"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    _conv("depthwise-multiplier3", (1, 4, 9, 9), (12, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    # On a CPU the channels of a depthwise conv run in blocks of 8 sharing one padded plane (nn._channel_block):
    # three blocks per image, two images.
    _conv("depthwise-channel-blocks-batch2-stride2", (2, 24, 17, 17), (24, 1, 3, 3),
          {"group": 24, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    _conv("1x1-pads2", (1, 3, 4, 4), (4, 3, 1, 1), {"pads": [2, 2, 2, 2]}),
    _conv("pads-beyond-kernel", (1, 3, 4, 4), (4, 3, 3, 3), {"pads": [3, 0, 4, 1]}),
    # Big column matrices of the convs that keep im2col on a CPU (1x1 strided, under 64 taps) are built band by
    # band (nn._column_bands): full bands and a rest; two full bands of a strided 1x1 conv.
    _conv("banded-few-taps-rest", (1, 4, 160, 160), (16, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("banded-strided-1x1", (1, 64, 128, 128), (16, 64, 1, 1), {"strides": [2, 2]}),
    # Convs of 64 taps or more, wider than 1x1, run as implicit GEMMs on a CPU (nn._implicit_gemm): grouped,
    # batched, dilated, strided by rows only, with uneven pads.
    _conv("implicit-groups2-batch2-dilated", (2, 32, 15, 15), (32, 16, 3, 3),
          {"group": 2, "dilations": [2, 2], "strides": [1, 2], "pads": [2, 1, 2, 3]}),
    _conv("implicit-64-channels-rows", (1, 64, 40, 40), (16, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    # A few pixels by many channels and a deep k: column blocks run k block by k block with their partial sums in
    # a scratch tile (gemm._small_m_k_block), implicit and transposed pointwise.
    _conv("small-plane-deep-implicit", (1, 64, 7, 7), (100, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("small-plane-deep-pointwise", (1, 600, 7, 7), (112, 600, 1, 1)),
    # Small output planes run transposed (pixels as the GEMM's rows, nn._pixels_as_rows): im2col, pointwise,
    # grouped and strided, a channel tail narrower than a vector, and a single pixel.
    _conv("small-plane-3x3", (1, 32, 7, 7), (48, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("small-plane-pointwise", (1, 64, 7, 7), (80, 64, 1, 1)),
    _conv("small-plane-groups2-batch2-stride2", (2, 32, 13, 13), (64, 16, 3, 3),
          {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv("small-plane-channel-tail", (1, 16, 5, 5), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, bias=False),
    _conv("single-pixel-pointwise", (1, 64, 1, 1), (32, 64, 1, 1)),
    case("conv-weight-as-graph-input",
         single_op_model("Conv", [("x", (1, 3, 6, 6)), ("w", (4, 3, 3, 3))], {"pads": [1, 1, 1, 1]})),
]

# 1-D convs run as 2-D ones of height 1 (nn._as_plane), through each of the 2-D paths: im2col, pointwise, depthwise,
# grouped, implicit GEMM (96 taps), a small plane's transposed GEMM. 3-D convs run as a loop nest.
CONV_1D_3D_CASES: list[OpCase] = [
    _conv("1d-3tap-pads-batch2", (2, 4, 11), (5, 4, 3), {"pads": [1, 1]}),
    _conv("1d-strided-dilated-asymmetric-pads", (1, 3, 20), (4, 3, 3), {"strides": [2], "dilations": [2],
                                                                        "pads": [2, 1]}),
    _conv("1d-pointwise", (1, 8, 9), (6, 8, 1), bias=False),
    _conv("1d-depthwise-causal", (2, 6, 15), (6, 1, 4), {"group": 6, "pads": [3, 0]}),
    _conv("1d-groups2", (1, 8, 10), (6, 4, 3), {"group": 2}),
    _conv("1d-implicit", (1, 32, 30), (16, 32, 3), {"pads": [1, 1]}),
    _conv("1d-small-plane-pointwise", (1, 64, 7), (80, 64, 1)),
    _conv("1d-auto-pad-same-upper-stride2", (1, 3, 10), (4, 3, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    _conv("1d-kernel-shape-attr", (1, 3, 9), (4, 3, 5), {"kernel_shape": [5], "pads": [2, 2]}),
    case("conv-1d-weight-as-graph-input",
         single_op_model("Conv", [("x", (1, 3, 12)), ("w", (4, 3, 3))], {"strides": [3]})),
    _conv("3d-pads", (1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1] * 6}),
    _conv("3d-strides-dilations-asymmetric-pads", (2, 3, 7, 8, 6), (4, 3, 2, 3, 2),
          {"strides": [2, 1, 2], "dilations": [1, 2, 1], "pads": [1, 0, 1, 0, 2, 1]}, bias=False),
    _conv("3d-groups2", (1, 4, 4, 5, 5), (6, 2, 3, 3, 3), {"group": 2}),
    _conv("3d-depthwise", (1, 3, 5, 5, 5), (3, 1, 3, 3, 3), {"group": 3, "pads": [1] * 6}),
    _conv("3d-pointwise", (1, 5, 3, 4, 5), (4, 5, 1, 1, 1)),
    _conv("3d-auto-pad-same-lower", (1, 2, 5, 5, 5), (2, 2, 2, 2, 2), {"auto_pad": "SAME_LOWER"}),
    case("conv-3d-weight-as-graph-input",
         single_op_model("Conv", [("x", (1, 2, 4, 4, 4)), ("w", (3, 2, 2, 2, 2))], {"pads": [0, 1, 0, 1, 0, 1]})),
]

# ------------------------------------------------------------------------------------------------- ConvTranspose


def _conv_transpose(id: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict | None = None, bias: bool = True,
                    opset: int = 17) -> OpCase:
    """ConvTranspose of x with weights w (C, M/group, k...) and a bias of M = w[1] * group."""
    initializers = {"w": rand(*w, seed=1, scale=1.0 / np.sqrt(np.prod(w[1:])))}
    if bias:
        initializers["b"] = rand(w[1] * (attrs or {}).get("group", 1), seed=2)
    return case(f"convtranspose-{id}", single_op_model("ConvTranspose", [("x", x)], attrs or {}, initializers, opset))


CONV_TRANSPOSE_CASES: list[OpCase] = [
    _conv_transpose("3x3", (1, 4, 5, 5), (4, 6, 3, 3)),
    _conv_transpose("3x3-no-bias", (1, 4, 5, 6), (4, 3, 3, 3), bias=False),
    _conv_transpose("stride2-pads1", (1, 4, 5, 5), (4, 6, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv_transpose("stride2-output-padding", (1, 3, 4, 5), (3, 2, 3, 3),
                    {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    _conv_transpose("stride-3-2", (2, 3, 4, 5), (3, 2, 3, 2), {"strides": [3, 2]}),
    _conv_transpose("4x4-stride2-pad1-dcgan", (1, 32, 8, 8), (32, 16, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv_transpose("dilation2", (1, 2, 5, 5), (2, 3, 3, 3), {"dilations": [2, 2]}),
    _conv_transpose("dilation2-stride2", (1, 2, 4, 4), (2, 3, 3, 3), {"dilations": [2, 2], "strides": [2, 2],
                                                                      "pads": [2, 1, 0, 1]}),
    _conv_transpose("asymmetric-pads", (1, 3, 5, 5), (3, 2, 3, 3), {"pads": [0, 2, 1, 0]}),
    _conv_transpose("groups2", (1, 4, 5, 5), (4, 3, 3, 3), {"group": 2}),
    _conv_transpose("groups2-batch2-stride2", (2, 4, 4, 4), (4, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
    _conv_transpose("depthwise", (1, 4, 5, 5), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv_transpose("kernel-shape-attr", (1, 2, 4, 4), (2, 3, 3, 3), {"kernel_shape": [3, 3]}),
    _conv_transpose("output-shape", (1, 2, 3, 3), (2, 3, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    _conv_transpose("output-shape-odd-padding", (1, 2, 3, 3), (2, 3, 3, 3),
                    {"strides": [2, 2], "output_shape": [6, 5]}),
    _conv_transpose("output-shape-same-upper", (1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [6, 5],
                                                                           "auto_pad": "SAME_UPPER"}),
    _conv_transpose("auto-pad-same-upper", (1, 2, 4, 5), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    _conv_transpose("auto-pad-same-lower", (1, 2, 4, 5), (2, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    _conv_transpose("auto-pad-valid", (1, 2, 4, 4), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    _conv_transpose("1x1", (1, 8, 4, 4), (8, 5, 1, 1)),
    _conv_transpose("1d", (2, 3, 7), (3, 4, 3), {"strides": [2], "pads": [1, 0]}),
    _conv_transpose("3d", (1, 2, 3, 4, 3), (2, 3, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 0, 1, 1]}),
    _conv_transpose("opset9", (1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2]}, opset=9),
    case("convtranspose-weight-as-graph-input",
         single_op_model("ConvTranspose", [("x", (1, 3, 4, 4)), ("w", (3, 2, 3, 3))], {"strides": [2, 2]})),
]

# ---------------------------------------------------------------------------------------------------------- Gemm


def _gemm(id: str, m: int, k: int, n: int, attrs: dict | None = None, c: tuple[int, ...] | None = (-1,),
          b_input: bool = False) -> OpCase:
    """Gemm of A (graph input) and B (initializer, or graph input if b_input) with C of shape `c` ((-1,) = (N,))."""
    attrs = attrs or {}
    a_shape = (k, m) if attrs.get("transA") else (m, k)
    b_shape = (n, k) if attrs.get("transB") else (k, n)
    inputs = [("a", a_shape)] + ([("b", b_shape)] if b_input else [])
    initializers = {} if b_input else {"b": rand(*b_shape, seed=1)}
    if c is not None:
        initializers["c"] = rand(*((n,) if c == (-1,) else c), seed=2)
    return case(f"gemm-{id}", single_op_model("Gemm", inputs, attrs, initializers))


GEMM_CASES: list[OpCase] = [
    _gemm("plain", 3, 20, 7),
    _gemm("transA", 3, 20, 7, {"transA": 1}),
    _gemm("transB", 3, 20, 7, {"transB": 1}),
    _gemm("transA-transB", 3, 20, 7, {"transA": 1, "transB": 1}),
    _gemm("transB-no-c", 4, 9, 5, {"transB": 1}, c=None),
    _gemm("transA-no-c", 4, 9, 5, {"transA": 1}, c=None),
    _gemm("alpha-beta", 3, 20, 7, {"alpha": 0.5, "beta": 2.0}),
    _gemm("alpha-beta-transB", 3, 20, 7, {"alpha": -1.25, "beta": 0.25, "transB": 1}),
    _gemm("beta0", 3, 8, 7, {"beta": 0.0}),
    _gemm("alpha-no-c", 3, 8, 7, {"alpha": 3.0}, c=None),
    _gemm("c-n", 5, 6, 7, c=(7,)),
    _gemm("c-1xn", 5, 6, 7, c=(1, 7)),
    _gemm("c-mxn", 5, 6, 7, c=(5, 7)),
    _gemm("c-mx1", 5, 6, 7, c=(5, 1)),
    _gemm("c-scalar", 5, 6, 7, c=()),
    _gemm("c-1", 5, 6, 7, c=(1,)),
    _gemm("c-mxn-transA-transB", 5, 6, 7, {"transA": 1, "transB": 1, "beta": 0.5}, c=(5, 7)),
    _gemm("no-c", 3, 20, 7, c=None),
    _gemm("b-graph-input", 4, 6, 3, b_input=True),
    _gemm("b-graph-input-transB", 4, 6, 3, {"transB": 1}, b_input=True),
    _gemm("large", 33, 70, 65, {"transB": 1}),
    _gemm("large-constant-b", 33, 70, 113),
    _gemm("large-transA", 67, 129, 70, {"transA": 1}),
    case("gemm-a-initializer", single_op_model("Gemm", [("b", (5, 4))], {"transA": 1}, {"a": rand(5, 3), "c": rand(4)},
                                               node_inputs=["a", "b", "c"])),
    _gemm("vector-row", 1, 100, 10),
]

# -------------------------------------------------------------------------------------------------------- MatMul


def _matmul(a: tuple[int, ...], b: tuple[int, ...], b_initializer: bool = False) -> OpCase:
    name = "-".join("x".join(map(str, s)) for s in (a, b)) + ("-init" if b_initializer else "")
    if b_initializer:
        model = single_op_model("MatMul", [("a", a)], {}, {"b": rand(*b, seed=1)})
    else:
        model = single_op_model("MatMul", [("a", a), ("b", b)])
    return case(f"matmul-{name}", model)


MATMUL_CASES: list[OpCase] = [
    _matmul((3, 5), (5, 4)),
    _matmul((3, 20), (20, 33), b_initializer=True),
    _matmul((2, 3, 5), (2, 5, 4)),
    _matmul((2, 3, 4, 5), (2, 3, 5, 6)),
    _matmul((2, 3, 5, 20), (20, 33), b_initializer=True),
    _matmul((2, 3, 5), (5, 4)),
    _matmul((3, 5), (2, 5, 4)),
    _matmul((2, 1, 3, 4), (5, 4, 6)),
    _matmul((1, 3, 4), (5, 4, 2)),
    _matmul((4, 1, 3, 4), (1, 2, 4, 5)),
    _matmul((5,), (5, 4)),
    _matmul((3, 5), (5,)),
    _matmul((5,), (2, 5, 4)),
    _matmul((2, 3, 5), (5,)),
    _matmul((7,), (7,)),
    _matmul((67, 259), (259, 131)),
    _matmul((3, 33, 130), (130, 65)),
    # a constant B is read pre-packed in column panels, per k x n block: shared, batched, broadcast, a vector
    _matmul((67, 259), (259, 131), b_initializer=True),
    _matmul((3, 5), (2, 5, 60), b_initializer=True),
    _matmul((2, 1, 3, 4), (5, 4, 70), b_initializer=True),
    _matmul((2, 3, 5), (5,), b_initializer=True),
    case("matmul-a-initializer", single_op_model("MatMul", [("b", (2, 5, 4))], {}, {"a": rand(3, 5)},
                                                 node_inputs=["a", "b"])),
]

# --------------------------------------------------------------------------------------------------------- pools

POOL_X = [("x", (1, 3, 10, 10))]


def _pool(op: str, id: str, attrs: dict, x: tuple[int, ...] = (1, 3, 10, 10), opset: int = 17) -> OpCase:
    return case(f"{op.lower()}-{id}", single_op_model(op, [("x", x)], attrs, opset=opset))


POOL_CASES: list[OpCase] = [
    _pool("MaxPool", "2x2-s2", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    _pool("MaxPool", "3x3-default-strides", {"kernel_shape": [3, 3]}),
    _pool("MaxPool", "3x3-s2-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _pool("MaxPool", "3x3-s2-asymmetric-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 2, 0]}),
    _pool("MaxPool", "3x3-s2-ceil", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    _pool("MaxPool", "3x3-s2-ceil-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                          "ceil_mode": 1}, x=(1, 2, 11, 12)),
    _pool("MaxPool", "same-upper", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    _pool("MaxPool", "same-upper-even-kernel", {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}, x=(1, 2, 7, 7)),
    _pool("MaxPool", "same-lower", {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}, x=(1, 2, 7, 7)),
    _pool("MaxPool", "valid", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}, x=(1, 2, 9, 10)),
    _pool("MaxPool", "dilations2", {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    _pool("MaxPool", "dilations2-pads-s2", {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2],
                                            "pads": [1, 1, 1, 1]}),
    _pool("MaxPool", "kernel-larger-than-stride", {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2]}),
    _pool("MaxPool", "non-square", {"kernel_shape": [2, 3], "strides": [1, 2]}, x=(2, 3, 8, 11)),
    _pool("MaxPool", "opset9", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, opset=9),
    _pool("MaxPool", "opset11-ceil", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, opset=11),
    # On a CPU a MaxPool reads padded planes shared by blocks of 8 channels (nn._max_pool_planes): four blocks.
    _pool("MaxPool", "channel-blocks-batch2", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
          x=(2, 16, 21, 20)),
    _pool("AveragePool", "2x2-s2", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    _pool("AveragePool", "pads-exclude", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    _pool("AveragePool", "pads-include", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                          "count_include_pad": 1}),
    _pool("AveragePool", "asymmetric-pads-include", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 2, 0],
                                                     "count_include_pad": 1}),
    _pool("AveragePool", "asymmetric-pads-exclude", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 2, 0],
                                                     "count_include_pad": 0}),
    _pool("AveragePool", "ceil-exclude", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    _pool("AveragePool", "ceil-include", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1,
                                          "count_include_pad": 1}),
    _pool("AveragePool", "ceil-pads-include", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1,
                                               "pads": [1, 1, 1, 1], "count_include_pad": 1}, x=(1, 2, 11, 12)),
    _pool("AveragePool", "same-upper", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    _pool("AveragePool", "same-upper-include", {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER",
                                                "count_include_pad": 1}, x=(1, 2, 7, 7)),
    _pool("AveragePool", "kernel-larger-than-stride", {"kernel_shape": [5, 5], "strides": [2, 2],
                                                       "pads": [2, 2, 2, 2]}),
    _pool("AveragePool", "non-square", {"kernel_shape": [3, 2], "strides": [2, 1]}, x=(2, 3, 9, 8)),
    _pool("AveragePool", "opset9", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, opset=9),
    case("globalaveragepool", single_op_model("GlobalAveragePool", POOL_X)),
    case("globalaveragepool-non-square-batch2", single_op_model("GlobalAveragePool", [("x", (2, 5, 7, 3))])),
    case("globalaveragepool-1x1", single_op_model("GlobalAveragePool", [("x", (1, 4, 1, 1))])),
    case("globalaveragepool-3d", single_op_model("GlobalAveragePool", [("x", (2, 3, 11))])),
    case("globalmaxpool", single_op_model("GlobalMaxPool", POOL_X)),
    case("globalmaxpool-non-square-batch2", single_op_model("GlobalMaxPool", [("x", (2, 5, 7, 3))])),
    case("globalmaxpool-3d", single_op_model("GlobalMaxPool", [("x", (2, 3, 11))])),
    case("globalaveragepool-5d", single_op_model("GlobalAveragePool", [("x", (1, 2, 3, 4, 5))])),
    case("globalmaxpool-5d", single_op_model("GlobalMaxPool", [("x", (1, 2, 3, 4, 5))])),
    # ceil_mode where the last window would start in the right padding: onnxruntime and onnx's reference
    # evaluator drop that window (PyTorch's rule: output 3, not 4, for input 5, kernel 2, stride 2, pads 1).
    _pool("MaxPool", "ceil-last-window-in-pad", {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                                 "ceil_mode": 1}, x=(1, 2, 5, 5)),
    _pool("AveragePool", "ceil-last-window-in-pad", {"kernel_shape": [2, 2], "strides": [2, 2],
                                                     "pads": [1, 1, 1, 1], "ceil_mode": 1}, x=(1, 2, 5, 5)),
    _pool("AveragePool", "ceil-last-window-in-pad-include", {"kernel_shape": [2, 2], "strides": [2, 2],
                                                             "pads": [0, 1, 0, 1], "ceil_mode": 1,
                                                             "count_include_pad": 1}, x=(1, 2, 4, 5)),
    # A window of -inf only: the max is -inf (onnxruntime agrees), not the most negative float.
    case("maxpool-all-minus-inf-window", single_op_model("MaxPool", [("x", (1, 2, 3, 3))], {"kernel_shape": [2, 2]}),
         {"x": np.where(np.arange(18).reshape(1, 2, 3, 3) < 9, -np.inf, rand(1, 2, 3, 3)).astype(np.float32)}),
]

# MaxPool and AveragePool over 1-D inputs (planes of height 1: the 2-D kernels, channel blocks on a CPU included)
# and 3-D ones (a loop nest), with pads, dilations, ceil_mode, auto_pad and count_include_pad.
POOL_1D_3D_CASES: list[OpCase] = [
    _pool("MaxPool", "1d-pads-s2", {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, x=(2, 3, 11)),
    _pool("MaxPool", "1d-ceil-dilated", {"kernel_shape": [2], "strides": [2], "dilations": [2], "ceil_mode": 1},
          x=(1, 2, 10)),
    _pool("MaxPool", "1d-channel-blocks", {"kernel_shape": [3], "strides": [2]}, x=(2, 16, 21)),
    _pool("AveragePool", "1d-include-pad", {"kernel_shape": [3], "strides": [2], "pads": [1, 2],
                                            "count_include_pad": 1}, x=(1, 3, 12)),
    _pool("AveragePool", "1d-same-upper", {"kernel_shape": [4], "auto_pad": "SAME_UPPER"}, x=(1, 3, 9)),
    _pool("MaxPool", "3d-2x2x2-s2", {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, x=(1, 2, 6, 7, 8)),
    _pool("MaxPool", "3d-pads-dilations", {"kernel_shape": [3, 2, 3], "strides": [1, 2, 2],
                                           "pads": [1, 0, 1, 1, 1, 0], "dilations": [1, 2, 1]}, x=(2, 2, 5, 6, 7)),
    _pool("MaxPool", "3d-ceil", {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "ceil_mode": 1}, x=(1, 2, 8, 7, 9)),
    _pool("AveragePool", "3d-pads-exclude", {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1] * 6},
          x=(1, 2, 7, 6, 5)),
    _pool("AveragePool", "3d-ceil-pads-include", {"kernel_shape": [3, 3, 2], "strides": [2, 2, 2], "ceil_mode": 1,
                                                  "pads": [1, 0, 1, 1, 0, 0], "count_include_pad": 1},
          x=(1, 2, 8, 7, 6)),
    _pool("AveragePool", "3d-same-upper", {"kernel_shape": [2, 3, 2], "auto_pad": "SAME_UPPER"}, x=(1, 2, 5, 5, 5)),
]

# LpPool over 1, 2 and 3 spatial axes (one N-D kernel); its padding adds nothing to the sum.
LP_POOL_CASES: list[OpCase] = [
    _pool("LpPool", "2d-default", {"kernel_shape": [3, 3]}, opset=18),
    _pool("LpPool", "1d", {"kernel_shape": [3]}, x=(2, 3, 11), opset=18),
    _pool("LpPool", "3d", {"kernel_shape": [2, 3, 2], "strides": [1, 2, 1]}, x=(1, 2, 4, 6, 5), opset=18),
    _pool("LpPool", "p1", {"kernel_shape": [2, 2], "p": 1}, opset=18),
    _pool("LpPool", "p3-strides-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 2, 1], "p": 3},
          opset=18),
    _pool("LpPool", "same-upper", {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
          x=(1, 2, 7, 8), opset=18),
    _pool("LpPool", "same-lower", {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}, x=(1, 2, 7, 7), opset=18),
    _pool("LpPool", "valid", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}, x=(1, 2, 9, 10),
          opset=18),
    _pool("LpPool", "dilations", {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1]}, opset=18),
    _pool("LpPool", "ceil", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, opset=18),
    _pool("LpPool", "1d-ceil-pads", {"kernel_shape": [2], "strides": [2], "pads": [1, 1], "ceil_mode": 1},
          x=(1, 3, 6), opset=18),
    _pool("LpPool", "opset11", {"kernel_shape": [2, 2], "strides": [2, 2], "p": 4}, opset=11),
]

# --------------------------------------------------------------------------------------- LRN, BN and Softmax

def lrn_reference(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    """The ONNX spec's LRN: channels max(0, c - floor((size-1)/2)) .. min(C-1, c + ceil((size-1)/2)); in float64.

    onnxruntime refuses even sizes (it asserts size % 2 == 1) although the spec defines them, so the even case is
    checked against this (itself checked against onnxruntime on odd sizes below)."""
    channels, before = x.shape[1], (size - 1) // 2
    after = size - 1 - before
    square = x.astype(np.float64) ** 2
    out = np.empty(x.shape, dtype=np.float64)
    for c in range(channels):
        window = square[:, max(0, c - before): min(channels - 1, c + after) + 1].sum(axis=1)
        out[:, c] = x[:, c] / (bias + alpha / size * window) ** beta
    return out.astype(np.float32)


def _lrn_even_reference(feeds):
    return {"y": lrn_reference(feeds["x"], 4, alpha=0.1, beta=0.5)}


def _lrn_huge_reference(feeds):
    return {"y": lrn_reference(feeds["x"], 2**62, alpha=2.0**61, beta=0.75)}


LRN_CASES: list[OpCase] = [
    case("lrn-size3", single_op_model("LRN", [("x", (1, 8, 5, 5))], {"size": 3})),
    case("lrn-size5", single_op_model("LRN", [("x", (2, 8, 5, 5))],
                                      {"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 2.0})),
    case("lrn-size4-even", single_op_model("LRN", [("x", (1, 7, 4, 6))], {"size": 4, "alpha": 0.1, "beta": 0.5}),
         reference=_lrn_even_reference),
    case("lrn-size1", single_op_model("LRN", [("x", (1, 3, 4, 4))], {"size": 1, "alpha": 0.5, "bias": 1.5})),
    case("lrn-size-larger-than-channels", single_op_model("LRN", [("x", (1, 3, 4, 4))],
                                                          {"size": 7, "alpha": 0.3, "beta": 1.0})),
    # A hostile window of 2**62 channels (issue 13): the kernel loops over the channels it covers, not 2**62 times;
    # onnxruntime can't run it (it pads its buffer by the window), so the spec's formula is the reference.
    case("lrn-size-2**62", single_op_model("LRN", [("x", (1, 5, 3, 3))], {"size": 2**62, "alpha": 2.0**61}),
         reference=_lrn_huge_reference),
    case("lrn-alexnet", single_op_model("LRN", [("x", (1, 16, 6, 6))],
                                        {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}),
         {"x": rand(1, 16, 6, 6, scale=30.0)}),
]


def _bn(id: str, x: tuple[int, ...], attrs: dict | None = None, opset: int = 17) -> OpCase:
    c = x[1]
    initializers = {"scale": rand(c, seed=1), "bias": rand(c, seed=2), "mean": rand(c, seed=3),
                    "var": rand(c, seed=4, positive=True)}
    return case(f"batchnorm-{id}", single_op_model("BatchNormalization", [("x", x)], attrs or {}, initializers, opset))


BN_CASES: list[OpCase] = [
    _bn("4d", (2, 8, 5, 6)),
    _bn("3d", (2, 6, 9)),
    _bn("2d", (4, 5)),
    _bn("epsilon", (1, 3, 4, 4), {"epsilon": 0.1}),
    _bn("opset9", (1, 3, 4, 4), opset=9),
    _bn("opset14", (1, 3, 4, 4), opset=14),
    _bn("5d", (1, 2, 3, 4, 5)),
]


def _softmax(x: tuple[int, ...], axis: int | None, opset: int) -> OpCase:
    attrs = {} if axis is None else {"axis": axis}
    name = f"softmax-{len(x)}d-axis{'default' if axis is None else axis}-opset{opset}"
    return case(name, single_op_model("Softmax", [("x", x)], attrs, opset=opset), {"x": rand(*x, scale=3.0)})


SOFTMAX_SHAPES = [(4, 7), (2, 3, 7), (2, 3, 4, 5)]
SOFTMAX_CASES: list[OpCase] = [
    _softmax(shape, axis, opset)
    for opset in (11, 13)
    for shape in SOFTMAX_SHAPES
    for axis in sorted({0, 1, len(shape) - 1, -1}) + [None]
] + [
    _softmax((2, 3, 4, 5), -2, 11),
    _softmax((2, 3, 4, 5), -2, 13),
    _softmax((2, 3, 4, 5), 2, 9),
    _softmax((3, 1000), None, 17),
    case("softmax-large-logits", single_op_model("Softmax", [("x", (2, 50))]), {"x": rand(2, 50, scale=80.0)}),
]

def _softmax_family(op: str, x: tuple[int, ...], axis: int | None, opset: int, scale: float = 3.0) -> OpCase:
    attrs = {} if axis is None else {"axis": axis}
    name = f"{op.lower()}-{len(x)}d-axis{'default' if axis is None else axis}-opset{opset}"
    return case(name, single_op_model(op, [("x", x)], attrs, opset=opset), {"x": rand(*x, scale=scale)})


SOFTMAX_FAMILY_CASES: list[OpCase] = [
    _softmax_family(op, shape, axis, opset)
    for op in ("LogSoftmax", "Hardmax")
    for opset in (11, 13)
    for shape in SOFTMAX_SHAPES
    for axis in sorted({0, 1, len(shape) - 1, -1}) + [None]
] + [
    _softmax_family("LogSoftmax", (2, 3, 4, 5), -2, 9),
    _softmax_family("Hardmax", (2, 3, 4, 5), 2, 9),
    _softmax_family("LogSoftmax", (3, 1000), None, 17),
    _softmax_family("Softmax", (8, 16, 32), 1, 17),
    case("logsoftmax-large-logits", single_op_model("LogSoftmax", [("x", (2, 50))]), {"x": rand(2, 50, scale=80.0)}),
    case("hardmax-ties-first", single_op_model("Hardmax", [("x", (3, 4))]),
         {"x": np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -5, -1, -3]], np.float32)}),
]

# --------------------------------------------------------------------------------------------- normalisations


def _layernorm(id: str, x: tuple[int, ...], axis: int | None = None, scale: tuple[int, ...] | None = None,
               bias: bool = True, attrs: dict | None = None, graph_params: bool = False) -> OpCase:
    """LayerNormalization with scale (and bias) of shape `scale` (default: the normalised shape) as initializers,
    or as graph inputs with graph_params."""
    attrs = {**(attrs or {}), **({} if axis is None else {"axis": axis})}
    param_shape = scale or x[(axis if axis is not None else -1):]
    params = {"scale": rand(*param_shape, seed=1), **({"bias": rand(*param_shape, seed=2)} if bias else {})}
    if graph_params:
        model = single_op_model("LayerNormalization", [("x", x), *[(n, a.shape) for n, a in params.items()]], attrs)
        feeds = {"x": rand(*x, scale=2.0) + 1.0, **params}
    else:
        model = single_op_model("LayerNormalization", [("x", x)], attrs, params)
        feeds = {"x": rand(*x, scale=2.0) + 1.0}
    return case(f"layernorm-{id}", model, feeds)


def _layernorm_statistics(outputs: list[str], axis: int) -> OpCase:
    """LayerNormalization with its optional Mean and InvStdDev outputs ("" for one left out) as graph outputs."""
    x = (2, 3, 4, 5)
    params = {"scale": rand(*x[axis:], seed=1), "bias": rand(*x[axis:], seed=2)}
    node = helper.make_node("LayerNormalization", ["x", *params], outputs, axis=axis)
    present = [name for name in outputs if name]
    return case(f"layernorm-statistics-{'-'.join(present[1:])}", graph_model([node], [("x", x)], present, params))


def _same_shape_model(op: str, inputs: list[tuple[str, tuple[int, ...]]], attrs: dict, initializers: dict,
                      opset: int) -> onnx.ModelProto:
    """One `op` node whose output y is declared with x's shape: ONNX shape inference leaves GroupNormalization's
    output untyped. (The checker refuses GroupNormalization-18, deprecated since opset 21 though models use it.)"""
    node = helper.make_node(op, [n for n, _ in inputs] + list(initializers), ["y"], name=f"{op.lower()}_0", **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n, shape in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(inputs[0][1]))],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    if (op, opset) != ("GroupNormalization", 18):
        onnx.checker.check_model(model)
    return model


def _norm(op: str, id: str, x: tuple[int, ...], attrs: dict | None = None, params: dict | None = None,
          opset: int = 17, graph_params: bool = False) -> OpCase:
    params = params or {}
    inputs = [("x", x)] + ([(n, a.shape) for n, a in params.items()] if graph_params else [])
    model = _same_shape_model(op, inputs, attrs or {}, {} if graph_params else params, opset)
    return case(f"{op.lower()}-{id}", model, {"x": rand(*x, scale=2.0) + 0.5, **(params if graph_params else {})})


def _channel_params(c: int) -> dict:
    return {"scale": rand(c, seed=1), "bias": rand(c, seed=2)}


NORM_CASES: list[OpCase] = [
    _layernorm("last-axis", (2, 5, 16)),
    _layernorm("axis1", (2, 3, 4, 5), axis=1),
    _layernorm("axis0", (3, 4), axis=0),
    _layernorm("negative-axis", (2, 3, 4, 5), axis=-2),
    _layernorm("no-bias", (4, 32), bias=False),
    _layernorm("epsilon", (4, 8), attrs={"epsilon": 0.5}),
    _layernorm("scale-broadcast", (2, 3, 4, 5), axis=2, scale=(5,)),
    _layernorm("scale-leading-ones", (2, 6, 8), scale=(1, 1, 8)),
    _layernorm("graph-input-params", (2, 3, 10), graph_params=True),
    _layernorm("transformer-row", (1, 16, 768)),
    _layernorm_statistics(["y", "mean", "inv_std"], 1),
    _layernorm_statistics(["y", "mean"], -1),
    _layernorm_statistics(["y", "", "inv_std"], 2),
    _norm("InstanceNormalization", "4d", (2, 3, 5, 6), params=_channel_params(3)),
    _norm("InstanceNormalization", "3d-epsilon", (2, 4, 7), {"epsilon": 0.01}, _channel_params(4)),
    _norm("InstanceNormalization", "graph-input-params", (1, 3, 4, 4), params=_channel_params(3), graph_params=True),
    _norm("InstanceNormalization", "opset9", (1, 2, 3, 3), params=_channel_params(2), opset=9),
    _norm("GroupNormalization", "opset21-per-channel", (2, 6, 4, 5), {"num_groups": 3}, _channel_params(6), opset=21),
    _norm("GroupNormalization", "opset21-one-group", (2, 4, 3, 3), {"num_groups": 1, "epsilon": 0.01},
          _channel_params(4), opset=21),
    _norm("GroupNormalization", "opset21-channel-groups", (1, 4, 6), {"num_groups": 4}, _channel_params(4),
          opset=21),
    _norm("GroupNormalization", "opset18-per-group", (2, 6, 4, 5), {"num_groups": 3}, _channel_params(3), opset=18),
    _norm("MeanVarianceNormalization", "default-axes", (2, 3, 4, 5)),
    _norm("MeanVarianceNormalization", "axes-2-3", (2, 3, 4, 5), {"axes": [2, 3]}),
    _norm("MeanVarianceNormalization", "axes-1", (2, 3, 4, 5), {"axes": [1]}),
    _norm("MeanVarianceNormalization", "opset9", (2, 3, 4, 5), opset=9),
    _norm("LpNormalization", "default", (3, 4, 5)),
    _norm("LpNormalization", "p1-axis1", (3, 4, 5), {"p": 1, "axis": 1}),
    _norm("LpNormalization", "p2-axis0", (3, 4), {"p": 2, "axis": 0}),
    _norm("LpNormalization", "p1-negative-axis", (2, 3, 4), {"p": 1, "axis": -3}),
    case("lpnormalization-zero-row", single_op_model("LpNormalization", [("x", (3, 4))]),
         {"x": np.array([[0, 0, 0, 0], [1, 2, 3, 4], [0, -1, 0, 0]], np.float32)}),
]

# ------------------------------------------------------------------------------------------- fused activations


def _pair(id: str, first: tuple, second: tuple, inputs, initializers, opset: int = 17,
          schedule: tuple[str, ...] = ()) -> OpCase:
    """Two nodes first -> second (each (op, extra inputs, attrs)); `schedule`: the ops the artifact must run."""
    op1, extra1, attrs1 = first
    op2, extra2, attrs2 = second
    nodes = [helper.make_node(op1, [n for n, _ in inputs] + list(extra1), ["t"], name="first", **attrs1),
             helper.make_node(op2, ["t", *extra2], ["y"], name="second", **attrs2)]
    return case(f"fused-{id}", graph_model(nodes, inputs, ["y"], initializers, opset), schedule=schedule)


W = {"w": rand(6, 4, 3, 3, seed=1, scale=0.3), "b": rand(6, seed=2)}
CONV = ("Conv", ["w", "b"], {"pads": [1, 1, 1, 1]})
CONV_X = [("x", (1, 4, 8, 8))]

FUSED_CASES: list[OpCase] = [
    _pair("conv-relu", CONV, ("Relu", [], {}), CONV_X, W, schedule=("Conv",)),
    _pair("conv-clip-0-6", CONV, ("Clip", ["lo", "hi"], {}), CONV_X,
          {**W, "lo": np.float32(0.0), "hi": np.float32(6.0)}, schedule=("Conv",)),
    _pair("conv-clip-0-6-opset9", CONV, ("Clip", [], {"min": 0.0, "max": 6.0}), CONV_X, W, opset=9,
          schedule=("Conv",)),
    _pair("conv-clip-only-max", CONV, ("Clip", ["", "hi"], {}), CONV_X, {**W, "hi": np.float32(0.5)},
          schedule=("Conv",)),
    _pair("conv-leakyrelu", CONV, ("LeakyRelu", [], {"alpha": 0.1}), CONV_X, W, schedule=("Conv",)),
    _pair("depthwise-conv-clip", ("Conv", ["dw"], {"group": 4, "pads": [1, 1, 1, 1]}), ("Clip", ["lo", "hi"], {}),
          CONV_X, {"dw": rand(4, 1, 3, 3, seed=3), "lo": np.float32(0.0), "hi": np.float32(0.5)}, schedule=("Conv",)),
    _pair("convtranspose-relu", ("ConvTranspose", ["tw", "tb"], {"strides": [2, 2]}), ("Relu", [], {}), CONV_X,
          {"tw": rand(4, 3, 3, 3, seed=8), "tb": rand(3, seed=9)}, schedule=("ConvTranspose",)),
    _pair("small-plane-conv-clip", ("Conv", ["sw", "sb"], {"pads": [1, 1, 1, 1]}), ("Clip", ["lo", "hi"], {}),
          [("x", (1, 16, 7, 7))], {"sw": rand(32, 16, 3, 3, seed=5, scale=0.1), "sb": rand(32, seed=6),
                                   "lo": np.float32(-0.5), "hi": np.float32(0.5)}, schedule=("Conv",)),
    _pair("small-plane-pointwise-conv-leakyrelu", ("Conv", ["sw"], {}), ("LeakyRelu", [], {"alpha": 0.1}),
          [("x", (1, 16, 7, 7))], {"sw": rand(40, 16, 1, 1, seed=7)}, schedule=("Conv",)),
    case("fused-conv-residual-relu", graph_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "r"], ["s"]),
         helper.make_node("Relu", ["s"], ["y"])], [*CONV_X, ("r", (1, 6, 8, 8))], ["y"], W), schedule=("Conv",)),
    case("fused-implicit-conv-residual-relu", graph_model(
        [helper.make_node("Conv", ["x", "bw", "bb"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "r"], ["s"]),
         helper.make_node("Relu", ["s"], ["y"])], [("x", (1, 64, 40, 40)), ("r", (1, 16, 40, 40))], ["y"],
        {"bw": rand(16, 64, 3, 3, seed=9, scale=0.05), "bb": rand(16, seed=10)}), schedule=("Conv",)),
    # The residual an activation that dies at the conv, which writes over it (planner._residuals_in_place).
    case("fused-conv-residual-in-place-relu", graph_model(
        [helper.make_node("Relu", ["r"], ["q"]), helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["c", "q"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        [*CONV_X, ("r", (1, 6, 8, 8))], ["y"], W), schedule=("Relu", "Conv")),
    case("fused-implicit-conv-residual-in-place", graph_model(
        [helper.make_node("Relu", ["r"], ["q"]), helper.make_node("Conv", ["x", "bw"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["q", "c"], ["y"]), helper.make_node("Sigmoid", ["y"], ["z"])],
        [("x", (1, 64, 40, 40)), ("r", (1, 16, 40, 40))], ["z"], {"bw": rand(16, 64, 3, 3, seed=9, scale=0.05)}),
        schedule=("Relu", "Conv", "Sigmoid")),
    case("fused-small-plane-deep-conv-residual-clip", graph_model(
        [helper.make_node("Conv", ["x", "dw_", "db"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Clip", ["s", "lo", "hi"], ["y"])],
        [("x", (1, 64, 7, 7)), ("r", (1, 100, 7, 7))], ["y"],
        {"dw_": rand(100, 64, 3, 3, seed=11, scale=0.05), "db": rand(100, seed=12), "lo": np.float32(-0.5),
         "hi": np.float32(0.5)}), schedule=("Conv",)),
    case("fused-small-plane-pointwise-conv-residual", graph_model(
        [helper.make_node("Conv", ["x", "pw"], ["c"]), helper.make_node("Sum", ["r", "c"], ["y"])],
        [("x", (1, 16, 7, 7)), ("r", (1, 32, 7, 7))], ["y"], {"pw": rand(32, 16, 1, 1, seed=8)}), schedule=("Conv",)),
    _pair("pointwise-conv-relu", ("Conv", ["pw"], {}), ("Relu", [], {}), CONV_X, {"pw": rand(5, 4, 1, 1, seed=4)},
          schedule=("Conv",)),
    _pair("gemm-leakyrelu", ("Gemm", ["gw", "gb"], {"transB": 1}), ("LeakyRelu", [], {"alpha": 0.2}),
          [("x", (3, 10))], {"gw": rand(7, 10, seed=5), "gb": rand(7, seed=6)}, schedule=("Gemm",)),
    _pair("gemm-plain-relu", ("Gemm", ["gw", "gb"], {}), ("Relu", [], {}),
          [("x", (3, 10))], {"gw": rand(10, 7, seed=5), "gb": rand(7, seed=6)}, schedule=("Gemm",)),
    _pair("matmul-relu", ("MatMul", ["mw"], {}), ("Relu", [], {}), [("x", (2, 3, 10))], {"mw": rand(10, 4, seed=7)},
          schedule=("MatMul",)),
    _pair("add-relu", ("Add", [], {}), ("Relu", [], {}), [("x", (2, 3, 4)), ("z", (3, 1))], {}, schedule=("Add",)),
    _pair("mul-clip", ("Mul", [], {}), ("Clip", ["lo", "hi"], {}), [("x", (2, 3, 4)), ("z", (4,))],
          {"lo": np.float32(-0.5), "hi": np.float32(0.5)}, schedule=("Mul",)),
    _pair("sum-leakyrelu", ("Sum", [], {}), ("LeakyRelu", [], {}), [("x", (2, 3)), ("z", (3,)), ("q", (2, 1))], {},
          schedule=("Sum",)),
    _pair("batchnorm-relu", ("BatchNormalization", ["s", "bb", "m", "v"], {}), ("Relu", [], {}), [("x", (1, 3, 4, 4))],
          {"s": rand(3, seed=1), "bb": rand(3, seed=2), "m": rand(3, seed=3), "v": rand(3, seed=4, positive=True)},
          schedule=("BatchNormalization",)),
    _pair("maxpool-relu-not-fused", ("MaxPool", [], {"kernel_shape": [2, 2]}), ("Relu", [], {}), CONV_X, {},
          schedule=("MaxPool", "Relu")),
    case("fused-conv-batchnorm-relu", graph_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
         helper.make_node("Relu", ["n"], ["y"])],
        CONV_X, ["y"],
        {**W, "s": rand(6, seed=1), "bb": rand(6, seed=2), "m": rand(6, seed=3), "v": rand(6, seed=4, positive=True)}),
        schedule=("Conv",)),
    _pair("conv1d-relu", ("Conv", ["w1"], {"pads": [1, 1]}), ("Relu", [], {}), [("x", (1, 4, 9))],
          {"w1": rand(6, 4, 3, seed=13)}, schedule=("Conv",)),
    _pair("conv3d-clip", ("Conv", ["w3", "b3"], {"pads": [1] * 6}), ("Clip", ["lo", "hi"], {}), [("x", (1, 2, 4, 5, 4))],
          {"w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3), "b3": rand(3, seed=15), "lo": np.float32(-0.5),
           "hi": np.float32(0.5)}, schedule=("Conv",)),
    case("fused-conv3d-residual-relu", graph_model(
        [helper.make_node("Conv", ["x", "w3", "b3"], ["c"], pads=[1] * 6), helper.make_node("Add", ["c", "r"], ["s"]),
         helper.make_node("Relu", ["s"], ["y"])], [("x", (1, 2, 4, 5, 4)), ("r", (1, 3, 4, 5, 4))], ["y"],
        {"w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3), "b3": rand(3, seed=15)}), schedule=("Conv",)),
    case("fused-conv3d-residual-in-place", graph_model(
        [helper.make_node("Relu", ["r"], ["q"]), helper.make_node("Conv", ["x", "w3"], ["c"], pads=[1] * 6),
         helper.make_node("Add", ["q", "c"], ["y"]), helper.make_node("Sigmoid", ["y"], ["z"])],
        [("x", (1, 2, 4, 5, 4)), ("r", (1, 3, 4, 5, 4))], ["z"], {"w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3)}),
        schedule=("Relu", "Conv", "Sigmoid")),
    case("fused-conv3d-batchnorm", graph_model(
        [helper.make_node("Conv", ["x", "w3", "b3"], ["c"]),
         helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"])],
        [("x", (1, 2, 4, 5, 4))], ["y"],
        {"w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3), "b3": rand(3, seed=15), "s": rand(3, seed=1),
         "bb": rand(3, seed=2), "m": rand(3, seed=3), "v": rand(3, seed=4, positive=True)}), schedule=("Conv",)),
    # A depthwise conv never absorbs a residual (its kernel has no GEMM epilogue), 1-D ones included.
    case("fused-conv1d-depthwise-residual-not-absorbed", graph_model(
        [helper.make_node("Conv", ["x", "dw1"], ["c"], group=4, pads=[1, 1]), helper.make_node("Add", ["c", "r"], ["y"])],
        [("x", (1, 4, 9)), ("r", (1, 4, 9))], ["y"], {"dw1": rand(4, 1, 3, seed=16)}), schedule=("Conv", "Add")),
    case("fused-conv-relu-output-also-used", graph_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        CONV_X, ["c", "y"], W), schedule=("Conv", "Relu")),
]

CASES: list[OpCase] = (CONV_CASES + CONV_1D_3D_CASES + CONV_TRANSPOSE_CASES + GEMM_CASES + MATMUL_CASES + POOL_CASES
                       + POOL_1D_3D_CASES + LP_POOL_CASES + LRN_CASES + BN_CASES + SOFTMAX_CASES + SOFTMAX_FAMILY_CASES + NORM_CASES)
ALL_CASES: list[OpCase] = CASES + FUSED_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


@pytest.mark.parametrize("size", [1, 3, 5, 7])
def test_lrn_reference_matches_onnxruntime_on_odd_sizes(size: int) -> None:
    """lrn_reference (used for the even size onnxruntime refuses) agrees with onnxruntime where it runs.

    (onnx.reference's LRN can't serve as the reference: onnx 1.23's op_lrn loops over the batch axis, not the
    channels, so only the first N channels get their square sums.)"""
    model = single_op_model("LRN", [("x", (2, 7, 3, 4))], {"size": size, "alpha": 0.2, "beta": 0.6, "bias": 1.5})
    x = rand(2, 7, 3, 4, seed=size)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_close(lrn_reference(x, size, alpha=0.2, beta=0.6, bias=1.5), session.run(None, {"x": x})[0])


def test_lrn_reference_even_window() -> None:
    """For size 4 the window of channel c is c-1 .. c+2 (floor((size-1)/2) before, ceil((size-1)/2) after)."""
    x = np.ones((1, 7, 1, 1), dtype=np.float32)
    counts = np.array([3, 4, 4, 4, 4, 3, 2], dtype=np.float64)
    expected = (1.0 / (1.0 + 0.1 / 4 * counts) ** 0.5).astype(np.float32).reshape(1, 7, 1, 1)
    assert_close(lrn_reference(x, 4, alpha=0.1, beta=0.5), expected)


@pytest.mark.parametrize("c", params(FUSED_CASES))
def test_fused_activation_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    """The passes fuse the activation into its producer (the schedule shows one kernel) and the result still
    matches onnxruntime; where fusion must not happen, the activation stays a kernel of its own."""
    check_case(c, tmp_path)


# ----------------------------------------------------------------------------------------------- geometry


def _spec_of(model: onnx.ModelProto, tmp_path) -> KernelSpec:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return plan_model(path).steps[0].spec


def test_conv_geometry_names_the_sizes_of_a_grouped_strided_dilated_conv(tmp_path) -> None:
    attrs = {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 1, 2]}
    spec = _spec_of(single_op_model("Conv", [("x", (2, 6, 9, 11))], attrs, {"w": rand(4, 3, 3, 2)}), tmp_path)
    geo = nn._conv_geometry(spec)
    assert geo == nn.ConvGeometry(batch=2, in_channels=6, out_channels=4, groups=2, height=9, width=11,
                                  out_height=5, out_width=11, kernel_height=3, kernel_width=2, stride_height=2,
                                  stride_width=1, dilation_height=1, dilation_width=2, pad_top=1, pad_left=0)
    assert (geo.in_channels_per_group, geo.out_channels_per_group) == (3, 2)
    assert (geo.in_pixels, geo.out_pixels, geo.column_rows) == (99, 55, 3 * 3 * 2)
    assert geo.column_stride == 64  # 55 pixels a row, padded to a cache line
    assert LOWERINGS["Conv"].scratch_floats(spec) == geo.column_rows * geo.column_stride  # one group's im2col matrix


def test_pool_window_is_the_conv_window_without_channels(tmp_path) -> None:
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 0, 0]}
    spec = _spec_of(single_op_model("MaxPool", [("x", (1, 3, 8, 7))], attrs), tmp_path)
    assert nn._window(spec) == nn.Window(height=8, width=7, out_height=4, out_width=4, kernel_height=3,
                                         kernel_width=2, stride_height=2, stride_width=2, dilation_height=1,
                                         dilation_width=1, pad_top=1, pad_left=1)


def test_a_1d_window_is_a_plane_of_height_1(tmp_path) -> None:
    """A 1-D conv's attributes come out as a 2-D conv's (nn._as_plane), so its kernel is a 2-D one's."""
    attrs = {"strides": [2], "dilations": [3], "pads": [2, 1]}
    spec = _spec_of(single_op_model("Conv", [("x", (1, 3, 20))], attrs, {"w": rand(4, 3, 3)}), tmp_path)
    assert {key: spec.attrs[key] for key in ("kernel_shape", "strides", "dilations", "pads")} == {
        "kernel_shape": [1, 3], "strides": [1, 2], "dilations": [1, 3], "pads": [0, 2, 0, 1]}
    assert nn._window(spec) == nn.Window(height=1, width=20, out_height=1, out_width=9, kernel_height=1,
                                         kernel_width=3, stride_height=1, stride_width=2, dilation_height=1,
                                         dilation_width=3, pad_top=0, pad_left=2)


def test_3d_convs_and_pools_lower_to_loop_nests_without_scratch(tmp_path) -> None:
    conv = _spec_of(single_op_model("Conv", [("x", (1, 2, 4, 4, 4))], {}, {"w": rand(3, 2, 2, 2, 2)}), tmp_path)
    pool = _spec_of(single_op_model("MaxPool", [("x", (1, 2, 4, 4, 4))], {"kernel_shape": [2, 2, 2]}), tmp_path)
    assert LOWERINGS["Conv"].scratch_floats(conv) == LOWERINGS["MaxPool"].scratch_floats(pool) == 0
    assert nn.CONV_LOWERINGS[nn._spatial_rank(conv)].lower is nn._lower_conv_volumes
    assert nn.POOL_LOWERINGS[nn._spatial_rank(pool)].lower is nn._lower_pool_volumes


def test_conv_transpose_geometry_sizes_the_transposed_weights_and_the_column_buffer(tmp_path) -> None:
    model = single_op_model("ConvTranspose", [("x", (1, 4, 5, 6))], {"group": 2, "strides": [2, 2]},
                            {"w": rand(4, 3, 3, 2)})
    spec = _spec_of(model, tmp_path)
    geo = nn._conv_transpose_geometry(spec)
    assert (geo.batch, geo.in_channels, geo.out_channels, geo.groups) == (1, 4, 6, 2)
    assert (geo.in_sizes, geo.out_sizes, geo.taps, geo.in_pixels) == ([5, 6], [11, 12], 6, 30)
    assert (geo.in_channels_per_group, geo.column_rows, geo.column_start) == (2, 3 * 6, 2 * 18 * 2)
    assert nn._conv_transpose_scratch(spec) == geo.column_start + geo.column_rows * geo.in_pixels


# ------------------------------------------------------------------------------------------------- OpenCL

# The kernels added with the softmax family, the normalisations and ConvTranspose (transposed weights, Gemm into
# scratch, col2im with tap skipping, fused activation), convs whose GEMM runs transposed (small planes) or reads
# im2col rows padded to a cache line, and the MaxPools and depthwise convs whose CPU form blocks channels (OpenCL
# keeps a work-item per channel), rendered as OpenCL C and run on this host's device.
OPENCL_SAMPLE = [
    "softmax-3d-axis1-opset17", "logsoftmax-3d-axis1-opset13", "hardmax-4d-axis2-opset9", "layernorm-scale-broadcast",
    "layernorm-statistics-mean-inv_std", "instancenormalization-4d", "groupnormalization-opset21-per-channel",
    "meanvariancenormalization-axes-1", "lpnormalization-p1-axis1", "convtranspose-stride2-output-padding",
    "convtranspose-groups2-batch2-stride2", "convtranspose-dilation2-stride2", "convtranspose-3d",
    "fused-convtranspose-relu", "conv-small-plane-3x3", "conv-small-plane-pointwise",
    "conv-small-plane-groups2-batch2-stride2", "conv-small-plane-channel-tail", "conv-3x3-stride2-asymmetric-pads",
    "fused-conv-relu", "fused-conv-leakyrelu", "fused-conv-clip-0-6", "fused-small-plane-conv-clip",
    "fused-small-plane-pointwise-conv-leakyrelu", "fused-conv-residual-relu", "fused-small-plane-pointwise-conv-residual",
    "conv-banded-strided-1x1", "conv-implicit-groups2-batch2-dilated", "fused-implicit-conv-residual-relu",
    "fused-conv-residual-in-place-relu", "fused-implicit-conv-residual-in-place", "maxpool-3x3-s2-pads", "maxpool-3x3-s2-ceil-pads", "conv-depthwise-channel-blocks-batch2-stride2",
    "lppool-3d", "lppool-p3-strides-pads", "lppool-1d-ceil-pads", "conv-1d-implicit", "conv-1d-depthwise-causal",
    "conv-1d-strided-dilated-asymmetric-pads", "conv-3d-strides-dilations-asymmetric-pads", "conv-3d-groups2",
    "maxpool-1d-pads-s2", "averagepool-1d-include-pad", "maxpool-3d-pads-dilations", "averagepool-3d-ceil-pads-include",
    "fused-conv3d-residual-in-place", "fused-conv3d-clip",
]


@pytest.mark.parametrize("c", params(c for c in ALL_CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in ALL_CASES}


# Hostile attributes (issue 13): each is refused with one line naming the node, before anything is built. A pool
# window of 2**40 with pads of half that has a small output but would loop 2**40 times per element: the planner's
# bound on a kernel's work refuses it (farm/plan/planner.py MAX_KERNEL_WORK).
HOSTILE = [
    pytest.param(hostile_op_model("Softmax", {"axis": 2**40}), "axis 1099511627776 is out of range for rank 4",
                 id="softmax-axis"),
    pytest.param(hostile_op_model("Hardmax", {"axis": 2**40}), "axis 1099511627776 is out of range", id="hardmax-axis"),
    pytest.param(hostile_op_model("LayerNormalization", {"axis": 2**40}, {"scale": np.ones(4, np.float32)}),
                 "axis 1099511627776 is out of range", id="layernorm-axis"),
    pytest.param(hostile_op_model("LpNormalization", {"axis": 2**40}), "axis 1099511627776 is out of range",
                 id="lpnorm-axis"),
    pytest.param(hostile_op_model("MaxPool", {"kernel_shape": [2**40, 1], "pads": [2**39, 0, 2**39, 0]}),
                 "its kernel would run .* loop steps, over farm's limit", id="maxpool-window-huge"),
    pytest.param(hostile_op_model("AveragePool", {"kernel_shape": [2**40, 1], "pads": [2**39, 0, 2**39, 0],
                                                  "count_include_pad": 1}),
                 "its kernel would run .* loop steps, over farm's limit", id="averagepool-window-huge"),
    pytest.param(hostile_op_model("MaxPool", {"kernel_shape": [2**62, 1], "pads": [2**61, 0, 2**61, 0]}),
                 "its kernel would run .* loop steps", id="maxpool-window-2**62"),
    pytest.param(hostile_op_model("LpPool", {"kernel_shape": [2**40, 1], "pads": [2**39, 0, 2**39, 0]}),
                 "its kernel would run .* loop steps, over farm's limit", id="lppool-window-huge"),
    pytest.param(hostile_op_model("LpPool", {"kernel_shape": [2, 2], "p": 0}), "p=0 is not supported",
                 id="lppool-p0"),
    pytest.param(hostile_op_model("LpPool", {"kernel_shape": [2, 2], "strides": [0, 1]}),
                 "must be positive|shape", id="lppool-stride0"),
    pytest.param(hostile_op_model("LpPool", {"kernel_shape": [2]}), "must cover the 2 spatial axes|shape",
                 id="lppool-kernel-rank"),
    pytest.param(hostile_op_model("MaxPool", {"kernel_shape": [2**40, 1, 1], "pads": [2**39, 0, 0, 2**39, 0, 0]},
                                  x=(1, 2, 4, 4, 4)), "its kernel would run .* loop steps, over farm's limit",
                 id="maxpool-3d-window-huge"),
    pytest.param(hostile_op_model("Conv", {"kernel_shape": [2**40, 1, 1]}, {"w": np.ones((2, 2, 1, 1, 1), np.float32)},
                                  x=(1, 2, 4, 4, 4)), "empty dim|negative dim|differs from the weight's", id="conv-3d-kernel-huge"),
    pytest.param(hostile_op_model("Conv", {"kernel_shape": [1, 1]}, {"w": np.ones((2, 2, 3, 3), np.float32)}),
                 "kernel_shape \\[1, 1\\] differs from the weight's \\[3, 3\\]", id="conv-kernel-shape-not-the-weights"),
    pytest.param(hostile_op_model("Conv", {}, {"w": np.ones((2, 2, 3, 3), np.float32)}, x=(1, 2, 4, 4, 4)),
                 "the weight must be a tensor \\[M, C/group, k...\\] of the input's rank|shape", id="conv-weight-rank"),
    pytest.param(hostile_op_model("Conv", {}, {"w": np.ones((2, 2, 1, 1, 1, 1), np.float32)}, x=(1, 2, 3, 3, 3, 3)),
                 "only 1-D, 2-D and 3-D spatial inputs", id="conv-4d-spatial"),
    pytest.param(hostile_op_model("MaxPool", {"kernel_shape": [2, 2, 2]}, x=(1, 2, 4, 4)),
                 "must cover the 2 spatial axes|shape", id="maxpool-kernel-rank"),
    pytest.param(hostile_op_model("Conv", {"kernel_shape": [2**40, 2**40]}, {"w": np.ones((2, 2, 1, 1), np.float32)}),
                 "negative dim", id="conv-kernel-huge"),
    pytest.param(hostile_op_model("Conv", {"pads": [2**40] * 4}, {"w": np.ones((2, 2, 1, 1), np.float32)}),
                 "over farm's limit of 4294967296 per tensor", id="conv-pads-huge"),
    pytest.param(hostile_op_model("ConvTranspose", {"output_shape": [2**40, 2**40]},
                                  {"w": np.ones((2, 2, 1, 1), np.float32)}),
                 "over farm's limit of 4294967296 per tensor", id="convtranspose-output-shape"),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)


def test_a_gemm_whose_operands_disagree_is_refused_before_its_kernel_reads_past_b(tmp_path):
    """A fuzzed small_cnn whose Flatten was rewired to a bigger value: inference gave the Gemm no shape, the declared
    output stood in, and the kernel read 4096 columns of a 32-column B (SIGSEGV at run, issue 13)."""
    from numerics import assert_refused

    model = hostile_op_model("Gemm", {"transB": 1}, {"b": np.ones((10, 32), np.float32)}, x=(1, 4096))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 1
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 10
    assert_refused(model, "input shapes are inconsistent", tmp_path)


def test_gemm_and_matmul_check_their_operands_whatever_inference_found():
    from farm.errors import UnsupportedError
    from farm.ir.graph import Node, TensorInfo
    from farm.ops.registry import NodeContext

    def context(op, a, b, y):
        return NodeContext(Node("victim", op, ["a", "b"], ["y"]), [TensorInfo(a), TensorInfo(b)], [TensorInfo(y)],
                           {}, 17)

    with pytest.raises(UnsupportedError, match="can't give Y"):
        nn._gemm_attrs(context("Gemm", (1, 4096), (32, 10), (1, 10)))
    with pytest.raises(UnsupportedError, match="the inner dims differ"):
        nn._matmul_attrs(context("MatMul", (2, 1, 4096), (32, 10), (2, 1, 10)))
    assert nn._matmul_attrs(context("MatMul", (2, 3, 32), (32,), (2, 3))) == {}


def test_conv_and_pool_windows_are_checked_whatever_inference_found():
    """The weight's rank, kernel_shape against the weight, and the window's attributes against the spatial rank:
    the kernels index by them, so a mismatch would read the wrong weights or past a buffer."""
    from farm.errors import UnsupportedError
    from farm.ir.graph import Node, TensorInfo
    from farm.ops.registry import NodeContext

    def context(op, x, attrs, weight=None):
        inputs = [TensorInfo(x)] + ([TensorInfo(weight)] if weight else [])
        return NodeContext(Node("victim", op, ["x", "w"][:len(inputs)], ["y"], attrs), inputs, [TensorInfo(x)], {}, 17)

    with pytest.raises(UnsupportedError, match="of the input's rank"):
        nn._conv_attrs(context("Conv", (1, 2, 4, 4, 4), {}, (3, 2, 2, 2)))
    with pytest.raises(UnsupportedError, match="differs from the weight's"):
        nn._conv_attrs(context("Conv", (1, 2, 9), {"kernel_shape": [2]}, (3, 2, 3)))
    with pytest.raises(UnsupportedError, match="must cover the 3 spatial axes"):
        nn._pool_attrs(context("MaxPool", (1, 2, 4, 4, 4), {"kernel_shape": [2, 2]}))
    with pytest.raises(UnsupportedError, match="must cover the 1 spatial axes"):
        nn._pool_attrs(context("AveragePool", (1, 2, 9), {"kernel_shape": [2], "pads": [1, 1, 1, 1]}))
