"""The GEMM's epilogue: what a tile's final store applies to its sums (the bias, the residual, the fused activation),
and the vector activations and NaN-propagating max and min it uses (the loop IR's renderer uses them too).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from farm.backends.llvm.gemm_emitter import F32_T, GemmEmitter, lanes_of, load_c, load_floats, splat
from farm.ir import loopir as L


def apply_epilogue(
    gen: GemmEmitter,
    epilogue: L.GemmEpilogue,
    value: ir.Value,
    place: tuple[ir.Value, ir.Value],
    index: tuple[ir.Value, int],
    along_rows: bool = False,
) -> ir.Value:
    """value (the accumulators of C[m, n:n+lanes], or of C[m:m+lanes, n] `along_rows`) + bias + residual, through
    the activation."""
    b, (m, n), vec_t = gen.b, place, value.type
    if epilogue.bias is not None:
        at = gen.address(gen.bias, n if epilogue.bias_on_columns else m)
        bias = (
            load_floats(b, at, vec_t)
            if epilogue.bias_on_columns != along_rows
            else splat(b, b.load(at, align=4, typ=F32_T), lanes_of(vec_t))
        )
        value = b.fadd(value, bias)
    if epilogue.residual is not None and not gen.residual_summed:
        value = b.fadd(value, load_c(gen, gen.residual, index, vec_t))
    if epilogue.activation is not None:
        kind, params = epilogue.activation
        value = VECTOR_ACTIVATIONS[kind](b, value, params)
    return value


def _constant(typ: ir.Type, number: float) -> ir.Constant:
    return ir.Constant(typ, [number] * typ.count if isinstance(typ, ir.VectorType) else number)


def fmax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """max of floats or float vectors that returns x when x is NaN, as onnxruntime's Relu/Clip/MaxPool do (the
    loop IR's "max" renders through it too)."""
    return b.select(b.fcmp_ordered("<", x, y), y, x)


def fmin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """min of floats or float vectors, returning x when x is NaN (the loop IR's "min" renders through it too)."""
    return b.select(b.fcmp_ordered(">", x, y), y, x)


def _leaky_relu(b: ir.IRBuilder, x: ir.Value, params: tuple[float, ...]) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, _constant(x.type, 0.0)), b.fmul(x, _constant(x.type, params[0])), x)


VECTOR_ACTIVATIONS: dict[str, Callable[[ir.IRBuilder, ir.Value, tuple[float, ...]], ir.Value]] = {
    "relu": lambda b, x, p: fmax(b, x, _constant(x.type, 0.0)),
    "leakyrelu": _leaky_relu,
    "clip": lambda b, x, p: fmin(b, fmax(b, x, _constant(x.type, p[0])), _constant(x.type, p[1])),
}
"""ops.registry.ACTIVATIONS on a vector of C (or one float), as the loop IR renders max and min: a Gemm's epilogue."""
