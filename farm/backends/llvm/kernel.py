"""compile_cpu_kernel: a KernelSpec and a CPU target in, an object file's bytes out (a pure function)."""

from __future__ import annotations

import dataclasses
import functools
import json

from llvmlite import ir

from farm.backends.llvm.dot_products import b_panels_flipped, dot_product_for
from farm.backends.llvm.gemm_blocking import GemmBlocking, balanced_blocking, single_tile_blocking
from farm.backends.llvm.gemm_outlining import MAX_PARTS, Outlining, outlined_functions
from farm.backends.llvm.render import render_kernel
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import Pipeline, compile_ir
from farm.errors import BuildError
from farm.ir import launching
from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import lower_kernel

LOWERED_CACHE = 4096
"""How many kernels' packed parameters and launches a process keeps (_packed_params, _cpu_launches): a link plan
asks for each kernel's several times (its manifest, its layout, each step's weights), and every answer lowered the
kernel again: light DenseNet-121's link plan lowered its 316 kernels 2,212 times, 0.3-0.4 s of the finish."""
TINY_KERNEL_WORK = 16384
"""The most innermost statements (launching.launch_info's work, all launches together) of a kernel whose loops LLVM
doesn't unroll (kernel_pipeline). Such a kernel runs for a few microseconds whatever its code, but O3's unroller
spent up to 0.4 s of LLVM on one: a 3 x 8 x 18 Transpose fully unrolled, Attention kernels of ONNX's cases 0.25 s
each. With this bound the first 400 of ONNX's node cases compiled their 513 kernels in 12.8 s instead of 25.3
(one Xeon core), and bert_style, vit_style and mobilenetv2_style (whose LayerNormalizations, a MatMul and a Conv
fall under it) ran as fast as before, node by node."""


def default_blocking(target: CpuTarget) -> GemmBlocking:
    """The untuned micro-kernel shape (the documented default variant): 8 rows x 3 vectors of the target's widest
    float vector where it has 32 vector registers (AVX-512, AArch64), else 4 x 3 (16 registers: AVX2, SSE).
    Eight rows hold 24 accumulators, and each loaded B vector feeds eight FMAs instead of four: light ResNet-50's
    convolutions on one Xeon core (AVX-512) went from 118-134 to 156-191 GFLOP/s at 14x14 and 28x28."""
    rows = 8 if target.vector_registers >= 32 else 4
    return GemmBlocking(rows=rows, vectors=3, lanes=target.simd_floats)


def untuned_blocking(spec: KernelSpec, target: CpuTarget) -> GemmBlocking:
    """The blocking of `spec` on `target` when it names no variant: the target's default, or the wider tile where
    that one's blocks split unevenly on two threads (gemm_blocking.balanced_blocking) or where it covers the GEMM
    as one tile (gemm_blocking.single_tile_blocking). What tuning times first.
    Decided on the kernel as `target` lowers it (a CPU spec's Gemm may read a copy an OpenCL one doesn't)."""
    return _untuned_blocking(dataclasses.replace(spec, target_id=target.id, variant_json=""), target)


@functools.lru_cache(maxsize=LOWERED_CACHE)
def _untuned_blocking(spec: KernelSpec, target: CpuTarget) -> GemmBlocking:
    found = gemms(lower_kernel(spec).body)
    return single_tile_blocking(found, balanced_blocking(found, default_blocking(target)))


def blocking_for(spec: KernelSpec, target: CpuTarget) -> GemmBlocking:
    """The GEMM blocking `spec` asks for: its variant, or untuned_blocking when it names none."""
    if not spec.variant_json:
        return untuned_blocking(spec, target)
    try:
        return GemmBlocking.from_json(json.loads(spec.variant_json))
    except ValueError as error:
        raise BuildError(f"kernel {spec.op} {spec.symbol}: unusable variant: {error}") from None


def packed_params(spec: KernelSpec, target: CpuTarget) -> dict[int, tuple[int, ...]]:
    """Parameter index -> panels of each constant the kernel reads pre-packed on `target`: (rows, m, k) for an A
    read in panels of the tile rows (L.Gemm.a_panels), (width, k, n, transposed) for a B read in column panels of
    the tile width (L.Gemm.b_panels), (lanes, k, n, transposed, flip) for an IntGemm's byte B (L.IntGemm.b_panels).
    Its blob must be built with BlobSpec.panels equal to this."""
    return dict(_packed_params(spec, target))


@functools.lru_cache(maxsize=LOWERED_CACHE)
def _packed_params(spec: KernelSpec, target: CpuTarget) -> tuple[tuple[int, tuple[int, ...]], ...]:
    blocking = blocking_for(spec, target)
    kernel = lower_kernel(spec)
    names = [param.name for param in kernel.params]
    packed: dict[int, tuple[int, ...]] = {}
    for gemm in gemms(kernel.body):
        if gemm.a_panels:
            packed[names.index(gemm.a)] = (blocking.rows, gemm.m, gemm.k)
        if gemm.b_panels:
            packed[names.index(gemm.b)] = (blocking.tile_columns, gemm.k, gemm.n, int(gemm.b_transposed))
    for int_gemm in int_gemms(kernel.body):
        if int_gemm.b_panels:
            dtypes = [kernel.params[names.index(operand)].dtype for operand in (int_gemm.a, int_gemm.b)]
            flip = int(b_panels_flipped(dot_product_for(target), dtypes[0] == L.I8, dtypes[1] == L.I8))
            layout = (L.INT_GEMM_PANEL_LANES, int_gemm.k, int_gemm.b_panels, int(int_gemm.b_transposed), flip)
            packed[names.index(int_gemm.b)] = layout
    return tuple(packed.items())


def gemms(stmts: list[L.Stmt]) -> list[L.Gemm]:
    """Every Gemm among `stmts`, nested ones included, in order."""
    found = []
    for stmt in stmts:
        found += [stmt] if isinstance(stmt, L.Gemm) else gemms(getattr(stmt, "body", []))
    return found


def int_gemms(stmts: list[L.Stmt]) -> list[L.IntGemm]:
    """Every IntGemm among `stmts`, nested ones included, in order."""
    found = []
    for stmt in stmts:
        found += [stmt] if isinstance(stmt, L.IntGemm) else int_gemms(getattr(stmt, "body", []))
    return found


@functools.lru_cache(maxsize=LOWERED_CACHE)
def kernel_parts(spec: KernelSpec, target: CpuTarget) -> int:
    """How many objects (units) the kernel's code is split into on `target`: 1 + its launches' outlined functions
    (gemm_outlining.outlined_functions), at most gemm_outlining.MAX_PARTS. A build compiles each part as a unit of
    its own, so that the longest compile of a kernel, serial on one worker, is a part's. Kept per spec and target
    (LOWERED_CACHE): the build's units and every part's compile ask for it."""
    blocking = blocking_for(spec.whole, target)
    _, groups = launching.launch_groups(lower_kernel(spec.whole))
    outlined = 0
    for group in groups:
        if group.kind == launching.LaunchKind.GEMM and isinstance(group.head, L.Gemm):
            outlined += outlined_functions(group.head, blocking)
    return 1 + min(outlined, MAX_PARTS - 1)


def kernel_ir(spec: KernelSpec, target: CpuTarget) -> str:
    """The kernel's LLVM IR text, before optimisation: all of it, or one part's (KernelSpec.part) functions, the
    others only declared."""
    whole = spec.whole
    module = ir.Module(name=whole.symbol)
    module.triple = target.triple
    part = None if spec.part is None else spec.part[0]
    outlining = Outlining(kernel_parts(whole, target), part)
    if spec.part is not None and spec.part[1] != outlining.parts:
        raise BuildError(
            f"kernel {spec.op} {whole.symbol}: part {list(spec.part)}, but the kernel has {outlining.parts} parts"
        )
    render_kernel(
        module, whole.symbol, lower_kernel(whole), blocking_for(whole, target), outlining, dot_product_for(target)
    )
    return str(module)


def cpu_launches(spec: KernelSpec, target: CpuTarget) -> list[list[int]]:
    """[extent, grain, work] of each launch of the kernel (the functions `<symbol>_<index>` that it defines); a
    GEMM's grain is its variant's tile rows, or a block's vectors where it splits by columns."""
    return [list(launch) for launch in _cpu_launches(spec, target)]


@functools.lru_cache(maxsize=LOWERED_CACHE)
def _cpu_launches(spec: KernelSpec, target: CpuTarget) -> tuple[tuple[int, ...], ...]:
    """launch_info's, each launch's work weighing its IntGemms by the target's dot product (work_divisor)."""
    blocking, divisor = blocking_for(spec, target), dot_product_for(target).work_divisor
    infos = launching.launch_info(lower_kernel(spec), blocking.rows, blocking.tile_columns, blocking.vectors, divisor)
    return tuple((info.extent, info.grain, info.work) for info in infos)


def kernel_pipeline(spec: KernelSpec, target: CpuTarget) -> Pipeline:
    """How LLVM optimises the kernel's object (or part's). An outlined GEMM part (KernelSpec.part past 0) holds only
    the micro-kernel's tile loops, whose rows, vectors and kernel columns the emitter lays out itself (gemm_tiles):
    Pipeline.EMITTED. O3's loop passes found nothing there, and its unroller only copied the k loops' bodies. Every
    other kernel holds loop IR that LLVM vectorises: O3, without unrolling where its launches together run at most
    TINY_KERNEL_WORK innermost statements (microseconds, whatever the code), and over the widest vectors where they
    call math functions (calls_math)."""
    if spec.part is not None and spec.part[0] > 0:
        return Pipeline.EMITTED
    if sum(work for _, _, work in _cpu_launches(spec.whole, target)) <= TINY_KERNEL_WORK:
        return Pipeline.O3_NO_UNROLL
    return Pipeline.O3_WIDE_LOOPS if calls_math(lower_kernel(spec.whole).body) else Pipeline.O3


def calls_math(node: object) -> bool:
    """Whether loop-IR statements or expressions (a list of them, or one) call a math function (L.Call: exp, log,
    sqrt, floor), anywhere below. Such loops are bound by their arithmetic, and vectorise over the widest vectors
    (Pipeline.O3_WIDE_LOOPS); loops that move data (pools, pads, a broadcast Mul) ran 6-30% slower on 512-bit
    vectors, a stride-2 depthwise conv onto an 8x8 plane twice as slow."""
    if isinstance(node, L.Call):
        return True
    if isinstance(node, list):
        return any(calls_math(item) for item in node)
    if isinstance(node, (L.Expr, L.Stmt)) and dataclasses.is_dataclass(node):
        return any(calls_math(getattr(node, field.name)) for field in dataclasses.fields(node))
    return False


def compile_cpu_kernel(spec: KernelSpec, target: CpuTarget) -> bytes:
    """The object code of one kernel for one CPU target."""
    text = kernel_ir(spec, target)
    return compile_ir(text, target, f"kernel {spec.op} {spec.symbol}", kernel_pipeline(spec, target))
