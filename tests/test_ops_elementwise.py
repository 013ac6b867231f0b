"""farm.ops.elementwise against onnxruntime, one op per model: activations, math functions, broadcasting
arithmetic (float32 and int64/int32), comparisons, logic, Where and Cast, and the storage dtypes (float16, bfloat16,
float64, 8-32 bit integers); a sample of the cases also on OpenCL."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from numerics import (
    OPSET,
    OpCase,
    assert_unsupported,
    build_and_load,
    case,
    check_case,
    check_case_on_opencl,
    graph_model,
    params,
    rand,
    run_onnxruntime,
    single_op_model,
)
from onnx import TensorProto, helper

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
    case(
        "clip-opset9-relu6",
        single_op_model("Clip", X4, {"min": 0.0, "max": 6.0}, opset=9),
        {"x": rand(2, 3, 5, 7, scale=5.0)},
    ),
    case("clip-opset11-inputs", single_op_model("Clip", X4, {}, {"lo": _f32(-0.3), "hi": _f32(0.4)}, opset=11)),
    case("clip-opset13-inputs", single_op_model("Clip", X4, {}, {"lo": _f32(-1.0), "hi": _f32(0.5)}, opset=13)),
    case("clip-opset13-only-min", single_op_model("Clip", X4, {}, {"lo": _f32(0.1)}, opset=13)),
    case(
        "clip-opset13-only-max",
        single_op_model("Clip", X4, {}, {"hi": _f32(-0.1)}, opset=13, node_inputs=["x", "", "hi"]),
    ),
    case("clip-opset13-unbounded", single_op_model("Clip", X4, opset=13)),
    case("clip-opset17-equal-bounds", single_op_model("Clip", X4, {}, {"lo": _f32(0.2), "hi": _f32(0.2)})),
    case("clip-min-above-max", single_op_model("Clip", X4, {}, {"lo": _f32(0.5), "hi": _f32(-0.5)})),
    case(
        "clip-constant-node-bound",
        graph_model(
            [helper.make_node("Constant", [], ["lo"], value_float=-0.2), helper.make_node("Clip", ["x", "lo"], ["y"])],
            X4,
        ),
    ),
]


def _binary(op: str, a: tuple[int, ...], b: tuple[int, ...], opset: int = 17) -> OpCase:
    """`op` over graph inputs of shapes a and b; Div gets denominators away from zero."""
    model = single_op_model(op, [("a", a), ("b", b)], opset=opset)
    feeds = None
    if op == "Div":
        sign = np.where(rand(*b, seed=2) < 0, -1.0, 1.0).astype(np.float32)
        feeds = {"a": rand(*a, seed=1), "b": _f32(sign * rand(*b, seed=3, positive=True))}
    return case(f"{op.lower()}-{_shape_id(a)}-{_shape_id(b)}" + ("" if opset == 17 else f"-opset{opset}"), model, feeds)


def _shape_id(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


BROADCAST_SHAPES = [
    ((2, 3, 4), (2, 3, 4)),  # same shape
    ((2, 3, 4), (4,)),  # trailing vector
    ((2, 3, 4), (3, 1)),  # middle axis
    ((2, 3, 4), ()),  # scalar
    ((2, 3, 4), (1,)),  # one-element vector
    ((), (2, 3, 4)),  # scalar first
    ((4,), (2, 3, 4)),  # smaller rank first
    ((2, 1, 4, 5), (3, 1, 5)),  # rank mismatch, both broadcast
    ((3, 1), (1, 4)),  # outer product
    ((1, 1, 1), (2, 1, 3)),  # all-ones shape
]

ARITHMETIC_CASES: list[OpCase] = [
    _binary(op, a, b) for op in ("Add", "Sub", "Mul", "Div") for a, b in BROADCAST_SHAPES
] + [
    _binary("Add", (2, 3, 4), (3, 1), opset=9),
    _binary("Div", (2, 3, 4), (4,), opset=13),
    case("add-initializer", single_op_model("Add", [("x", (2, 3, 4))], {}, {"c": rand(3, 4, seed=5)})),
    case(
        "sub-initializer-first",
        single_op_model("Sub", [("x", (2, 3, 4))], {}, {"c": rand(4, seed=5)}, node_inputs=["c", "x"]),
    ),
    case("mul-scalar-initializer", single_op_model("Mul", [("x", (2, 3, 4))], {}, {"c": _f32(-2.5)})),
    case("div-scalar-initializer", single_op_model("Div", [("x", (2, 3, 4))], {}, {"c": _f32(4.0)})),
    case("mul-same-input-twice", single_op_model("Mul", [("x", (3, 5))], node_inputs=["x", "x"])),
    case(
        "div-by-zero",
        single_op_model("Div", [("a", (4,)), ("b", (4,))]),
        {"a": _f32([1.0, -1.0, 0.0, 2.0]), "b": _f32([0.0, 0.0, 0.0, 4.0])},
    ),
    case(
        "add-two-initializers-as-output",
        graph_model(
            [helper.make_node("Add", ["p", "q"], ["y"]), helper.make_node("Relu", ["x"], ["z"])],
            [("x", (3,))],
            ["y", "z"],
            {"p": rand(2, 3, seed=1), "q": rand(3, seed=2)},
        ),
    ),
    case("sum-one-input", single_op_model("Sum", [("a", (2, 3))])),
    case("sum-two-inputs", single_op_model("Sum", [("a", (2, 3)), ("b", (2, 3))])),
    case("sum-three-broadcast", single_op_model("Sum", [("a", (2, 3)), ("b", (3,)), ("c", (2, 1))])),
    case("sum-four-rank-mismatch", single_op_model("Sum", [("a", (4, 1, 3)), ("b", ()), ("c", (1,)), ("d", (2, 1))])),
    case("sum-opset9", single_op_model("Sum", [("a", (2, 3)), ("b", (2, 3)), ("c", (2, 3))], opset=9)),
    case("sum-initializer", single_op_model("Sum", [("a", (2, 3))], {}, {"c": rand(3, seed=4)})),
    case("sum-scalars", single_op_model("Sum", [("a", ()), ("b", ())])),
]

# ------------------------------------------------------------------------------------------ typed models

NAN, INF = math.nan, math.inf


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _ints(shape: tuple[int, ...], seed: int, low: int = -20, high: int = 20, dtype=np.int64) -> np.ndarray:
    return np.asarray(np.random.default_rng(seed).integers(low, high, shape), dtype=dtype)


def _bools(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.asarray(np.random.default_rng(seed).random(shape) < 0.5)


def _unary_case(
    id: str, op: str, x: np.ndarray, attrs: Mapping[str, object] | None = None, opset: int = OPSET
) -> OpCase:
    return case(id, single_op_model(op, [("x", x.shape, x.dtype.type)], attrs, opset=opset), {"x": x})


def _binary_case(
    id: str, op: str, a: np.ndarray, b: np.ndarray, attrs: Mapping[str, object] | None = None, opset: int = OPSET
) -> OpCase:
    inputs = [("a", a.shape, a.dtype.type), ("b", b.shape, b.dtype.type)]
    return case(id, single_op_model(op, inputs, attrs, opset=opset), {"a": a, "b": b})


SPECIAL = _f32([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-30, 30.0, -30.0])
X3 = (2, 3, 4)
# The edges of asin, acos and atanh: +-1, the half-angle switch at +-0.5 and its neighbours, just outside [-1, 1].
UNIT_EDGES = _f32(
    [NAN, INF, -INF, 1, -1, 0.5, -0.5, 0.49999997, 0.50000006, 0.99999994, -0.99999994, 1.0000001, -2, 0.0, -0.0, 1e-30]
)
# sinh and cosh up to and past float32's overflow (89.4), where exp alone overflows first (88.7).
HYPERBOLIC_RANGE = _f32([-89.4, -88.8, -50, -1.0001, -1, -0.5, 1e-8, 0.9999, 1, 20, 88.8, 89.4, 89.5, 100])

# ---------------------------------------------------------------------------------------- float unary ops

# op -> input data (random, special values, a third variant); attribute variants get their own cases below.
UNARY_DATA: dict[str, tuple[np.ndarray, ...]] = {
    "Sqrt": (np.abs(rand(*X3, scale=10.0)), _f32([0, INF, NAN, -1, 1e-20, 4, 1e30]), _f32(2.0)),
    "Reciprocal": (
        _f32(rand(*X3, positive=True) * np.sign(rand(*X3, seed=1))),
        _f32([INF, -INF, NAN, 0, 3, -8]),
        _f32(-0.25),
    ),
    "Exp": (rand(*X3, scale=10.0), _f32([-INF, INF, NAN, 88.5, 89.0, -100.0, 0]), _f32(np.linspace(-80, 80, 33))),
    "Log": (
        np.abs(rand(*X3, scale=10.0)) + 1e-3,
        _f32([0, INF, NAN, -1, 1e-37, 1e38, 1]),
        _f32(np.logspace(-30, 30, 25)),
    ),
    "Floor": (rand(*X3, scale=5.0), SPECIAL, _f32(np.arange(-4, 4, 0.5))),
    "Ceil": (rand(*X3, scale=5.0), SPECIAL, _f32(np.arange(-4, 4, 0.5))),
    "Round": (_f32(np.arange(-5, 5, 0.5)), SPECIAL, _f32([0.49999997, -0.49999997, 1.5000001, 8388609.0, 1e10, -2.5])),
    "Sin": (rand(*X3, scale=3.0), SPECIAL, _f32(np.linspace(-100, 100, 101))),
    "Cos": (rand(*X3, scale=3.0), SPECIAL, _f32(np.linspace(-100, 100, 101))),
    "Tan": (rand(*X3, scale=1.5), _f32([NAN, INF, -INF, 0, 1, -1, 3, 10, -10, 100]), _f32(np.linspace(-20, 20, 81))),
    "Atan": (rand(*X3, scale=3.0), SPECIAL, _f32(np.logspace(-5, 10, 31) * np.resize([1, -1], 31))),
    "Erf": (rand(*X3, scale=2.0), SPECIAL, _f32(np.linspace(-6, 6, 49))),
    "Softsign": (rand(*X3, scale=5.0), SPECIAL, _f32(1e20)),
    "Softplus": (rand(*X3, scale=5.0), SPECIAL, _f32(np.linspace(-100, 100, 41))),
    "HardSwish": (rand(*X3, scale=5.0), SPECIAL, _f32(np.linspace(-4, 4, 17))),
    "Mish": (rand(*X3, scale=5.0), _f32([NAN, INF, 0, -0.0, 1, -1, -30, 30, -100]), _f32(np.linspace(-20, 20, 41))),
    "Asin": (_f32(np.linspace(-1, 1, 41)), UNIT_EDGES, rand(*X3, scale=0.5)),
    "Acos": (_f32(np.linspace(-1, 1, 41)), UNIT_EDGES, rand(*X3, scale=0.5)),
    "Atanh": (_f32(np.linspace(-0.999, 0.999, 41)), UNIT_EDGES, rand(*X3, scale=0.5)),
    "Sinh": (rand(*X3, scale=3.0), SPECIAL, HYPERBOLIC_RANGE),
    "Cosh": (rand(*X3, scale=3.0), SPECIAL, HYPERBOLIC_RANGE),
    "Asinh": (rand(*X3, scale=3.0), SPECIAL, _f32(np.logspace(-6, 38, 45) * np.resize([1, -1], 45))),
    "Acosh": (
        1 + np.abs(rand(*X3, scale=3.0)),
        _f32([NAN, INF, -INF, 0, 1, 0.999, 1.0001, 1.5, 1500, 1e38]),
        _f32(1 + np.logspace(-7, 30, 38)),
    ),
    "Swish": (rand(*X3, scale=5.0), SPECIAL, _f32(np.linspace(-100, 100, 41))),
    "IsNaN": (rand(*X3), SPECIAL, _f32(NAN)),
    "Neg": (rand(*X3), SPECIAL, _ints(X3, seed=4)),
    "Abs": (rand(*X3), SPECIAL, _ints(X3, seed=4)),
    "Sign": (rand(*X3), SPECIAL, _ints(X3, seed=4)),
}

# Ops newer than the default opset.
FIRST_OPSET = {"Mish": 18, "Gelu": 20, "Swish": 24}

UNARY_CASES: list[OpCase] = [
    _unary_case(f"{op.lower()}-{variant}", op, x, opset=max(OPSET, FIRST_OPSET.get(op, OPSET)))
    for op, data in UNARY_DATA.items()
    for variant, x in zip(("random", "special", "more"), data)
] + [
    _unary_case("neg-int32", "Neg", _ints((7,), seed=5, dtype=np.int32)),
    _unary_case("abs-int32", "Abs", _ints((7,), seed=5, dtype=np.int32)),
    _unary_case("abs-int64-extremes", "Abs", _i64([2**62, -(2**62), 0, -1])),
    _unary_case("sign-int32", "Sign", _ints((7,), seed=5, dtype=np.int32)),
    _unary_case("isnan-opset20", "IsNaN", SPECIAL, opset=20),
    _unary_case("elu-default", "Elu", rand(*X3, scale=3.0)),
    _unary_case("elu-alpha", "Elu", rand(*X3, scale=3.0), {"alpha": 0.5}),
    _unary_case("elu-special", "Elu", SPECIAL, {"alpha": 2.0}),
    _unary_case("selu-default", "Selu", rand(*X3, scale=3.0)),
    _unary_case("selu-attrs", "Selu", rand(*X3, scale=3.0), {"alpha": 2.0, "gamma": 3.0}),
    _unary_case("selu-special", "Selu", SPECIAL),
    _unary_case("celu-default", "Celu", rand(*X3, scale=3.0)),
    _unary_case("celu-alpha", "Celu", rand(*X3, scale=3.0), {"alpha": 2.0}),
    _unary_case("celu-special", "Celu", SPECIAL, {"alpha": 0.5}),
    _unary_case("hardsigmoid-default", "HardSigmoid", rand(*X3, scale=5.0)),
    _unary_case("hardsigmoid-attrs", "HardSigmoid", rand(*X3, scale=5.0), {"alpha": 0.5, "beta": 0.6}),
    _unary_case("hardsigmoid-special", "HardSigmoid", SPECIAL),
    _unary_case("thresholdedrelu-default", "ThresholdedRelu", rand(*X3, scale=2.0)),
    _unary_case("thresholdedrelu-alpha", "ThresholdedRelu", rand(*X3, scale=2.0), {"alpha": 0.3}),
    _unary_case("thresholdedrelu-negative-alpha", "ThresholdedRelu", SPECIAL, {"alpha": -0.5}),
    _unary_case("shrink-default", "Shrink", rand(*X3, scale=2.0)),
    _unary_case("shrink-lambd-bias", "Shrink", rand(*X3, scale=2.0), {"lambd": 1.0, "bias": 0.5}),
    _unary_case("shrink-special", "Shrink", SPECIAL, {"lambd": 0.0, "bias": 1.5}),
    _unary_case("gelu-default", "Gelu", rand(*X3, scale=3.0), opset=20),
    _unary_case("gelu-none", "Gelu", _f32(np.linspace(-10, 10, 41)), {"approximate": "none"}, opset=20),
    _unary_case("gelu-tanh", "Gelu", rand(*X3, scale=3.0), {"approximate": "tanh"}, opset=20),
    _unary_case("gelu-special", "Gelu", SPECIAL, opset=20),
    _unary_case("gelu-tanh-special", "Gelu", SPECIAL, {"approximate": "tanh"}, opset=20),
    _unary_case("swish-alpha", "Swish", rand(*X3, scale=5.0), {"alpha": 0.5}, opset=24),
    _unary_case("swish-negative-alpha", "Swish", SPECIAL, {"alpha": -1.702}, opset=24),
    _unary_case("isinf-default", "IsInf", SPECIAL),
    _unary_case("isinf-positive-only", "IsInf", SPECIAL, {"detect_negative": 0}),
    _unary_case("isinf-negative-only", "IsInf", SPECIAL, {"detect_positive": 0}),
    _unary_case("isinf-neither", "IsInf", SPECIAL, {"detect_positive": 0, "detect_negative": 0}),
]

# -------------------------------------------------------------------------------------------- binary ops

INT_BROADCAST = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3))]


def _int_binary(op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype=np.int64) -> OpCase:
    """`op` on integers of both signs; divisors are non-zero."""
    a = _ints(a_shape, seed=1, low=-50, high=50, dtype=dtype)
    b = _ints(b_shape, seed=2, low=1, high=9, dtype=dtype) * np.where(_bools(b_shape, seed=3), 1, -1).astype(dtype)
    name = f"{op.lower()}-{np.dtype(dtype).name}-{_shape_id(a_shape)}-{_shape_id(b_shape)}"
    return _binary_case(name, op, a, b)


def _pow_base() -> np.ndarray:
    return rand(*X3, positive=True, scale=2.0)


POW_SPECIAL_X = _f32([-2, -2, 0, 0, 0, -8, 2, NAN, 1, -1, -1, INF, -INF, -INF, 0.5, 3])
POW_SPECIAL_Y = _f32([2, 0.5, 0, -1, 3, 1 / 3, NAN, 0, NAN, INF, -INF, -2, 3, 2, INF, 40])

INTEGER_ARITHMETIC_CASES: list[OpCase] = (
    [_int_binary(op, a, b) for op in ("Add", "Sub", "Mul", "Div", "Mod") for a, b in INT_BROADCAST]
    + [_int_binary(op, (2, 3, 4), (3, 1), dtype=np.int32) for op in ("Add", "Sub", "Mul", "Div", "Mod")]
    + [
        _binary_case("div-int64-truncates", "Div", _i64([7, -7, 7, -7, 0, 2**40]), _i64([2, 2, -2, -2, 3, -3])),
        _binary_case("mod-int64-signs", "Mod", _i64([7, -7, 7, -7, 0, 9]), _i64([3, 3, -3, -3, 5, 3])),
        _binary_case("mod-int64-fmod", "Mod", _i64([7, -7, 7, -7, 0, 9]), _i64([3, 3, -3, -3, 5, 3]), {"fmod": 1}),
        _binary_case(
            "mod-float-fmod", "Mod", rand(*X3, scale=10.0), _f32(rand(4, seed=3, positive=True) * 3), {"fmod": 1}
        ),
        _binary_case(
            "mod-float-fmod-signs",
            "Mod",
            _f32([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0]),
            _f32([2.1, -3.4, 8.0, -2.1, 3.4, 5.0]),
            {"fmod": 1},
        ),
        _binary_case(
            "mod-float-fmod-special",
            "Mod",
            _f32([0, -0.0, -3, 3, INF, 1, NAN, 1, 5.5]),
            _f32([2, 2, INF, -INF, 2, 0, 2, NAN, -2]),
            {"fmod": 1},
        ),
        _binary_case(
            "mod-float-floor-opset28",
            "Mod",
            _f32([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0]),
            _f32([2.1, -3.4, 8.0, -2.1, 3.4, 5.0]),
            opset=28,
        ),
        _binary_case(
            "mod-float-floor-special-opset28",
            "Mod",
            _f32([0, -0.0, 0, -3, 3, -1, 1, INF, -INF, 1, NAN]),
            _f32([-2, 2, 2, INF, INF, -INF, -INF, 2, 2, 0, 2]),
            opset=28,
        ),
        case(
            "add-int64-fused-clip",
            graph_model(
                [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Clip", ["s", "lo", "hi"], ["y"])],
                [("a", X3, np.int64)],
                initializers={"b": _i64([1, -2, 3, 50]), "lo": _i64(-5), "hi": _i64(30)},
            ),
            {"a": _ints(X3, 1)},
            schedule=("Add",),
        ),
        case(
            "add-int64-fused-clip-unbounded-max",
            graph_model(
                [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Clip", ["s", "lo"], ["y"])],
                [("a", X3, np.int64), ("b", X3, np.int64)],
                initializers={"lo": _i64(0)},
            ),
            {"a": _ints(X3, 1), "b": _ints(X3, 2)},
            schedule=("Add",),
        ),
        _binary_case("pow-float-float", "Pow", _pow_base(), rand(*X3, seed=2, scale=2.0)),
        _binary_case("pow-float-int64", "Pow", rand(*X3, scale=2.0), _ints(X3, seed=2, low=-4, high=5)),
        _binary_case(
            "pow-float-int32-broadcast",
            "Pow",
            rand(*X3, scale=2.0),
            _ints((4,), seed=2, low=-3, high=4, dtype=np.int32),
        ),
        _binary_case(
            "pow-negative-base-integer-exponents",
            "Pow",
            rand(*X3, scale=3.0),
            _f32(np.resize([0, 1, 2, 3, -1, -2, 5, 0.5], X3)),
        ),
        _binary_case("pow-scalar-exponent-input", "Pow", _pow_base(), _f32(1.7)),
        _binary_case("pow-special", "Pow", POW_SPECIAL_X, POW_SPECIAL_Y),
        _binary_case(
            "pow-int64-int64", "Pow", _ints((12,), seed=1, low=-5, high=6), _ints((12,), seed=2, low=-2, high=9)
        ),
        _binary_case(
            "pow-int32-int32",
            "Pow",
            _ints((12,), seed=1, low=-5, high=6, dtype=np.int32),
            _ints((12,), seed=2, low=0, high=9, dtype=np.int32),
        ),
        _binary_case(
            "pow-int64-float-integral",
            "Pow",
            _ints((12,), seed=1, low=-5, high=6),
            _f32(_ints((12,), seed=2, low=0, high=9)),
        ),
        _binary_case(
            "pow-int64-float-fractional",
            "Pow",
            _i64([4, 9, 16, 27, 2, 10, 100, 8]),
            _f32([0.5, 0.5, 0.25, 1 / 3, 0.5, 1.5, 0.5, 2 / 3]),
        ),
        _binary_case(
            "pow-int32-float-fractional-nan",
            "Pow",
            np.asarray([4, 9, 2, 3, 7, -4], np.int32),
            _f32([0.5, 0.5, NAN, 0.5, 1.5, 0.5]),
        ),
        *[
            case(
                f"pow-constant-exponent-{exponent:g}",
                single_op_model("Pow", [("x", X3)], {}, {"e": _f32(exponent)}),
                {"x": rand(*X3, scale=3.0)},
            )
            for exponent in (2.0, 3.0, -1.0, -2.0, 0.0, 1.0, 0.5, 1.7)
        ],
        case("pow-constant-exponent-int64", single_op_model("Pow", [("x", X3)], {}, {"e": _i64(3)})),
        case(
            "pow-constant-exponent-special",
            single_op_model("Pow", [("x", (12,))], {}, {"e": _f32(2.0)}),
            {"x": SPECIAL},
        ),
        case("pow-constant-sqrt-special", single_op_model("Pow", [("x", (12,))], {}, {"e": _f32(0.5)}), {"x": SPECIAL}),
    ]
)

# ------------------------------------------------------------------------------- Min, Max, Mean, PRelu, Clip


def _variadic(op: str, shapes: Sequence[tuple[int, ...]], dtype=np.float32, opset: int = OPSET) -> OpCase:
    names = [f"x{i}" for i in range(len(shapes))]
    data = {
        n: (_ints(s, seed=i) if dtype != np.float32 else rand(*s, seed=i)).astype(dtype)
        for i, (n, s) in enumerate(zip(names, shapes))
    }
    id = f"{op.lower()}-{np.dtype(dtype).name}-" + "-".join(_shape_id(s) for s in shapes)
    return case(
        id + ("" if opset == OPSET else f"-opset{opset}"),
        single_op_model(op, [(n, s, dtype) for n, s in zip(names, shapes)], opset=opset),
        data,
    )


VARIADIC_SHAPES = [[(2, 3)], [(2, 3, 4), (4,)], [(2, 1), (3,), (1, 1)], [(), (2, 2)]]

MIN_MAX_MEAN_CASES: list[OpCase] = (
    [_variadic(op, shapes) for op in ("Min", "Max", "Mean") for shapes in VARIADIC_SHAPES]
    + [_variadic(op, [(2, 3, 4), (3, 1)], dtype) for op in ("Min", "Max") for dtype in (np.int64, np.int32)]
    + [
        _variadic("Max", [(2, 3), (3,)], opset=9),
        _variadic("Mean", [(2, 3), (2, 3)], opset=9),
        _binary_case("max-nan", "Max", _f32([NAN, 1, NAN, INF, -INF]), _f32([1, NAN, NAN, 2, 3])),
        _binary_case("min-nan", "Min", _f32([NAN, 1, NAN, INF, -INF]), _f32([1, NAN, NAN, 2, 3])),
    ]
)

PRELU_CASES: list[OpCase] = [
    case("prelu-channel-slope", single_op_model("PRelu", [("x", (2, 3, 4, 5))], {}, {"s": rand(3, 1, 1, seed=1)})),
    case("prelu-scalar-slope", single_op_model("PRelu", [("x", X3)], {}, {"s": _f32(0.25)})),
    case("prelu-same-shape-input", single_op_model("PRelu", [("x", X3), ("s", X3)])),
    case("prelu-special", single_op_model("PRelu", [("x", (12,))], {}, {"s": _f32([0.1])}), {"x": SPECIAL}),
]

CLIP_CASES: list[OpCase] = [
    case(
        "clip-int64",
        single_op_model("Clip", [("x", X3, np.int64)], initializers={"lo": _i64(-5), "hi": _i64(7)}),
        {"x": _ints(X3, 1)},
    ),
    case(
        "clip-int64-only-max",
        single_op_model("Clip", [("x", X3, np.int64)], {}, {"hi": _i64(3)}, node_inputs=["x", "", "hi"]),
        {"x": _ints(X3, 1)},
    ),
    case("clip-int32-unbounded", single_op_model("Clip", [("x", X3, np.int32)]), {"x": _ints(X3, 1, dtype=np.int32)}),
    case(
        "clip-runtime-bounds",
        single_op_model("Clip", [("x", X3, np.float32), ("lo", (), np.float32), ("hi", (), np.float32)]),
        {"x": rand(*X3), "lo": _f32(-0.5), "hi": _f32(0.7)},
    ),
    case(
        "clip-runtime-max-constant-min",
        single_op_model(
            "Clip",
            [("x", X3, np.float32), ("hi", (), np.float32)],
            {},
            {"lo": _f32(-0.2)},
            node_inputs=["x", "lo", "hi"],
        ),
        {"x": rand(*X3), "hi": _f32(0.3)},
    ),
    case(
        "clip-runtime-min-only",
        single_op_model("Clip", [("x", X3, np.float32), ("lo", (), np.float32)]),
        {"x": rand(*X3), "lo": _f32(0.1)},
    ),
    case("clip-inf-unbounded", single_op_model("Clip", [("x", (12,))]), {"x": SPECIAL}),
]

# ------------------------------------------------------------------------------------ comparisons and logic

COMPARISON_OPS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")


def _rounded(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Floats with many ties, so that equality is exercised."""
    return _f32(np.round(rand(*shape, seed=seed) * 2) / 2)


COMPARISON_CASES: list[OpCase] = (
    [
        _binary_case(f"{op.lower()}-float-{_shape_id(a)}-{_shape_id(b)}", op, _rounded(a, 1), _rounded(b, 2))
        for op in COMPARISON_OPS
        for a, b in [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((), (5,))]
    ]
    + [_binary_case(f"{op.lower()}-int64", op, _ints(X3, 1, -3, 3), _ints((4,), 2, -3, 3)) for op in COMPARISON_OPS]
    + [
        _binary_case(f"{op.lower()}-int32", op, _ints(X3, 1, -3, 3, np.int32), _ints(X3, 2, -3, 3, np.int32))
        for op in COMPARISON_OPS
    ]
    + [
        _binary_case(
            f"{op.lower()}-nan-inf", op, _f32([NAN, NAN, 1, INF, -INF, 0.0]), _f32([NAN, 1, NAN, INF, 1, -0.0])
        )
        for op in COMPARISON_OPS
    ]
    + [
        _binary_case("equal-bool", "Equal", _bools(X3, 1), _bools((4,), 2)),
        _binary_case("less-opset9", "Less", _rounded(X3, 1), _rounded((4,), 2), opset=9),
        _binary_case("equal-opset11", "Equal", _ints(X3, 1, -3, 3), _ints((4,), 2, -3, 3), opset=11),
    ]
)

LOGIC_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (5,))]

LOGIC_CASES: list[OpCase] = [
    _binary_case(f"{op.lower()}-{_shape_id(a)}-{_shape_id(b)}", op, _bools(a, 1), _bools(b, 2))
    for op in ("And", "Or", "Xor")
    for a, b in LOGIC_SHAPES
] + [
    _unary_case("not-3d", "Not", _bools(X3, 1)),
    _unary_case("not-1d", "Not", _bools((7,), 2)),
    _unary_case("not-scalar", "Not", np.asarray(True)),
]

# ----------------------------------------------------------------------------------------------- bit ops
#
# Values over each dtype's whole range; shift amounts past the width (0, or the sign fill for a right shift) and,
# for the signed dtypes (BitShift-28), negative.

SIGNED_INTS = (np.int8, np.int16, np.int32, np.int64)
UNSIGNED_INTS = (np.uint8, np.uint16, np.uint32)


def _full_range(dtype, shape: tuple[int, ...] = X3) -> np.ndarray:
    """Values from the dtype's minimum to its maximum (both included), with -1, 0 and 1 where signed."""
    info, size = np.iinfo(dtype), int(np.prod(shape))
    step = (int(info.max) - int(info.min)) // (size - 1)
    values = np.asarray([int(info.min) + i * step for i in range(size)], dtype=dtype)
    values[-1] = info.max
    values[1:4] = [0, 1, info.max - 1] if info.min == 0 else [-1, 0, 1]
    return values.reshape(shape)


def _shift_amounts(dtype, size: int = 4) -> np.ndarray:
    """Shifts inside the width, at its edges and past it (negative ones too where the dtype is signed)."""
    bits = np.iinfo(dtype).bits
    amounts = [0, 1, bits - 1, bits, bits + 1, 3, np.iinfo(dtype).max]
    if np.iinfo(dtype).min < 0:
        amounts += [-1, -bits, np.iinfo(dtype).min]
    return np.asarray(np.resize(amounts, size), dtype=dtype)


def _shift_case(dtype, direction: str, y_shape: tuple[int, ...], opset: int) -> OpCase:
    x, y = _full_range(dtype), _shift_amounts(dtype, int(np.prod(y_shape))).reshape(y_shape)
    name = f"bitshift-{direction.lower()}-{np.dtype(dtype).name}-{_shape_id(y_shape)}"
    return _binary_case(name, "BitShift", x, y, {"direction": direction}, opset=opset)


def _bitwise_case(op: str, dtype, b_shape: tuple[int, ...] = X3) -> OpCase:
    b = np.resize(_full_range(dtype)[::-1].ravel(), b_shape).astype(dtype)
    name = f"{op.lower()}-{np.dtype(dtype).name}-{_shape_id(b_shape)}"
    return _binary_case(name, op, _full_range(dtype), b, opset=18)


BIT_CASES: list[OpCase] = [
    *[_shift_case(t, d, shape, 11) for t in UNSIGNED_INTS for d in ("LEFT", "RIGHT") for shape in [(4,), X3]],
    *[_shift_case(t, d, (3, 1), 28) for t in SIGNED_INTS + UNSIGNED_INTS for d in ("LEFT", "RIGHT")],
    *[_bitwise_case(op, t) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor") for t in SIGNED_INTS + UNSIGNED_INTS],
    _bitwise_case("BitwiseAnd", np.uint8, (4,)),
    _bitwise_case("BitwiseXor", np.int32, (3, 1)),
    *[
        _unary_case(f"bitwisenot-{np.dtype(t).name}", "BitwiseNot", _full_range(t), opset=18)
        for t in SIGNED_INTS + UNSIGNED_INTS
    ],
]

# ---------------------------------------------------------------------------------------------- Where, Cast


def _where(id: str, c: tuple[int, ...], x: np.ndarray, y: np.ndarray) -> OpCase:
    model = single_op_model("Where", [("c", c, np.bool_), ("a", x.shape, x.dtype.type), ("b", y.shape, y.dtype.type)])
    # onnxruntime has no bool Where: numpy is the reference there.
    reference = (lambda f: {"y": np.where(f["c"], f["a"], f["b"])}) if x.dtype == np.bool_ else None
    return case(f"where-{id}", model, {"c": _bools(c, 1), "a": x, "b": y}, reference=reference)


WHERE_CASES: list[OpCase] = [
    _where("float", X3, rand(*X3, seed=2), rand(*X3, seed=3)),
    _where("float-broadcast", (3, 1), rand(2, 1, 4, seed=2), rand(4, seed=3)),
    _where("int64", X3, _ints(X3, 2), _ints((4,), 3)),
    _where("int32-scalar-values", X3, np.asarray(7, np.int32), np.asarray(-3, np.int32)),
    _where("bool-values", (2, 1), _bools((1, 4), 2), _bools((2, 4), 3)),
    _where("scalar-condition", (), rand(3, seed=2), rand(3, seed=3)),
]

CAST_VALUES = _f32([2.7, -2.7, 0.5, -0.5, 0.0, -0.0, 1e10, -1e10, 3e9, NAN, 100.0, -7.0])
CAST_SOURCES: dict[str, np.ndarray] = {
    "float32": CAST_VALUES,
    "int64": _i64([0, 1, -1, 2**40 + 5, -(2**33), 7, 2**62, -3, 5, 0, 12, -12]),
    "int32": np.asarray([0, 1, -1, 2**30, -(2**31), 7, 2**31 - 1, -3, 5, 0, 12, -12], np.int32),
    "bool": np.resize([True, False, False], 12),
}
CAST_TARGETS = {
    "float32": TensorProto.FLOAT,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "bool": TensorProto.BOOL,
}
# Float to int of NaN and out-of-range values: onnxruntime gives x86's "integer indefinite" (the dtype's minimum).
CAST_CASES: list[OpCase] = [
    _unary_case(f"cast-{source}-to-{target}", "Cast", data, {"to": CAST_TARGETS[target]})
    for source, data in CAST_SOURCES.items()
    for target in CAST_TARGETS
] + [
    _unary_case("cast-float32-to-int64-opset9", "Cast", rand(*X3, scale=100.0), {"to": TensorProto.INT64}, opset=9),
    _unary_case(
        "cast-float32-to-bool-opset19-saturate", "Cast", SPECIAL, {"to": TensorProto.BOOL, "saturate": 1}, opset=19
    ),
    case(
        "castlike-float32-to-int64",
        single_op_model("CastLike", [("x", (12,), np.float32)], initializers={"like": _i64([0])}),
        {"x": CAST_VALUES},
    ),
    case(
        "castlike-int64-to-float32",
        single_op_model("CastLike", [("x", (12,), np.int64)], initializers={"like": _f32([0])}),
        {"x": CAST_SOURCES["int64"]},
    ),
    case(
        "castlike-float32-to-bool-input",
        single_op_model("CastLike", [("x", (12,), np.float32), ("like", (2,), np.bool_)]),
        {"x": SPECIAL, "like": np.asarray([True, False])},
    ),
    case(
        "castlike-bool-to-int32",
        single_op_model("CastLike", [("x", (12,), np.bool_)], initializers={"like": np.asarray([1], np.int32)}),
        {"x": CAST_SOURCES["bool"]},
    ),
]

# ------------------------------------------------------------------------------- storage dtypes (issue 15)
#
# float16 loads as float32 and stores rounded to nearest even; float64 computes in double; the narrow integers load
# as int64 and store their low bits (numpy's wrap-around).

NARROW_INTS = (np.int8, np.uint8, np.int16, np.uint16, np.uint32)
NARROW_CAST_TARGETS = {
    "float16": TensorProto.FLOAT16,
    "float64": TensorProto.DOUBLE,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
}
WIDE_FLOATS = np.asarray([2.7, -2.7, 0.5, 65504.0, 65520.0, 1e-8, 1e16 + 2, -1e300, NAN, INF, 7.0, 1.0 / 3.0])


def _wrapping(op: str, dtype) -> OpCase:
    """`op` over the whole range of a narrow integer dtype, so that sums and products wrap around."""
    info = np.iinfo(dtype)
    a = np.asarray(np.linspace(info.min, info.max, 24), dtype=dtype).reshape(2, 3, 4)
    b = np.asarray(np.resize([1, 3, 7, 100, 2, 5], 4), dtype=dtype)
    return _binary_case(f"{op.lower()}-{np.dtype(dtype).name}-wraps", op, a, b)


# Float to uint32 outside [0, 2^32) is undefined (C++ and ONNX); onnxruntime's answers there follow no one rule.
UINT32_CAST_VALUES = _f32([2.7, -2.7, 0.5, -0.5, 0.0, -0.0, 3e9, 4.2e9, 100.0, -7.0, 65536.5, 1.0])
DTYPE_CASES: list[OpCase] = [
    *[
        _unary_case(
            f"cast-float32-to-{target}", "Cast", UINT32_CAST_VALUES if target == "uint32" else CAST_VALUES, {"to": code}
        )
        for target, code in NARROW_CAST_TARGETS.items()
    ],
    *[
        _unary_case(
            f"cast-{np.dtype(t).name}-to-float32", "Cast", _ints((12,), 4, 0, 120, t), {"to": TensorProto.FLOAT}
        )
        for t in NARROW_INTS
    ],
    _unary_case("cast-float64-to-float16", "Cast", WIDE_FLOATS, {"to": TensorProto.FLOAT16}),
    _unary_case("cast-float64-to-float32", "Cast", WIDE_FLOATS, {"to": TensorProto.FLOAT}),
    _unary_case("cast-float16-to-float64", "Cast", WIDE_FLOATS.astype(np.float16), {"to": TensorProto.DOUBLE}),
    _unary_case("cast-int64-to-uint8", "Cast", CAST_SOURCES["int64"], {"to": TensorProto.UINT8}),
    _unary_case("cast-int32-to-float16", "Cast", CAST_SOURCES["int32"], {"to": TensorProto.FLOAT16}),
    *[_wrapping(op, t) for t in NARROW_INTS for op in ("Add", "Mul")],
    _int_binary("Div", (2, 3, 4), (4,), dtype=np.int8),
    _int_binary("Sub", (2, 3, 4), (4,), dtype=np.int16),
    _binary_case("add-float16", "Add", rand(*X3, seed=5).astype(np.float16), rand(4, seed=6).astype(np.float16)),
    _binary_case("div-float16", "Div", rand(*X3, seed=5).astype(np.float16), rand(4, seed=6).astype(np.float16) + 2),
    _unary_case("sigmoid-float16", "Sigmoid", rand(*X3, seed=7).astype(np.float16)),
    _binary_case(
        "add-float64-exact", "Add", np.asarray([1e16, 1.0, -1e300, 0.1]), np.asarray([1.0, 1e-17, 1e300, 0.2])
    ),
    _binary_case("mul-float64", "Mul", rand(*X3, seed=8).astype(np.float64), rand(4, seed=9).astype(np.float64)),
    _unary_case("sqrt-float64", "Sqrt", np.asarray([2.0, 1e-300, 1e300, 0.0, INF, 3.0])),
    _binary_case("less-uint32", "Less", np.asarray([0, 2**32 - 1, 5], np.uint32), np.asarray([1, 2**31, 5], np.uint32)),
]

# ------------------------------------------------------------------------------------------------- bfloat16
#
# bfloat16 loads as float32 and stores rounded to nearest even. onnxruntime's Python API has no bfloat16 arrays, so
# the reference is numpy with ml_dtypes' bfloat16, which computes each op in float32 and rounds the same way. Values
# stay near 1 (the tolerance, 1e-4 of the largest, is then under one bfloat16 step, 2^-8 there): the renderer tests
# check the conversions bit for bit over the whole range.

BF16 = ml_dtypes.bfloat16
STEP = 2.0**-8  # one bfloat16 step in [1, 2)
# Random values, ties to even both ways, just off ties, the overflow to infinity (float32's largest), NaN, inf.
BF16_SOURCES = np.concatenate(
    [
        rand(24, seed=10),
        1 + STEP * np.asarray([0.5, 1.5, 2.5, -0.25, 0.51, 1.49]),
        [3.4028235e38, -3.4e38, NAN, INF, -INF, 0.0, -0.0, 1e-40],
    ]
).astype(np.float32)
# Doubles a rounding through float32's nearest would put on a tie, then round again to the even neighbour.
BF16_DOUBLES = np.concatenate([1 + STEP * (np.arange(12) + 0.5) + sign * 2.0**-40 for sign in (1, -1)])


def _bfloat16_case(
    id: str,
    op: str,
    inputs: Mapping[str, np.ndarray],
    reference: Callable[..., np.ndarray],
    attrs: Mapping[str, object] | None = None,
) -> OpCase:
    """`op` over graph inputs `inputs` (in order), output y compared with reference(*inputs)."""
    model = single_op_model(op, [(name, x.shape, x.dtype) for name, x in inputs.items()], attrs)
    return case(id, model, inputs, reference=lambda feeds: {"y": np.asarray(reference(*feeds.values()))})


def _bfloat16_cast(source: np.ndarray, to) -> OpCase:
    """Cast `source` to `to` (a numpy dtype) against numpy's astype (ml_dtypes' conversions)."""
    return _bfloat16_case(
        f"cast-{source.dtype.name}-to-{np.dtype(to).name}",
        "Cast",
        {"x": source},
        lambda x: x.astype(to),
        {"to": helper.np_dtype_to_tensor_dtype(np.dtype(to))},
    )


def _bfloat16_random(*shape: int, seed: int) -> np.ndarray:
    return rand(*shape, seed=seed).astype(BF16)


BFLOAT16_CASES: list[OpCase] = [
    _bfloat16_cast(BF16_SOURCES, BF16),
    _bfloat16_cast(BF16_SOURCES.astype(BF16), np.float32),
    _bfloat16_cast(BF16_DOUBLES, BF16),
    _bfloat16_cast(BF16_DOUBLES.astype(BF16), np.float64),
    _bfloat16_cast(np.concatenate([BF16_SOURCES[:30], [65504.0, 70000.0]]).astype(BF16), np.float16),
    _bfloat16_cast((BF16_SOURCES[:30] * 100).astype(np.float16), BF16),
    _bfloat16_cast((BF16_SOURCES[:30] * 100).astype(BF16), np.int64),
    _bfloat16_cast(BF16_SOURCES.astype(BF16), np.bool_),
    _bfloat16_cast(np.asarray([True, False, True]), BF16),
    _bfloat16_cast(np.arange(-32768, 32768, 257).astype(np.int16), BF16),
    _bfloat16_cast(np.arange(0, 256, 3).astype(np.uint8), BF16),
    *[
        _bfloat16_case(f"{op.lower()}-bfloat16", op, {"a": _bfloat16_random(*X3, seed=11), "b": b}, fn)
        for op, fn, b in [
            ("Add", np.add, _bfloat16_random(4, seed=12)),
            ("Sub", np.subtract, _bfloat16_random(3, 1, seed=12)),
            ("Mul", np.multiply, _bfloat16_random(4, seed=13)),
            ("Div", np.divide, (rand(4, seed=14, positive=True) * 3).astype(BF16)),
            ("Max", np.maximum, _bfloat16_random(4, seed=15)),
        ]
    ],
    _bfloat16_case("relu-bfloat16", "Relu", {"x": BF16_SOURCES.astype(BF16)}, lambda x: np.maximum(x, BF16(0))),
    _bfloat16_case("neg-bfloat16", "Neg", {"x": BF16_SOURCES.astype(BF16)}, np.negative),
    _bfloat16_case(
        "less-bfloat16", "Less", {"a": _bfloat16_random(*X3, seed=16), "b": _bfloat16_random(4, seed=17)}, np.less
    ),
    _bfloat16_case(
        "where-bfloat16",
        "Where",
        {"c": _bools(X3, 18), "a": _bfloat16_random(*X3, seed=19), "b": _bfloat16_random(4, seed=20)},
        np.where,
    ),
]

CASES: list[OpCase] = (
    ACTIVATION_CASES
    + ARITHMETIC_CASES
    + UNARY_CASES
    + INTEGER_ARITHMETIC_CASES
    + MIN_MAX_MEAN_CASES
    + PRELU_CASES
    + CLIP_CASES
    + COMPARISON_CASES
    + LOGIC_CASES
    + WHERE_CASES
    + BIT_CASES
    + CAST_CASES
    + DTYPE_CASES
    + BFLOAT16_CASES
)


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


@pytest.mark.parametrize("c", params(c for c in BIT_CASES if any(w in c.id for w in ("32", "64"))))
def test_wide_bit_results_are_exact(c: OpCase, tmp_path: Path) -> None:
    """The bit ops of 32 and 64 bit integers bit for bit: the tolerance of check_case scales with the values (about
    4e5 at uint32's top), so it would pass a wrong low bit."""
    path = tmp_path / "model.onnx"
    onnx.save(c.model, path)
    _, model = build_and_load(path, tmp_path / "out")
    expected = run_onnxruntime(path, c.feeds)
    for name, value in model.run(c.feeds).items():
        assert value.dtype == expected[name].dtype and np.array_equal(value, expected[name]), name


@pytest.mark.parametrize(
    "model, message",
    [
        pytest.param(
            single_op_model("Relu", [("x", X3, np.int64)]),
            "farm's Relu takes bfloat16, float16, float32, float64",
            id="relu-int64",
        ),
        pytest.param(
            single_op_model("Mean", [("a", X3, np.int32), ("b", X3, np.int32)]),
            "input 'a' has dtype int32, which Mean does not take",
            id="mean-int32",
        ),
        pytest.param(
            single_op_model("Gelu", [("x", X3, np.float32)], {"approximate": "erf"}, opset=20),
            "Gelu approximate='erf'",
            id="gelu-unknown-approximation",
        ),
        pytest.param(
            single_op_model("Pow", [("a", X3, np.float32)], initializers={"b": np.ones(4, np.float64)}),
            "input 1 has dtype float64",
            id="pow-float64-exponent",
        ),
        pytest.param(
            single_op_model("Exp", [("x", X3, np.float64)]),
            "farm's Exp takes bfloat16, float16, float32$",
            id="exp-float64-would-be-float32-accurate",
        ),
        pytest.param(
            single_op_model("MatMul", [("a", (2, 3), np.float16), ("b", (3, 4), np.float16)]),
            "input 'a' has dtype float16; MatMul takes bool, float32, int32, int64 in farm",
            id="matmul-float16-has-no-gemm",
        ),
        pytest.param(
            single_op_model("BitShift", [("a", X3, np.uint64), ("b", X3, np.uint64)], {"direction": "LEFT"}, opset=11),
            "dtype uint64",
            id="bitshift-uint64",
        ),
        pytest.param(
            single_op_model("BitwiseNot", [("x", X3, np.uint64)], opset=18), "dtype uint64", id="bitwisenot-uint64"
        ),
        pytest.param(
            single_op_model("BitShift", [("a", X3, np.uint8), ("b", X3, np.uint8)], {"direction": "UP"}, opset=11),
            "BitShift direction='UP'",
            id="bitshift-unknown-direction",
        ),
        pytest.param(
            single_op_model("Cast", [("x", (3,), np.int64)], {"to": TensorProto.BFLOAT16}),
            "cast from int64 to bfloat16: .* round twice",
            id="cast-int64-to-bfloat16-would-round-twice",
        ),
        pytest.param(
            single_op_model("Cast", [("x", (3,), np.int32)], {"to": TensorProto.BFLOAT16}),
            "cast from int32 to bfloat16",
            id="cast-int32-to-bfloat16-would-round-twice",
        ),
        pytest.param(
            single_op_model("MatMul", [("a", (2, 3), ml_dtypes.bfloat16), ("b", (3, 4), ml_dtypes.bfloat16)]),
            "input 'a' has dtype bfloat16; MatMul takes",
            id="matmul-bfloat16-has-no-gemm",
        ),
    ],
)
def test_unsupported_variants_are_refused(model: onnx.ModelProto, message: str, tmp_path: Path) -> None:
    assert_unsupported(model, message, tmp_path)


# ------------------------------------------------------------------------------------------------- OpenCL

# One or two cases per kind of kernel: the math functions' polynomials and selects, integer division, bool
# buffers, casts, broadcasting and runtime bounds, rendered as OpenCL C and run on this host's device.
OPENCL_SAMPLE = [
    "erf-random",
    "gelu-tanh",
    "sin-more",
    "cos-special",
    "tan-random",
    "atan-more",
    "round-special",
    "mish-more",
    "softplus-more",
    "isinf-default",
    "pow-special",
    "pow-int64-int64",
    "pow-constant-exponent-2",
    "max-nan",
    "mod-int64-signs",
    "mod-float-floor-special-opset28",
    "div-int64-truncates",
    "add-int64-2x3x4-4",
    "less-float-2x3x4-3x1",
    "equal-bool",
    "xor-2x3x4-2x3x4",
    "not-3d",
    "where-float-broadcast",
    "where-bool-values",
    "cast-float32-to-int64",
    "cast-float32-to-bool",
    "cast-bool-to-float32",
    "cast-int64-to-int32",
    "clip-runtime-bounds",
    "add-int64-fused-clip",
    "cast-float32-to-float16",
    "cast-float64-to-float16",
    "cast-float16-to-float64",
    "add-uint8-wraps",
    "mul-int16-wraps",
    "cast-float32-to-uint32",
    "sigmoid-float16",
    "add-float64-exact",
    "asin-special",
    "acos-special",
    "sinh-more",
    "cosh-more",
    "asinh-more",
    "acosh-special",
    "atanh-special",
    "swish-negative-alpha",
    "bitshift-right-int8-3x1",
    "bitshift-left-uint32-2x3x4",
    "bitshift-right-int64-3x1",
    "bitwisexor-int64-2x3x4",
    "bitwiseand-uint8-4",
    "bitwisenot-uint16",
    "cast-float32-to-bfloat16",
    "cast-float64-to-bfloat16",
    "cast-bfloat16-to-float32",
    "div-bfloat16",
    "where-bfloat16",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}
