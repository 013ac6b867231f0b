"""Quantization ops, as onnxruntime's quantization tools produce them: QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, the integer products MatMulInteger and ConvInteger, and the requantizing QLinearMatMul and
QLinearConv.

Quantized values are int8, uint8, int16 or uint16 buffers (DequantizeLinear also reads int32); float8, int4, uint4
and int2 are not buffer dtypes in farm, so nodes with them are refused. Scales and zero points are kernel inputs
(constant or not): per tensor (one element), per axis (1-D along `axis`) or blocked (the input's shape with the
axis cut into blocks of `block_size`).

Every rounding follows ONNX's reference (onnx/reference/ops), step for step:
- QuantizeLinear: q = x / scale, in the dtype numpy's true division of the two gives (float32 for float32 or mixed
  float16/float32 operands, float16 for two float16s, float64 for an int32 x; the `precision` attribute names it
  instead), correctly rounded (L.exact_div: a reciprocal multiply would be an ulp off at times, enough to move a
  half-way value); then round half to even, + zero point, saturation. NaN gives the range's low end (as both the
  reference and onnxruntime do); values beyond int32 saturate (onnxruntime's way: the reference's int32 cast wraps).
- DequantizeLinear: (x - zero point) as an exact integer, to float32, times the scale in float32 (onnxruntime's
  order; the reference agrees wherever x and the zero point are below 2**24), stored in the output dtype.
- Requantization (QLinearMatMul, QLinearConv): the multiplier a_scale * b_scale / y_scale in the scales' dtype,
  then accumulator * multiplier + zero point in float64 (exact: a product of a 32-bit integer and a float32), round
  half to even and saturate, as the reference does. onnxruntime's MLAS rounds the product to float32 first, so its
  result can differ by one where that rounding moves the product across a half-way point.
Float16 arithmetic (float16 scales, the reference's float16 divisions) is done in float32 and rounded to float16
after each operation (`round_to_half`), which gives float16's correctly rounded results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from farm.ir import loopir as L
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec
from farm.ops import mathfns as M
from farm.ops.conv import checked_group
from farm.ops.integer_gemm import (
    INTEGER,
    QLINEAR,
    Operands,
    constant_weight,
    conv_integer_gemm,
    conv_integer_scratch,
    given_input_buffer,
    input_buffer,
    matmul_integer_gemm,
    present_inputs,
    zero_constants,
)
from farm.ops.registry import ALL_DTYPES, NodeContext, axis_in_range, out_shape, prod, register
from farm.ops.tensor import load
from farm.ops.window import spatial_attrs, tap_input, window

QUANT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}
"""The quantized dtypes farm holds in buffers, with the range each saturates to."""
DEQUANTIZED_INTS = frozenset(QUANT_RANGES) | {"int32"}
SCALE_DTYPES = frozenset({"float32", "float16"})
BYTE_INTS = frozenset({"int8", "uint8"})
"""The operand dtypes of the integer products (MatMulInteger, ConvInteger, QLinear*)."""
INT32 = frozenset({"int32"})
NOT_BUFFERS = "float8, float4, int4, uint4, int2, uint2 and bfloat16 are not buffer dtypes in farm"

# ------------------------------------------------------------------------------------------ float16 rounding

_HALF_MAX = 65504.0
_HALF_MIN_EXPONENT, _HALF_MAX_EXPONENT, _HALF_MANTISSA = -14, 15, 10


def round_to_half(s: M.Scope, x: L.Expr) -> L.Expr:
    """float32 x rounded to the nearest float16 value (ties to even, overflow to infinity), still as float32: the
    spacing of float16 values around |x| is picked by comparisons with powers of two, and |x| / spacing is rounded
    half to even. Every step is exact (powers of two and small integers), so no fast-math rewriting can change it."""
    x = s.bind(x)
    magnitude = s.bind(M.absolute(s, x))
    spacing: L.Expr = L.const(2.0 ** (_HALF_MIN_EXPONENT - _HALF_MANTISSA))  # the subnormals'
    for exponent in range(_HALF_MIN_EXPONENT, _HALF_MAX_EXPONENT + 1):
        spacing = L.select(L.compare("ge", magnitude, 2.0**exponent), 2.0 ** (exponent - _HALF_MANTISSA), spacing)
    spacing = s.bind(spacing)
    rounded = s.bind(M.round_half_even(s, magnitude / spacing) * spacing)
    rounded = s.bind(L.select(L.compare("gt", rounded, _HALF_MAX), M.INF, rounded))
    return L.select(L.compare("lt", x, 0.0), -rounded, rounded)


# ----------------------------------------------------------------------------------------- shared helpers


def scalar_value(spec: KernelSpec, index: int, default: L.Expr) -> L.Expr:
    """The first element of node input `index` (a per-tensor scale or zero point), or `default` if it is absent."""
    buffer = input_buffer(spec, index)
    return default if buffer is None else load(buffer[0], buffer[1], L.const(0))


def _required(ctx: NodeContext, count: int) -> None:
    """Refuse a node that lacks one of its first `count` inputs (all required by ONNX; a hostile model may omit
    one)."""
    missing = [i for i in range(count) if i >= len(ctx.inputs) or ctx.inputs[i] is None]
    if missing:
        raise ctx.unsupported(f"required input {missing[0]} is missing")


def _require(ctx: NodeContext, index: int, allowed: frozenset[str], what: str) -> TensorInfo | None:
    """Node input `index`'s info (None if absent), refused unless its dtype is one of `allowed`."""
    info = ctx.inputs[index] if index < len(ctx.inputs) else None
    if info is not None and info.dtype not in allowed:
        raise ctx.unsupported(
            f"{what} {ctx.node.inputs[index]!r} has dtype {info.dtype}; {ctx.node.op_type} takes "
            f"{', '.join(sorted(allowed))} in farm ({NOT_BUFFERS})"
        )
    return info


def _require_given(ctx: NodeContext, index: int, allowed: frozenset[str], what: str) -> TensorInfo:
    """_require for an input the op requires (_required has refused a node without it)."""
    _require(ctx, index, allowed, what)
    return ctx.input_info(index)


def _require_output(ctx: NodeContext, allowed: frozenset[str] | dict[str, Any]) -> str:
    """The output's dtype, refused unless it is one of `allowed`."""
    dtype = ctx.outputs[0].dtype
    if dtype not in allowed:
        raise ctx.unsupported(
            f"output dtype {dtype} is not supported ({', '.join(sorted(allowed))} are; {NOT_BUFFERS})"
        )
    return dtype


def _require_size_one(ctx: NodeContext, index: int, what: str) -> None:
    info = ctx.inputs[index] if index < len(ctx.inputs) else None
    if info is not None and info.size != 1:
        raise ctx.unsupported(
            f"{what} {ctx.node.inputs[index]!r} has shape {list(info.shape)}; farm takes one value (per tensor) here"
        )


def saturate(s: M.Scope, value: L.Expr, dtype: str) -> L.Expr:
    """An integer-valued float clamped into `dtype`'s range as an int32 (NaN gives the low end), to be stored: every
    quantized range fits int32, and float to int32 is a vector conversion on every x86 with AVX, float to int64 none
    on AVX2 (docs/architecture.md, Dtypes)."""
    low, high = QUANT_RANGES[dtype]
    value = s.bind(value)
    clamped = L.minimum(L.maximum(value, float(low)), float(high))
    return L.Cast(L.select(M.is_nan(value), float(low), clamped), L.I32)


def _half_if(s: M.Scope, value: L.Expr, half: bool) -> L.Expr:
    return round_to_half(s, value) if half else value


# --------------------------------------------------------------------------- scale and zero-point layouts


def _param_layout(ctx: NodeContext, index: int, x: tuple[int, ...], axis: int | None, block: int) -> None:
    """Refuse a scale or zero point (node input `index`) that is neither one value, nor 1-D along `axis`, nor
    (with a block size) x's shape with the axis cut into ceil(x.shape[axis] / block) blocks."""
    info = ctx.inputs[index] if index < len(ctx.inputs) else None
    if info is None or info.size == 1:
        return
    name, shape = ctx.node.inputs[index], list(info.shape)
    if axis is None:
        raise ctx.unsupported(f"{name!r} of shape {shape} is not one value, and the op's opset has no axis")
    if block:
        blocks = -(-x[axis] // block)
        wanted = [blocks if i == axis else d for i, d in enumerate(x)]
        if shape != wanted:
            raise ctx.unsupported(
                f"blocked {name!r} has shape {shape}; block_size {block} on axis {axis} of {list(x)} needs {wanted}"
            )
    elif shape != [x[axis]]:
        raise ctx.unsupported(
            f"{name!r} has shape {shape}; per-axis quantization on axis {axis} of {list(x)} needs [{x[axis]}]"
        )


def _layout_attrs(ctx: NodeContext) -> dict[str, Any]:
    """axis and block_size of a Quantize/DequantizeLinear, checked against the scale's and zero point's shapes (the
    axis only matters, and is only checked, when one of them has more than one value)."""
    x, attrs = ctx.input_info(0).shape, ctx.node.attrs
    block = int(attrs.get("block_size", 0))
    if block < 0:
        raise ctx.unsupported(f"block_size {block} is negative")
    per_axis = any(info is not None and info.size != 1 for info in ctx.inputs[1:3])
    axis = axis_in_range(ctx, attrs.get("axis", 1), len(x)) if per_axis and ctx.opset >= 13 else None
    for index in (1, 2):
        _param_layout(ctx, index, x, axis, block)
    return {"axis": axis, "block_size": block, "present": present_inputs(ctx.node.inputs)}


def _param_at(spec: KernelSpec, index: int, v: list[L.Var]) -> L.Expr | None:
    """The flat index into node input `index` (a scale or zero point) for the element at v, or None if absent."""
    buffer = input_buffer(spec, index)
    if buffer is None:
        return None
    info, axis, block = buffer[1], spec.attrs["axis"], spec.attrs["block_size"]
    if info.size == 1:
        return L.const(0)
    if block:
        return L.flat_index(info.shape, [i / block if a == axis else i for a, i in enumerate(v)])
    return v[axis]


def _param(spec: KernelSpec, index: int, v: list[L.Var], default: L.Expr) -> L.Expr:
    at, buffer = _param_at(spec, index, v), input_buffer(spec, index)
    if at is None or buffer is None:
        return default
    name, info = buffer
    return load(name, info, at)


def _elementwise(
    names: L.Names,
    shape: tuple[int, ...],
    value: Callable[[M.Scope, list[L.Var]], L.Expr],
) -> list[L.Stmt]:
    """out0[v] = value(v) over `shape`, each element's intermediate locals in its own scope (parallel)."""

    def element(v: list[L.Var]) -> list[L.Stmt]:
        scope = M.Scope(names)
        result = value(scope, v)
        return [*scope.stmts, L.Store("out0", L.flat_index(shape, v), result)]

    body, _ = L.loop_nest(names, shape, element, parallel=True)
    return body


def _loop_shape(spec: KernelSpec) -> tuple[int, ...]:
    """The shape a Quantize/DequantizeLinear loops over: the output's, or one flat axis where every scale and zero
    point is one value (a loop nest over a short innermost axis vectorises badly: registry.coalesced)."""
    shape = out_shape(spec)
    params = (input_buffer(spec, index) for index in (1, 2))
    return (prod(shape),) if all(param is None or param[1].size == 1 for param in params) else shape


def _as(value: L.Expr, dtype: str) -> L.Expr:
    return value if value.dtype == dtype else L.Cast(value, dtype)


# ------------------------------------------------------------------------------------------ QuantizeLinear


@dataclass(frozen=True)
class Division:
    """How QuantizeLinear's x / scale is computed: in float32 or float64, rounded to float16 after (and operands
    rounded to float16 before) where float16 is the division's dtype."""

    dtype: str
    half: bool = False


ONNX_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}
"""The dtype names of ONNX's TensorProto data types that a `precision` attribute may name (onnx.helper's table,
without importing onnx: the compile workers import the op registry)."""

DIVISIONS = {"float32": Division(L.F32), "float64": Division(L.F64), "float16": Division(L.F32, half=True)}


def _division_dtype(ctx: NodeContext, x: TensorInfo, scale: TensorInfo) -> str:
    """numpy's true-division dtype of x and the scale (what the reference divides in), or the `precision`
    attribute's dtype."""
    precision = int(ctx.node.attrs.get("precision", 0))
    if precision:
        dtype = ONNX_DTYPES.get(precision, f"ONNX data type {precision}")
    else:
        dtype = np.true_divide(np.ones(1, x.dtype), np.ones(1, scale.dtype)).dtype.name
    if dtype not in DIVISIONS:
        raise ctx.unsupported(f"a division in {dtype} is not supported (float32, float16 and float64 are)")
    return dtype


def _quantize_attrs(ctx: NodeContext) -> dict[str, Any]:
    _required(ctx, 2)
    x = _require_given(ctx, 0, frozenset({"float32", "float16", "int32"}), "input")
    scale = _require_given(ctx, 1, SCALE_DTYPES, "scale")
    _require(ctx, 2, frozenset(QUANT_RANGES), "zero point")
    dtype = _require_output(ctx, QUANT_RANGES)
    return {**_layout_attrs(ctx), "division": _division_dtype(ctx, x, scale), "to": dtype}


def _quantize_value(spec: KernelSpec, s: M.Scope, v: list[L.Var]) -> L.Expr:
    """saturate(round_half_even(x / scale) + zero point)."""
    division = DIVISIONS[spec.attrs["division"]]
    x, scale, shape = spec.inputs[0], spec.inputs[1], _loop_shape(spec)

    def operand(value: L.Expr, info: TensorInfo) -> L.Expr:
        """The operand in the division's dtype (a float16 buffer's values are float16 already)."""
        return _half_if(s, _as(value, division.dtype), division.half and info.dtype != "float16")

    quotient = L.exact_div(
        operand(load("in0", x, L.flat_index(shape, v)), x), operand(_param(spec, 1, v, L.const(1.0)), scale)
    )
    rounded = M.round_half_even(s, _half_if(s, quotient, division.half))
    zero = _as(_param(spec, 2, v, L.const(0)), division.dtype)
    return saturate(s, rounded + zero, spec.attrs["to"])


@register("QuantizeLinear", normalize=_quantize_attrs, dtypes=ALL_DTYPES)
def _lower_quantize(spec: KernelSpec) -> list[L.Stmt]:
    return _elementwise(L.Names(), _loop_shape(spec), lambda s, v: _quantize_value(spec, s, v))


# ---------------------------------------------------------------------------------------- DequantizeLinear


def _dequantize_attrs(ctx: NodeContext) -> dict[str, Any]:
    _required(ctx, 2)
    x = _require_given(ctx, 0, DEQUANTIZED_INTS, "input")
    _require(ctx, 1, SCALE_DTYPES, "scale")
    zero = _require(ctx, 2, DEQUANTIZED_INTS, "zero point")
    if zero is not None and zero.dtype != x.dtype:
        raise ctx.unsupported(f"zero point dtype {zero.dtype} differs from the input's {x.dtype}")
    _require_output(ctx, SCALE_DTYPES)
    return _layout_attrs(ctx)


@register("DequantizeLinear", normalize=_dequantize_attrs, dtypes=ALL_DTYPES)
def _lower_dequantize(spec: KernelSpec) -> list[L.Stmt]:
    """(x - zero point) * scale: the difference exact in int64, then float32 (the store rounds to float16)."""
    x, shape = spec.inputs[0], _loop_shape(spec)

    def value(s: M.Scope, v: list[L.Var]) -> L.Expr:
        difference = load("in0", x, L.flat_index(shape, v)) - _param(spec, 2, v, L.const(0))
        return L.Cast(difference, L.F32) * _param(spec, 1, v, L.const(1.0))

    return _elementwise(L.Names(), shape, value)


# ----------------------------------------------------------------------------------- DynamicQuantizeLinear


def _dynamic_attrs(ctx: NodeContext) -> dict[str, Any]:
    _required(ctx, 1)
    _require(ctx, 0, frozenset({"float32"}), "input")
    return {}


MIN_MAX_LANES = 16
"""The running minima and maxima DynamicQuantizeLinear keeps, one per element of a block: independent, so LLVM
makes them one vector each (a single running min and max took a 128 x 512 input's kernel 44 us on one core)."""


def _min_max(names: L.Names, size: int, low: L.Var, high: L.Var) -> list[L.Stmt]:
    """low, high = min(0, x...), max(0, x...): the range always holds zero. Blocks of MIN_MAX_LANES elements
    update as many running minima (then maxima, in a pass of their own), then the last partial block the first
    ones, then they are merged."""
    i, tail = names.var("i"), names.var("t")
    lows = [names.local(f"low{lane}") for lane in range(MIN_MAX_LANES)]
    highs = [names.local(f"high{lane}") for lane in range(MIN_MAX_LANES)]
    blocks, rest = divmod(size, MIN_MAX_LANES)

    def update(running: list[L.Var], reduce: Callable[[L.Expr, L.Expr], L.Expr], lane: int, at: L.Expr) -> L.Stmt:
        return L.Assign(running[lane], reduce(running[lane], L.Load("in0", at)))

    stmts: list[L.Stmt] = [L.Assign(local, L.const(0.0)) for local in (*lows, *highs)]
    for running, reduce in ((lows, L.minimum), (highs, L.maximum)):  # apart: LLVM then vectorises each
        block = [update(running, reduce, lane, i * MIN_MAX_LANES + lane) for lane in range(MIN_MAX_LANES)]
        stmts += [
            L.Loop(i, blocks, block),
            L.Loop(tail, rest, [update(running, reduce, 0, tail + blocks * MIN_MAX_LANES)]),
        ]
    stmts += [L.Assign(low, L.const(0.0)), L.Assign(high, L.const(0.0))]
    for lane in range(MIN_MAX_LANES):
        stmts += [L.Assign(low, L.minimum(low, lows[lane])), L.Assign(high, L.maximum(high, highs[lane]))]
    return stmts


@register("DynamicQuantizeLinear", normalize=_dynamic_attrs, dtypes=ALL_DTYPES)
def _lower_dynamic_quantize(spec: KernelSpec) -> list[L.Stmt]:
    """onnxruntime's steps: scale = (max - min) / 255, or 1 for an all-zero input (ONNX's reference gives 1 / 255
    there; the quantized zeros are the same), zero point = round(clamp(0 - min / scale, 0, 255)) (both stored
    first, serially), then every element quantized with them."""
    names, size = L.Names(), prod(out_shape(spec))
    low, high, scale = names.local("low"), names.local("high"), names.local("scale")
    s = M.Scope(names)
    span = L.select(L.compare("eq", high, low), 255.0, high - low)
    zero = M.round_half_even(s, L.minimum(L.maximum(0.0 - L.exact_div(low, scale), 0.0), 255.0))
    parameters = [
        *_min_max(names, size, low, high),
        L.Assign(scale, L.exact_div(span, 255.0)),
        L.Store("out1", L.const(0), scale),
        *s.stmts,
        L.Store("out2", L.const(0), L.Cast(zero, L.I64)),
    ]

    def value(s: M.Scope, v: list[L.Var]) -> L.Expr:
        quotient = L.exact_div(L.Load("in0", v[0]), L.Load("out1", L.const(0)))
        zero_point = L.Cast(L.Load("out2", L.const(0), L.I64), L.F32)
        return saturate(s, M.round_half_even(s, quotient) + zero_point, "uint8")

    return parameters + _elementwise(names, (size,), value)


# ----------------------------------------------------------------------------------------- integer products

Finish = Callable[[M.Scope, L.Var, L.Expr], L.Expr]
"""What an integer product stores for one output element: (scope, the int64 accumulator, the element's output
channel or column) -> value."""
ZeroAt = Callable[[L.Expr], L.Expr]
"""A weight zero point for one output channel or column."""


def per_channel(spec: KernelSpec, index: int) -> ZeroAt:
    """Node input `index` (a zero point or scale: one value, one per output channel/column, or absent: 0) at a
    channel."""
    buffer = input_buffer(spec, index)
    if buffer is None:
        return lambda channel: L.const(0)
    name, info = buffer
    return lambda channel: load(name, info, L.const(0) if info.size == 1 else channel)


def _require_channels(ctx: NodeContext, index: int, channels: int, what: str) -> None:
    """Refuse node input `index` unless it is absent, one value or 1-D with one value per output channel/column."""
    info = ctx.inputs[index] if index < len(ctx.inputs) else None
    if info is not None and info.size != 1 and list(info.shape) != [channels]:
        raise ctx.unsupported(
            f"{what} {ctx.node.inputs[index]!r} has shape {list(info.shape)}; farm takes one "
            f"value or one per output channel ([{channels}])"
        )


def _require_like(ctx: NodeContext, index: int, of: int, what: str) -> None:
    """A zero point must have its operand's dtype (ONNX's type constraint, which the reference relies on)."""
    info = ctx.inputs[index] if index < len(ctx.inputs) else None
    if info is not None and info.dtype != ctx.input_info(of).dtype:
        raise ctx.unsupported(f"{what} has dtype {info.dtype}, its operand {ctx.input_info(of).dtype}")


def _matmul_layout(
    spec: KernelSpec, a_index: int, b_index: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(A as a matrix stack, B as one, the output's batch dims), numpy matmul style (1-D operands promoted)."""
    a, b = given_input_buffer(spec, a_index)[1].shape, given_input_buffer(spec, b_index)[1].shape
    o = out_shape(spec)
    a_mat = (1, *a) if len(a) == 1 else a
    b_mat = (*b, 1) if len(b) == 1 else b
    return a_mat, b_mat, tuple(o[: len(o) - (len(a) > 1) - (len(b) > 1)])


def _integer_matmul(
    spec: KernelSpec, a_index: int, b_index: int, a_zero: L.Expr, b_zero: ZeroAt, finish: Finish
) -> list[L.Stmt]:
    """out[.., m, n] = finish(sum over k of (a[.., m, k] - a_zero) * (b[.., k, n] - b_zero(n))), exact in int64,
    batch dims broadcast."""
    (a_name, a), (b_name, b) = given_input_buffer(spec, a_index), given_input_buffer(spec, b_index)
    a_mat, b_mat, batch = _matmul_layout(spec, a_index, b_index)
    rows, depth, cols = a_mat[-2], a_mat[-1], b_mat[-1]
    names = L.Names()
    k, acc = names.var("k"), names.local("acc", L.I64)

    def element(v: list[L.Var]) -> list[L.Stmt]:
        bv, m, n = v[:-2], v[-2], v[-1]
        a_at = (L.broadcast_index(a_mat[:-2], batch, bv) * rows + m) * depth + k
        b_at = (L.broadcast_index(b_mat[:-2], batch, bv) * depth + k) * cols + n
        term = (load(a_name, a, a_at) - a_zero) * (load(b_name, b, b_at) - b_zero(n))
        scope = M.Scope(names)
        result = finish(scope, acc, n)
        return [
            L.Assign(acc, L.const(0)),
            L.Loop(k, depth, [L.Assign(acc, acc + term)]),
            *scope.stmts,
            L.Store("out0", L.flat_index((*batch, rows, cols), v), result),
        ]

    body, _ = L.loop_nest(names, (*batch, rows, cols), element, parallel=True)
    return body


def _check_matmul(ctx: NodeContext, a_index: int, b_index: int) -> int:
    """The operands' inner dims must agree; returns the output's columns (B's last dim)."""
    a, b = ctx.input_info(a_index).shape, ctx.input_info(b_index).shape
    if not a or not b or a[-1] != (b[0] if len(b) == 1 else b[-2]):
        raise ctx.unsupported(f"a product of {list(a)} and {list(b)}: the inner dims differ")
    return 1 if len(b) == 1 else b[-1]


def _conv_view(ctx: NodeContext, w_index: int) -> NodeContext:
    """ctx as Conv's attribute helpers read it: x and the weight as inputs 0 and 1."""
    node = replace(ctx.node, inputs=[ctx.node.inputs[0], ctx.node.inputs[w_index]])
    return replace(ctx, node=node, inputs=[ctx.inputs[0], ctx.inputs[w_index]])


def _conv_attrs(ctx: NodeContext, w_index: int) -> dict[str, Any]:
    """Conv's window attributes (2-D NCHW; auto_pad resolved) and group, for a conv whose weight is input w_index."""
    view = _conv_view(ctx, w_index)
    if len(view.input_info(0).shape) != 4 or len(view.input_info(1).shape) != 4:
        raise ctx.unsupported("the input and the weight must be 4-D tensors (NCHW): farm's integer convs are 2-D")
    group = checked_group(view)
    kernel = list(view.input_info(1).shape[2:])
    if list(ctx.node.attrs.get("kernel_shape", kernel)) != kernel:
        raise ctx.unsupported(f"kernel_shape {list(ctx.node.attrs['kernel_shape'])} differs from the weight's {kernel}")
    return {**spatial_attrs(view, kernel), "group": group, "present": present_inputs(ctx.node.inputs)}


def _integer_conv(spec: KernelSpec, w_index: int, x_zero: L.Expr, w_zero: ZeroAt, finish: Finish) -> list[L.Stmt]:
    """out[n, m, oh, ow] = finish(sum over the group's channels and the window's taps inside the input of
    (x - x_zero) * (w[m] - w_zero(m))), exact in int64: the padding contributes nothing (ONNX pads x after
    subtracting its zero point)."""
    geo, (w_name, w) = window(spec), given_input_buffer(spec, w_index)
    x = spec.inputs[0]
    batch, channels, out_channels = x.shape[0], x.shape[1], out_shape(spec)[1]
    group_channels, group_outputs = w.shape[1], out_channels // spec.attrs["group"]
    names = L.Names()
    c, r, t, acc = names.var("c"), names.var("r"), names.var("s"), names.local("acc", L.I64)

    def element(v: list[L.Var]) -> list[L.Stmt]:
        n, m, oh, ow = v
        inside, in_plane = tap_input(geo, oh, ow, r, t)
        channel = m / group_outputs * group_channels + c
        x_at = (n * channels + channel) * (geo.height * geo.width) + in_plane
        w_at = ((m * group_channels + c) * geo.kernel_height + r) * geo.kernel_width + t
        term = (load("in0", x, x_at) - x_zero) * (load(w_name, w, w_at) - w_zero(m))
        taps = L.Loop(
            c,
            group_channels,
            [
                L.Loop(
                    r,
                    geo.kernel_height,
                    [L.Loop(t, geo.kernel_width, [L.Assign(acc, acc + L.select(inside, term, 0))])],
                )
            ],
        )
        scope = M.Scope(names)
        result = finish(scope, acc, m)
        return [
            L.Assign(acc, L.const(0)),
            taps,
            *scope.stmts,
            L.Store("out0", L.flat_index(out_shape(spec), v), result),
        ]

    body, _ = L.loop_nest(names, (batch, out_channels, geo.out_height, geo.out_width), element, parallel=True)
    return body


def _as_stored(s: M.Scope, acc: L.Var, channel: L.Expr) -> L.Expr:
    return acc


# ---------------------------------------------------------------------------------- MatMulInteger, ConvInteger


def _integer_operands(ctx: NodeContext, operands: tuple[int, int], zeros: tuple[int, int]) -> None:
    """int8/uint8 operands, zero points of their operand's dtype, the first one per tensor."""
    for index, zero in zip(operands, zeros):
        _require(ctx, index, BYTE_INTS, "operand")
        _require_like(ctx, zero, index, "zero point")
    _require_size_one(ctx, zeros[0], "zero point")


def matmul_integer_attrs(ctx: NodeContext, output: frozenset[str] = INT32) -> dict[str, Any]:
    """MatMulInteger's checks (and those of the ops built on it, farm.ops.dequantized_matmul: their `output`
    dtypes): 8-bit operands whose inner dims agree, zero points of their dtypes, A's per tensor."""
    _required(ctx, 2)
    _integer_operands(ctx, (0, 1), (2, 3))
    _require_output(ctx, output)
    _require_channels(ctx, 3, _check_matmul(ctx, 0, 1), "b_zero_point")
    return {"present": present_inputs(ctx.node.inputs), **constant_weight(ctx, 1), **zero_constants(ctx, (2, 3))}


def integer_matmul_kernel(spec: KernelSpec, operands: Operands = INTEGER, finish: Finish | None = None) -> list[L.Stmt]:
    """A MatMulInteger-shaped product (A, B and their zero points as inputs 0-3) through IntGemm where its shape suits
    one (integer_gemm.matmul_integer_gemm), else as a loop nest storing `finish` of each sum (None: the sum)."""
    a_mat, b_mat, _ = _matmul_layout(spec, 0, 1)
    gemm = matmul_integer_gemm(spec, a_mat, b_mat, operands)
    if gemm is not None:
        return gemm
    zero = scalar_value(spec, 2, L.const(0))
    return _integer_matmul(spec, 0, 1, zero, per_channel(spec, 3), finish or _as_stored)


@register("MatMulInteger", normalize=matmul_integer_attrs, dtypes=ALL_DTYPES)
def _lower_matmul_integer(spec: KernelSpec) -> list[L.Stmt]:
    """Through IntGemm where its shape suits one, else as a loop nest (integer_matmul_kernel)."""
    return integer_matmul_kernel(spec)


def _conv_integer_attrs(ctx: NodeContext) -> dict[str, Any]:
    _required(ctx, 2)
    _integer_operands(ctx, (0, 1), (2, 3))
    _require_output(ctx, INT32)
    attrs = _conv_attrs(ctx, 1)
    _require_channels(ctx, 3, ctx.input_info(1).shape[0], "w_zero_point")
    return {**attrs, **constant_weight(ctx, 1), **zero_constants(ctx, (2, 3))}


@register(
    "ConvInteger",
    normalize=_conv_integer_attrs,
    dtypes=ALL_DTYPES,
    **conv_integer_scratch(INTEGER),
)
def _lower_conv_integer(spec: KernelSpec) -> list[L.Stmt]:
    """Through IntGemm where its shape suits one (integer_gemm.conv_integer_gemm), else as a loop nest."""
    gemm = conv_integer_gemm(spec)
    if gemm is not None:
        return gemm
    return _integer_conv(spec, 1, scalar_value(spec, 2, L.const(0)), per_channel(spec, 3), _as_stored)


# ---------------------------------------------------------------------------------- QLinearMatMul, QLinearConv

# Inputs of both: x/a, x_scale, x_zero_point, w/b, w_scale, w_zero_point, y_scale, y_zero_point (QLinearConv: and
# an int32 bias B).
_SCALES = (1, 4, 6)


def _qlinear_attrs(ctx: NodeContext, channels: int) -> dict[str, Any]:
    """Operands int8/uint8 with zero points of their dtype, scales of one float dtype, x's and y's scale and zero
    point per tensor, the weight's per tensor or per output channel/column; the output is y_zero_point's dtype."""
    _integer_operands(ctx, (0, 3), (2, 5))
    scales = {_require_given(ctx, index, SCALE_DTYPES, "scale").dtype for index in _SCALES}
    if len(scales) > 1:
        raise ctx.unsupported(f"the scales' dtypes differ ({', '.join(sorted(scales))})")
    for index in (1, 6, 7):
        _require_size_one(ctx, index, "scale or zero point")
    for index in (4, 5):
        _require_channels(ctx, index, channels, "weight scale or zero point")
    if ctx.inputs[7] is None or ctx.outputs[0].dtype != ctx.inputs[7].dtype:
        raise ctx.unsupported("the output must have y_zero_point's dtype")
    _require_output(ctx, BYTE_INTS)
    attrs = {"present": present_inputs(ctx.node.inputs), "half": scales == {"float16"}, "to": ctx.outputs[0].dtype}
    return {**attrs, **constant_weight(ctx, 3), **zero_constants(ctx, (2, 5))}


def _requantize(spec: KernelSpec) -> Finish:
    """acc (plus the bias, if any) * (x_scale * w_scale / y_scale) + y_zero_point, rounded half to even and
    saturated: the multiplier in the scales' dtype, the rest in float64 (exact, as the reference computes it); with a
    fused Relu (the QDQ fusion pass sets one) never below y_zero_point."""
    half, to = spec.attrs["half"], spec.attrs["to"]
    w_scale, bias = per_channel(spec, 4), input_buffer(spec, 8)

    def finish(s: M.Scope, acc: L.Var, channel: L.Expr) -> L.Expr:
        product = _half_if(s, scalar_value(spec, 1, L.const(1.0)) * w_scale(channel), half)
        multiplier = _half_if(s, L.exact_div(product, scalar_value(spec, 6, L.const(1.0))), half)
        total = acc if bias is None else acc + load(bias[0], bias[1], channel)
        zero = L.Cast(scalar_value(spec, 7, L.const(0)), L.F64)
        rounded = M.round_half_even(s, L.Cast(total, L.F64) * L.Cast(multiplier, L.F64) + zero)
        return saturate(s, rounded if spec.activation is None else L.maximum(rounded, zero), to)

    return finish


def _qlinear_matmul_attrs(ctx: NodeContext) -> dict[str, Any]:
    _required(ctx, 8)
    return _qlinear_attrs(ctx, _check_matmul(ctx, 0, 3))


@register("QLinearMatMul", normalize=_qlinear_matmul_attrs, dtypes=ALL_DTYPES)
def _lower_qlinear_matmul(spec: KernelSpec) -> list[L.Stmt]:
    """Through IntGemm, requantizing as it stores, where it suits (integer_gemm.matmul_integer_gemm), else as a
    loop nest."""
    a_mat, b_mat, _ = _matmul_layout(spec, 0, 3)
    gemm = matmul_integer_gemm(spec, a_mat, b_mat, QLINEAR)
    if gemm is not None:
        return gemm
    return _integer_matmul(spec, 0, 3, scalar_value(spec, 2, L.const(0)), per_channel(spec, 5), _requantize(spec))


def _qlinear_conv_attrs(ctx: NodeContext) -> dict[str, Any]:
    _required(ctx, 8)
    attrs = _conv_attrs(ctx, 3)
    out_channels = ctx.input_info(3).shape[0]
    bias = _require(ctx, 8, INT32, "bias")
    if bias is not None and list(bias.shape) != [out_channels]:
        raise ctx.unsupported(f"bias of shape {list(bias.shape)}; it must be [{out_channels}]")
    return {**attrs, **_qlinear_attrs(ctx, out_channels)}


@register(
    "QLinearConv",
    normalize=_qlinear_conv_attrs,
    dtypes=ALL_DTYPES,
    **conv_integer_scratch(QLINEAR),
)
def _lower_qlinear_conv(spec: KernelSpec) -> list[L.Stmt]:
    """Through IntGemm, requantizing as it stores, where it suits (integer_gemm.conv_integer_gemm), else as a loop
    nest."""
    gemm = conv_integer_gemm(spec, QLINEAR)
    if gemm is not None:
        return gemm
    return _integer_conv(spec, 3, scalar_value(spec, 2, L.const(0)), per_channel(spec, 5), _requantize(spec))
