"""farm.ops.conv against onnxruntime: Conv (its 2-D paths, 1-D convs as planes, 3-D ones as a loop nest) over its
attribute variants; then activations fused into their producer by the passes (convs and ConvTranspose, and the Gemm,
MatMul, elementwise, BatchNormalization and MaxPool producers beside them); the conv geometry; a sample also on
OpenCL; hostile attributes refused. ConvTranspose's own cases are tests/test_ops_conv_transpose.py's."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from numerics import (
    OpCase,
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
from onnx import helper

from farm.build.assembly import plan_model
from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import LOWERINGS, conv, lower_kernel

# ---------------------------------------------------------------------------------------------------------- Conv


def _conv(
    id: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict | None = None, bias: bool = True, opset: int = 17
) -> OpCase:
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
    _conv(
        "depthwise-dilated-uneven-pads",
        (1, 4, 13, 11),
        (4, 1, 3, 3),
        {"group": 4, "pads": [2, 1, 0, 3], "dilations": [2, 2]},
    ),
    _conv(
        "depthwise-stride3-no-interior",
        (1, 3, 5, 4),
        (3, 1, 3, 3),
        {"group": 3, "pads": [2, 2, 2, 2], "strides": [3, 3]},
    ),
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
    # On a CPU the channels of a depthwise conv run in blocks of 8 sharing one padded plane (conv._channel_block):
    # three blocks per image, two images.
    _conv(
        "depthwise-channel-blocks-batch2-stride2",
        (2, 24, 17, 17),
        (24, 1, 3, 3),
        {"group": 24, "pads": [1, 1, 1, 1], "strides": [2, 2]},
    ),
    _conv("1x1-pads2", (1, 3, 4, 4), (4, 3, 1, 1), {"pads": [2, 2, 2, 2]}),
    _conv("pads-beyond-kernel", (1, 3, 4, 4), (4, 3, 3, 3), {"pads": [3, 0, 4, 1]}),
    # Big column matrices of the convs that keep im2col on a CPU (1x1 strided, under 64 taps) are built band by
    # band (conv._column_bands): full bands and a rest; two full bands of a strided 1x1 conv.
    _conv("banded-few-taps-rest", (1, 4, 160, 160), (16, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("banded-strided-1x1", (1, 64, 128, 128), (16, 64, 1, 1), {"strides": [2, 2]}),
    # Convs of 64 taps or more, wider than 1x1, run as implicit GEMMs on a CPU (conv._implicit_gemm): grouped,
    # batched, dilated, strided by rows only, with uneven pads.
    _conv(
        "implicit-groups2-batch2-dilated",
        (2, 32, 15, 15),
        (32, 16, 3, 3),
        {"group": 2, "dilations": [2, 2], "strides": [1, 2], "pads": [2, 1, 2, 3]},
    ),
    _conv("implicit-64-channels-rows", (1, 64, 40, 40), (16, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    # A few pixels by many channels and a deep k: column blocks run k block by k block with their partial sums in
    # a scratch tile (gemm_blocking.small_m_k_block), implicit and transposed pointwise.
    _conv("small-plane-deep-implicit", (1, 64, 7, 7), (100, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("small-plane-deep-pointwise", (1, 600, 7, 7), (112, 600, 1, 1)),
    # Small output planes run transposed (pixels as the GEMM's rows, conv._pixels_as_rows): im2col, pointwise,
    # grouped and strided, a channel tail narrower than a vector, and a single pixel.
    _conv("small-plane-3x3", (1, 32, 7, 7), (48, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    _conv("small-plane-pointwise", (1, 64, 7, 7), (80, 64, 1, 1)),
    _conv(
        "small-plane-groups2-batch2-stride2",
        (2, 32, 13, 13),
        (64, 16, 3, 3),
        {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    _conv("small-plane-channel-tail", (1, 16, 5, 5), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, bias=False),
    _conv("single-pixel-pointwise", (1, 64, 1, 1), (32, 64, 1, 1)),
    _conv("small-plane-13x13-pointwise", (1, 64, 13, 13), (100, 64, 1, 1)),
    _conv("small-plane-pointwise-pixel-major", (1, 64, 13, 13), (400, 64, 1, 1)),
    _conv("small-plane-pointwise-pixel-major-groups2-batch2", (2, 64, 7, 7), (768, 32, 1, 1), {"group": 2}),
    # 196 rows, k = 2304, 256 columns: 6 x 4 tiles where 32 vector registers allow (gemm_blocking.balanced_blocking),
    # the launch's ranges cut at whole blocks of 4 vectors on two threads
    _conv("small-plane-3x3-wide-tile", (1, 256, 14, 14), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}),
    case(
        "conv-weight-as-graph-input",
        single_op_model("Conv", [("x", (1, 3, 6, 6)), ("w", (4, 3, 3, 3))], {"pads": [1, 1, 1, 1]}),
    ),
]

# 1-D convs run as 2-D ones of height 1 (window._as_plane), through each of the 2-D paths: im2col, pointwise, depthwise,
# grouped, implicit GEMM (96 taps), a small plane's transposed GEMM. 3-D convs run as a loop nest.
CONV_1D_3D_CASES: list[OpCase] = [
    _conv("1d-3tap-pads-batch2", (2, 4, 11), (5, 4, 3), {"pads": [1, 1]}),
    _conv(
        "1d-strided-dilated-asymmetric-pads", (1, 3, 20), (4, 3, 3), {"strides": [2], "dilations": [2], "pads": [2, 1]}
    ),
    _conv("1d-pointwise", (1, 8, 9), (6, 8, 1), bias=False),
    _conv("1d-depthwise-causal", (2, 6, 15), (6, 1, 4), {"group": 6, "pads": [3, 0]}),
    _conv("1d-groups2", (1, 8, 10), (6, 4, 3), {"group": 2}),
    _conv("1d-implicit", (1, 32, 30), (16, 32, 3), {"pads": [1, 1]}),
    _conv("1d-small-plane-pointwise", (1, 64, 7), (80, 64, 1)),
    _conv("1d-auto-pad-same-upper-stride2", (1, 3, 10), (4, 3, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    _conv("1d-kernel-shape-attr", (1, 3, 9), (4, 3, 5), {"kernel_shape": [5], "pads": [2, 2]}),
    case(
        "conv-1d-weight-as-graph-input",
        single_op_model("Conv", [("x", (1, 3, 12)), ("w", (4, 3, 3))], {"strides": [3]}),
    ),
    _conv("3d-pads", (1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1] * 6}),
    _conv(
        "3d-strides-dilations-asymmetric-pads",
        (2, 3, 7, 8, 6),
        (4, 3, 2, 3, 2),
        {"strides": [2, 1, 2], "dilations": [1, 2, 1], "pads": [1, 0, 1, 0, 2, 1]},
        bias=False,
    ),
    _conv("3d-groups2", (1, 4, 4, 5, 5), (6, 2, 3, 3, 3), {"group": 2}),
    _conv("3d-depthwise", (1, 3, 5, 5, 5), (3, 1, 3, 3, 3), {"group": 3, "pads": [1] * 6}),
    _conv("3d-pointwise", (1, 5, 3, 4, 5), (4, 5, 1, 1, 1)),
    _conv("3d-auto-pad-same-lower", (1, 2, 5, 5, 5), (2, 2, 2, 2, 2), {"auto_pad": "SAME_LOWER"}),
    case(
        "conv-3d-weight-as-graph-input",
        single_op_model("Conv", [("x", (1, 2, 4, 4, 4)), ("w", (3, 2, 2, 2, 2))], {"pads": [0, 1, 0, 1, 0, 1]}),
    ),
]

# ------------------------------------------------------------------------------------------- fused activations


def _pair(
    id: str, first: tuple, second: tuple, inputs, initializers, opset: int = 17, schedule: tuple[str, ...] = ()
) -> OpCase:
    """Two nodes first -> second (each (op, extra inputs, attrs)); `schedule`: the ops the artifact must run."""
    op1, extra1, attrs1 = first
    op2, extra2, attrs2 = second
    nodes = [
        helper.make_node(op1, [n for n, _ in inputs] + list(extra1), ["t"], name="first", **attrs1),
        helper.make_node(op2, ["t", *extra2], ["y"], name="second", **attrs2),
    ]
    return case(f"fused-{id}", graph_model(nodes, inputs, ["y"], initializers, opset), schedule=schedule)


W = {"w": rand(6, 4, 3, 3, seed=1, scale=0.3), "b": rand(6, seed=2)}
CONV = ("Conv", ["w", "b"], {"pads": [1, 1, 1, 1]})
CONV_X = [("x", (1, 4, 8, 8))]

FUSED_CASES: list[OpCase] = [
    _pair("conv-relu", CONV, ("Relu", [], {}), CONV_X, W, schedule=("Conv",)),
    _pair(
        "conv-clip-0-6",
        CONV,
        ("Clip", ["lo", "hi"], {}),
        CONV_X,
        {**W, "lo": np.float32(0.0), "hi": np.float32(6.0)},
        schedule=("Conv",),
    ),
    _pair("conv-clip-0-6-opset9", CONV, ("Clip", [], {"min": 0.0, "max": 6.0}), CONV_X, W, opset=9, schedule=("Conv",)),
    _pair(
        "conv-clip-only-max", CONV, ("Clip", ["", "hi"], {}), CONV_X, {**W, "hi": np.float32(0.5)}, schedule=("Conv",)
    ),
    _pair("conv-leakyrelu", CONV, ("LeakyRelu", [], {"alpha": 0.1}), CONV_X, W, schedule=("Conv",)),
    _pair(
        "depthwise-conv-clip",
        ("Conv", ["dw"], {"group": 4, "pads": [1, 1, 1, 1]}),
        ("Clip", ["lo", "hi"], {}),
        CONV_X,
        {"dw": rand(4, 1, 3, 3, seed=3), "lo": np.float32(0.0), "hi": np.float32(0.5)},
        schedule=("Conv",),
    ),
    _pair(
        "convtranspose-relu",
        ("ConvTranspose", ["tw", "tb"], {"strides": [2, 2]}),
        ("Relu", [], {}),
        CONV_X,
        {"tw": rand(4, 3, 3, 3, seed=8), "tb": rand(3, seed=9)},
        schedule=("ConvTranspose",),
    ),
    _pair(
        "small-plane-conv-clip",
        ("Conv", ["sw", "sb"], {"pads": [1, 1, 1, 1]}),
        ("Clip", ["lo", "hi"], {}),
        [("x", (1, 16, 7, 7))],
        {
            "sw": rand(32, 16, 3, 3, seed=5, scale=0.1),
            "sb": rand(32, seed=6),
            "lo": np.float32(-0.5),
            "hi": np.float32(0.5),
        },
        schedule=("Conv",),
    ),
    _pair(
        "small-plane-pointwise-conv-leakyrelu",
        ("Conv", ["sw"], {}),
        ("LeakyRelu", [], {"alpha": 0.1}),
        [("x", (1, 16, 7, 7))],
        {"sw": rand(40, 16, 1, 1, seed=7)},
        schedule=("Conv",),
    ),
    case(
        "fused-conv-residual-relu",
        graph_model(
            [
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Add", ["c", "r"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"]),
            ],
            [*CONV_X, ("r", (1, 6, 8, 8))],
            ["y"],
            W,
        ),
        schedule=("Conv",),
    ),
    case(
        "fused-implicit-conv-residual-relu",
        graph_model(
            [
                helper.make_node("Conv", ["x", "bw", "bb"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Add", ["c", "r"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"]),
            ],
            [("x", (1, 64, 40, 40)), ("r", (1, 16, 40, 40))],
            ["y"],
            {"bw": rand(16, 64, 3, 3, seed=9, scale=0.05), "bb": rand(16, seed=10)},
        ),
        schedule=("Conv",),
    ),
    # The residual an activation that dies at the conv, which writes over it (planner._residuals_in_place).
    case(
        "fused-conv-residual-in-place-relu",
        graph_model(
            [
                helper.make_node("Relu", ["r"], ["q"]),
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Add", ["c", "q"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"]),
            ],
            [*CONV_X, ("r", (1, 6, 8, 8))],
            ["y"],
            W,
        ),
        schedule=("Relu", "Conv"),
    ),
    case(
        "fused-implicit-conv-residual-in-place",
        graph_model(
            [
                helper.make_node("Relu", ["r"], ["q"]),
                helper.make_node("Conv", ["x", "bw"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Add", ["q", "c"], ["y"]),
                helper.make_node("Sigmoid", ["y"], ["z"]),
            ],
            [("x", (1, 64, 40, 40)), ("r", (1, 16, 40, 40))],
            ["z"],
            {"bw": rand(16, 64, 3, 3, seed=9, scale=0.05)},
        ),
        schedule=("Relu", "Conv", "Sigmoid"),
    ),
    case(
        "fused-small-plane-deep-conv-residual-clip",
        graph_model(
            [
                helper.make_node("Conv", ["x", "dw_", "db"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Add", ["c", "r"], ["s"]),
                helper.make_node("Clip", ["s", "lo", "hi"], ["y"]),
            ],
            [("x", (1, 64, 7, 7)), ("r", (1, 100, 7, 7))],
            ["y"],
            {
                "dw_": rand(100, 64, 3, 3, seed=11, scale=0.05),
                "db": rand(100, seed=12),
                "lo": np.float32(-0.5),
                "hi": np.float32(0.5),
            },
        ),
        schedule=("Conv",),
    ),
    case(
        "fused-small-plane-pointwise-conv-residual",
        graph_model(
            [helper.make_node("Conv", ["x", "pw"], ["c"]), helper.make_node("Sum", ["r", "c"], ["y"])],
            [("x", (1, 16, 7, 7)), ("r", (1, 32, 7, 7))],
            ["y"],
            {"pw": rand(32, 16, 1, 1, seed=8)},
        ),
        schedule=("Conv",),
    ),
    _pair(
        "pointwise-conv-relu",
        ("Conv", ["pw"], {}),
        ("Relu", [], {}),
        CONV_X,
        {"pw": rand(5, 4, 1, 1, seed=4)},
        schedule=("Conv",),
    ),
    _pair(
        "gemm-leakyrelu",
        ("Gemm", ["gw", "gb"], {"transB": 1}),
        ("LeakyRelu", [], {"alpha": 0.2}),
        [("x", (3, 10))],
        {"gw": rand(7, 10, seed=5), "gb": rand(7, seed=6)},
        schedule=("Gemm",),
    ),
    _pair(
        "gemm-plain-relu",
        ("Gemm", ["gw", "gb"], {}),
        ("Relu", [], {}),
        [("x", (3, 10))],
        {"gw": rand(10, 7, seed=5), "gb": rand(7, seed=6)},
        schedule=("Gemm",),
    ),
    _pair(
        "matmul-relu",
        ("MatMul", ["mw"], {}),
        ("Relu", [], {}),
        [("x", (2, 3, 10))],
        {"mw": rand(10, 4, seed=7)},
        schedule=("MatMul",),
    ),
    _pair("add-relu", ("Add", [], {}), ("Relu", [], {}), [("x", (2, 3, 4)), ("z", (3, 1))], {}, schedule=("Add",)),
    _pair(
        "mul-clip",
        ("Mul", [], {}),
        ("Clip", ["lo", "hi"], {}),
        [("x", (2, 3, 4)), ("z", (4,))],
        {"lo": np.float32(-0.5), "hi": np.float32(0.5)},
        schedule=("Mul",),
    ),
    _pair(
        "sum-leakyrelu",
        ("Sum", [], {}),
        ("LeakyRelu", [], {}),
        [("x", (2, 3)), ("z", (3,)), ("q", (2, 1))],
        {},
        schedule=("Sum",),
    ),
    _pair(
        "batchnorm-relu",
        ("BatchNormalization", ["s", "bb", "m", "v"], {}),
        ("Relu", [], {}),
        [("x", (1, 3, 4, 4))],
        {"s": rand(3, seed=1), "bb": rand(3, seed=2), "m": rand(3, seed=3), "v": rand(3, seed=4, positive=True)},
        schedule=("BatchNormalization",),
    ),
    _pair(
        "maxpool-relu-not-fused",
        ("MaxPool", [], {"kernel_shape": [2, 2]}),
        ("Relu", [], {}),
        CONV_X,
        {},
        schedule=("MaxPool", "Relu"),
    ),
    case(
        "fused-conv-batchnorm-relu",
        graph_model(
            [
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
                helper.make_node("Relu", ["n"], ["y"]),
            ],
            CONV_X,
            ["y"],
            {
                **W,
                "s": rand(6, seed=1),
                "bb": rand(6, seed=2),
                "m": rand(6, seed=3),
                "v": rand(6, seed=4, positive=True),
            },
        ),
        schedule=("Conv",),
    ),
    _pair(
        "conv1d-relu",
        ("Conv", ["w1"], {"pads": [1, 1]}),
        ("Relu", [], {}),
        [("x", (1, 4, 9))],
        {"w1": rand(6, 4, 3, seed=13)},
        schedule=("Conv",),
    ),
    _pair(
        "conv3d-clip",
        ("Conv", ["w3", "b3"], {"pads": [1] * 6}),
        ("Clip", ["lo", "hi"], {}),
        [("x", (1, 2, 4, 5, 4))],
        {
            "w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3),
            "b3": rand(3, seed=15),
            "lo": np.float32(-0.5),
            "hi": np.float32(0.5),
        },
        schedule=("Conv",),
    ),
    case(
        "fused-conv3d-residual-relu",
        graph_model(
            [
                helper.make_node("Conv", ["x", "w3", "b3"], ["c"], pads=[1] * 6),
                helper.make_node("Add", ["c", "r"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"]),
            ],
            [("x", (1, 2, 4, 5, 4)), ("r", (1, 3, 4, 5, 4))],
            ["y"],
            {"w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3), "b3": rand(3, seed=15)},
        ),
        schedule=("Conv",),
    ),
    case(
        "fused-conv3d-residual-in-place",
        graph_model(
            [
                helper.make_node("Relu", ["r"], ["q"]),
                helper.make_node("Conv", ["x", "w3"], ["c"], pads=[1] * 6),
                helper.make_node("Add", ["q", "c"], ["y"]),
                helper.make_node("Sigmoid", ["y"], ["z"]),
            ],
            [("x", (1, 2, 4, 5, 4)), ("r", (1, 3, 4, 5, 4))],
            ["z"],
            {"w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3)},
        ),
        schedule=("Relu", "Conv", "Sigmoid"),
    ),
    case(
        "fused-conv3d-batchnorm",
        graph_model(
            [
                helper.make_node("Conv", ["x", "w3", "b3"], ["c"]),
                helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"]),
            ],
            [("x", (1, 2, 4, 5, 4))],
            ["y"],
            {
                "w3": rand(3, 2, 3, 3, 3, seed=14, scale=0.3),
                "b3": rand(3, seed=15),
                "s": rand(3, seed=1),
                "bb": rand(3, seed=2),
                "m": rand(3, seed=3),
                "v": rand(3, seed=4, positive=True),
            },
        ),
        schedule=("Conv",),
    ),
    # A depthwise conv never absorbs a residual (its kernel has no GEMM epilogue), 1-D ones included.
    case(
        "fused-conv1d-depthwise-residual-not-absorbed",
        graph_model(
            [
                helper.make_node("Conv", ["x", "dw1"], ["c"], group=4, pads=[1, 1]),
                helper.make_node("Add", ["c", "r"], ["y"]),
            ],
            [("x", (1, 4, 9)), ("r", (1, 4, 9))],
            ["y"],
            {"dw1": rand(4, 1, 3, seed=16)},
        ),
        schedule=("Conv", "Add"),
    ),
    case(
        "fused-conv-relu-output-also-used",
        graph_model(
            [
                helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["y"]),
            ],
            CONV_X,
            ["c", "y"],
            W,
        ),
        schedule=("Conv", "Relu"),
    ),
]

CASES: list[OpCase] = CONV_CASES + CONV_1D_3D_CASES
ALL_CASES: list[OpCase] = CASES + FUSED_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


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
    geo = conv._conv_geometry(spec)
    assert geo == conv.ConvGeometry(
        batch=2,
        in_channels=6,
        out_channels=4,
        groups=2,
        height=9,
        width=11,
        out_height=5,
        out_width=11,
        kernel_height=3,
        kernel_width=2,
        stride_height=2,
        stride_width=1,
        dilation_height=1,
        dilation_width=2,
        pad_top=1,
        pad_left=0,
    )
    assert (geo.in_channels_per_group, geo.out_channels_per_group) == (3, 2)
    assert (geo.in_pixels, geo.out_pixels, geo.column_rows) == (99, 55, 3 * 3 * 2)
    assert geo.column_stride == 64  # 55 pixels a row, padded to a cache line
    assert LOWERINGS["Conv"].scratch_floats(spec) == geo.column_rows * geo.column_stride  # one group's im2col matrix


def test_planes_whose_pixels_tile_vectors_badly_run_pixels_as_rows(tmp_path) -> None:
    """What a side of the GEMM costs is its tiling's (whole vectors, an 8- and a 4-float vector, single floats): a
    13x13 plane (169 pixels: 10 vectors, an 8-float one and a float) runs pixels as rows by 100 channels, as 7x7
    does; 14x14 (12 vectors and a 4-float one) and 28x28 keep channels as rows."""
    assert [conv._tiled_cost(n) for n in (49, 169, 196, 784, 100, 1000)] == [64, 192, 208, 784, 112, 1008]
    for side, transposed in ((7, True), (13, True), (14, False), (28, False)):
        model = single_op_model("Conv", [("x", (1, 64, side, side))], {}, {"w": rand(100, 64, 1, 1)})
        spec = _spec_of(model, tmp_path)
        assert conv._pixels_as_rows(spec, conv._conv_geometry(spec)) == transposed, side


def test_wide_pointwise_convs_on_14x14_planes_run_pixels_as_rows(tmp_path) -> None:
    """A 14x14 plane (waste 1.06) runs pixels as rows once both sides of a pointwise conv have at least
    WIDE_POINTWISE_CHANNELS channels (ResNet-50's 256 -> 1024), not with fewer on either side, nor as a 3x3 conv."""
    cases = (((256, 1024, 1), True), ((1024, 256, 1), True), ((576, 128, 1), False), ((128, 576, 1), False))
    for (inputs, outputs, kernel), transposed in (*cases, ((256, 256, 3), False)):
        pads = {"pads": [kernel // 2] * 4}
        model = single_op_model(
            "Conv", [("x", (1, inputs, 14, 14))], pads, {"w": rand(outputs, inputs, kernel, kernel)}
        )
        spec = _spec_of(model, tmp_path)
        assert conv._pixels_as_rows(spec, conv._conv_geometry(spec)) == transposed, (inputs, outputs, kernel)


def _gemms(stmts: list) -> list[L.Gemm]:
    found = []
    for stmt in stmts:
        found += [stmt] if isinstance(stmt, L.Gemm) else _gemms(getattr(stmt, "body", []))
    return found


def test_a_small_plane_pointwise_conv_copies_its_input_pixel_major_on_a_cpu(tmp_path) -> None:
    """Run pixels as rows with PIXEL_MAJOR_MIN_PANELS panels of weights or more, a pointwise conv's CPU form first
    copies its input pixel by pixel (a line more than its channels apart) and reads that copy as the GEMM's A as it
    is; an unspecialised (OpenCL) spec reads the input transposed. The scratch the memory plan gives it (from the
    unspecialised spec) holds the copy. With fewer output channels, or 28x28 pixels as columns, nothing is copied."""

    def gemm_of(spec: KernelSpec) -> L.Gemm:
        (gemm,) = _gemms(lower_kernel(spec).body)
        return gemm

    def conv_spec(side: int, channels: int) -> KernelSpec:
        model = single_op_model("Conv", [("x", (1, 512, side, side))], {}, {"w": rand(channels, 512, 1, 1)})
        return _spec_of(model, tmp_path)

    def on_cpu(spec: KernelSpec) -> KernelSpec:
        return dataclasses.replace(spec, target_id="cpu-test")

    assert conv.PIXEL_MAJOR_MIN_PANELS * conv.WEIGHT_PANEL_COLUMNS == 384
    spec = conv_spec(13, 384)
    assert not spec.for_cpu and on_cpu(spec).for_cpu
    generic, copied = gemm_of(spec), gemm_of(on_cpu(spec))
    assert (generic.a, generic.a_transposed, generic.lda) == ("in0", True, 169)
    assert (copied.a, copied.a_transposed, copied.lda, copied.m, copied.k) == ("scratch", False, 512 + 16, 169, 512)
    assert LOWERINGS["Conv"].scratch_floats(spec) == 169 * (512 + 16)
    few_panels = conv_spec(13, 380)
    assert (gemm_of(on_cpu(few_panels)).a, LOWERINGS["Conv"].scratch_floats(few_panels)) == ("in0", 0)
    channels_as_rows = conv_spec(28, 384)  # 784 pixels tile their vectors
    assert (gemm_of(on_cpu(channels_as_rows)).b, LOWERINGS["Conv"].scratch_floats(channels_as_rows)) == ("in0", 0)


# ------------------------------------------------------------------------------------------------- OpenCL

# A ConvTranspose with a fused activation, convs whose GEMM runs transposed (small planes) or reads im2col rows
# padded to a cache line, and the depthwise convs whose CPU form blocks channels (OpenCL keeps a work-item per
# channel), rendered as OpenCL C and run on this host's device.
OPENCL_SAMPLE = [
    "fused-convtranspose-relu",
    "conv-small-plane-3x3",
    "conv-small-plane-pointwise",
    "conv-small-plane-pointwise-pixel-major-groups2-batch2",
    "conv-small-plane-groups2-batch2-stride2",
    "conv-small-plane-channel-tail",
    "conv-3x3-stride2-asymmetric-pads",
    "fused-conv-relu",
    "fused-conv-leakyrelu",
    "fused-conv-clip-0-6",
    "fused-small-plane-conv-clip",
    "fused-small-plane-pointwise-conv-leakyrelu",
    "fused-conv-residual-relu",
    "fused-small-plane-pointwise-conv-residual",
    "conv-banded-strided-1x1",
    "conv-implicit-groups2-batch2-dilated",
    "fused-implicit-conv-residual-relu",
    "fused-conv-residual-in-place-relu",
    "fused-implicit-conv-residual-in-place",
    "conv-depthwise-channel-blocks-batch2-stride2",
    "conv-1d-implicit",
    "conv-1d-depthwise-causal",
    "conv-1d-strided-dilated-asymmetric-pads",
    "conv-3d-strides-dilations-asymmetric-pads",
    "conv-3d-groups2",
    "fused-conv3d-residual-in-place",
    "fused-conv3d-clip",
]


@pytest.mark.parametrize("c", params(c for c in ALL_CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in ALL_CASES}


# Hostile attributes (issue 13): each is refused with one line naming the node, before anything is built.
HOSTILE = [
    pytest.param(
        hostile_op_model(
            "Conv", {"kernel_shape": [2**40, 1, 1]}, {"w": np.ones((2, 2, 1, 1, 1), np.float32)}, x=(1, 2, 4, 4, 4)
        ),
        "empty dim|negative dim|differs from the weight's",
        id="conv-3d-kernel-huge",
    ),
    pytest.param(
        hostile_op_model("Conv", {"kernel_shape": [1, 1]}, {"w": np.ones((2, 2, 3, 3), np.float32)}),
        "kernel_shape \\[1, 1\\] differs from the weight's \\[3, 3\\]",
        id="conv-kernel-shape-not-the-weights",
    ),
    pytest.param(
        hostile_op_model("Conv", {}, {"w": np.ones((2, 2, 3, 3), np.float32)}, x=(1, 2, 4, 4, 4)),
        "the weight must be a tensor \\[M, C/group, k...\\] of the input's rank|shape",
        id="conv-weight-rank",
    ),
    pytest.param(
        hostile_op_model("Conv", {}, {"w": np.ones((2, 2, 1, 1, 1, 1), np.float32)}, x=(1, 2, 3, 3, 3, 3)),
        "only 1-D, 2-D and 3-D spatial inputs",
        id="conv-4d-spatial",
    ),
    pytest.param(
        hostile_op_model("Conv", {"kernel_shape": [2**40, 2**40]}, {"w": np.ones((2, 2, 1, 1), np.float32)}),
        "negative dim",
        id="conv-kernel-huge",
    ),
    pytest.param(
        hostile_op_model("Conv", {"pads": [2**40] * 4}, {"w": np.ones((2, 2, 1, 1), np.float32)}),
        "over farm's limit of 4294967296 per tensor",
        id="conv-pads-huge",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
