"""farm.ops.elementwise against onnxruntime: activations (Relu, LeakyRelu, Clip, Sigmoid, Tanh) and the
broadcasting arithmetic ops (Add, Sub, Mul, Div, Sum), one op per model."""

from __future__ import annotations

import numpy as np
import pytest
from numerics import OpCase, case, check_case, graph_model, params, rand, single_op_model
from onnx import helper

X4 = [("x", (2, 3, 5, 7))]


def _f32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def _saturating(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Values over [-60, 60] (±50 included) and random ones: sigmoid and tanh saturate without overflow."""
    size = int(np.prod(shape))
    data = np.linspace(-60.0, 60.0, size)
    data[:6] = [-50.0, 50.0, -1e-3, 1e-3, 0.0, -20.0]
    return {"x": _f32(data.reshape(shape))}


ACTIVATION_CASES: list[OpCase] = [
    case("relu", single_op_model("Relu", X4)),
    case("relu-1d", single_op_model("Relu", [("x", (17,))])),
    case("relu-opset9", single_op_model("Relu", X4, opset=9)),
    case("leakyrelu-default", single_op_model("LeakyRelu", X4)),
    case("leakyrelu-0.2", single_op_model("LeakyRelu", X4, {"alpha": 0.2})),
    case("leakyrelu-negative-alpha", single_op_model("LeakyRelu", [("x", (4, 9))], {"alpha": -1.5})),
    case("sigmoid", single_op_model("Sigmoid", X4)),
    case("sigmoid-saturating", single_op_model("Sigmoid", [("x", (4, 50))]), _saturating((4, 50))),
    case("tanh", single_op_model("Tanh", X4)),
    case("tanh-saturating", single_op_model("Tanh", [("x", (4, 50))]), _saturating((4, 50))),
    case("relu-scalar", single_op_model("Relu", [("x", ())])),
    case("relu-nan-inf", single_op_model("Relu", [("x", (4,))]), {"x": _f32([np.nan, -np.inf, np.inf, -1.0])}),
    case("sigmoid-inf", single_op_model("Sigmoid", [("x", (4,))]), {"x": _f32([np.inf, -np.inf, 100, -100])}),
    case("tanh-inf", single_op_model("Tanh", [("x", (4,))]), {"x": _f32([np.inf, -np.inf, 100, -100])}),
    # Clip: attributes before opset 11 (Clip-6 style, tested at opset 9), constant inputs from opset 11.
    case("clip-opset9-attrs", single_op_model("Clip", X4, {"min": -0.5, "max": 0.75}, opset=9)),
    case("clip-opset9-only-min", single_op_model("Clip", X4, {"min": -0.25}, opset=9)),
    case("clip-opset9-only-max", single_op_model("Clip", X4, {"max": 0.25}, opset=9)),
    case("clip-opset9-relu6", single_op_model("Clip", X4, {"min": 0.0, "max": 6.0}, opset=9),
         {"x": rand(2, 3, 5, 7, scale=5.0)}),
    case("clip-opset11-inputs", single_op_model("Clip", X4, {}, {"lo": _f32(-0.3), "hi": _f32(0.4)}, opset=11)),
    case("clip-opset13-inputs", single_op_model("Clip", X4, {}, {"lo": _f32(-1.0), "hi": _f32(0.5)}, opset=13)),
    case("clip-opset13-only-min", single_op_model("Clip", X4, {}, {"lo": _f32(0.1)}, opset=13)),
    case("clip-opset13-only-max",
         single_op_model("Clip", X4, {}, {"hi": _f32(-0.1)}, opset=13, node_inputs=["x", "", "hi"])),
    case("clip-opset13-unbounded", single_op_model("Clip", X4, opset=13)),
    case("clip-opset17-equal-bounds", single_op_model("Clip", X4, {}, {"lo": _f32(0.2), "hi": _f32(0.2)})),
    case("clip-min-above-max", single_op_model("Clip", X4, {}, {"lo": _f32(0.5), "hi": _f32(-0.5)})),
    case("clip-constant-node-bound", graph_model([helper.make_node("Constant", [], ["lo"], value_float=-0.2),
                                                  helper.make_node("Clip", ["x", "lo"], ["y"])], X4)),
]


def _binary(op: str, a: tuple[int, ...], b: tuple[int, ...], opset: int = 17) -> OpCase:
    """`op` over graph inputs of shapes a and b; Div gets denominators away from zero."""
    model = single_op_model(op, [("a", a), ("b", b)], opset=opset)
    feeds = None
    if op == "Div":
        sign = np.where(rand(*b, seed=2) < 0, -1.0, 1.0).astype(np.float32)
        feeds = {"a": rand(*a, seed=1), "b": _f32(sign * rand(*b, seed=3, positive=True))}
    return case(f"{op.lower()}-{_shape_id(a)}-{_shape_id(b)}" + ("" if opset == 17 else f"-opset{opset}"),
                model, feeds)


def _shape_id(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


BROADCAST_SHAPES = [
    ((2, 3, 4), (2, 3, 4)),     # same shape
    ((2, 3, 4), (4,)),          # trailing vector
    ((2, 3, 4), (3, 1)),        # middle axis
    ((2, 3, 4), ()),            # scalar
    ((2, 3, 4), (1,)),          # one-element vector
    ((), (2, 3, 4)),            # scalar first
    ((4,), (2, 3, 4)),          # smaller rank first
    ((2, 1, 4, 5), (3, 1, 5)),  # rank mismatch, both broadcast
    ((3, 1), (1, 4)),           # outer product
    ((1, 1, 1), (2, 1, 3)),     # all-ones shape
]

ARITHMETIC_CASES: list[OpCase] = [
    _binary(op, a, b) for op in ("Add", "Sub", "Mul", "Div") for a, b in BROADCAST_SHAPES
] + [
    _binary("Add", (2, 3, 4), (3, 1), opset=9),
    _binary("Div", (2, 3, 4), (4,), opset=13),
    case("add-initializer", single_op_model("Add", [("x", (2, 3, 4))], {}, {"c": rand(3, 4, seed=5)})),
    case("sub-initializer-first",
         single_op_model("Sub", [("x", (2, 3, 4))], {}, {"c": rand(4, seed=5)}, node_inputs=["c", "x"])),
    case("mul-scalar-initializer", single_op_model("Mul", [("x", (2, 3, 4))], {}, {"c": _f32(-2.5)})),
    case("div-scalar-initializer", single_op_model("Div", [("x", (2, 3, 4))], {}, {"c": _f32(4.0)})),
    case("mul-same-input-twice", single_op_model("Mul", [("x", (3, 5))], node_inputs=["x", "x"])),
    case("div-by-zero", single_op_model("Div", [("a", (4,)), ("b", (4,))]),
         {"a": _f32([1.0, -1.0, 0.0, 2.0]), "b": _f32([0.0, 0.0, 0.0, 4.0])}),
    case("add-two-initializers-as-output", graph_model(
        [helper.make_node("Add", ["p", "q"], ["y"]), helper.make_node("Relu", ["x"], ["z"])], [("x", (3,))],
        ["y", "z"], {"p": rand(2, 3, seed=1), "q": rand(3, seed=2)})),
    case("sum-one-input", single_op_model("Sum", [("a", (2, 3))])),
    case("sum-two-inputs", single_op_model("Sum", [("a", (2, 3)), ("b", (2, 3))])),
    case("sum-three-broadcast", single_op_model("Sum", [("a", (2, 3)), ("b", (3,)), ("c", (2, 1))])),
    case("sum-four-rank-mismatch",
         single_op_model("Sum", [("a", (4, 1, 3)), ("b", ()), ("c", (1,)), ("d", (2, 1))])),
    case("sum-opset9", single_op_model("Sum", [("a", (2, 3)), ("b", (2, 3)), ("c", (2, 3))], opset=9)),
    case("sum-initializer", single_op_model("Sum", [("a", (2, 3))], {}, {"c": rand(3, seed=4)})),
    case("sum-scalars", single_op_model("Sum", [("a", ()), ("b", ())])),
]

CASES: list[OpCase] = ACTIVATION_CASES + ARITHMETIC_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)
