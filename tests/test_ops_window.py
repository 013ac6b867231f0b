"""farm.ops.window: the window Conv and the pools share (a pool's is a conv's without its channels, a 1-D one a plane
of height 1, 3-D ones lower to loop nests without scratch), and the window attributes checked whatever shape inference
found."""

from __future__ import annotations

import onnx
import pytest
from numerics import rand, single_op_model

from farm.build.assembly import plan_model
from farm.ir.specs import KernelSpec
from farm.ops import LOWERINGS, conv, pool, window


def _spec_of(model: onnx.ModelProto, tmp_path) -> KernelSpec:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return plan_model(path).steps[0].spec


def test_pool_window_is_the_conv_window_without_channels(tmp_path) -> None:
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 0, 0]}
    spec = _spec_of(single_op_model("MaxPool", [("x", (1, 3, 8, 7))], attrs), tmp_path)
    assert window.window(spec) == window.Window(
        height=8,
        width=7,
        out_height=4,
        out_width=4,
        kernel_height=3,
        kernel_width=2,
        stride_height=2,
        stride_width=2,
        dilation_height=1,
        dilation_width=1,
        pad_top=1,
        pad_left=1,
    )


def test_a_1d_window_is_a_plane_of_height_1(tmp_path) -> None:
    """A 1-D conv's attributes come out as a 2-D conv's (window._as_plane), so its kernel is a 2-D one's."""
    attrs = {"strides": [2], "dilations": [3], "pads": [2, 1]}
    spec = _spec_of(single_op_model("Conv", [("x", (1, 3, 20))], attrs, {"w": rand(4, 3, 3)}), tmp_path)
    assert {key: spec.attrs[key] for key in ("kernel_shape", "strides", "dilations", "pads")} == {
        "kernel_shape": [1, 3],
        "strides": [1, 2],
        "dilations": [1, 3],
        "pads": [0, 2, 0, 1],
    }
    assert window.window(spec) == window.Window(
        height=1,
        width=20,
        out_height=1,
        out_width=9,
        kernel_height=1,
        kernel_width=3,
        stride_height=1,
        stride_width=2,
        dilation_height=1,
        dilation_width=3,
        pad_top=0,
        pad_left=2,
    )


def test_3d_convs_and_pools_lower_to_loop_nests_without_scratch(tmp_path) -> None:
    conv_spec = _spec_of(single_op_model("Conv", [("x", (1, 2, 4, 4, 4))], {}, {"w": rand(3, 2, 2, 2, 2)}), tmp_path)
    pool_spec = _spec_of(single_op_model("MaxPool", [("x", (1, 2, 4, 4, 4))], {"kernel_shape": [2, 2, 2]}), tmp_path)
    assert LOWERINGS["Conv"].scratch_floats(conv_spec) == LOWERINGS["MaxPool"].scratch_floats(pool_spec) == 0
    assert conv.CONV_LOWERINGS[window._spatial_rank(conv_spec)].lower is conv._lower_conv_volumes
    assert pool.POOL_LOWERINGS[window._spatial_rank(pool_spec)].lower is pool._lower_pool_volumes


def test_conv_and_pool_windows_are_checked_whatever_inference_found():
    """The weight's rank, kernel_shape against the weight, and the window's attributes against the spatial rank:
    the kernels index by them, so a mismatch would read the wrong weights or past a buffer."""
    from farm.errors import UnsupportedError
    from farm.ir.graph import Node, TensorInfo
    from farm.ops.registry import NodeContext

    def context(op, x, attrs, weight=None):
        inputs = [TensorInfo(x)] + ([TensorInfo(weight)] if weight else [])
        return NodeContext(Node("victim", op, ["x", "w"][: len(inputs)], ["y"], attrs), inputs, [TensorInfo(x)], {}, 17)

    with pytest.raises(UnsupportedError, match="of the input's rank"):
        conv._conv_attrs(context("Conv", (1, 2, 4, 4, 4), {}, (3, 2, 2, 2)))
    with pytest.raises(UnsupportedError, match="differs from the weight's"):
        conv._conv_attrs(context("Conv", (1, 2, 9), {"kernel_shape": [2]}, (3, 2, 3)))
    with pytest.raises(UnsupportedError, match="must cover the 3 spatial axes"):
        pool._pool_attrs(context("MaxPool", (1, 2, 4, 4, 4), {"kernel_shape": [2, 2]}))
    with pytest.raises(UnsupportedError, match="must cover the 1 spatial axes"):
        pool._pool_attrs(context("AveragePool", (1, 2, 9), {"kernel_shape": [2], "pads": [1, 1, 1, 1]}))
