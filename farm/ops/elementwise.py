"""Elementwise ops: activations and math functions, numpy-broadcasting arithmetic, comparisons, logic, bit
operations, Where and Cast.

Every op here is one table entry (`Elementwise`): its value at one output element, given one element of each input
(broadcast numpy-style to the output shape), plus the dtypes its inputs may have and its attributes. One lowering
turns any entry into a parallel loop nest. Values are float32 (float16 and bfloat16 buffers load and store as
float32), float64, int64 (narrower integer buffers load and store as int64) or bool, as ONNX allows per op; math
functions come from farm.ops.mathfns, which are float32's: an op that calls one doesn't take float64 (DOUBLE), which
it would compute to float32's accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from farm.ir import loopir as L
from farm.ir.graph import Activation, itemsize
from farm.ir.specs import KernelSpec
from farm.ops import mathfns as M
from farm.ops.registry import (
    ALL_DTYPES,
    BUFFER_DTYPES,
    HALF_FLOATS,
    NARROW_INTS,
    NodeContext,
    activate,
    coalesced,
    out_shape,
    register,
)

FLOAT = frozenset({"float32"}) | HALF_FLOATS
DOUBLE = frozenset({"float64"})
EXACT_FLOAT = FLOAT | DOUBLE
"""For ops made of arithmetic, comparisons and floor alone, exact in float64 too."""
INT = frozenset({"int64", "int32"}) | NARROW_INTS
BOOL = frozenset({"bool"})
NUMERIC = FLOAT | INT
EXACT_NUMERIC = EXACT_FLOAT | INT
ANY = EXACT_NUMERIC | BOOL

# The value of an op at one element: scope for intermediate locals, the inputs' elements, normalised attributes.
Value = Callable[[M.Scope, list[L.Expr], dict[str, Any]], L.Expr]


@dataclass(frozen=True)
class Elementwise:
    """One elementwise op.

    `dtypes` gives the dtypes allowed for input 0, 1, ... (the last entry covers the remaining inputs);
    `defaults` the attributes with their default values (their type is the attribute's); `attributes`, where
    given, reads further attributes from the node (constant inputs, checked enums); `data_inputs` as in register.
    """

    value: Value
    dtypes: tuple[frozenset[str], ...] = (FLOAT,)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    attributes: Callable[[NodeContext], dict[str, Any]] | None = None
    data_inputs: tuple[int, ...] | None = None


def _unary(fn: Callable[[M.Scope, L.Expr, dict[str, Any]], L.Expr]) -> Value:
    return lambda s, xs, a: fn(s, xs[0], a)


def _math(fn: Callable[[M.Scope, L.Expr], L.Expr]) -> Value:
    """An attribute-free float function of mathfns."""
    return lambda s, xs, a: fn(s, xs[0])


def _fold(combine: Callable[[M.Scope, L.Expr, L.Expr], L.Expr]) -> Value:
    """A variadic op as a left fold over its inputs."""
    return lambda s, xs, a: reduce(lambda acc, x: combine(s, acc, x), xs)


def _binary(op: str) -> Callable[[M.Scope, L.Expr, L.Expr], L.Expr]:
    return lambda s, a, b: L.binary(op, a, b)


# ------------------------------------------------------------------------------------------ activations


def _leaky_relu(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    return L.select(L.compare("lt", x, 0.0), x * a["alpha"], x)


def _clip(s: M.Scope, xs: list[L.Expr], a: dict[str, Any]) -> L.Expr:
    """Lower bound first, then upper (so min > max gives max everywhere, as onnxruntime does). A bound is a number,
    None (unbounded) or "input": read from the kernel's next input buffer."""
    x, runtime_bounds = xs[0], iter(xs[1:])
    for key, bound in (("min", L.maximum), ("max", L.minimum)):
        if a[key] is not None:
            x = bound(x, next(runtime_bounds) if a[key] == "input" else a[key])
    return x


def _elu(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    return L.select(L.compare("lt", x, 0.0), a["alpha"] * M.expm1(x), x)


def _selu(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    return L.select(L.compare("le", x, 0.0), (a["gamma"] * a["alpha"]) * M.expm1(x), a["gamma"] * x)


def _celu(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    return L.maximum(x, 0.0) + L.minimum(a["alpha"] * M.expm1(x / a["alpha"]), 0.0)


def _hard_sigmoid(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    """min(max(alpha x + beta, 0), 1), the value first in each so that NaN propagates."""
    return L.minimum(L.maximum(a["alpha"] * x + a["beta"], 0.0), 1.0)


def _hard_swish(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    return x * _hard_sigmoid(s, x, {"alpha": 1.0 / 6.0, "beta": 0.5})


def _thresholded_relu(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    return L.select(L.compare("gt", x, a["alpha"]), x, 0.0)


def _shrink(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x, lambd, bias = s.bind(x), a["lambd"], a["bias"]
    return L.select(L.compare("lt", x, -lambd), x + bias, L.select(L.compare("gt", x, lambd), x - bias, 0.0))


def _softsign(s: M.Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    return x / (1.0 + M.absolute(s, x))


def _swish(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    """x sigmoid(alpha x), as ONNX's Swish (opset 24) defines it."""
    x = s.bind(x)
    return x * M.sigmoid(a["alpha"] * x)


def _mish(s: M.Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    return x * M.tanh(s, M.softplus(s, x))


_SQRT_HALF, _SQRT_2_OVER_PI = math.sqrt(0.5), math.sqrt(2.0 / math.pi)


def _gelu(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    if a["approximate"] == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + M.tanh(s, inner))
    return 0.5 * x * (1.0 + M.erf(s, x * _SQRT_HALF))


def _is_inf(s: M.Scope, x: L.Expr, a: dict[str, Any]) -> L.Expr:
    x = s.bind(x)
    found = [
        L.compare("eq", x, sign * M.INF)
        for sign, attr in ((1.0, "detect_positive"), (-1.0, "detect_negative"))
        if a[attr]
    ]
    return reduce(M.logical_or, found) if found else M.FALSE


# ----------------------------------------------------------------------------------------------- arithmetic


def _divide(s: M.Scope, a: L.Expr, b: L.Expr) -> L.Expr:
    """Float division, or integer division truncating toward zero (x / 0 gives 0 instead of trapping, and
    x / -1 is a negation, so that INT64_MIN / -1 can't trap either)."""
    if a.dtype in L.FLOATS:
        return a / b
    a, b = s.bind(a), s.bind(b)
    quotient = a / _safe_divisor(s, b)
    return L.select(L.compare("eq", b, -1), -a, L.select(L.compare("eq", b, 0), 0, quotient))


def _safe_divisor(s: M.Scope, b: L.Expr) -> L.Expr:
    """b, or 1 where b is 0 or -1: divisors that can't trap (x % 1 = x % -1 = 0)."""
    return L.select(M.logical_or(L.compare("eq", b, 0), L.compare("eq", b, -1)), 1, b)


def _nan_max(s: M.Scope, a: L.Expr, b: L.Expr) -> L.Expr:
    """max that propagates NaN from either side, as onnxruntime's Max does."""
    if a.dtype not in L.FLOATS:
        return L.maximum(a, b)
    b = s.bind(b)
    return L.select(M.is_nan(b), b, L.maximum(a, b))


def _nan_min(s: M.Scope, a: L.Expr, b: L.Expr) -> L.Expr:
    if a.dtype not in L.FLOATS:
        return L.minimum(a, b)
    b = s.bind(b)
    return L.select(M.is_nan(b), b, L.minimum(a, b))


def _mean(s: M.Scope, xs: list[L.Expr], a: dict[str, Any]) -> L.Expr:
    return reduce(lambda acc, x: acc + x, xs) * (1.0 / len(xs))


def _prelu(s: M.Scope, xs: list[L.Expr], a: dict[str, Any]) -> L.Expr:
    x = s.bind(xs[0])
    return L.select(L.compare("lt", x, 0.0), xs[1] * x, x)


def _mod(s: M.Scope, xs: list[L.Expr], a: dict[str, Any]) -> L.Expr:
    """fmod=1: C's fmod (the sign of the dividend); fmod=0: the sign of the divisor (numpy's mod). An integer
    remainder by 0 gives 0 instead of trapping."""
    x, y = xs
    if x.dtype in L.FLOATS:
        return M.fmod(s, x, y) if a["fmod"] else M.floor_mod(s, x, y)
    y = s.bind(y)
    r = s.bind(x % _safe_divisor(s, y))
    if a["fmod"]:
        return r
    differ = L.compare("ne", L.compare("lt", r, 0), L.compare("lt", y, 0))
    return L.select(L.logical_and(M.logical_not(L.compare("eq", r, 0)), differ), r + y, r)


# ------------------------------------------------------------------------------------------ bit operations


def _bit_shift(s: M.Scope, xs: list[L.Expr], a: dict[str, Any]) -> L.Expr:
    """x shifted by y bits, as ONNX's BitShift-28 says for every integer dtype: a shift outside [0, bits) leaves
    only the sign fill (0, or -1 for a right shift of a negative x), as numpy and onnxruntime give for the unsigned
    dtypes too. Values are int64, sign- or zero-extended from their dtype, so an arithmetic right shift is the
    dtype's own (logical for the unsigned ones), and the store keeps a left shift's low bits."""
    x, y = s.bind(xs[0]), s.bind(xs[1])
    in_range = s.bind(L.logical_and(L.compare("ge", y, 0), L.compare("lt", y, a["bits"])))
    if a["direction"] == "LEFT":
        return L.select(in_range, L.binary("shl", x, L.select(in_range, y, 0)), 0)
    return L.binary("shr", x, L.select(in_range, y, 63))


def _shift_attrs(ctx: NodeContext) -> dict[str, Any]:
    """BitShift's direction, and the bit width of its dtype (the shifts it allows)."""
    direction = ctx.node.attrs.get("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.unsupported(f"BitShift direction={direction!r} (supported: 'LEFT', 'RIGHT')")
    return {"direction": direction, "bits": itemsize(ctx.input_info(0).dtype) * 8}


# --------------------------------------------------------------------------------------------------- powers

# Constant exponents computed by multiplication: Pow(x, 2) is how exported norms square.
_MULTIPLY_EXPONENTS = 16


def _power(s: M.Scope, xs: list[L.Expr], a: dict[str, Any]) -> L.Expr:
    x, y = xs
    if x.dtype == L.I64:
        return _int_base_power(s, x, y, a["to"])
    exponent = a["exponent"]
    if exponent is not None and exponent == int(exponent) and abs(exponent) <= _MULTIPLY_EXPONENTS:
        return M.integer_power(s, x, int(exponent))
    if exponent == 0.5:
        x = s.bind(x)
        return L.select(L.compare("eq", x, -M.INF), M.INF, L.call("sqrt", x))
    return M.power(s, x, L.to_float(y))


def _int_base_power(s: M.Scope, x: L.Expr, y: L.Expr, dtype: str) -> L.Expr:
    """An integer base: exact for an integer (or integer-valued float) exponent; for a fractional one, the float
    power truncated toward zero to `dtype`, snapped to the nearest integer when within float rounding of it."""
    if y.dtype == L.I64:
        return M.int_power(s, x, y)
    y = s.bind(y)
    whole = L.compare("eq", L.call("floor", y), y)
    exact = M.int_power(s, x, L.Cast(L.minimum(L.maximum(y, -64.0), 64.0), L.I64))
    approximate = s.bind(M.power(s, L.to_float(x), y))
    nearest = s.bind(L.call("floor", approximate + 0.5))
    close = L.compare("le", M.absolute(s, approximate - nearest), 1e-5 * M.absolute(s, nearest))
    truncated = _float_to_int(s, L.select(close, nearest, approximate), dtype)
    return L.select(whole, exact, truncated)


# ------------------------------------------------------------------------------------------------- casts

# Smallest value of the integer that x86's float-to-int conversion (and so onnxruntime) produces: what NaN and
# out-of-range values give. Narrower targets convert through int32 (C's conversion of a float to a short or a byte
# on x86) and uint32 through int64, keeping the low bits. INT64_MIN is written as a cast of -2^63 (a float):
# OpenCL C has no literal for it.
_INT64_RULE = (2.0**63, L.Cast(L.const(-(2.0**63)), L.I64))
_INT32_RULE = (2.0**31, L.const(-(2**31)))
_FLOAT_TO_INT_RULES = {
    "int64": _INT64_RULE,
    "uint32": _INT64_RULE,
    "int32": _INT32_RULE,
    "int16": _INT32_RULE,
    "uint16": _INT32_RULE,
    "int8": _INT32_RULE,
    "uint8": _INT32_RULE,
}


def _float_to_int(s: M.Scope, x: L.Expr, dtype: str) -> L.Expr:
    """Truncation toward zero; NaN and out-of-range values give the converting integer's smallest value (the store
    then keeps `dtype`'s low bits)."""
    x = s.bind(x)
    limit, smallest = _FLOAT_TO_INT_RULES[dtype]
    in_range = L.compare("lt", M.absolute(s, x), limit)
    return L.select(in_range, L.Cast(x, L.I64), smallest)


def _to_float(x: L.Expr, to: str) -> L.Expr:
    """x as the value a float buffer of dtype `to` stores with one rounding: a float64 value stays float64 when the
    target is float16 or bfloat16 (the store rounds double to half directly); an integer becomes float32 for a
    float16 target (exact up to 2^24, and float16 overflows past 65504) or a bfloat16 one (integers of 16 bits or
    less only: see _cast_target)."""
    if to == "float64":
        return L.Cast(x, L.F64) if x.dtype != L.F64 else x
    if to in HALF_FLOATS and x.dtype == L.F64:
        return x
    return L.Cast(x, L.F32) if x.dtype != L.F32 else x


def _cast(s: M.Scope, xs: list[L.Expr], a: dict[str, Any]) -> L.Expr:
    """Cast among the buffer dtypes: float to int truncates (see _float_to_int), anything to bool is x != 0,
    integers wrap to a narrower integer, floats round to nearest even."""
    x, to = xs[0], a["to"]
    if to == "bool":
        return M.nonzero(x)
    if to in EXACT_FLOAT:
        return _to_float(x, to)
    if x.dtype in L.FLOATS:
        return _float_to_int(s, x, to)
    return L.Cast(x, L.I64) if x.dtype == L.BOOL else x


# ------------------------------------------------------------------------------------------ normalisation


_FLT_MAX = 3.4028234663852886e38


def _clip_bounds(ctx: NodeContext) -> dict[str, Any]:
    """Clip's bounds: attributes before opset 11; from 11 inputs, which are kernel buffers ("input"). An absent
    float bound is +-FLT_MAX (onnxruntime clamps infinities to it), an absent integer bound None (no clamp)."""
    is_float = ctx.input_info(0).dtype == "float32"
    bounds: dict[str, float | str | None] = {
        "min": -_FLT_MAX if is_float else None,
        "max": _FLT_MAX if is_float else None,
    }
    for index, key in ((1, "min"), (2, "max")):
        if index < len(ctx.node.inputs) and ctx.node.inputs[index]:
            bounds[key] = "input"
        elif key in ctx.node.attrs:
            bounds[key] = float(ctx.node.attrs[key])
    return bounds


def _pow_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Pow's exponent when it is a one-element constant (a float base then gets a specialised kernel), and the
    output dtype (an integer base's float power saturates to it)."""
    value = ctx.constants.get(ctx.node.inputs[1])
    exponent = float(value.item()) if value is not None and value.size == 1 else None
    finite = exponent is not None and math.isfinite(exponent)
    return {"exponent": exponent if finite else None, "to": ctx.outputs[0].dtype}


def _gelu_attrs(ctx: NodeContext) -> dict[str, Any]:
    approximate = ctx.node.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"Gelu approximate={approximate!r} (supported: 'none', 'tanh')")
    return {"approximate": approximate}


_ROUNDED_TWICE = {"bfloat16": frozenset({"int32", "uint32", "int64"})}
"""Source dtypes whose values float32 may round before a cast to the key rounds them again, landing on a tie."""


def _cast_target(ctx: NodeContext) -> dict[str, Any]:
    """The output dtype: Cast's `to` or CastLike's second input (already in the output's info). `saturate` only
    matters for float8 types, which farm doesn't compute with."""
    to, source = ctx.outputs[0].dtype, ctx.input_info(0).dtype
    if to not in ANY:
        raise ctx.unsupported(f"cast to {to} (supported: {', '.join(sorted(ANY))})")
    if source in _ROUNDED_TWICE.get(to, ()):
        raise ctx.unsupported(
            f"cast from {source} to {to}: farm converts integers through float32, which would round "
            "twice past 2^24 (one bfloat16 step off at some values)"
        )
    return {"to": to}


def _normalize(op: Elementwise) -> Callable[[NodeContext], dict[str, Any]]:
    """The op's attribute normaliser: dtypes checked, defaults filled, then its own `attributes`."""

    def normalize(ctx: NodeContext) -> dict[str, Any]:
        _check_dtypes(ctx, op.dtypes)
        attrs = {name: type(default)(ctx.node.attrs.get(name, default)) for name, default in op.defaults.items()}
        return attrs | (op.attributes(ctx) if op.attributes else {})

    return normalize


def _check_dtypes(ctx: NodeContext, allowed: tuple[frozenset[str], ...]) -> None:
    for index, info in enumerate(ctx.inputs):
        accepted = allowed[min(index, len(allowed) - 1)]
        if info is not None and info.dtype not in accepted:
            raise ctx.unsupported(
                f"input {index} has dtype {info.dtype}; farm's {ctx.node.op_type} takes {', '.join(sorted(accepted))}"
            )


# --------------------------------------------------------------------------------------------------- table

_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875
_COMPARISONS = {"Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge"}

ELEMENTWISE: dict[str, Elementwise] = {
    # activations
    "Relu": Elementwise(_unary(lambda s, x, a: L.maximum(x, 0.0)), (EXACT_FLOAT,)),
    "LeakyRelu": Elementwise(_unary(_leaky_relu), defaults={"alpha": 0.01}),
    "Clip": Elementwise(_clip, (EXACT_NUMERIC,), attributes=_clip_bounds),
    "Sigmoid": Elementwise(_unary(lambda s, x, a: M.sigmoid(x))),
    "Tanh": Elementwise(_math(M.tanh)),
    "Elu": Elementwise(_unary(_elu), defaults={"alpha": 1.0}),
    "Selu": Elementwise(_unary(_selu), defaults={"alpha": _SELU_ALPHA, "gamma": _SELU_GAMMA}),
    "Celu": Elementwise(_unary(_celu), defaults={"alpha": 1.0}),
    "HardSigmoid": Elementwise(_unary(_hard_sigmoid), defaults={"alpha": 0.2, "beta": 0.5}),
    "HardSwish": Elementwise(_unary(_hard_swish)),
    "ThresholdedRelu": Elementwise(_unary(_thresholded_relu), defaults={"alpha": 1.0}),
    "Shrink": Elementwise(_unary(_shrink), defaults={"lambd": 0.5, "bias": 0.0}),
    "Softsign": Elementwise(_math(_softsign)),
    "Softplus": Elementwise(_math(M.softplus)),
    "Mish": Elementwise(_math(_mish)),
    "Gelu": Elementwise(_unary(_gelu), attributes=_gelu_attrs),
    "Swish": Elementwise(_unary(_swish), defaults={"alpha": 1.0}),
    # math functions
    "Erf": Elementwise(_math(M.erf)),
    "Sqrt": Elementwise(_unary(lambda s, x, a: L.call("sqrt", x)), (EXACT_FLOAT,)),
    "Reciprocal": Elementwise(_unary(lambda s, x, a: 1.0 / x), (EXACT_FLOAT,)),
    "Exp": Elementwise(_unary(lambda s, x, a: L.call("exp", x))),
    "Log": Elementwise(_unary(lambda s, x, a: L.call("log", x))),
    "Floor": Elementwise(_unary(lambda s, x, a: L.call("floor", x)), (EXACT_FLOAT,)),
    "Ceil": Elementwise(_unary(lambda s, x, a: M.ceil(x)), (EXACT_FLOAT,)),
    "Round": Elementwise(_math(M.round_half_even), (EXACT_FLOAT,)),
    "Sin": Elementwise(_math(M.sin)),
    "Cos": Elementwise(_math(M.cos)),
    "Tan": Elementwise(_math(M.tan)),
    "Atan": Elementwise(_math(M.atan)),
    "Asin": Elementwise(_math(M.asin)),
    "Acos": Elementwise(_math(M.acos)),
    "Sinh": Elementwise(_math(M.sinh)),
    "Cosh": Elementwise(_math(M.cosh)),
    "Asinh": Elementwise(_math(M.asinh)),
    "Acosh": Elementwise(_math(M.acosh)),
    "Atanh": Elementwise(_math(M.atanh)),
    "Neg": Elementwise(_unary(lambda s, x, a: -x), (EXACT_NUMERIC,)),
    "Abs": Elementwise(_math(M.absolute), (EXACT_NUMERIC,)),
    "Sign": Elementwise(_math(M.sign), (EXACT_NUMERIC,)),
    "IsNaN": Elementwise(_unary(lambda s, x, a: M.is_nan(x)), (EXACT_FLOAT,)),
    "IsInf": Elementwise(_unary(_is_inf), (EXACT_FLOAT,), defaults={"detect_positive": 1, "detect_negative": 1}),
    # arithmetic (numpy broadcasting, variadic where ONNX is)
    "Add": Elementwise(_fold(_binary("add")), (EXACT_NUMERIC,)),
    "Sub": Elementwise(_fold(_binary("sub")), (EXACT_NUMERIC,)),
    "Mul": Elementwise(_fold(_binary("mul")), (EXACT_NUMERIC,)),
    "Div": Elementwise(_fold(_divide), (EXACT_NUMERIC,)),
    "Sum": Elementwise(_fold(_binary("add")), (EXACT_FLOAT,)),
    "Max": Elementwise(_fold(_nan_max), (EXACT_NUMERIC,)),
    "Min": Elementwise(_fold(_nan_min), (EXACT_NUMERIC,)),
    "Mean": Elementwise(_mean, (EXACT_FLOAT,)),
    "PRelu": Elementwise(_prelu, (EXACT_FLOAT,)),
    "Mod": Elementwise(_mod, (EXACT_NUMERIC,), defaults={"fmod": 0}),
    "Pow": Elementwise(_power, (NUMERIC,), attributes=_pow_attrs),
    # comparisons and logic (bool out)
    **{
        op: Elementwise(_fold(_binary(cmp)), (ANY if op == "Equal" else EXACT_NUMERIC,))
        for op, cmp in _COMPARISONS.items()
    },
    "Not": Elementwise(_unary(lambda s, x, a: M.logical_not(x)), (BOOL,)),
    "And": Elementwise(_fold(_binary("and")), (BOOL,)),
    "Or": Elementwise(_fold(_binary("or")), (BOOL,)),
    "Xor": Elementwise(_fold(_binary("ne")), (BOOL,)),
    "Where": Elementwise(lambda s, xs, a: L.select(*xs), (BOOL, ANY)),
    # bit operations (integers; the store keeps the dtype's low bits)
    "BitShift": Elementwise(_bit_shift, (INT,), attributes=_shift_attrs),
    "BitwiseAnd": Elementwise(_fold(_binary("bitand")), (INT,)),
    "BitwiseOr": Elementwise(_fold(_binary("bitor")), (INT,)),
    "BitwiseXor": Elementwise(_fold(_binary("bitxor")), (INT,)),
    "BitwiseNot": Elementwise(_unary(lambda s, x, a: L.binary("bitxor", x, -1)), (INT,)),
    # casts
    "Cast": Elementwise(_cast, (ANY,), attributes=_cast_target),
    "CastLike": Elementwise(_cast, (ANY,), attributes=_cast_target, data_inputs=(0,)),
}


# ------------------------------------------------------------------------------------------------ lowering


def _load(spec: KernelSpec, index: int, at: L.Expr) -> L.Expr:
    return L.Load(f"in{index}", at, L.VALUE_DTYPES[BUFFER_DTYPES[spec.inputs[index].dtype]])


def _activated(value: L.Expr, activation: Activation | None) -> L.Expr:
    """The fused activation applied to a numeric value; integer values get integer bounds (clamped so that the
    +-inf of an unbounded Clip stays representable)."""
    if activation is None or value.dtype == L.BOOL:
        return value
    if value.dtype == L.I64:
        limit = 2**63 - 1
        activation = Activation(activation.kind, tuple(int(max(min(p, limit), -limit)) for p in activation.params))
    return activate(value, activation)


def _lower(spec: KernelSpec) -> list[L.Stmt]:
    """out0[i...] = the op's value at i..., every input broadcast to the output shape; iterations independent."""
    op, names = ELEMENTWISE[spec.op], L.Names()
    shape, in_shapes = coalesced(out_shape(spec), [info.shape for info in spec.inputs])

    def element(v: list[L.Var]) -> list[L.Stmt]:
        scope = M.Scope(names)
        inputs = [_load(spec, i, L.broadcast_index(in_shape, shape, v)) for i, in_shape in enumerate(in_shapes)]
        value = _activated(op.value(scope, inputs, spec.attrs), spec.activation)
        return [*scope.stmts, L.Store("out0", L.flat_index(shape, v), value)]

    body, _ = L.loop_nest(names, shape, element, parallel=True)
    return body


for _name, _op in ELEMENTWISE.items():
    register(_name, normalize=_normalize(_op), data_inputs=_op.data_inputs, dtypes=ALL_DTYPES)(_lower)
