"""QLinearAdd: the sum of two quantized tensors, quantized, in one kernel (farm.frontend.passes.quantized_add makes
it from DequantizeLinear(a), DequantizeLinear(b) -> Add -> [Relu] -> QuantizeLinear, as onnxruntime's
quantize_static writes a ResNet's skip connections).

Its inputs are those of onnxruntime's com.microsoft QLinearAdd (a, a_scale, a_zero_point, b, b_scale, b_zero_point,
y_scale, y_zero_point; every scale and zero point one value), but not its arithmetic: the kernel computes what the
chain's own kernels computed, bit for bit. Each operand is dequantized as DequantizeLinear does, (x - zero point)
times the scale rounded to float32 (here the product is taken in float64, where it is exact, and rounded once, so
that no fast-math contraction can fuse it into the sum); the float32 sum, the Relu if any, then QuantizeLinear's
correctly rounded division, rounding half to even and saturation. One pass over three byte tensors replaces four
kernels and two float32 tensors."""

from __future__ import annotations

from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import mathfns as M
from farm.ops.integer_gemm import given_input_buffer, present_inputs
from farm.ops.quantize import BYTE_INTS, saturate, scalar_value
from farm.ops.registry import NodeContext, activate, coalesced, out_shape, register
from farm.ops.tensor import load

OPERANDS = {"a": (0, 1, 2), "b": (3, 4, 5)}
"""Each quantized operand's node inputs: its values, scale and zero point."""
Y_SCALE, Y_ZERO = 6, 7


def _quantized_add_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Refuse what the kernel can't take: 8-bit operands, one float32 scale each and (optional) zero points of the
    dtype they offset, and an output of y_zero_point's dtype."""
    required = (0, 1, 3, 4, Y_SCALE, Y_ZERO)
    if len(ctx.inputs) != 8 or any(ctx.inputs[i] is None for i in required):
        raise ctx.unsupported(
            "QLinearAdd takes a, a_scale, [a_zero_point], b, b_scale, [b_zero_point], y_scale, y_zero_point"
        )
    for name, (values, scale, zero) in OPERANDS.items():
        _require_params(ctx, name, ctx.input_info(values).dtype, scale, zero)
    _require_params(ctx, "y", ctx.outputs[0].dtype, Y_SCALE, Y_ZERO)
    return {"present": present_inputs(ctx.node.inputs)}


def _require_params(ctx: NodeContext, name: str, dtype: str, scale_index: int, zero_index: int) -> None:
    """`name` 8-bit, its scale one float32 value and its zero point (if given) one value of its dtype."""
    scale, zero = ctx.input_info(scale_index), ctx.inputs[zero_index]
    if dtype not in BYTE_INTS:
        raise ctx.unsupported(f"{name} has dtype {dtype}; QLinearAdd takes int8 and uint8")
    if scale.dtype != "float32" or scale.size != 1 or (zero is not None and (zero.size != 1 or zero.dtype != dtype)):
        raise ctx.unsupported(f"{name}'s scale and zero point must be one float32 and one {dtype} value")


def _dequantized(spec: KernelSpec, operand: str, at: L.Expr) -> L.Expr:
    """DequantizeLinear's float32 value of the operand's element `at`: (x - zero point) * scale, rounded once."""
    values, scale, zero = OPERANDS[operand]
    difference = load(*given_input_buffer(spec, values), at) - scalar_value(spec, zero, L.const(0))
    return L.Cast(L.Cast(difference, L.F64) * L.Cast(scalar_value(spec, scale, L.const(1.0)), L.F64), L.F32)


@register("QLinearAdd", normalize=_quantized_add_attrs, dtypes=BYTE_INTS | {"float32"})
def _lower_quantized_add(spec: KernelSpec) -> list[L.Stmt]:
    operands = [given_input_buffer(spec, OPERANDS[name][0])[1].shape for name in OPERANDS]
    shape, (a_shape, b_shape) = coalesced(out_shape(spec), operands)
    names = L.Names()

    def element(v: list[L.Var]) -> list[L.Stmt]:
        s = M.Scope(names)
        a = _dequantized(spec, "a", L.broadcast_index(a_shape, shape, v))
        b = _dequantized(spec, "b", L.broadcast_index(b_shape, shape, v))
        total = s.bind(activate(a + b, spec.activation))
        rounded = M.round_half_even(s, L.exact_div(total, scalar_value(spec, Y_SCALE, L.const(1.0))))
        quantized = saturate(s, rounded + L.Cast(scalar_value(spec, Y_ZERO, L.const(0)), L.F32), spec.outputs[0].dtype)
        return [*s.stmts, L.Store("out0", L.flat_index(shape, v), quantized)]

    body, _ = L.loop_nest(names, shape, element, parallel=True)
    return body
