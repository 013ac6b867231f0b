"""What every part of the GEMM's emission shares: the emitter (GemmEmitter: the builder, the operands, counted loops,
addresses and the state a path sets for its tiles), outlined functions (outline), and the IR helpers for loads,
broadcasts, prefetches and the accesses to C.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from llvmlite import ir

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.gemm_outlining import Outlining
from farm.ir import loopir as L

F32_T, I64_T, I32_T = ir.FloatType(), ir.IntType(64), ir.IntType(32)


def outline(gen: GemmEmitter, values: list[ir.Value], body: Callable[[GemmEmitter, list[ir.Value]], None]) -> None:
    """body(g, values) in a function of its own, called here with A, B, C (the bias and the residual when the
    epilogue has them) and `values`, when the kernel is split into parts; else in place. The function is hidden
    and never inlined (its part may be another object); its pointers are noalias when they are based on distinct
    arguments of the launch, as the launch's own are. Its scratch (partial sums, a packed panel of B) is its own,
    on its stack."""
    outlining = gen.outlining
    if outlining is None or outlining.parts == 1:
        body(gen, values)
        return
    index, outlining.count = outlining.count, outlining.count + 1
    pointers = [gen.a, gen.bm, gen.c, *(p for p in (gen.bias, gen.residual) if p is not None)]
    fn = ir.Function(
        gen.b.module,
        ir.FunctionType(ir.VoidType(), [p.type for p in pointers] + [v.type for v in values]),
        f"{gen.b.function.name}_o{index}",
    )
    fn.linkage = "hidden"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    bases = [getattr(p, "pointer", p) for p in pointers]
    if all(isinstance(base, ir.Argument) for base in bases) and len({id(base) for base in bases}) == len(bases):
        for arg in fn.args[: len(pointers)]:
            arg.add_attribute("noalias")
    if outlining.emits(index):
        entry, start = fn.append_basic_block("entry"), fn.append_basic_block("body")
        builder = ir.IRBuilder(start)
        slots: dict[str, ir.AllocaInstr] = {}

        def slot(name: str, typ: ir.Type) -> ir.AllocaInstr:
            if name not in slots:
                slots[name] = ir.IRBuilder(entry).alloca(typ, name=name)
            return slots[name]

        args = list(fn.args)
        inner = GemmEmitter(builder, slot, args[0], args[1], args[2], gen.gemm, gen.blocking)
        extras = iter(args[3 : len(pointers)])
        inner.bias = None if gen.bias is None else next(extras)
        inner.residual = None if gen.residual is None else next(extras)
        inner.prefetch, inner.c_prefetch, inner.residual_summed = gen.prefetch, gen.c_prefetch, gen.residual_summed
        body(inner, args[len(pointers) :])
        builder.ret_void()
        ir.IRBuilder(entry).branch(start)
    gen.b.call(fn, [*pointers, *values])


class GemmEmitter:
    """One Gemm's emission into one function (the launch's, or an outlined one's): the builder, its scratch slots,
    the operands' pointers, and what the path being emitted sets for its tiles (prefetch distances, a packed panel
    of B, partial sums)."""

    def __init__(self, builder, slot, a, b, c, gemm: L.Gemm, blocking: GemmBlocking) -> None:
        self.b, self.slot, self.a, self.bm, self.c, self.gemm = builder, slot, a, b, c, gemm
        self.blocking = blocking
        self.outlining: Outlining | None = None
        """How the kernel is split into parts (gemm.emit_gemm); None: in one function."""
        self.count = 0
        self.bias: ir.Value | None = None
        self.residual: ir.Value | None = None
        self.prefetch = 0
        """Floats ahead of each B load to prefetch (gemm.SMALL_M_PREFETCH_BLOCKS k blocks ahead in
        gemm_blocking.small_m_k_block's path, the next column block's elsewhere); 0: none."""
        self.c_prefetch: ir.Value | None = None
        """Columns ahead (a runtime i64) of each tile's C (and residual) to prefetch as the tile starts: the next
        column block's in a column-split GEMM with a big C (gemm._emit_column_blocks), 0 in the range's last
        block; None: no prefetch."""
        self.b_packed: tuple[ir.Value, ir.Value, int] | None = None
        """Where tiles read B while a panel of it is packed on the fly (gemm._pack_b_panel): the panel, its first k
        and its vectors per k; None: B itself."""
        self.partial: ir.Value | None = None
        """Where tiles keep their partial sums between k blocks (gemm_blocking.small_m_k_block): m x vectors
        vectors, the column block's own; None: in C itself."""
        self.residual_in_c = gemm.epilogue is not None and gemm.epilogue.residual_in_c(gemm)
        """C holds the residual as the kernel starts (L.GemmEpilogue.residual_in_c)."""
        self.residual_summed = False
        """The sums being emitted started from the residual in C (gemm._k_blocks), so the epilogue doesn't add it."""

    def loop(self, extent: int | ir.Value, body: Callable[[ir.Value], None]) -> None:
        """A counted loop 0..extent (a constant or a runtime i64) whose body gets the i64 index."""
        if isinstance(extent, int) and extent == 1:
            body(ir.Constant(I64_T, 0))
            return
        self.count += 1
        counted_loop(self.b, self.slot(f"gemm.i{self.count}", I64_T), f"gemm{self.count}", extent, body)

    def address(self, base: ir.Value, index: ir.Value) -> ir.Value:
        return self.b.gep(base, [index], inbounds=True, source_etype=F32_T)

    def offset(self, *terms: tuple[ir.Value | int, int]) -> ir.Value:
        """sum of value * scale, as i64, with the constant terms summed here and no multiply by 1: llvmlite's
        builder folds nothing, and each instruction it made was Python objects, then IR text for LLVM to parse and
        fold away."""
        constant, parts = 0, []
        for value, scale in terms:
            if isinstance(value, ir.Constant) and isinstance(value.constant, int):
                value = value.constant
            if isinstance(value, int):
                constant += value * scale
            elif scale:
                parts.append(value if scale == 1 else self.b.mul(value, ir.Constant(I64_T, scale)))
        total = functools.reduce(self.b.add, parts) if parts else ir.Constant(I64_T, constant)
        return self.b.add(total, ir.Constant(I64_T, constant)) if parts and constant else total


def counted_loop(
    b: ir.IRBuilder, counter: ir.AllocaInstr, label: str, extent: int | ir.Value, body: Callable[[ir.Value], None]
) -> None:
    """for counter in 0..extent: body(counter), as basic blocks `label`.head/body/done over the alloca `counter`
    (mem2reg makes it a register)."""
    b.store(ir.Constant(I64_T, 0), counter)
    head, loop_body, done = (b.append_basic_block(f"{label}.{s}") for s in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(b.icmp_signed("<", b.load(counter), i64(extent)), loop_body, done)
    b.position_at_end(loop_body)
    body(b.load(counter))
    b.store(b.add(b.load(counter), ir.Constant(I64_T, 1)), counter)
    b.branch(head)
    b.position_at_end(done)


def i64(value: int | ir.Value) -> ir.Value:
    """An i64 constant of an int; a runtime value as it is."""
    return ir.Constant(I64_T, value) if isinstance(value, int) else value


def intrinsic(module: ir.Module, name: str, typ: ir.Type, arity: int) -> ir.Function:
    """Declare an overloaded float intrinsic (llvm.fmuladd, llvm.sqrt, ...) for f32, f64 or a vector of f32."""
    suffix = f"v{typ.count}f32" if isinstance(typ, ir.VectorType) else "f64" if typ == ir.DoubleType() else "f32"
    full = f"{name}.{suffix}"
    if full in module.globals:
        return module.globals[full]
    return ir.Function(module, ir.FunctionType(typ, [typ] * arity), full)


def vector_type(lanes: int) -> ir.Type:
    """The type of `lanes` floats: a vector, or f32 for one lane."""
    return F32_T if lanes == 1 else ir.VectorType(F32_T, lanes)


def prefetch(gen: GemmEmitter, address: ir.Value, write: bool = False) -> None:
    """A read (or write) prefetch of `address` into L2 (llvm.prefetch, locality 2; it never faults)."""
    module = gen.b.module
    name = "llvm.prefetch.p0"
    function = module.globals.get(name) or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [address.type, I32_T, I32_T, I32_T]), name
    )
    gen.b.call(function, [address, ir.Constant(I32_T, int(write)), ir.Constant(I32_T, 2), ir.Constant(I32_T, 1)])


def load_c(gen: GemmEmitter, base: ir.Value, index: tuple[ir.Value, int], vec_t: ir.Type) -> ir.Value:
    """Values laid out like C (C itself for a later k block, or a residual) for one accumulator: one vector load,
    or one load per lane when C is transposed."""
    start, stride = index
    if stride == 1:
        return load_floats(gen.b, gen.address(base, start), vec_t)
    lanes = lanes_of(vec_t)
    values = [
        gen.b.load(gen.address(base, gen.b.add(start, ir.Constant(I64_T, lane * stride))), align=4, typ=F32_T)
        for lane in range(lanes)
    ]
    if lanes == 1:
        return values[0]
    vector: ir.Value = ir.Constant(vec_t, ir.Undefined)
    for lane, value in enumerate(values):
        vector = gen.b.insert_element(vector, value, ir.Constant(I32_T, lane))
    return vector


def store_c(gen: GemmEmitter, value: ir.Value, index: tuple[ir.Value, int]) -> None:
    """Store an accumulator into C: one vector store, or one store per lane when C is transposed (once per tile
    per k pass: over a conv's thousands of k steps, the scattered stores cost little)."""
    start, stride = index
    if stride == 1:
        gen.b.store(value, gen.address(gen.c, start), align=4)
        return
    lanes = lanes_of(value.type)
    for lane in range(lanes):
        scalar = value if lanes == 1 else gen.b.extract_element(value, ir.Constant(I32_T, lane))
        gen.b.store(scalar, gen.address(gen.c, gen.b.add(start, ir.Constant(I64_T, lane * stride))), align=4)


def lanes_of(typ: ir.Type) -> int:
    """The lanes of a float vector type; 1 for a float."""
    return typ.count if isinstance(typ, ir.VectorType) else 1


def load_floats(b: ir.IRBuilder, address: ir.Value, vec_t: ir.Type) -> ir.Value:
    """A load of `vec_t` (a float vector, or one float) from `address`, aligned as a float only."""
    return b.load(address, align=4, typ=vec_t)


def splat(b: ir.IRBuilder, scalar: ir.Value, lanes: int) -> ir.Value:
    """`scalar` in every lane of a vector of `lanes` floats (the scalar itself for one lane)."""
    if lanes == 1:
        return scalar
    vec_t = ir.VectorType(F32_T, lanes)
    single = b.insert_element(ir.Constant(vec_t, ir.Undefined), scalar, ir.Constant(I32_T, 0))
    mask = ir.Constant(ir.VectorType(I32_T, lanes), None)  # zeroinitializer: every lane takes lane 0
    return b.shuffle_vector(single, ir.Constant(vec_t, ir.Undefined), mask)
