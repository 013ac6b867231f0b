"""farm.ops.conv_transpose against onnxruntime: ConvTranspose over its attribute variants (any number of spatial
axes, groups, strides, dilations, output padding and shape, auto_pad); its geometry; a sample also on OpenCL; hostile
attributes refused. A ConvTranspose with a fused activation is among tests/test_ops_conv.py's fused cases."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from numerics import (
    OpCase,
    assert_refused,
    case,
    check_case,
    check_case_on_opencl,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)

from farm.build.assembly import plan_model
from farm.ir.specs import KernelSpec
from farm.ops import conv_transpose


def _conv_transpose(
    id: str, x: tuple[int, ...], w: tuple[int, ...], attrs: dict | None = None, bias: bool = True, opset: int = 17
) -> OpCase:
    """ConvTranspose of x with weights w (C, M/group, k...) and a bias of M = w[1] * group."""
    initializers = {"w": rand(*w, seed=1, scale=1.0 / np.sqrt(np.prod(w[1:])))}
    if bias:
        initializers["b"] = rand(w[1] * (attrs or {}).get("group", 1), seed=2)
    return case(f"convtranspose-{id}", single_op_model("ConvTranspose", [("x", x)], attrs or {}, initializers, opset))


CASES: list[OpCase] = [
    _conv_transpose("3x3", (1, 4, 5, 5), (4, 6, 3, 3)),
    _conv_transpose("3x3-no-bias", (1, 4, 5, 6), (4, 3, 3, 3), bias=False),
    _conv_transpose("stride2-pads1", (1, 4, 5, 5), (4, 6, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv_transpose(
        "stride2-output-padding",
        (1, 3, 4, 5),
        (3, 2, 3, 3),
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    _conv_transpose("stride-3-2", (2, 3, 4, 5), (3, 2, 3, 2), {"strides": [3, 2]}),
    _conv_transpose("4x4-stride2-pad1-dcgan", (1, 32, 8, 8), (32, 16, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv_transpose("dilation2", (1, 2, 5, 5), (2, 3, 3, 3), {"dilations": [2, 2]}),
    _conv_transpose(
        "dilation2-stride2", (1, 2, 4, 4), (2, 3, 3, 3), {"dilations": [2, 2], "strides": [2, 2], "pads": [2, 1, 0, 1]}
    ),
    _conv_transpose("asymmetric-pads", (1, 3, 5, 5), (3, 2, 3, 3), {"pads": [0, 2, 1, 0]}),
    _conv_transpose("groups2", (1, 4, 5, 5), (4, 3, 3, 3), {"group": 2}),
    _conv_transpose("groups2-batch2-stride2", (2, 4, 4, 4), (4, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
    _conv_transpose("depthwise", (1, 4, 5, 5), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _conv_transpose("kernel-shape-attr", (1, 2, 4, 4), (2, 3, 3, 3), {"kernel_shape": [3, 3]}),
    _conv_transpose("output-shape", (1, 2, 3, 3), (2, 3, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    _conv_transpose(
        "output-shape-odd-padding", (1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [6, 5]}
    ),
    _conv_transpose(
        "output-shape-same-upper",
        (1, 2, 3, 3),
        (2, 3, 3, 3),
        {"strides": [2, 2], "output_shape": [6, 5], "auto_pad": "SAME_UPPER"},
    ),
    _conv_transpose("auto-pad-same-upper", (1, 2, 4, 5), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    _conv_transpose("auto-pad-same-lower", (1, 2, 4, 5), (2, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    _conv_transpose("auto-pad-valid", (1, 2, 4, 4), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    _conv_transpose("1x1", (1, 8, 4, 4), (8, 5, 1, 1)),
    _conv_transpose("1d", (2, 3, 7), (3, 4, 3), {"strides": [2], "pads": [1, 0]}),
    _conv_transpose("3d", (1, 2, 3, 4, 3), (2, 3, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 0, 1, 1]}),
    _conv_transpose("opset9", (1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2]}, opset=9),
    case(
        "convtranspose-weight-as-graph-input",
        single_op_model("ConvTranspose", [("x", (1, 3, 4, 4)), ("w", (3, 2, 3, 3))], {"strides": [2, 2]}),
    ),
]


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


# ----------------------------------------------------------------------------------------------- geometry


def _spec_of(model: onnx.ModelProto, tmp_path) -> KernelSpec:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return plan_model(path).steps[0].spec


def test_conv_transpose_geometry_sizes_the_transposed_weights_and_the_column_buffer(tmp_path) -> None:
    model = single_op_model(
        "ConvTranspose", [("x", (1, 4, 5, 6))], {"group": 2, "strides": [2, 2]}, {"w": rand(4, 3, 3, 2)}
    )
    spec = _spec_of(model, tmp_path)
    geo = conv_transpose._conv_transpose_geometry(spec)
    assert (geo.batch, geo.in_channels, geo.out_channels, geo.groups) == (1, 4, 6, 2)
    assert (geo.in_sizes, geo.out_sizes, geo.taps, geo.in_pixels) == ([5, 6], [11, 12], 6, 30)
    assert (geo.in_channels_per_group, geo.column_rows, geo.column_start) == (2, 3 * 6, 2 * 18 * 2)
    assert conv_transpose._conv_transpose_scratch(spec) == geo.column_start + geo.column_rows * geo.in_pixels


# ------------------------------------------------------------------------------------------------- OpenCL

# Transposed weights, the Gemm into scratch and col2im with tap skipping, rendered as OpenCL C and run on this host's
# device.
OPENCL_SAMPLE = [
    "convtranspose-stride2-output-padding",
    "convtranspose-groups2-batch2-stride2",
    "convtranspose-dilation2-stride2",
    "convtranspose-3d",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


# Hostile attributes (issue 13): each is refused with one line naming the node, before anything is built.
HOSTILE = [
    pytest.param(
        hostile_op_model("ConvTranspose", {"output_shape": [2**40, 2**40]}, {"w": np.ones((2, 2, 1, 1), np.float32)}),
        "over farm's limit of 4294967296 per tensor",
        id="convtranspose-output-shape",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
