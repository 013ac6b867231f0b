"""MatMulIntegerToFloat: an integer product dequantized into float32 in one kernel (farm.frontend.passes
.dequantize_fusion makes it from MatMulInteger -> Cast to float32 -> Mul by a scale -> [Add of a bias], the chain
onnxruntime's quantize_dynamic writes for every MatMul of a transformer, and that QDQ products not followed by a
QuantizeLinear become).

Its inputs: a, b, a_zero_point, b_zero_point (as MatMulInteger's), the scale (one float32, or one per column of the
output) and the bias (optional: one float32 per column). The kernel computes what the chain's own kernels computed,
bit for bit: each int32 sum converted to float32, times the scale rounded to float32, plus the bias; the IntGemm
stores that as it finishes each vector of sums (L.Dequantize), so neither an int32 nor an unbiased float32 tensor
is written, and three kernels with their launches go. onnxruntime has the same fusion (its com.microsoft
MatMulIntegerToFloat), which farm does not read from a model file: its node is one that farm's pass makes.
"""

from __future__ import annotations

from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import mathfns as M
from farm.ops.integer_gemm import Operands, input_buffer
from farm.ops.quantize import Finish, integer_matmul_kernel, matmul_integer_attrs, per_channel
from farm.ops.registry import ALL_DTYPES, NodeContext, register

SCALE, BIAS = 4, 5
"""The node inputs past MatMulInteger's four: the scale and the bias."""
DEQUANTIZING = Operands(weight=1, x_zero=2, w_zero=3, dequantize=(SCALE, BIAS))
FLOAT32 = frozenset({"float32"})


def _dequantized_matmul_attrs(ctx: NodeContext) -> dict[str, Any]:
    """MatMulInteger's checks, a float32 output, and the scale (required) and bias (optional) float32, each one
    value or one per output column."""
    attrs = matmul_integer_attrs(ctx, FLOAT32)
    columns = ctx.outputs[0].shape[-1] if ctx.outputs[0].shape else 1
    for index, what in ((SCALE, "scale"), (BIAS, "bias")):
        info = ctx.inputs[index] if index < len(ctx.inputs) else None
        if info is None and index == SCALE:
            raise ctx.unsupported("required input 4 (the scale) is missing")
        if info is not None and (info.dtype != "float32" or (info.size != 1 and list(info.shape) != [columns])):
            raise ctx.unsupported(
                f"{what} {ctx.node.inputs[index]!r} is {info.dtype} {list(info.shape)}; farm takes one float32 "
                f"value or one per output column ([{columns}])"
            )
    return attrs


def _dequantize(spec: KernelSpec) -> Finish:
    """The loop nest's finish: float32(int32 sum) * scale + bias, the product rounded to float32 before the add
    (L.exact_mul: no fast-math contraction fuses them)."""
    scale, bias, biased = per_channel(spec, SCALE), per_channel(spec, BIAS), input_buffer(spec, BIAS) is not None

    def finish(s: M.Scope, acc: L.Var, column: L.Expr) -> L.Expr:
        total = L.Cast(L.Cast(acc, L.I32), L.F32)
        product = L.exact_mul(total, scale(column))
        return product + bias(column) if biased else product  # adding 0 would turn -0.0 into +0.0

    return finish


@register("MatMulIntegerToFloat", normalize=_dequantized_matmul_attrs, dtypes=ALL_DTYPES)
def _lower_dequantized_matmul(spec: KernelSpec) -> list[L.Stmt]:
    """Through IntGemm, dequantizing as it stores, where its shape suits one, else as a loop nest
    (quantize.integer_matmul_kernel)."""
    return integer_matmul_kernel(spec, DEQUANTIZING, _dequantize(spec))
