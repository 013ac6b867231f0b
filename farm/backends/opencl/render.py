"""Render a loop-IR kernel as OpenCL C: the second backend over the same op lowering as the LLVM path.

Shapes are constants here too. A kernel becomes one or more launches, run in order on one queue: each top-level
loop marked parallel is a launch with one work-item per iteration, each Gemm a 2-D launch with one work-item per
register tile of the output (`GemmTile`), and other statements run on a single work-item (always correct).
Top-level loops of extent 1 (a batch of one) are unwrapped first, so a convolution is im2col, Gemm and epilogue,
each parallel.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from farm.errors import BuildError
from farm.ir import launching
from farm.ir import loopir as L

C_TYPES = {L.F32: "float", L.F64: "double", L.I64: "long", L.I32: "int", L.BOOL: "int"}
# Buffer element types (numpy's layouts: bool is one byte); C's conversions widen and narrow on load and store,
# except for half, which OpenCL C reads and writes only through vload_half and vstore_half (no cl_khr_fp16 needed),
# and bfloat16, which C has no type for: its bits sit in a ushort (CODED_LOADS, CODED_STORES).
BUFFER_C_TYPES = {
    L.F32: "float",
    L.F64: "double",
    L.F16: "half",
    L.BF16: "ushort",
    L.I64: "long",
    L.I32: "int",
    L.I16: "short",
    L.I8: "char",
    L.U32: "uint",
    L.U16: "ushort",
    L.U8: "uchar",
    L.BOOL: "uchar",
}
FP64_PRAGMA = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
"""Double precision is an extension (most desktop GPUs and PoCL have it, many phone GPUs don't): a kernel that uses
double (a float64 buffer, an exact division) enables it, and a device without it fails that kernel's build, naming
the device."""
_CODED_BUFFERS: ContextVar[Mapping[str, str]] = ContextVar("coded_buffers", default=MappingProxyType({}))
"""The buffers of the kernel being rendered that hold half or bfloat16 elements, by name: their dtype."""
FLOAT_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
INT_OPS = {**FLOAT_OPS, "mod": "%", "shr": ">>", "bitand": "&", "bitor": "|", "bitxor": "^"}
"""On long values; OpenCL C defines >> of a negative value as arithmetic (the sign fills the vacated bits)."""
COMPARE_OPS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}


@dataclass(frozen=True)
class GemmTile:
    """The block of C one work-item computes: `rows` rows by `vectors` x `width` columns, accumulated in registers.

    Measured on PoCL (2 cores, Zen 4) over resnet18_style's GEMM shapes: 4 rows x 2 float4 columns runs 10-25x
    faster than one work-item per element (3.5 -> 40-97 GFLOP/s); rows beyond m are clamped on load and skipped
    on store. Columns use float4 loads when n allows, else scalars with the same clamping.
    """

    rows: int
    vectors: int
    width: int

    @property
    def columns(self) -> int:
        return self.vectors * self.width

    def grid(self, g: L.Gemm) -> tuple[int, int]:
        """Global size: column tiles (dimension 0, adjacent work-items read adjacent B columns), then row tiles."""
        return (-(-g.n // self.columns), -(-g.m // self.rows))


def gemm_tile(g: L.Gemm) -> GemmTile:
    for vectors, width in ((2, 4), (1, 4)):
        if g.n % (vectors * width) == 0:
            return GemmTile(4, vectors, width)
    return GemmTile(4, 4, 1)


def launches(symbol: str, kernel: L.LoopKernel) -> list[tuple[str, tuple[int, ...]]]:
    """(OpenCL kernel name, global size) of every launch that runs `kernel`, in order."""
    _, groups = launching.launch_groups(kernel)
    return [(f"{symbol}_{index}", LAUNCH_SHAPES[group.kind](group)) for index, group in enumerate(groups)]


def render_opencl(symbol: str, kernel: L.LoopKernel) -> str:
    """OpenCL C source of one kernel: a __kernel function per launch (see `launches`)."""
    params = ", ".join(_param(p) for p in kernel.params)
    fixed, groups = launching.launch_groups(kernel)
    prologue = "".join(f"    const long {name} = 0;\n" for name in fixed)
    token = _CODED_BUFFERS.set({p.name: p.dtype for p in kernel.params if p.dtype in CODED_LOADS})
    try:
        functions = [
            f"__kernel void {name}({params})\n{{\n{prologue}{LAUNCH_BODIES[group.kind](group)}}}\n"
            for (name, _), group in zip(launches(symbol, kernel), groups)
        ]
    finally:
        _CODED_BUFFERS.reset(token)
    source = "\n".join(functions)
    return (FP64_PRAGMA if re.search(r"\bdouble\b", source) else "") + source


def _parallel_body(group: launching.LaunchGroup) -> str:
    """A work-item per iteration of the launch's loop; one past its extent does nothing."""
    loop, v = group.loop, group.loop.var.name
    return (
        f"    const long {v} = get_global_id(0);\n    if ({v} >= {loop.extent}L) return;\n"
        + _declare_locals(group.stmts)
        + _block(loop.body, 1)
    )


def _serial_body(group: launching.LaunchGroup) -> str:
    """Every statement on the one work-item, in order."""
    return _declare_locals(group.stmts) + _block(group.stmts, 1)


def _declare_locals(stmts: list[L.Stmt]) -> str:
    return "".join(f"    {C_TYPES[dtype]} {name};\n" for name, dtype in sorted(_locals(stmts).items()))


LAUNCH_SHAPES: dict[launching.LaunchKind, Callable[[launching.LaunchGroup], tuple[int, ...]]] = {
    launching.LaunchKind.GEMM: lambda group: gemm_tile(group.gemm).grid(group.gemm),
    launching.LaunchKind.PARALLEL: lambda group: (group.loop.extent,),
    launching.LaunchKind.SERIAL: lambda group: (1,),
}
"""The global size of a launch of each kind: a work-item per GemmTile, per loop iteration, or one."""

LAUNCH_BODIES: dict[launching.LaunchKind, Callable[[launching.LaunchGroup], str]] = {
    launching.LaunchKind.GEMM: lambda group: _parallel_gemm(group.gemm),
    launching.LaunchKind.PARALLEL: _parallel_body,
    launching.LaunchKind.SERIAL: _serial_body,
}
"""The __kernel body of a launch of each kind, for the global size LAUNCH_SHAPES gives it."""


def _parallel_gemm(g: L.Gemm) -> str:
    """One work-item per `GemmTile` of C: A values broadcast against B vectors into tile accumulators."""
    _check_matrix_a(g)
    tile = gemm_tile(g)
    vector = "float" if tile.width == 1 else f"float{tile.width}"
    rows, vectors = range(tile.rows), range(tile.vectors)
    lines = [
        f"const long gn0 = get_global_id(0) * {tile.columns}L, gm0 = get_global_id(1) * {tile.rows}L;",
        f"__global const float* ga = {g.a} + ({expr(g.a_offset)});",
        f"__global const float* gb = {g.b} + ({expr(g.b_offset)});",
        f"__global float* gc = {g.c} + ({expr(g.c_offset)});",
    ]
    lines += [f"const long ga{r} = min(gm0 + {r}L, {g.m - 1}L);" for r in rows]
    lines += [f"{vector} gacc{r}_{v} = 0.0f;" for r in rows for v in vectors]
    lines += [f"for (long gk = 0; gk < {g.k}L; ++gk) {{"]
    lines += [f"    const float gx{r} = ga[{_a_at(g, f'ga{r}', 'gk')}];" for r in rows]
    lines += [f"    const {vector} gy{v} = {_gemm_load(g, tile, v)};" for v in vectors]
    lines += [f"    gacc{r}_{v} = fma(({vector})(gx{r}), gy{v}, gacc{r}_{v});" for r in rows for v in vectors]
    lines += ["}"]
    lines += [_gemm_store(g, tile, r, v) for r in rows for v in vectors]
    return "".join(f"    {line}\n" for line in lines)


def _a_at(g: L.Gemm, row: str, k: str) -> str:
    """Where A[row, k] is: row-major, or transposed (L.Gemm.a_transposed)."""
    return f"{k} * {g.lda}L + {row}" if g.a_transposed else f"{row} * {g.lda}L + {k}"


def _c_at(g: L.Gemm, row: str, column: str) -> str:
    """Where C[row, column] is: row-major, or transposed (L.Gemm.c_transposed)."""
    return f"({column}) * {g.ldc}L + {row}" if g.c_transposed else f"({row}) * {g.ldc}L + {column}"


def _gemm_load(g: L.Gemm, tile: GemmTile, v: int) -> str:
    if g.b_transposed:
        return _transposed_load(g, tile, v)
    if tile.width == 1:
        return f"gb[gk * {g.ldb}L + min(gn0 + {v}L, {g.n - 1}L)]"
    return f"vload{tile.width}(0, gb + gk * {g.ldb}L + gn0 + {v * tile.width}L)"


def _transposed_load(g: L.Gemm, tile: GemmTile, v: int) -> str:
    """B's values for one k when B is stored n x k (L.Gemm.b_transposed): one load per column, gathered."""
    if tile.width == 1:
        return f"gb[min(gn0 + {v}L, {g.n - 1}L) * {g.ldb}L + gk]"
    columns = ", ".join(f"gb[(gn0 + {v * tile.width + i}L) * {g.ldb}L + gk]" for i in range(tile.width))
    return f"(float{tile.width})({columns})"


def _gemm_store(g: L.Gemm, tile: GemmTile, r: int, v: int) -> str:
    row, column = f"gm0 + {r}L", f"gn0 + {v * tile.width}L"
    value = _epilogue(g, f"gacc{r}_{v}", row, column, tile.width)
    if tile.width == 1:
        return f"if ({row} < {g.m}L && {column} < {g.n}L) gc[{_c_at(g, row, column)}] = {value};"
    if g.c_transposed:
        lanes = "".join(f" gc[{_c_at(g, row, f'{column} + {i}L')}] = gout.s{i:x};" for i in range(tile.width))
        return f"if ({row} < {g.m}L) {{ const float{tile.width} gout = {value};{lanes} }}"
    return f"if ({row} < {g.m}L) vstore{tile.width}({value}, 0, gc + ({row}) * {g.ldc}L + {column});"


def _epilogue(g: L.Gemm, value: str, row: str, column: str, width: int) -> str:
    """`value` (C[row, column:column+width]) + bias + residual, through the activation (L.GemmEpilogue)."""
    epilogue = g.epilogue
    if epilogue is None:
        return value
    vector = "float" if width == 1 else f"float{width}"
    if epilogue.bias is not None:
        bias = f"{epilogue.bias} + ({expr(epilogue.bias_offset or L.const(0))})"
        on_columns = width > 1 and epilogue.bias_on_columns
        term = (
            f"vload{width}(0, {bias} + {column})"
            if on_columns
            else f"({bias})[{column if epilogue.bias_on_columns else row}]"
        )
        value = f"({value} + {term})"
    if epilogue.residual is not None:
        residual = f"({epilogue.residual} + ({expr(epilogue.residual_offset or L.const(0))}))"
        value = f"({value} + {_laid_out_like_c(g, residual, row, column, width)})"
    if epilogue.activation is not None:
        kind, params = epilogue.activation
        constants = [f"(({vector})({_const(L.const(float(p)))}))" for p in params]
        value = OPENCL_ACTIVATIONS[kind](f"({value})", constants, vector)
    return value


def _laid_out_like_c(g: L.Gemm, buffer: str, row: str, column: str, width: int) -> str:
    if width == 1:
        return f"{buffer}[{_c_at(g, row, column)}]"
    if g.c_transposed:
        lanes = [f"{buffer}[{_c_at(g, row, column + f' + {i}L')}]" for i in range(width)]
        return f"((float{width})({', '.join(lanes)}))"
    return f"vload{width}(0, {buffer} + ({row}) * {g.ldc}L + {column})"


def _maximum(x: str, y: str) -> str:
    return f"({x} < {y} ? {y} : {x})"


def _minimum(x: str, y: str) -> str:
    return f"({x} > {y} ? {y} : {x})"


OPENCL_ACTIVATIONS: dict[str, Callable[[str, list[str], str], str]] = {
    "relu": lambda x, p, t: _maximum(x, f"(({t})(0.0f))"),
    "leakyrelu": lambda x, p, t: f"({x} < (({t})(0.0f)) ? {x} * {p[0]} : {x})",
    "clip": lambda x, p, t: _minimum(_maximum(x, p[0]), p[1]),
}
"""ops.registry.ACTIVATIONS in OpenCL C on a float or floatN (as the loop IR renders max and min): a Gemm's
epilogue."""


def _param(param: L.Param) -> str:
    qualifier = "" if param.output else "const "
    return f"__global {qualifier}{BUFFER_C_TYPES[param.dtype]}* restrict {param.name}"


def _locals(stmts: list[L.Stmt], found: dict[str, str] | None = None) -> dict[str, str]:
    """Every scalar local assigned anywhere in `stmts`, with its type."""
    found = {} if found is None else found
    for stmt in stmts:
        if isinstance(stmt, L.Assign):
            found[stmt.var.name] = stmt.value.dtype
        for child in getattr(stmt, "body", None) or []:
            _locals([child], found)
    return found


def _block(stmts: list[L.Stmt], depth: int) -> str:
    return "".join(STMT_RENDERERS[type(s)](s, depth) for s in stmts)


def _indent(depth: int) -> str:
    return "    " * depth


def _loop(loop: L.Loop, depth: int) -> str:
    v, pad = loop.var.name, _indent(depth)
    return f"{pad}for (long {v} = 0; {v} < {loop.extent}L; ++{v}) {{\n{_block(loop.body, depth + 1)}{pad}}}\n"


def _store(store: L.Store, depth: int) -> str:
    coded = _CODED_BUFFERS.get().get(store.buf)
    if coded:
        return f"{_indent(depth)}{CODED_STORES[coded](store)}\n"
    return f"{_indent(depth)}{store.buf}[{expr(store.index)}] = {expr(store.value)};\n"


def _bfloat16_store(store: L.Store) -> str:
    """A block storing the value's bfloat16 bits, rounded to nearest even with integer arithmetic (adding 0x7fff
    plus the lowest kept bit carries exactly the values past the halfway point, and into the exponent where the
    value overflows to infinity); NaN becomes the quiet NaN of its sign, as ml_dtypes does. A double first becomes
    float bits rounded to odd (truncated, the lowest bit set if inexact), so that it is rounded only once. The
    local's name ends in a letter: no name of the kernel's (L.Names: hint and number) can be shadowed."""
    if store.value.dtype == L.F64:
        bits = (
            "const double bfloat_wide = " + expr(store.value) + "; const float bfloat_narrow = "
            "convert_float_rtz(bfloat_wide); const uint bfloat_bits = as_uint(bfloat_narrow) | "
            "(uint)((double)bfloat_narrow != bfloat_wide);"
        )
    else:
        bits = f"const uint bfloat_bits = as_uint((float)({expr(store.value)}));"
    rounded = (
        "(bfloat_bits & 0x7fffffffu) > 0x7f800000u ? ((bfloat_bits >> 16) & 0x8000u) | 0x7fc0u : "
        "(bfloat_bits + 0x7fffu + ((bfloat_bits >> 16) & 1u)) >> 16"
    )
    return f"{{ {bits} {store.buf}[{expr(store.index)}] = (ushort)({rounded}); }}"


CODED_STORES: dict[str, Callable[[L.Store], str]] = {
    L.F16: lambda st: f"vstore_half_rte({expr(st.value)}, {expr(st.index)}, {st.buf});",
    L.BF16: _bfloat16_store,
}
CODED_LOADS: dict[str, Callable[[L.Load], str]] = {
    L.F16: lambda ld: f"vload_half({expr(ld.index)}, {ld.buf})",
    L.BF16: lambda ld: f"as_float((uint)({ld.buf}[{expr(ld.index)}]) << 16)",
}


def _assign(assign: L.Assign, depth: int) -> str:
    return f"{_indent(depth)}{assign.var.name} = {expr(assign.value)};\n"


def _if(stmt: L.If, depth: int) -> str:
    return f"{_indent(depth)}if ({expr(stmt.cond)}) {{\n{_block(stmt.body, depth + 1)}{_indent(depth)}}}\n"


def _check_matrix_a(g: L.Gemm) -> None:
    """OpenCL reads A as a matrix: the lowering never gives it an implicit GEMM (L.Gemm.a_window)."""
    if g.a_window is not None:
        raise BuildError("an implicit GEMM (A read as a padded input plane) has no OpenCL rendering")


def _gemm(g: L.Gemm, depth: int) -> str:
    _check_matrix_a(g)
    pad, a, b, c = _indent(depth), expr(g.a_offset), expr(g.b_offset), expr(g.c_offset)
    b_at = f"gn * {g.ldb}L + gk" if g.b_transposed else f"gk * {g.ldb}L + gn"
    return (
        f"{pad}for (long gm = 0; gm < {g.m}L; ++gm) for (long gn = 0; gn < {g.n}L; ++gn) {{\n"
        f"{pad}    float gacc = 0.0f;\n"
        f"{pad}    for (long gk = 0; gk < {g.k}L; ++gk) gacc = fma({g.a}[{a} + {_a_at(g, 'gm', 'gk')}], "
        f"{g.b}[{b} + {b_at}], gacc);\n"
        f"{pad}    {g.c}[{c} + {_c_at(g, 'gm', 'gn')}] = {_epilogue(g, 'gacc', 'gm', 'gn', 1)};\n{pad}}}\n"
    )


def _zero_point(points: L.LineValues | None, line: str) -> str:
    """An IntGemm operand's zero point for row (column) `line`, as a long; 0 without zero points."""
    if points is None:
        return "0L"
    at = f" + {line}" if points.per_line else ""
    return f"(long){points.buf}[{expr(points.offset)}{at}]"


def _int_gemm(g: L.IntGemm, depth: int) -> str:
    """Each element's sum of (a - a_zero) * (b - b_zero) in a long, stored as the int it wraps to; the bytes read
    as their buffers' types (uchar, char) give each value its sign."""
    pad, a, b, c = _indent(depth), expr(g.a_offset), expr(g.b_offset), expr(g.c_offset)
    b_at = f"in_ * {g.ldb}L + ik" if g.b_transposed else f"ik * {g.ldb}L + in_"
    c_at = f"in_ * {g.ldc}L + im" if g.c_transposed else f"im * {g.ldc}L + in_"
    return (
        f"{pad}for (long im = 0; im < {g.m}L; ++im) for (long in_ = 0; in_ < {g.n}L; ++in_) {{\n"
        f"{pad}    long iacc = 0L;\n"
        f"{pad}    for (long ik = 0; ik < {g.k}L; ++ik) iacc += ((long){g.a}[{a} + im * {g.lda}L + ik] - "
        f"{_zero_point(g.a_zero, 'im')}) * ((long){g.b}[{b} + {b_at}] - {_zero_point(g.b_zero, 'in_')});\n"
        f"{_int_gemm_store(g, f'{g.c}[{c} + {c_at}]', pad + '    ')}{pad}}}\n"
    )


def _int_gemm_store(g: L.IntGemm, target: str, pad: str) -> str:
    """The statements that store the sum iacc into C's element `target`: as _int_gemm_result computes it, or
    dequantized (L.Dequantize): the float32 product held in a variable of its own before the bias is added, since
    OpenCL C may contract a multiply and an add within one expression into one rounding."""
    d = g.dequantize
    if d is None:
        return f"{pad}{target} = {_int_gemm_result(g)};\n"
    product = f"{pad}float gdq = (float)(int)iacc * {_line_value(d.scale, 'in_')};\n"
    bias = "" if d.bias is None else f" + {_line_value(d.bias, 'in_')}"
    return f"{product}{pad}{target} = gdq{bias};\n"


def _line_value(values: L.LineValues, line: str) -> str:
    """A per-line value (scale, bias) for row or column `line`, or the one value."""
    at = f" + {line}" if values.per_line else ""
    return f"{values.buf}[{expr(values.offset)}{at}]"


def _int_gemm_result(g: L.IntGemm) -> str:
    """What C stores for the sum iacc: the int it wraps to, or (L.Requantize) the sum requantized in double: the
    multiplier a float division rounded once (the double quotient of two floats rounds to the float quotient), rint
    rounding half to even, fmax/fmin saturating (a NaN low)."""
    q = g.requantize
    if q is None:
        return "(int)iacc"
    line = "im" if q.on_rows else "in_"
    total = "(double)(int)iacc" if q.bias is None else f"(double)((int)iacc + {_line_value(q.bias, line)})"
    multiplier = (
        f"(double)(float)((double)({_line_value(q.x_scale, line)} * {_line_value(q.w_scale, line)}) / "
        f"(double){_line_value(q.y_scale, line)})"
    )
    zero = "0.0" if q.y_zero is None else f"(double){_line_value(q.y_zero, line)}"
    floor = f"fmax({float(q.low)}, {zero})" if q.relu else f"{float(q.low)}"
    return f"fmin(fmax(rint({total} * {multiplier} + {zero}), {floor}), {float(q.high)})"


# Each renderer takes the statement or expression type it is keyed by, which a dict's type can only write as Any.
STMT_RENDERERS: dict[type, Callable[[Any, int], str]] = {
    L.Loop: _loop,
    L.Store: _store,
    L.Assign: _assign,
    L.If: _if,
    L.Gemm: _gemm,
    L.IntGemm: _int_gemm,
}


def expr(e: L.Expr) -> str:
    """C text of one expression, fully parenthesised."""
    return EXPR_RENDERERS[type(e)](e)


def _const(c: L.Const) -> str:
    if c.dtype not in L.FLOATS:
        return f"{int(c.value)}L"
    value = float(c.value)
    if math.isnan(value):
        return "NAN" if c.dtype == L.F32 else "((double)NAN)"
    if math.isinf(value):
        infinity = "INFINITY" if c.dtype == L.F32 else "((double)INFINITY)"
        return infinity if value > 0 else f"(-{infinity})"
    return f"({value.hex()}{'f' if c.dtype == L.F32 else ''})"


def _load(ld: L.Load) -> str:
    coded = _CODED_BUFFERS.get().get(ld.buf)
    if coded:
        return CODED_LOADS[coded](ld)
    element = f"{ld.buf}[{expr(ld.index)}]"
    return f"({element} != 0)" if ld.dtype == L.BOOL else element


SPELLED_BINARY: dict[str, Callable[[str, str], str]] = {
    "max": lambda x, y: f"(({x}) < ({y}) ? ({y}) : ({x}))",
    "min": lambda x, y: f"(({x}) > ({y}) ? ({y}) : ({x}))",
    "shl": lambda x, y: f"((long)((ulong)({x}) << ({y})))",
}
"""Binary ops that are no single C operator: max and min as selects, and shl through ulong, so that bits leave
the top of a negative value as they do in LLVM's shl (a left shift of a negative signed value is undefined in C)."""


def _binary(b: L.Binary) -> str:
    lhs, rhs = expr(b.lhs), expr(b.rhs)
    if b.op in EXACT_OPS:
        return _exact(b, lhs, rhs)
    if b.op in SPELLED_BINARY:
        return SPELLED_BINARY[b.op](lhs, rhs)
    symbol = COMPARE_OPS.get(b.op) or (FLOAT_OPS if b.lhs.dtype in L.FLOATS else INT_OPS)[b.op]
    return f"({lhs} {symbol} {rhs})"


EXACT_OPS = {"exact_div": "/", "exact_mul": "*"}
"""The loop IR's correctly rounded float ops (L.exact_div, L.exact_mul) and their C operators."""


def _exact(b: L.Binary, lhs: str, rhs: str) -> str:
    """L.exact_div or L.exact_mul: a float quotient or product taken in double and rounded once to float. OpenCL C's
    float division may be 2.5 ulp off (only double division must be correctly rounded; double has more than twice
    float's precision, so its quotient rounds to the correctly rounded float one), and it may contract a float
    multiply and an add into one rounding (a double product of floats is exact, and no add fuses with its
    rounding). The kernel then needs cl_khr_fp64."""
    symbol = EXACT_OPS[b.op]
    if b.lhs.dtype == L.F64:
        return f"({lhs} {symbol} {rhs})"
    return f"((float)((double)({lhs}) {symbol} (double)({rhs})))"


EXPR_RENDERERS: dict[type, Callable[[Any], str]] = {
    L.Const: _const,
    L.Var: lambda v: v.name,
    L.Load: _load,
    L.Binary: _binary,
    L.Call: lambda c: f"{c.fn}({expr(c.arg)})",
    L.Select: lambda s: f"({expr(s.cond)} ? {expr(s.if_true)} : {expr(s.if_false)})",
    L.Cast: lambda c: f"(({C_TYPES[c.dtype]})({expr(c.arg)}))",
}
