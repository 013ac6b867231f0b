"""A small loop IR that every op lowers into once (farm/ops), and that each backend renders: as LLVM IR for CPUs
(farm/backends/llvm) and as OpenCL C (farm/backends/opencl).

Shapes are static, so loop extents and strides are plain integers: the renderers see fully specialised kernels,
the way Glow specialises its kernels, and LLVM folds every index computation.

A kernel runs as launches, one after another: farm.ir.launching splits it into them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

Number = Union[int, float]

F32, F64, I64, BOOL = "f32", "f64", "i64", "bool"
FLOATS = frozenset({F32, F64})
"""The float value dtypes: float32, and float64 where a kernel computes in double precision."""
# Buffers may also hold narrower element types, which loads widen and stores narrow: float16 and bfloat16 (F16,
# BF16) as F32 values (stores round to nearest even), the signed and unsigned integers of 8-32 bits as I64 values
# (stores keep the low bits: wrap-around, as numpy's integer arithmetic). BOOL buffers hold one byte per element
# (numpy's bool); loads give BOOL values.
F16, BF16, I8, I16, I32, U8, U16, U32 = "f16", "bf16", "i8", "i16", "i32", "u8", "u16", "u32"
VALUE_DTYPES = {
    F32: F32,
    F64: F64,
    F16: F32,
    BF16: F32,
    I64: I64,
    I8: I64,
    I16: I64,
    I32: I64,
    U8: I64,
    U16: I64,
    U32: I64,
    BOOL: BOOL,
}


class Expr:
    """An expression; arithmetic operators build new expressions."""

    dtype: str = F32

    def __add__(self, other: ExprLike) -> Expr:
        return binary("add", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binary("add", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binary("sub", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binary("sub", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binary("mul", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binary("mul", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binary("div", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binary("div", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        quotient = binary("div", self, other)
        return quotient if self.dtype == I64 else call("floor", quotient)

    def __mod__(self, other: ExprLike) -> Expr:
        return binary("mod", self, other)

    def __neg__(self) -> Expr:
        return binary("sub", const(0.0 if self.dtype in FLOATS else 0, self.dtype), self)


ExprLike = Union[Expr, Number]


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: Number
    dtype: str = F32


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A loop index or a scalar local, by name."""

    name: str
    dtype: str = I64


@dataclass(frozen=True, eq=False)
class Load(Expr):
    buf: str
    index: Expr
    dtype: str = F32


@dataclass(frozen=True, eq=False)
class Binary(Expr):
    """add sub mul div mod max min and comparisons lt le gt ge eq ne (which give BOOL), and/or on BOOL; exact_div
    and exact_mul (floats only: see `exact_div`, `exact_mul`); and the bit operations of I64 values (BITWISE): shl,
    shr (arithmetic: a narrow buffer's value is sign- or zero-extended on load, so it shifts as its own dtype would),
    bitand, bitor, bitxor. A shift's amount must lie in [0, 64): each renderer's shift is undefined (LLVM) or masked
    (OpenCL C) past it."""

    op: str
    lhs: Expr
    rhs: Expr
    dtype: str = F32


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A math function that each renderer provides: exp, log, sqrt, floor."""

    fn: str
    arg: Expr
    dtype: str = F32


@dataclass(frozen=True, eq=False)
class Select(Expr):
    cond: Expr
    if_true: Expr
    if_false: Expr
    dtype: str = F32


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    arg: Expr
    dtype: str = F32


COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
LOGICAL = frozenset({"and", "or"})
BITWISE = frozenset({"shl", "shr", "bitand", "bitor", "bitxor"})
"""The bit operations, on I64 values only (see Binary)."""


def const(value: Number, dtype: str | None = None) -> Const:
    """A constant; ints default to I64 and floats to F32."""
    return Const(value, dtype or (I64 if isinstance(value, int) and not isinstance(value, bool) else F32))


def wrap(value: ExprLike, like: str = F32) -> Expr:
    """Turn a Python number into a Const of the dtype of the expression it meets."""
    if isinstance(value, Expr):
        return value
    return Const(float(value) if like in FLOATS else int(value), like)


def binary(op: str, lhs: ExprLike, rhs: ExprLike) -> Expr:
    """Build a Binary, folding int constants so that index expressions stay small."""
    like = lhs.dtype if isinstance(lhs, Expr) else rhs.dtype if isinstance(rhs, Expr) else F32
    a, b = wrap(lhs, like), wrap(rhs, like)
    if op in BITWISE and (a.dtype, b.dtype) != (I64, I64):
        raise ValueError(f"{op} takes I64 operands, not {a.dtype} and {b.dtype}")
    folded = _fold_int(op, a, b)
    if folded is not None:
        return folded
    dtype = BOOL if op in COMPARISONS or op in LOGICAL else a.dtype
    return Binary(op, a, b, dtype)


def _truncating_div(x: int, y: int) -> int:
    """Integer division rounding toward zero, as the renderers' sdiv and C's `/` do."""
    quotient = abs(x) // abs(y)
    return quotient if (x < 0) == (y < 0) else -quotient


_INT_FOLDS = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": _truncating_div,
    "mod": lambda x, y: x - y * _truncating_div(x, y),
}


def _fold_int(op: str, a: Expr, b: Expr) -> Expr | None:
    """Fold constant integer arithmetic and the identities x+0, x*1, x*0 that index math produces."""
    if a.dtype != I64 or op not in _INT_FOLDS:
        return None
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(_INT_FOLDS[op](a.value, b.value), I64)
    if isinstance(b, Const) and ((op in ("add", "sub") and b.value == 0) or (op in ("mul", "div") and b.value == 1)):
        return a
    if isinstance(a, Const) and ((op == "add" and a.value == 0) or (op == "mul" and a.value == 1)):
        return b
    if op == "mul" and any(isinstance(x, Const) and x.value == 0 for x in (a, b)):
        return Const(0, I64)
    return None


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("max", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("min", a, b)


def exact_div(a: ExprLike, b: ExprLike) -> Expr:
    """a / b for floats, correctly rounded in their dtype (IEEE division). A plain "div" carries the renderers'
    fast-math freedom to multiply by a reciprocal instead (LLVM hoists 1/b out of a loop where b is invariant),
    which is one ulp off now and then: harmless for arithmetic compared within a tolerance, wrong where the
    quotient's last bit decides a rounding (QuantizeLinear's round(x / scale))."""
    return binary("exact_div", a, b)


def exact_mul(a: ExprLike, b: ExprLike) -> Expr:
    """a * b for floats, rounded in their dtype before anything else uses it. A plain "mul" carries the renderers'
    fast-math freedom to contract it with an add into one fused multiply-add, one rounding fewer: wrong where the
    value must be what a kernel of its own computed (MatMulIntegerToFloat's product before its bias)."""
    return binary("exact_mul", a, b)


def compare(op: str, a: ExprLike, b: ExprLike) -> Expr:
    return binary(op, a, b)


def logical_and(*conds: Expr) -> Expr:
    result = conds[0]
    for cond in conds[1:]:
        result = binary("and", result, cond)
    return result


def select(cond: Expr, if_true: ExprLike, if_false: ExprLike) -> Expr:
    a = wrap(if_true, if_false.dtype if isinstance(if_false, Expr) else F32)
    return Select(cond, a, wrap(if_false, a.dtype), a.dtype)


def call(fn: str, arg: Expr) -> Expr:
    """fn(arg), in arg's float dtype (float32 for an integer argument)."""
    return Call(fn, arg, arg.dtype if arg.dtype in FLOATS else F32)


def to_float(arg: Expr) -> Expr:
    """arg as a float value: float32 unless it is float64 already."""
    return arg if arg.dtype in FLOATS else Cast(arg, F32)


class Stmt:
    """A statement of a kernel body."""


@dataclass
class Loop(Stmt):
    """for var in range(extent): body. `parallel`: iterations are independent (no shared scratch, no reduction
    across them), so a backend may run them at once (OpenCL maps them to work-items)."""

    var: Var
    extent: int
    body: list[Stmt]
    parallel: bool = False


@dataclass
class Store(Stmt):
    buf: str
    index: Expr
    value: Expr


@dataclass
class Assign(Stmt):
    """Set a scalar local (declared on first assignment; its dtype is the value's)."""

    var: Var
    value: Expr


@dataclass
class If(Stmt):
    cond: Expr
    body: list[Stmt]


@dataclass
class Param:
    """A kernel argument: a buffer of `dtype` elements (a key of VALUE_DTYPES) that the kernel reads (or writes, if
    `output`). Loads from it have dtype VALUE_DTYPES[dtype]."""

    name: str
    dtype: str = F32
    output: bool = False


@dataclass
class LoopKernel:
    """A kernel as loops: parameters in call order and a body."""

    params: list[Param]
    body: list[Stmt]


class Names:
    """Hands out fresh loop-variable and local names inside one kernel."""

    def __init__(self) -> None:
        self.count = 0

    def var(self, hint: str = "i") -> Var:
        self.count += 1
        return Var(f"{hint}{self.count}")

    def local(self, hint: str = "acc", dtype: str = F32) -> Var:
        self.count += 1
        return Var(f"{hint}{self.count}", dtype)


def strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides."""
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def flat_index(shape: tuple[int, ...], indices: Sequence[ExprLike]) -> Expr:
    """Row-major flat index of `indices` in a tensor of `shape`."""
    result: Expr = Const(0, I64)
    for stride, index in zip(strides_of(shape), indices):
        result = result + wrap(index, I64) * stride
    return result


def broadcast_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...], out_vars: Sequence[Expr]) -> Expr:
    """Flat index into an input that numpy-broadcasts to `out_shape`, given the output's loop variables."""
    offset = len(out_shape) - len(in_shape)
    indices: list[Expr] = [Const(0, I64) if dim == 1 else out_vars[offset + axis] for axis, dim in enumerate(in_shape)]
    return flat_index(in_shape, indices)


def loop_nest(names: Names, shape: tuple[int, ...], make_body, parallel: bool = False) -> tuple[list[Stmt], list[Var]]:
    """Loops over every index of `shape`; make_body(vars) gives the innermost statements. With `parallel`, the
    loops are marked independent (the body writes a distinct element per index)."""
    loop_vars = [names.var() for _ in shape]
    body: list[Stmt] = make_body(loop_vars)
    for var, extent in reversed(list(zip(loop_vars, shape))):
        body = [Loop(var, extent, body, parallel)]
    return body, loop_vars


@dataclass(frozen=True)
class ImplicitColumns:
    """A read as the im2col matrix of a zero-padded input plane (pixels x taps) without building it (an implicit
    GEMM): A[m, k] is at a_offset + row_base(m) + tap_offset(k), with m = output row * out_width + output column,
    row_base(m) = (m // out_width) * row_step + (m % out_width) * column_step, and k = (channel * kernel_height + r)
    * kernel_width + s, tap_offset(k) = channel * plane + r * tap_row_step + s * tap_column_step."""

    out_width: int
    row_step: int
    column_step: int
    plane: int
    kernel_height: int
    kernel_width: int
    tap_row_step: int
    tap_column_step: int

    def row_base(self, m: int) -> int:
        return m // self.out_width * self.row_step + m % self.out_width * self.column_step

    def tap_offset(self, k: int) -> int:
        taps = self.kernel_height * self.kernel_width
        return (
            k // taps * self.plane
            + k % taps // self.kernel_width * self.tap_row_step
            + k % self.kernel_width * self.tap_column_step
        )


@dataclass
class GemmEpilogue:
    """What a Gemm does to each value of C before storing it, so that no second pass over C runs: add a bias (one
    value per row of C at bias[bias_offset + row], or per column with bias_on_columns), add a residual laid out like
    C (residual[residual_offset + the value's place in C]), then apply an activation: (kind, params) of one of
    ops.registry.ACTIVATIONS (relu, leakyrelu, clip), which each renderer implements.

    The residual may be C itself, at C's offset (residual_in_c: a conv that writes over a residual which dies
    there, plan.planner._residuals_in_place): renderers then read each value of C before they first write it,
    and a k loop cut into blocks that keep their sums in C starts from C's values instead of zero."""

    bias: str | None = None
    bias_offset: Expr | None = None
    bias_on_columns: bool = False
    residual: str | None = None
    residual_offset: Expr | None = None
    activation: tuple[str, tuple[float, ...]] | None = None

    def residual_in_c(self, gemm: Gemm) -> bool:
        """Whether the residual is the Gemm's C itself (see above; its offset is then C's)."""
        return self.residual == gemm.c


@dataclass
class Gemm(Stmt):
    """C[m, n] = sum_k A[m, k] * B[k, n] over row-major panels at element offsets, with leading dimensions.

    A primitive of the IR rather than three loops, because its speed lives in register blocking that each
    renderer does its own way (vector accumulators in LLVM, work-group tiles in OpenCL).
    """

    a: str
    a_offset: Expr
    lda: int
    b: str
    b_offset: Expr
    ldb: int
    c: str
    c_offset: Expr
    ldc: int
    m: int
    n: int
    k: int
    a_panels: bool = False
    """A (a constant: a conv's weights) may be read pre-packed. A CPU build then stores it in panels of the
    micro-kernel's tile rows R, each panel k-major (the R values of one k side by side), the m % R edge rows last
    (k-major too), per m x k block at a_offset; lda must be k. Renderers that don't pack (OpenCL) read it row-major
    and get it so."""
    b_panels: bool = False
    """B (a constant: a layer's weights) may be read pre-packed. A CPU build then stores it in column panels of the
    micro-kernel's tile width W (vectors x lanes), each panel k-major (the W values of one k side by side), the
    n % W edge columns last (row-major, k x (n % W)), per k x n block at b_offset; ldb must be n (k when
    b_transposed). Renderers that don't pack (OpenCL) read it as stored."""
    b_transposed: bool = False
    """B is stored transposed (n x k per block, ldb = k: Gemm's transB). Only with b_panels, whose packing turns
    it: the LLVM renderer never reads a transposed B itself."""
    a_transposed: bool = False
    """A is stored transposed (k x m per block, A[m, k] at k * lda + m, lda >= m): a conv's column matrix read as
    pixels x taps when the pixels are the rows (a small output plane). Never with a_panels."""
    c_transposed: bool = False
    """C is stored transposed (n x m, C[m, n] at n * ldc + m, ldc >= m): the NCHW output of a conv whose GEMM has
    the pixels as rows."""
    epilogue: GemmEpilogue | None = None
    """Bias, residual and activation applied as C is stored (see GemmEpilogue)."""
    a_window: ImplicitColumns | None = None
    """A is a padded input plane read as its im2col matrix (ImplicitColumns); lda is unused, k must be a whole
    number of channels' taps, and the k loop is not cut into blocks. Only the LLVM renderer reads it."""


@dataclass(frozen=True)
class LineValues:
    """Values an IntGemm reads per row or column of C (zero points, scales, a bias) from buf[offset]: one, or one per
    row of A (per column of B; for a Requantize, per its `on_rows`)."""

    buf: str
    offset: Expr
    per_line: bool = False


@dataclass(frozen=True)
class Requantize:
    """What an IntGemm stores instead of its int32 sums, as QLinearConv and QLinearMatMul define it: each sum plus
    `bias`, times multiplier = x_scale * w_scale / y_scale (float32 products and a correctly rounded float32
    division), plus y_zero, in float64; rounded half to even and saturated to [low, high] (C's bytes), and with
    `relu` never below y_zero (a Relu before the QuantizeLinear: quantizing is monotonic, so it clamps there).
    w_scale and bias are one value or one per row (`on_rows`: a conv's output channels as rows) or per column."""

    x_scale: LineValues
    w_scale: LineValues
    y_scale: LineValues
    y_zero: LineValues | None
    bias: LineValues | None
    on_rows: bool
    low: int
    high: int
    """The range C's bytes saturate to (-128..127 for int8, 0..255 for uint8)."""
    relu: bool = False


@dataclass(frozen=True)
class Dequantize:
    """What an IntGemm stores instead of its int32 sums, as MatMulInteger -> Cast to float32 -> Mul by `scale` ->
    [Add of `bias`] computes it: each sum converted to float32, times the scale, plus the bias, each step rounded to
    float32 on its own (no fused multiply-add). scale and bias are one value or one per column of C."""

    scale: LineValues
    bias: LineValues | None


@dataclass
class IntGemm(Stmt):
    """C[m, n] = sum_k (A[m, k] - a_zero[m]) * (B[k, n] - b_zero[n]) over int8/uint8 operands (as their buffers'
    dtypes), exact in int32 (wrapping as int32 does) into C's int32s: row-major panels at element offsets with
    leading dimensions, as Gemm's; any k and n. A primitive for the same reason as Gemm: its speed lives in each
    ISA's dot-product instructions (AVX-512 VNNI's vpdpbusd, AVX2's vpmaddwd) and in register blocking."""

    a: str
    a_offset: Expr
    lda: int
    b: str
    b_offset: Expr
    ldb: int
    c: str
    c_offset: Expr
    ldc: int
    m: int
    n: int
    k: int
    a_zero: LineValues | None = None
    """A's zero points (None: 0)."""
    b_zero: LineValues | None = None
    """B's zero points (None: 0)."""
    b_transposed: bool = False
    """B stored n x k (B[k, n] at n * ldb + k: a conv's weights, when its output pixels are the rows)."""
    c_transposed: bool = False
    """C stored n x m (C[m, n] at n * ldc + m: the NCHW output of a conv whose rows are its pixels)."""
    requantize: Requantize | None = None
    """Store each sum requantized into C's bytes (None: C holds the int32 sums)."""
    dequantize: Dequantize | None = None
    """Store each sum dequantized into C's float32s (None: C holds the int32 sums)."""
    b_panels: int = 0
    """B (a constant weight of this many columns; 0: none) may be read pre-packed: a CPU build stores it in panels of
    INT_GEMM_PANEL_LANES columns, group by group of four k, each column's four bytes side by side, as int8
    (packing.pack_byte_panels); b_offset is the unit's first column times k. OpenCL reads it as stored."""


INT_GEMM_K_GROUP = 4
INT_GEMM_PANEL_LANES = 16
"""The columns of a pre-packed B's panel: AVX-512's int32 lanes (AVX2 and NEON read halves and quarters)."""
