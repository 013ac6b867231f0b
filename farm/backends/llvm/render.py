"""Render a loop-IR kernel as an LLVM IR function with llvmlite's IR builder.

Loops become counted basic-block loops over allocas that mem2reg promotes; O3's loop vectoriser then widens the
inner loops to the target's SIMD width. Float math carries the fast-math flags that allow reassociation and FMA
contraction (reductions vectorise), but not nnan/ninf, so NaN and infinities propagate as in onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from farm.backends.llvm.dot_products import DotProduct, generic_dot_product
from farm.backends.llvm.gemm import emit_gemm
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.gemm_emitter import intrinsic
from farm.backends.llvm.gemm_epilogue import fmax, fmin
from farm.backends.llvm.gemm_outlining import Outlining
from farm.backends.llvm.int_gemm import (
    DequantizeOperands,
    IntGemmOperands,
    Lines,
    RequantizeOperands,
    Zeros,
    emit_int_gemm,
)
from farm.ir import launching
from farm.ir import loopir as L

F32_T, I64_T, BOOL_T, I32_T = ir.FloatType(), ir.IntType(64), ir.IntType(1), ir.IntType(32)
F64_T, F16_T, I16_T, I8_T = ir.DoubleType(), ir.HalfType(), ir.IntType(16), ir.IntType(8)
PTR_T = ir.PointerType()
LLVM_TYPES = {L.F32: F32_T, L.F64: F64_T, L.I64: I64_T, L.I32: I32_T, L.BOOL: BOOL_T}
# How each buffer dtype sits in memory (numpy's layouts: bool is one byte; unsigned integers are LLVM's integers of
# their width, read with zero extension; bfloat16 is its 16 bits, which llvmlite has no float type for).
STORAGE_TYPES = {
    L.F32: F32_T,
    L.F64: F64_T,
    L.F16: F16_T,
    L.BF16: I16_T,
    L.I64: I64_T,
    L.I32: I32_T,
    L.I16: I16_T,
    L.I8: I8_T,
    L.U32: I32_T,
    L.U16: I16_T,
    L.U8: I8_T,
    L.BOOL: I8_T,
}
UNSIGNED = frozenset({L.U32, L.U16, L.U8})
FAST = ("reassoc", "contract", "nsz", "arcp")


def declare_kernel(module: ir.Module, symbol: str, n_params: int) -> ir.Function:
    """Declare (or define later) a kernel: void symbol(ptr noalias, ...), hidden inside the model library."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T] * n_params), symbol)
    fn.linkage = "hidden"  # llvmlite prints the linkage slot verbatim and ignores `visibility` on functions
    return fn


def launch_symbol(symbol: str, index: int) -> str:
    """The function that runs launch `index` of kernel `symbol` (see launching.launch_groups)."""
    return f"{symbol}_{index}"


def declare_launch(module: ir.Module, symbol: str, n_params: int) -> ir.Function:
    """Declare a launch: void symbol(ptr noalias, ..., i64 begin, i64 end), hidden inside the model library."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T] * n_params + [I64_T, I64_T]), symbol)
    fn.linkage = "hidden"
    return fn


def render_kernel(
    module: ir.Module,
    symbol: str,
    kernel: L.LoopKernel,
    blocking: GemmBlocking,
    outlining: Outlining | None = None,
    dot: DotProduct | None = None,
) -> ir.Function:
    """Add `kernel` to `module` as function `symbol`, and each of its launches as `symbol_<index>(..., begin, end)`
    running only iterations [begin, end) of the launch's parallel loop or rows of its Gemm (a serial launch ignores
    the range). `symbol` runs every launch over its whole range, in order. Gemm statements use `blocking`; with
    `outlining`, a Gemm launch's heaviest code goes into functions of their own (gemm_outlining.Outlining).
    IntGemm statements use `dot` (dot_products.dot_product_for the target; widening multiplies by default)."""
    fixed, groups = launching.launch_groups(kernel)
    dot = dot or generic_dot_product(blocking.lanes)
    launches = [
        _render_launch(module, launch_symbol(symbol, index), kernel, fixed, group, blocking, outlining, dot)
        for index, group in enumerate(groups)
    ]
    fn = declare_kernel(module, symbol, len(kernel.params))
    fn.attributes.add("nounwind")
    for arg, param in zip(fn.args, kernel.params):
        arg.name = param.name
        arg.add_attribute("noalias")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    for launch, info in zip(
        launches, launching.launch_info(kernel, blocking.rows, blocking.tile_columns, blocking.vectors)
    ):
        builder.call(launch, [*fn.args, ir.Constant(I64_T, 0), ir.Constant(I64_T, info.extent)])
    builder.ret_void()
    if outlining is not None and outlining.part:  # the kernel and its launches are part 0's: declared here
        for function in (fn, *launches):
            function.blocks.clear()
    return fn


def _render_launch(
    module: ir.Module,
    symbol: str,
    kernel: L.LoopKernel,
    fixed: list[str],
    group: launching.LaunchGroup,
    blocking: GemmBlocking,
    outlining: Outlining | None,
    dot: DotProduct,
) -> ir.Function:
    fn = declare_launch(module, symbol, len(kernel.params))
    # noinline: the kernel calls each launch once; inlining would only duplicate the code in the object.
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    for arg, param in zip(fn.args, kernel.params):
        arg.name = param.name
        arg.add_attribute("noalias")
    begin, end = fn.args[-2:]
    begin.name, end.name = "begin", "end"
    entry = fn.append_basic_block("entry")
    body = fn.append_basic_block("body")
    state = _State(
        ir.IRBuilder(entry),
        {p.name: arg for p, arg in zip(kernel.params, fn.args)},
        blocking,
        {p.name: p.dtype for p in kernel.params},
        outlining,
        dot,
    )
    state.builder.position_at_end(body)
    for name in fixed:
        state.builder.store(ir.Constant(I64_T, 0), state.slot(L.Var(name)))
    LAUNCH_EMITTERS[group.kind](state, group, (begin, end))
    state.builder.ret_void()
    ir.IRBuilder(entry).branch(body)
    return fn


class _State:
    """What statement emission needs: the builder, buffer arguments and scalar slots (allocas)."""

    def __init__(
        self,
        builder: ir.IRBuilder,
        buffers: dict[str, ir.Argument],
        blocking: GemmBlocking,
        buffer_dtypes: dict[str, str],
        outlining: Outlining | None = None,
        dot: DotProduct | None = None,
    ):
        self.builder, self.buffers, self.blocking, self.buffer_dtypes = builder, buffers, blocking, buffer_dtypes
        self.outlining = outlining
        self.dot = dot or generic_dot_product(blocking.lanes)
        self.slots: dict[str, ir.AllocaInstr] = {}
        self.entry_block = builder.block

    def slot(self, var: L.Var) -> ir.AllocaInstr:
        """The alloca behind a loop variable or local."""
        return self.typed_slot(var.name, LLVM_TYPES[var.dtype])

    def typed_slot(self, name: str, typ: ir.Type) -> ir.AllocaInstr:
        """An alloca in the entry block, created on first use (mem2reg turns it into registers)."""
        if name not in self.slots:
            entry = ir.IRBuilder(self.entry_block)
            if self.entry_block.instructions:
                entry.position_before(self.entry_block.instructions[0])
            self.slots[name] = entry.alloca(typ, name=name)
        return self.slots[name]


def _emit_block(state: _State, stmts: list[L.Stmt]) -> None:
    for stmt in stmts:
        STMT_EMITTERS[type(stmt)](state, stmt)


def _emit_loop(state: _State, loop: L.Loop, bounds: tuple[ir.Value, ir.Value] | None = None) -> None:
    """The loop over [0, extent), or over the runtime range `bounds` (a launch's share of it)."""
    b = state.builder
    counter = state.slot(loop.var)
    start, stop = bounds or (ir.Constant(I64_T, 0), ir.Constant(I64_T, loop.extent))
    b.store(start, counter)
    head = b.append_basic_block(f"{loop.var.name}.head")
    body = b.append_basic_block(f"{loop.var.name}.body")
    done = b.append_basic_block(f"{loop.var.name}.done")
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(b.icmp_signed("<", b.load(counter), stop), body, done)
    b.position_at_end(body)
    _emit_block(state, loop.body)
    b.store(b.add(b.load(counter), ir.Constant(I64_T, 1), flags=("nsw", "nuw")), counter)
    b.branch(head)
    b.position_at_end(done)


def _emit_store(state: _State, store: L.Store) -> None:
    dtype = state.buffer_dtypes.get(store.buf, store.value.dtype)
    storage, encode = STORAGE_TYPES[dtype], ENCODERS.get(dtype, _to_storage)
    value = encode(state.builder, emit_expr(state, store.value), storage)
    state.builder.store(value, _address(state, store.buf, store.index, storage), align=storage_align(storage))


STORAGE_BYTES = {F32_T: 4, F64_T: 8, F16_T: 2, I64_T: 8, I32_T: 4, I16_T: 2, I8_T: 1}


def storage_align(storage: ir.Type) -> int:
    """The alignment a buffer of `storage` elements has (its element size, up to the 4 that numpy guarantees)."""
    return min(STORAGE_BYTES[storage], 4)


def _to_storage(b: ir.IRBuilder, value: ir.Value, storage: ir.Type) -> ir.Value:
    """A value as its buffer holds it: i1 widened to a byte, integers narrowed to their width (wrapping), floats
    rounded to nearest even to a narrower float or widened to a wider one."""
    if value.type == storage:
        return value
    if value.type == BOOL_T:
        return b.zext(value, storage)
    if isinstance(storage, ir.IntType):
        return b.trunc(value, storage)
    return b.fpext(value, storage) if STORAGE_BYTES[storage] > STORAGE_BYTES[value.type] else b.fptrunc(value, storage)


def _i32(n: int) -> ir.Constant:
    return ir.Constant(I32_T, n)


def _to_bfloat16(b: ir.IRBuilder, value: ir.Value, storage: ir.Type) -> ir.Value:
    """The bfloat16 bits of a float32 or float64 value, rounded to nearest even with integer arithmetic (adding
    0x7fff plus the lowest kept bit carries exactly the values past the halfway point, and carries into the
    exponent where the value overflows to infinity); NaN becomes the quiet NaN of its sign, as ml_dtypes does."""
    bits = b.bitcast(value, I32_T) if value.type == F32_T else _float32_bits_rounded_to_odd(b, value)
    high = b.lshr(bits, _i32(16))
    rounded = b.lshr(b.add(bits, b.add(b.and_(high, _i32(1)), _i32(0x7FFF))), _i32(16))
    quiet_nan = b.or_(b.and_(high, _i32(0x8000)), _i32(0x7FC0))
    nan = b.icmp_unsigned(">", b.and_(bits, _i32(0x7FFFFFFF)), _i32(0x7F800000))
    return b.trunc(b.select(nan, quiet_nan, rounded), storage)


def _float32_bits_rounded_to_odd(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """The float32 bits of a float64 value truncated toward zero, the lowest bit set if that lost anything (round
    to odd): rounding those to nearest even at bfloat16's width gives the double's own rounding, where going
    through float32's nearest would round twice (a double just above a bfloat16 tie would land on the tie)."""
    nearest = b.fptrunc(value, F32_T)
    back = b.fpext(nearest, F64_T)
    fabs = intrinsic(b.module, "llvm.fabs", F64_T, 1)
    overshoot = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [value]))
    toward_zero = b.sub(b.bitcast(nearest, I32_T), b.zext(overshoot, I32_T))
    return b.or_(toward_zero, b.zext(b.fcmp_ordered("!=", back, value), I32_T))


def _from_bfloat16(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """A bfloat16's float32 value: its bits are float32's upper half."""
    return b.bitcast(b.shl(b.zext(bits, I32_T), _i32(16)), F32_T)


# Buffer dtypes whose elements a conversion instruction can't read or write: what stores and loads do instead.
ENCODERS: dict[str, Callable[[ir.IRBuilder, ir.Value, ir.Type], ir.Value]] = {L.BF16: _to_bfloat16}
DECODERS: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {L.BF16: _from_bfloat16}


def _emit_assign(state: _State, assign: L.Assign) -> None:
    state.builder.store(emit_expr(state, assign.value), state.slot(assign.var))


def _emit_if(state: _State, stmt: L.If) -> None:
    with state.builder.if_then(emit_expr(state, stmt.cond)):
        _emit_block(state, stmt.body)


def _emit_gemm(state: _State, gemm: L.Gemm, launch_range: tuple[ir.Value, ir.Value] | None = None) -> None:
    a, b, c = [
        _address(state, buf, offset, F32_T)
        for buf, offset in ((gemm.a, gemm.a_offset), (gemm.b, gemm.b_offset), (gemm.c, gemm.c_offset))
    ]
    epilogue = gemm.epilogue or L.GemmEpilogue()
    bias, residual = (
        None if buf is None else _address(state, buf, offset or L.const(0), F32_T)
        for buf, offset in ((epilogue.bias, epilogue.bias_offset), (epilogue.residual, epilogue.residual_offset))
    )
    emit_gemm(
        state.builder, state.typed_slot, a, b, c, gemm, state.blocking, launch_range, (bias, residual), state.outlining
    )


def _emit_int_gemm(state: _State, gemm: L.IntGemm) -> None:
    def zeros(points: L.LineValues | None) -> Zeros | None:
        if points is None:
            return None
        pointer = _address(state, points.buf, points.offset, I8_T)
        return Zeros(pointer, state.buffer_dtypes[points.buf] == L.I8, points.per_line)

    requantize = None if gemm.requantize is None else _requantize_operands(state, gemm.requantize)
    dequantize = None if gemm.dequantize is None else _dequantize_operands(state, gemm.dequantize)
    c_element = I8_T if requantize is not None else F32_T if dequantize is not None else I32_T
    operands = IntGemmOperands(
        a=_address(state, gemm.a, gemm.a_offset, I8_T),
        b=_address(state, gemm.b, gemm.b_offset, I8_T),
        c=_address(state, gemm.c, gemm.c_offset, c_element),
        a_signed=state.buffer_dtypes[gemm.a] == L.I8,
        b_signed=state.buffer_dtypes[gemm.b] == L.I8,
        a_zero=zeros(gemm.a_zero),
        b_zero=zeros(gemm.b_zero),
        requantize=requantize,
        dequantize=dequantize,
    )
    emit_int_gemm(state.builder, state.typed_slot, gemm, operands, state.dot)


def _lines(state: _State, values: L.LineValues, element: ir.Type) -> Lines:
    return Lines(_address(state, values.buf, values.offset, element), values.per_line)


def _dequantize_operands(state: _State, d: L.Dequantize) -> DequantizeOperands:
    bias = None if d.bias is None else _lines(state, d.bias, F32_T)
    return DequantizeOperands(scale=_lines(state, d.scale, F32_T), bias=bias)


def _requantize_operands(state: _State, q: L.Requantize) -> RequantizeOperands:
    y_zero = None
    if q.y_zero is not None:
        pointer = _address(state, q.y_zero.buf, q.y_zero.offset, I8_T)
        y_zero = Zeros(pointer, state.buffer_dtypes[q.y_zero.buf] == L.I8, False)
    return RequantizeOperands(
        x_scale=_address(state, q.x_scale.buf, q.x_scale.offset, F32_T),
        w_scale=_lines(state, q.w_scale, F32_T),
        y_scale=_address(state, q.y_scale.buf, q.y_scale.offset, F32_T),
        y_zero=y_zero,
        bias=None if q.bias is None else _lines(state, q.bias, I32_T),
        on_rows=q.on_rows,
        low=q.low,
        high=q.high,
        relu=q.relu,
    )


def _emit_gemm_launch(state: _State, group: launching.LaunchGroup, launch_range: tuple[ir.Value, ir.Value]) -> None:
    """The rows (or column blocks) [begin, end) of the launch's Gemm."""
    _emit_gemm(state, group.gemm, launch_range)


def _emit_parallel_launch(state: _State, group: launching.LaunchGroup, launch_range: tuple[ir.Value, ir.Value]) -> None:
    """Iterations [begin, end) of the launch's parallel loop."""
    _emit_loop(state, group.loop, launch_range)


def _emit_serial_launch(state: _State, group: launching.LaunchGroup, launch_range: tuple[ir.Value, ir.Value]) -> None:
    """Every statement, in order; one worker runs a serial launch whole, so the range is ignored."""
    _emit_block(state, group.stmts)


LAUNCH_EMITTERS: dict[
    launching.LaunchKind, Callable[[_State, launching.LaunchGroup, tuple[ir.Value, ir.Value]], None]
] = {
    launching.LaunchKind.GEMM: _emit_gemm_launch,
    launching.LaunchKind.PARALLEL: _emit_parallel_launch,
    launching.LaunchKind.SERIAL: _emit_serial_launch,
}


# Each emitter takes the statement or expression type it is keyed by, which a dict's type can only write as Any.
STMT_EMITTERS: dict[type, Callable[[_State, Any], None]] = {
    L.Gemm: _emit_gemm,
    L.IntGemm: _emit_int_gemm,
    L.Loop: _emit_loop,
    L.Store: _emit_store,
    L.Assign: _emit_assign,
    L.If: _emit_if,
}


def _address(state: _State, buf: str, index: L.Expr, elem: ir.Type) -> ir.Value:
    return state.builder.gep(state.buffers[buf], [emit_expr(state, index)], inbounds=True, source_etype=elem)


def emit_expr(state: _State, expr: L.Expr) -> ir.Value:
    """Emit one expression tree and return its value."""
    return EXPR_EMITTERS[type(expr)](state, expr)


def _emit_const(state: _State, expr: L.Const) -> ir.Value:
    return ir.Constant(LLVM_TYPES[expr.dtype], expr.value)


def _emit_var(state: _State, expr: L.Var) -> ir.Value:
    return state.builder.load(state.slot(expr))


def _emit_load(state: _State, expr: L.Load) -> ir.Value:
    b, dtype = state.builder, state.buffer_dtypes.get(expr.buf, expr.dtype)
    storage = STORAGE_TYPES[dtype]
    value = b.load(_address(state, expr.buf, expr.index, storage), align=storage_align(storage), typ=storage)
    if dtype in DECODERS:
        return DECODERS[dtype](b, value)
    if expr.dtype == L.BOOL and storage != BOOL_T:
        return b.icmp_unsigned("!=", value, ir.Constant(storage, 0))
    wide = LLVM_TYPES[expr.dtype]
    if value.type == wide:
        return value
    if isinstance(wide, ir.IntType):
        return b.zext(value, wide) if dtype in UNSIGNED else b.sext(value, wide)
    return _fenced(b, b.fpext(value, wide))


def _fenced(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """`value` behind llvm.arithmetic.fence, so that LLVM keeps computing in its type: it would otherwise shrink
    fptrunc(fdiv(fpext a, fpext b)) of float16 values to a half division, which the fast-math flags then let it
    compute with an approximate reciprocal (0.662 came out 0.6626: 5e-4 off, several float16 ulp)."""
    return b.call(intrinsic(b.module, "llvm.arithmetic.fence", value.type, 1), [value])


def _emit_binary(state: _State, expr: L.Binary) -> ir.Value:
    lhs, rhs = emit_expr(state, expr.lhs), emit_expr(state, expr.rhs)
    table = FLOAT_BINARY if expr.lhs.dtype in L.FLOATS else INT_BINARY
    return table[expr.op](state.builder, lhs, rhs)


def _emit_select(state: _State, expr: L.Select) -> ir.Value:
    cond = emit_expr(state, expr.cond)
    return state.builder.select(cond, emit_expr(state, expr.if_true), emit_expr(state, expr.if_false))


def _emit_cast(state: _State, expr: L.Cast) -> ir.Value:
    value, b, to = emit_expr(state, expr.arg), state.builder, LLVM_TYPES[expr.dtype]
    if expr.arg.dtype == expr.dtype:
        return value
    source_float, target_float = expr.arg.dtype in L.FLOATS, expr.dtype in L.FLOATS
    if source_float and target_float:
        return b.fpext(value, to) if expr.dtype == L.F64 else b.fptrunc(value, to)
    if expr.arg.dtype == L.BOOL:
        return b.uitofp(value, to) if target_float else b.zext(value, to)
    if target_float:
        return b.sitofp(value, to)
    if not source_float:  # between I32 (a cast's value only: quantize.saturate) and I64
        return b.sext(value, to) if to.width > value.type.width else b.trunc(value, to)
    return b.fptosi(value, to)


def _emit_call(state: _State, expr: L.Call) -> ir.Value:
    return MATH[expr.fn](state.builder, emit_expr(state, expr.arg))


EXPR_EMITTERS: dict[type, Callable[[_State, Any], ir.Value]] = {
    L.Const: _emit_const,
    L.Var: _emit_var,
    L.Load: _emit_load,
    L.Binary: _emit_binary,
    L.Select: _emit_select,
    L.Cast: _emit_cast,
    L.Call: _emit_call,
}


def _fcmp(op: str):
    return lambda b, x, y: b.fcmp_ordered(op, x, y)


def _icmp(op: str):
    return lambda b, x, y: b.icmp_signed(op, x, y)


FLOAT_BINARY = {
    "add": lambda b, x, y: b.fadd(x, y, flags=FAST),
    "sub": lambda b, x, y: b.fsub(x, y, flags=FAST),
    "mul": lambda b, x, y: b.fmul(x, y, flags=FAST),
    "div": lambda b, x, y: b.fdiv(x, y, flags=FAST),
    "exact_div": lambda b, x, y: b.fdiv(x, y),  # no fast-math flags: no reciprocal, no shrinking (L.exact_div)
    "exact_mul": lambda b, x, y: b.fmul(x, y),  # no fast-math flags: never contracted into an FMA (L.exact_mul)
    "max": fmax,
    "min": fmin,
    **{
        name: _fcmp(sym) for name, sym in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items()
    },
}

INT_BINARY = {
    "add": lambda b, x, y: b.add(x, y),
    "sub": lambda b, x, y: b.sub(x, y),
    "mul": lambda b, x, y: b.mul(x, y),
    "div": lambda b, x, y: b.sdiv(x, y),
    "mod": lambda b, x, y: b.srem(x, y),
    "max": lambda b, x, y: b.select(b.icmp_signed(">", x, y), x, y),
    "min": lambda b, x, y: b.select(b.icmp_signed("<", x, y), x, y),
    "and": lambda b, x, y: b.and_(x, y),
    "or": lambda b, x, y: b.or_(x, y),
    # Bit operations on i64 (loopir.BITWISE): shl without nsw/nuw, so that bits leaving the top wrap as ONNX's
    # BitShift says; shr arithmetic, which is logical for a zero-extended unsigned value.
    "shl": lambda b, x, y: b.shl(x, y),
    "shr": lambda b, x, y: b.ashr(x, y),
    "bitand": lambda b, x, y: b.and_(x, y),
    "bitor": lambda b, x, y: b.or_(x, y),
    "bitxor": lambda b, x, y: b.xor(x, y),
    **{
        name: _icmp(sym) for name, sym in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items()
    },
}


def _intrinsic(name: str):
    def emit(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        return b.call(intrinsic(b.module, name, x.type, 1), [x])

    return emit


def _poly(b: ir.IRBuilder, x: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
    """Horner evaluation of coeffs (highest degree first) at x."""
    acc = ir.Constant(F32_T, coeffs[0])
    for c in coeffs[1:]:
        acc = b.fadd(b.fmul(acc, x, flags=FAST), ir.Constant(F32_T, c), flags=FAST)
    return acc


_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_LOG_POLY = (
    7.0376836292e-2,
    -1.1514610310e-1,
    1.1676998740e-1,
    -1.2420140846e-1,
    1.4249322787e-1,
    -1.6668057665e-1,
    2.0000714765e-1,
    -2.4999993993e-1,
    3.3333331174e-1,
)
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4


_EXP_MAX = 88.72283935546875


_EXP_MIN = -87.3
"""Below this expf's result is subnormal or 0: it is 0 here (flushed, as with FTZ), since a clamped input gave
about 1.2e-38 for any hugely negative one (a masked attention score of -10000), and products of such values in
the MatMul after a Softmax are subnormal, which this CPU handles in microcode: bert_style with a random mask
spent 0.7 of 1.25 ms on them."""


def _exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Cephes expf, inline, so that it vectorises and the library needs no libm; overflows to +inf like expf and
    underflows to 0 below _EXP_MIN."""
    c = lambda v: ir.Constant(F32_T, v)  # noqa: E731
    clamped = fmin(b, fmax(b, x, c(_EXP_MIN)), c(_EXP_MAX))
    n = _intrinsic("llvm.floor")(b, b.fadd(b.fmul(clamped, c(1.44269504088896341)), c(0.5)))
    r = b.fsub(b.fsub(clamped, b.fmul(n, c(_LN2_HI))), b.fmul(n, c(_LN2_LO)))
    y = b.fadd(b.fadd(b.fmul(_poly(b, r, _EXP_POLY), b.fmul(r, r, flags=FAST), flags=FAST), r), c(1.0))
    top = b.fcmp_ordered(">", n, c(127.0))
    y = b.select(top, b.fmul(y, c(2.0)), y)
    bits = b.shl(b.add(b.fptosi(fmin(b, n, c(127.0)), I32_T), ir.Constant(I32_T, 127)), ir.Constant(I32_T, 23))
    result = b.select(b.fcmp_ordered("<", x, c(_EXP_MIN)), c(0.0), b.fmul(y, b.bitcast(bits, F32_T)))
    return b.select(b.fcmp_ordered(">", x, c(_EXP_MAX)), c(float("inf")), result)


def _log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Cephes logf, inline; log(0) = -inf, log(inf) = inf, log of a negative or NaN is NaN. Subnormal inputs are
    scaled by 2^23 first (and the exponent corrected), so they keep full accuracy."""
    c = lambda v: ir.Constant(F32_T, v)  # noqa: E731
    i = lambda v: ir.Constant(I32_T, v)  # noqa: E731
    subnormal = b.fcmp_ordered("<", x, c(1.17549435e-38))
    scaled = b.select(subnormal, b.fmul(x, c(8388608.0)), x)
    bits = b.bitcast(fmax(b, scaled, c(1.17549435e-38)), I32_T)
    e = b.sitofp(b.sub(b.lshr(bits, i(23)), b.select(subnormal, i(149), i(126))), F32_T)
    m = b.bitcast(b.or_(b.and_(bits, i(0x807FFFFF)), i(0x3F000000)), F32_T)
    small = b.fcmp_ordered("<", m, c(0.707106781186547524))
    e = b.select(small, b.fsub(e, c(1.0)), e)
    m = b.fsub(b.select(small, b.fadd(m, m), m), c(1.0))
    z = b.fmul(m, m)
    y = b.fmul(b.fmul(_poly(b, m, _LOG_POLY), m), z)
    y = b.fadd(b.fadd(y, b.fmul(e, c(_LN2_LO))), b.fmul(z, c(-0.5)))
    result = b.fadd(b.fadd(m, y), b.fmul(e, c(_LN2_HI)))
    result = b.select(b.fcmp_ordered("==", x, c(0.0)), c(float("-inf")), result)
    result = b.select(b.fcmp_ordered("==", x, c(float("inf"))), x, result)
    return b.select(b.fcmp_unordered("<", x, c(0.0)), c(float("nan")), result)


MATH: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {
    "exp": _exp,
    "log": _log,
    "sqrt": _intrinsic("llvm.sqrt"),
    "floor": _intrinsic("llvm.floor"),
}
