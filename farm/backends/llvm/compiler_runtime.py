"""The compiler-runtime functions LLVM calls for half-precision conversions, defined in farm's own IR.

LLVM lowers a conversion that the target has no instruction for to a call into the compiler's runtime library
(compiler-rt's builtins, GCC's libgcc): `fptrunc double to half` calls `__truncdfhf2` on every x86-64 CPU without
AVX512-FP16; `fptrunc float to half` and `fpext half to float` call `__truncsfhf2` and `__extendhfsf2` where the
target lacks F16C (baseline x86-64) or Zfhmin (riscv64's rv64gc). No C library defines them and a build links no
compiler runtime (there is no C compiler in it), so a library importing one loads only in a process that happened
to load libgcc_s first. So farm defines these three itself, hidden, in an object (`runtime_object`) that every
library links after its entry (farm.build.parts.link_target): LLVM's calls resolve inside the library, whatever the
host and whatever features LLVM decided by.

They are integer bit manipulation, and give what the instructions give where a CPU has them (x86's F16C and
AVX512-FP16, AArch64's FCVT), so a model's float16 outputs are the same bits on every host: round to nearest even,
once (a double is rounded to half directly, never through float, which would round twice), subnormals exact,
overflow to infinity, signed zeros kept, a NaN kept NaN of its sign, made quiet, with its payload's top bits.

They take and return `half`, so LLVM passes them exactly as it passes its own calls to them: in xmm0 on x86-64
(LLVM 15 and later, as GCC 12's libgcc), in the low 16 bits of fa0 on riscv64 lp64d (the caller doesn't NaN-box the
argument; only its low bits are read). AArch64 has instructions for all three, so there they are never called.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import compile_ir

HALF_T, F32_T, F64_T, I16_T, I32_T = ir.HalfType(), ir.FloatType(), ir.DoubleType(), ir.IntType(16), ir.IntType(32)
HALF_FRACTION, HALF_BIAS, HALF_TOP_EXPONENT = 10, 15, 31
HALF_INFINITY, HALF_QUIET_BIT, HALF_SIGN = HALF_TOP_EXPONENT << HALF_FRACTION, 1 << (HALF_FRACTION - 1), 0x8000


@dataclass(frozen=True)
class WiderFormat:
    """An IEEE binary format wider than half (float32, float64), as its bits are laid out."""

    type: ir.Type
    bits: int
    fraction: int
    bias: int

    @property
    def int_type(self) -> ir.IntType:
        return ir.IntType(self.bits)

    @property
    def dropped(self) -> int:
        """Fraction bits that rounding to half drops."""
        return self.fraction - HALF_FRACTION

    @property
    def rebias(self) -> int:
        """What the exponent field loses between this format and half."""
        return self.bias - HALF_BIAS

    @property
    def infinity(self) -> int:
        return (2 * self.bias + 1) << self.fraction


FLOAT32 = WiderFormat(F32_T, 32, 23, 127)
FLOAT64 = WiderFormat(F64_T, 64, 52, 1023)


def _truncate_to_half(b: ir.IRBuilder, value: ir.Value, source: WiderFormat) -> ir.Value:
    """`value` rounded to the nearest half, ties to even. Below half's smallest normal the significand, implicit
    bit included, is shifted right to half's subnormal scale with a sticky bit for what falls off; above it the
    exponent is rebased. Either way the half's bits sit above `dropped` extra bits, and one rounding of those gives
    the result (its carry reaches the exponent, infinity included)."""
    c = lambda n: ir.Constant(source.int_type, n)  # noqa: E731
    bits = b.bitcast(value, source.int_type)
    magnitude = b.and_(bits, c((1 << (source.bits - 1)) - 1))
    sign = b.and_(b.trunc(b.lshr(bits, c(source.bits - 16)), I16_T), ir.Constant(I16_T, HALF_SIGN))
    normal = b.sub(magnitude, c(source.rebias << source.fraction))
    below_normal = b.icmp_unsigned("<", magnitude, c((source.rebias + 1) << source.fraction))
    rounded = _rounded(
        b, b.select(below_normal, _subnormal_with_sticky_bit(b, magnitude, source), normal), source.dropped
    )
    nan = b.or_(
        b.and_(b.lshr(magnitude, c(source.dropped)), c((1 << HALF_FRACTION) - 1)), c(HALF_INFINITY | HALF_QUIET_BIT)
    )
    overflows = b.icmp_unsigned(">=", magnitude, c((source.rebias + HALF_TOP_EXPONENT) << source.fraction))
    result = b.select(
        b.icmp_unsigned(">", magnitude, c(source.infinity)), nan, b.select(overflows, c(HALF_INFINITY), rounded)
    )
    return b.bitcast(b.or_(b.trunc(result, I16_T), sign), HALF_T)


def _subnormal_with_sticky_bit(b: ir.IRBuilder, magnitude: ir.Value, source: WiderFormat) -> ir.Value:
    """A magnitude below half's smallest normal as half's subnormal significand with `dropped` more bits below it,
    the lowest set if any bit shifted out was (so that a tie is told from just above one). A shift past the
    significand leaves only that bit (the value rounds to zero), so the shift is clamped there: it stays in range
    for the wider values too, whose result is not used."""
    c = lambda n: ir.Constant(source.int_type, n)  # noqa: E731
    exponent = b.lshr(magnitude, c(source.fraction))
    wanted = b.sub(c(source.rebias + 1), exponent)
    shift = b.select(b.icmp_unsigned("<", wanted, c(source.fraction + 1)), wanted, c(source.fraction + 1))
    significand = b.or_(b.and_(magnitude, c((1 << source.fraction) - 1)), c(1 << source.fraction))
    lost = b.icmp_unsigned("!=", b.shl(significand, b.sub(c(source.bits), shift)), c(0))
    return b.or_(b.lshr(significand, shift), b.zext(lost, source.int_type))


def _rounded(b: ir.IRBuilder, value: ir.Value, dropped: int) -> ir.Value:
    """`value` shifted right by `dropped` bits, rounded to nearest even: adding half an ulp less one, plus the
    lowest kept bit, carries exactly the values past the halfway point and the ties to an odd neighbour."""
    c = lambda n: ir.Constant(value.type, n)  # noqa: E731
    lowest_kept = b.and_(b.lshr(value, c(dropped)), c(1))
    return b.lshr(b.add(value, b.add(lowest_kept, c((1 << (dropped - 1)) - 1))), c(dropped))


def _extend_to_float(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A half's float32 value (exact). Normals rebase the exponent; infinity and NaN keep the fraction, a NaN made
    quiet; a subnormal's significand, below 2**10, converts exactly and its product by 2**-24 is a normal float32,
    so no rounding mode or flush-to-zero setting can change it."""
    c = lambda n: ir.Constant(I32_T, n)  # noqa: E731
    bits = b.zext(b.bitcast(value, I16_T), I32_T)
    magnitude = b.and_(bits, c(HALF_SIGN - 1))
    shifted = b.shl(magnitude, c(FLOAT32.dropped))
    normal = b.add(shifted, c(FLOAT32.rebias << FLOAT32.fraction))
    quiet = b.select(b.icmp_unsigned(">", magnitude, c(HALF_INFINITY)), c(1 << (FLOAT32.fraction - 1)), c(0))
    special = b.or_(b.or_(shifted, c(FLOAT32.infinity)), quiet)
    subnormal = b.bitcast(b.fmul(b.uitofp(magnitude, F32_T), ir.Constant(F32_T, 2.0**-24)), I32_T)
    result = b.select(
        b.icmp_unsigned("<", magnitude, c(1 << HALF_FRACTION)),
        subnormal,
        b.select(b.icmp_unsigned(">=", magnitude, c(HALF_INFINITY)), special, normal),
    )
    return b.bitcast(b.or_(result, b.shl(b.and_(bits, c(HALF_SIGN)), c(16))), F32_T)


@dataclass(frozen=True)
class RuntimeFunction:
    """One function LLVM calls: its name, type and body."""

    name: str
    returns: ir.Type
    argument: ir.Type
    body: Callable[[ir.IRBuilder, ir.Value], ir.Value]


RUNTIME_FUNCTIONS = (
    RuntimeFunction("__truncdfhf2", HALF_T, FLOAT64.type, lambda b, x: _truncate_to_half(b, x, FLOAT64)),
    RuntimeFunction("__truncsfhf2", HALF_T, FLOAT32.type, lambda b, x: _truncate_to_half(b, x, FLOAT32)),
    RuntimeFunction("__extendhfsf2", FLOAT32.type, HALF_T, _extend_to_float),
)
"""Every compiler-runtime function LLVM 22 calls from farm's kernels on x86-64, AArch64 and riscv64: these half
conversions (the link step refuses any other import: farm.backends.llvm.link.ALLOWED_IMPORTS). Its bfloat16 calls
(__truncsfbf2, __truncdfbf2) never arise: bfloat16 reaches LLVM as i16, converted by the renderer's own integer
code (farm.backends.llvm.render._to_bfloat16)."""


def _define(module: ir.Module, runtime: RuntimeFunction) -> None:
    """Add `runtime`'s definition to `module`, hidden: the library's kernels call it, nothing outside sees it."""
    function = ir.Function(module, ir.FunctionType(runtime.returns, [runtime.argument]), runtime.name)
    function.linkage = "hidden"  # llvmlite prints the linkage slot verbatim (see render.declare_kernel)
    function.attributes.add("nounwind")
    b = ir.IRBuilder(function.append_basic_block("entry"))
    b.ret(runtime.body(b, function.args[0]))


@functools.cache
def runtime_object(target: CpuTarget) -> bytes:
    """The object defining RUNTIME_FUNCTIONS for `target`, compiled once per process and target: at O3 it takes
    about 10 ms, which every link would otherwise spend again."""
    module = ir.Module(name="farm_compiler_runtime")
    module.triple = target.triple
    for runtime in RUNTIME_FUNCTIONS:
        _define(module, runtime)
    return compile_ir(str(module), target, "farm's compiler-runtime functions")
