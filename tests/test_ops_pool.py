"""farm.ops.pool against onnxruntime: MaxPool and AveragePool (planes, 1-D and 3-D), LpPool, GlobalAveragePool and
GlobalMaxPool over their attribute variants; a sample also on OpenCL; hostile windows refused."""

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
    hostile_op_model,
    params,
    rand,
    single_op_model,
)

from farm.build.assembly import plan_model
from farm.ops import LOWERINGS, lower_kernel

POOL_X = [("x", (1, 3, 10, 10))]


def _pool(op: str, id: str, attrs: dict, x: tuple[int, ...] = (1, 3, 10, 10), opset: int = 17) -> OpCase:
    return case(f"{op.lower()}-{id}", single_op_model(op, [("x", x)], attrs, opset=opset))


POOL_CASES: list[OpCase] = [
    _pool("MaxPool", "2x2-s2", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    _pool("MaxPool", "3x3-default-strides", {"kernel_shape": [3, 3]}),
    _pool("MaxPool", "3x3-s2-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    _pool("MaxPool", "3x3-s2-asymmetric-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 2, 0]}),
    _pool("MaxPool", "3x3-s2-ceil", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    _pool(
        "MaxPool",
        "3x3-s2-ceil-pads",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        x=(1, 2, 11, 12),
    ),
    _pool("MaxPool", "same-upper", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    _pool("MaxPool", "same-upper-even-kernel", {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}, x=(1, 2, 7, 7)),
    _pool("MaxPool", "same-lower", {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}, x=(1, 2, 7, 7)),
    _pool("MaxPool", "valid", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}, x=(1, 2, 9, 10)),
    _pool("MaxPool", "dilations2", {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    _pool(
        "MaxPool",
        "dilations2-pads-s2",
        {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    _pool("MaxPool", "kernel-larger-than-stride", {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2]}),
    _pool("MaxPool", "non-square", {"kernel_shape": [2, 3], "strides": [1, 2]}, x=(2, 3, 8, 11)),
    _pool("MaxPool", "opset9", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, opset=9),
    _pool("MaxPool", "opset11-ceil", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, opset=11),
    # On a CPU a MaxPool reads padded planes shared by blocks of 8 channels (pool._pool_planes): four blocks.
    _pool(
        "MaxPool",
        "channel-blocks-batch2",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        x=(2, 16, 21, 20),
    ),
    _pool("AveragePool", "2x2-s2", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    _pool("AveragePool", "pads-exclude", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    _pool(
        "AveragePool",
        "pads-include",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    ),
    _pool(
        "AveragePool",
        "asymmetric-pads-include",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 2, 0], "count_include_pad": 1},
    ),
    _pool(
        "AveragePool",
        "asymmetric-pads-exclude",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 2, 0], "count_include_pad": 0},
    ),
    _pool("AveragePool", "ceil-exclude", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    _pool(
        "AveragePool",
        "ceil-include",
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 1},
    ),
    _pool(
        "AveragePool",
        "ceil-pads-include",
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1], "count_include_pad": 1},
        x=(1, 2, 11, 12),
    ),
    _pool("AveragePool", "same-upper", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    _pool(
        "AveragePool",
        "same-upper-include",
        {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "count_include_pad": 1},
        x=(1, 2, 7, 7),
    ),
    _pool(
        "AveragePool", "kernel-larger-than-stride", {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2]}
    ),
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
    _pool(
        "MaxPool",
        "ceil-last-window-in-pad",
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        x=(1, 2, 5, 5),
    ),
    _pool(
        "AveragePool",
        "ceil-last-window-in-pad",
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
        x=(1, 2, 5, 5),
    ),
    _pool(
        "AveragePool",
        "ceil-last-window-in-pad-include",
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 1, 0, 1], "ceil_mode": 1, "count_include_pad": 1},
        x=(1, 2, 4, 5),
    ),
    # A window of -inf only: the max is -inf (onnxruntime agrees), not the most negative float.
    case(
        "maxpool-all-minus-inf-window",
        single_op_model("MaxPool", [("x", (1, 2, 3, 3))], {"kernel_shape": [2, 2]}),
        {"x": np.where(np.arange(18).reshape(1, 2, 3, 3) < 9, -np.inf, rand(1, 2, 3, 3)).astype(np.float32)},
    ),
]

# MaxPool and AveragePool over 1-D inputs (planes of height 1: the 2-D kernels, channel blocks on a CPU included)
# and 3-D ones (a loop nest), with pads, dilations, ceil_mode, auto_pad and count_include_pad.
POOL_1D_3D_CASES: list[OpCase] = [
    _pool("MaxPool", "1d-pads-s2", {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, x=(2, 3, 11)),
    _pool(
        "MaxPool",
        "1d-ceil-dilated",
        {"kernel_shape": [2], "strides": [2], "dilations": [2], "ceil_mode": 1},
        x=(1, 2, 10),
    ),
    _pool("MaxPool", "1d-channel-blocks", {"kernel_shape": [3], "strides": [2]}, x=(2, 16, 21)),
    _pool(
        "AveragePool",
        "1d-include-pad",
        {"kernel_shape": [3], "strides": [2], "pads": [1, 2], "count_include_pad": 1},
        x=(1, 3, 12),
    ),
    _pool("AveragePool", "1d-same-upper", {"kernel_shape": [4], "auto_pad": "SAME_UPPER"}, x=(1, 3, 9)),
    _pool("MaxPool", "3d-2x2x2-s2", {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, x=(1, 2, 6, 7, 8)),
    _pool(
        "MaxPool",
        "3d-pads-dilations",
        {"kernel_shape": [3, 2, 3], "strides": [1, 2, 2], "pads": [1, 0, 1, 1, 1, 0], "dilations": [1, 2, 1]},
        x=(2, 2, 5, 6, 7),
    ),
    _pool("MaxPool", "3d-ceil", {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "ceil_mode": 1}, x=(1, 2, 8, 7, 9)),
    _pool(
        "AveragePool",
        "3d-pads-exclude",
        {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1] * 6},
        x=(1, 2, 7, 6, 5),
    ),
    _pool(
        "AveragePool",
        "3d-ceil-pads-include",
        {
            "kernel_shape": [3, 3, 2],
            "strides": [2, 2, 2],
            "ceil_mode": 1,
            "pads": [1, 0, 1, 1, 0, 0],
            "count_include_pad": 1,
        },
        x=(1, 2, 8, 7, 6),
    ),
    _pool("AveragePool", "3d-same-upper", {"kernel_shape": [2, 3, 2], "auto_pad": "SAME_UPPER"}, x=(1, 2, 5, 5, 5)),
]

# LpPool over 1, 2 and 3 spatial axes (one N-D kernel); its padding adds nothing to the sum.
LP_POOL_CASES: list[OpCase] = [
    _pool("LpPool", "2d-default", {"kernel_shape": [3, 3]}, opset=18),
    _pool("LpPool", "1d", {"kernel_shape": [3]}, x=(2, 3, 11), opset=18),
    _pool("LpPool", "3d", {"kernel_shape": [2, 3, 2], "strides": [1, 2, 1]}, x=(1, 2, 4, 6, 5), opset=18),
    _pool("LpPool", "p1", {"kernel_shape": [2, 2], "p": 1}, opset=18),
    _pool(
        "LpPool", "p3-strides-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 2, 1], "p": 3}, opset=18
    ),
    _pool(
        "LpPool",
        "same-upper",
        {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
        x=(1, 2, 7, 8),
        opset=18,
    ),
    _pool("LpPool", "same-lower", {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}, x=(1, 2, 7, 7), opset=18),
    _pool(
        "LpPool", "valid", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}, x=(1, 2, 9, 10), opset=18
    ),
    _pool("LpPool", "dilations", {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1]}, opset=18),
    _pool("LpPool", "ceil", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, opset=18),
    _pool(
        "LpPool",
        "1d-ceil-pads",
        {"kernel_shape": [2], "strides": [2], "pads": [1, 1], "ceil_mode": 1},
        x=(1, 3, 6),
        opset=18,
    ),
    _pool("LpPool", "opset11", {"kernel_shape": [2, 2], "strides": [2, 2], "p": 4}, opset=11),
]


def _byte_pool(id: str, attrs: dict, x: tuple[int, ...], dtype: str) -> OpCase:
    return case(f"maxpool-{id}", single_op_model("MaxPool", [("x", x, dtype)], attrs, opset=12))


# MaxPool on bytes (ONNX's int8 and uint8, from opset 12): the max taken in float32, exact for bytes; the CPU's
# padded planes (strided, padded), a loop nest for 1-D and 3-D windows.
BYTE_CASES: list[OpCase] = [
    _byte_pool(
        "uint8-3x3-s2-pads", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, (1, 4, 9, 9), "uint8"
    ),
    _byte_pool("int8-2x2-s2", {"kernel_shape": [2, 2], "strides": [2, 2]}, (2, 3, 8, 8), "int8"),
    _byte_pool("int8-1d-pads", {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, (1, 3, 11), "int8"),
    _byte_pool("uint8-3d", {"kernel_shape": [2, 2, 2], "pads": [1, 0, 1, 1, 0, 1]}, (1, 2, 4, 5, 4), "uint8"),
]

CASES: list[OpCase] = POOL_CASES + POOL_1D_3D_CASES + LP_POOL_CASES + BYTE_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


def test_a_pool_whose_windows_stay_inside_its_input_reads_it_in_place_on_a_cpu(tmp_path) -> None:
    """A CPU pool copies each channel into a padded plane (pool._pool_planes) unless every tap of every output lies
    inside the input (no pads, no ceil_mode window past the edge): then it reads the input in place and the memory
    plan gives it no scratch (VGG-19's 2x2 MaxPools 0.69-0.91x the time with the copy)."""
    cases = {c.id: c for c in CASES}
    for name, in_place in [
        ("maxpool-2x2-s2", True),
        ("maxpool-dilations2", True),
        ("averagepool-non-square", True),
        ("maxpool-int8-2x2-s2", True),
        ("maxpool-3x3-s2-pads", False),
        ("maxpool-3x3-s2-ceil", False),
    ]:
        path = tmp_path / f"{name}.onnx"
        onnx.save(cases[name].model, str(path))
        spec = plan_model(path).steps[0].spec
        cpu = dataclasses.replace(spec, target_id="cpu-test")
        assert cpu.for_cpu
        reads_scratch = "'scratch'" in repr(lower_kernel(cpu).body)
        assert (reads_scratch, LOWERINGS[spec.op].scratch_floats(spec) > 0) == (not in_place, not in_place), name


# ------------------------------------------------------------------------------------------------- OpenCL

# The MaxPools whose CPU form blocks channels (OpenCL keeps a work-item per channel), LpPool and the 1-D and 3-D
# pools, rendered as OpenCL C and run on this host's device.
OPENCL_SAMPLE = [
    "maxpool-3x3-s2-pads",
    "maxpool-3x3-s2-ceil-pads",
    "lppool-3d",
    "lppool-p3-strides-pads",
    "lppool-1d-ceil-pads",
    "maxpool-1d-pads-s2",
    "averagepool-1d-include-pad",
    "maxpool-3d-pads-dilations",
    "averagepool-3d-ceil-pads-include",
    "maxpool-uint8-3x3-s2-pads",
    "maxpool-uint8-3d",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


# Hostile attributes (issue 13): each is refused with one line naming the node, before anything is built. A pool
# window of 2**40 with pads of half that has a small output but would loop 2**40 times per element: the planner's
# bound on a kernel's work refuses it (farm/plan/planner.py MAX_KERNEL_WORK).
HOSTILE = [
    pytest.param(
        hostile_op_model("MaxPool", {"kernel_shape": [2**40, 1], "pads": [2**39, 0, 2**39, 0]}),
        "its kernel would run .* loop steps, over farm's limit",
        id="maxpool-window-huge",
    ),
    pytest.param(
        hostile_op_model(
            "AveragePool", {"kernel_shape": [2**40, 1], "pads": [2**39, 0, 2**39, 0], "count_include_pad": 1}
        ),
        "its kernel would run .* loop steps, over farm's limit",
        id="averagepool-window-huge",
    ),
    pytest.param(
        hostile_op_model("MaxPool", {"kernel_shape": [2**62, 1], "pads": [2**61, 0, 2**61, 0]}),
        "its kernel would run .* loop steps",
        id="maxpool-window-2**62",
    ),
    pytest.param(
        hostile_op_model("LpPool", {"kernel_shape": [2**40, 1], "pads": [2**39, 0, 2**39, 0]}),
        "its kernel would run .* loop steps, over farm's limit",
        id="lppool-window-huge",
    ),
    pytest.param(hostile_op_model("LpPool", {"kernel_shape": [2, 2], "p": 0}), "p=0 is not supported", id="lppool-p0"),
    pytest.param(
        hostile_op_model("LpPool", {"kernel_shape": [2, 2], "strides": [0, 1]}),
        "must be positive|shape",
        id="lppool-stride0",
    ),
    pytest.param(
        hostile_op_model("LpPool", {"kernel_shape": [2]}),
        "must cover the 2 spatial axes|shape",
        id="lppool-kernel-rank",
    ),
    pytest.param(
        hostile_op_model(
            "MaxPool", {"kernel_shape": [2**40, 1, 1], "pads": [2**39, 0, 0, 2**39, 0, 0]}, x=(1, 2, 4, 4, 4)
        ),
        "its kernel would run .* loop steps, over farm's limit",
        id="maxpool-3d-window-huge",
    ),
    pytest.param(
        hostile_op_model("MaxPool", {"kernel_shape": [2, 2, 2]}, x=(1, 2, 4, 4)),
        "must cover the 2 spatial axes|shape",
        id="maxpool-kernel-rank",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
