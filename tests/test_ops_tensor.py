"""farm.ops.tensor against onnxruntime: reshapes (Reshape, Flatten, Squeeze, Unsqueeze), Identity, Dropout,
Transpose, Concat and Pad, one op per model."""

from __future__ import annotations

import numpy as np
import pytest
from numerics import OpCase, case, check_case, graph_model, params, rand, single_op_model
from onnx import helper

X4 = [("x", (2, 3, 4, 5))]


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


# ---------------------------------------------------------------------------------------------------- reshapes

RESHAPE_CASES: list[OpCase] = [
    *[case(f"flatten-axis{axis}", single_op_model("Flatten", X4, {"axis": axis})) for axis in range(5)],
    case("flatten-default-axis", single_op_model("Flatten", X4)),
    case("flatten-axis-1", single_op_model("Flatten", X4, {"axis": -1})),
    case("flatten-axis-4", single_op_model("Flatten", X4, {"axis": -4})),
    case("flatten-opset9", single_op_model("Flatten", X4, {"axis": 2}, opset=9)),
    case("reshape", single_op_model("Reshape", X4, {}, {"shape": _i64([6, 20])})),
    case("reshape-minus1", single_op_model("Reshape", X4, {}, {"shape": _i64([-1, 5])})),
    case("reshape-0", single_op_model("Reshape", X4, {}, {"shape": _i64([0, 0, 20])})),
    case("reshape-0-and-minus1", single_op_model("Reshape", X4, {}, {"shape": _i64([0, -1, 2])})),
    case("reshape-to-1d", single_op_model("Reshape", X4, {}, {"shape": _i64([-1])})),
    case("reshape-add-axes", single_op_model("Reshape", [("x", (6,))], {}, {"shape": _i64([1, 2, 1, 3])})),
    case("reshape-opset9", single_op_model("Reshape", X4, {}, {"shape": _i64([2, -1])}, opset=9)),
    case("squeeze-opset11-axes", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {"axes": [0, 2]}, opset=11)),
    case("squeeze-opset11-negative-axis", single_op_model("Squeeze", [("x", (2, 3, 1))], {"axes": [-1]}, opset=11)),
    case("squeeze-opset11-all", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], opset=11)),
    case("squeeze-opset9-axes", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {"axes": [2]}, opset=9)),
    case("squeeze-opset13-input", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {}, {"axes": _i64([0, 2])},
                                                  opset=13)),
    case("squeeze-opset13-negative-input", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {},
                                                           {"axes": _i64([-2])}, opset=13)),
    case("squeeze-opset13-all", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], opset=13)),
    case("unsqueeze-opset11-axes", single_op_model("Unsqueeze", [("x", (3, 5))], {"axes": [0, 3]}, opset=11)),
    case("unsqueeze-opset11-negative-axis", single_op_model("Unsqueeze", [("x", (3, 5))], {"axes": [-1]}, opset=11)),
    case("unsqueeze-opset9-axes", single_op_model("Unsqueeze", [("x", (3, 5))], {"axes": [1]}, opset=9)),
    case("unsqueeze-opset13-input", single_op_model("Unsqueeze", [("x", (3, 5))], {}, {"axes": _i64([0, 2])},
                                                    opset=13)),
    case("unsqueeze-opset13-negative-input", single_op_model("Unsqueeze", [("x", (3, 5))], {},
                                                             {"axes": _i64([-1, 1])}, opset=13)),
    case("unsqueeze-scalar", single_op_model("Unsqueeze", [("x", ())], {}, {"axes": _i64([0])})),
    case("squeeze-to-scalar", single_op_model("Squeeze", [("x", (1, 1))])),
    case("reshape-to-scalar", single_op_model("Reshape", [("x", (1, 1))], {}, {"shape": _i64([]).reshape(0)})),
    case("flatten-1d-axis0", single_op_model("Flatten", [("x", (5,))], {"axis": 0})),
]

# ---------------------------------------------------------------------------------------- Identity and Dropout

PASSTHROUGH_CASES: list[OpCase] = [
    # A pass-through from a graph input to a graph output can't be removed; it stays a copy kernel.
    case("identity-input-to-output", single_op_model("Identity", X4)),
    case("identity-opset9", single_op_model("Identity", [("x", (7,))], opset=9)),
    case("identity-of-computed-value", graph_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])], X4),
        schedule=("Relu",)),
    case("identity-between-ops", graph_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]),
         helper.make_node("Sigmoid", ["i"], ["y"])], X4), schedule=("Relu", "Sigmoid")),
    case("dropout-input-to-output", single_op_model("Dropout", X4)),
    case("dropout-ratio-input", single_op_model("Dropout", X4, {}, {"ratio": np.float32(0.3)})),
    case("dropout-opset9-ratio-attr", single_op_model("Dropout", X4, {"ratio": 0.4}, opset=9)),
    case("dropout-unused-mask", graph_model([helper.make_node("Dropout", ["x"], ["y", "mask"])], X4)),
    case("dropout-after-op", graph_model(
        [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Dropout", ["t"], ["y"])], X4), schedule=("Tanh",)),
]

# ------------------------------------------------------------------------------------------- Transpose, Concat

TRANSPOSE_CASES: list[OpCase] = [
    case("transpose-default-2d", single_op_model("Transpose", [("x", (3, 7))])),
    case("transpose-default-4d", single_op_model("Transpose", X4)),
    case("transpose-nchw-to-nhwc", single_op_model("Transpose", X4, {"perm": [0, 2, 3, 1]})),
    case("transpose-nhwc-to-nchw", single_op_model("Transpose", X4, {"perm": [0, 3, 1, 2]})),
    case("transpose-3d", single_op_model("Transpose", [("x", (2, 3, 4))], {"perm": [1, 0, 2]})),
    case("transpose-identity-perm", single_op_model("Transpose", [("x", (2, 3, 4))], {"perm": [0, 1, 2]})),
    case("transpose-5d", single_op_model("Transpose", [("x", (2, 1, 3, 2, 4))], {"perm": [4, 2, 0, 3, 1]})),
    case("transpose-1d", single_op_model("Transpose", [("x", (5,))])),
    case("transpose-opset9", single_op_model("Transpose", X4, {"perm": [1, 0, 3, 2]}, opset=9)),
]

CONCAT_CASES: list[OpCase] = [
    case("concat-axis0", single_op_model("Concat", [("a", (2, 3)), ("b", (4, 3))], {"axis": 0})),
    case("concat-axis1", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (2, 5, 4))], {"axis": 1})),
    case("concat-last-axis", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (2, 3, 1))], {"axis": 2})),
    case("concat-negative-axis", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (2, 3, 2))], {"axis": -1})),
    case("concat-negative-axis-3", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (1, 3, 4))], {"axis": -3})),
    case("concat-3-inputs", single_op_model("Concat", [("a", (1, 2, 3, 3)), ("b", (1, 4, 3, 3)),
                                                       ("c", (1, 1, 3, 3))], {"axis": 1})),
    case("concat-3-inputs-axis0", single_op_model("Concat", [("a", (1, 5)), ("b", (2, 5)), ("c", (3, 5))],
                                                  {"axis": 0})),
    case("concat-one-input", single_op_model("Concat", [("a", (2, 3))], {"axis": 1})),
    case("concat-initializer", single_op_model("Concat", [("a", (2, 3))], {"axis": 0}, {"c": rand(1, 3, seed=3)})),
    case("concat-initializer-around-input", single_op_model("Concat", [("x", (2, 3))], {"axis": 0},
                                                            {"c": rand(1, 3, seed=4)}, node_inputs=["c", "x", "c"])),
    case("concat-same-input-twice", single_op_model("Concat", [("a", (2, 3))], {"axis": 1}, node_inputs=["a", "a"])),
    case("concat-opset9", single_op_model("Concat", [("a", (2, 3)), ("b", (2, 2))], {"axis": 1}, opset=9)),
]

# -------------------------------------------------------------------------------------------------------- Pad

PAD_X = [("x", (1, 2, 5, 6))]
PADS = [0, 0, 1, 2, 0, 0, 2, 1]


def _pad(id: str, mode: str | None, pads=PADS, value: float | None = None, opset: int = 13,
         x=PAD_X) -> OpCase:
    """Pad with `pads` and `value` as inputs (opset >= 11) or attributes (opset < 11)."""
    attrs: dict = {} if mode is None else {"mode": mode}
    if opset < 11:
        attrs["pads"] = list(pads)
        if value is not None:
            attrs["value"] = value
        return case(f"pad-{id}-opset{opset}", single_op_model("Pad", x, attrs, opset=opset))
    initializers = {"pads": _i64(pads)}
    if value is not None:
        initializers["value"] = np.float32(value)
    return case(f"pad-{id}-opset{opset}", single_op_model("Pad", x, attrs, initializers, opset=opset))


PAD_CASES: list[OpCase] = [
    *[_pad(id, mode, value=value, opset=opset)
      for opset in (9, 11, 13)
      for id, mode, value in (("constant-default", None, None), ("constant-value", "constant", 1.5),
                              ("reflect", "reflect", None), ("edge", "edge", None))],
    _pad("constant-negative-value", "constant", value=-3.0, opset=18),
    _pad("constant-batch-and-channel-axes", "constant", pads=[1, 0, 0, 0, 0, 2, 0, 0], value=0.5),
    _pad("reflect-2d", "reflect", pads=[1, 2, 2, 3], x=[("x", (4, 5))]),
    _pad("edge-wide", "edge", pads=[0, 0, 4, 5, 0, 0, 3, 6]),
    _pad("edge-wider-than-input", "edge", pads=[0, 0, 5, 7, 0, 0, 6, 4], x=[("x", (1, 1, 3, 2))]),
    _pad("reflect-1d", "reflect", pads=[2, 3], x=[("x", (5,))]),
    _pad("reflect-max-width", "reflect", pads=[0, 0, 4, 5, 0, 0, 4, 5]),
    _pad("constant-3d", "constant", pads=[0, 1, 2, 0, 1, 0], value=2.0, x=[("x", (2, 3, 4))]),
    _pad("zero-pads", "constant", pads=[0] * 8),
    _pad("constant-negative-pads", "constant", pads=[0, 0, -1, 2, 0, 0, 1, -2], value=0.25),
    case("pad-opset13-absent-value", single_op_model("Pad", PAD_X, {}, {"pads": _i64(PADS)}, opset=13,
                                                     node_inputs=["x", "pads", ""])),
]

CASES: list[OpCase] = RESHAPE_CASES + PASSTHROUGH_CASES + TRANSPOSE_CASES + CONCAT_CASES + PAD_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)
