"""The dot products an IntGemm is rendered on, by target feature: four u8 x s8 byte products added to an int32 lane
without saturating (AVX-512 VNNI's and AVX-VNNI's vpdpbusd, AVX2's vpmaddwd on widened bytes, widening multiplies
elsewhere), the register tile each ISA keeps, and which operand plays the unsigned part (`Roles`). The emission
itself is farm/backends/llvm/int_gemm.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from farm.backends.llvm.target import CpuTarget
from farm.ir import launching
from farm.ir import loopir as L

I8_T, I16_T, I32_T = ir.IntType(8), ir.IntType(16), ir.IntType(32)
GROUP = L.INT_GEMM_K_GROUP
FLIP = 0x80
"""The xor that turns a byte's signed reading into its unsigned one plus 128 (and back)."""


def vector_of(element: ir.Type, count: int) -> ir.VectorType:
    return ir.VectorType(element, count)


def splat(b: ir.IRBuilder, scalar: ir.Value, count: int) -> ir.Value:
    """`scalar` in every lane of a vector of `count` of its type."""
    vec_t = vector_of(scalar.type, count)
    single = b.insert_element(ir.Constant(vec_t, ir.Undefined), scalar, ir.Constant(I32_T, 0))
    return b.shuffle_vector(single, ir.Constant(vec_t, ir.Undefined), ir.Constant(vector_of(I32_T, count), None))


def lanes_of_groups(b: ir.IRBuilder, wide: ir.Value, lanes: int, ways: int) -> ir.Value:
    """The sums of each run of `ways` consecutive elements of `wide` (lanes * ways int32), one per lane."""
    total = None
    for way in range(ways):
        mask = ir.Constant(vector_of(I32_T, lanes), [lane * ways + way for lane in range(lanes)])
        part = b.shuffle_vector(wide, ir.Constant(wide.type, ir.Undefined), mask)
        total = part if total is None else b.add(total, part)
    assert total is not None
    return total


def opaque(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """`value` through an empty inline asm, so that LLVM can't see what it is made of (a constant, or bytes widened):
    what LLVM would rewrite it into is slower (see the callers)."""
    return b.asm(ir.FunctionType(value.type, [value.type]), "", "=v,0", [value], side_effect=False)


def intrinsic(module: ir.Module, name: str, result: ir.Type, args: list[ir.Type]) -> ir.Function:
    """Declare (once) an intrinsic with a fixed signature."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(result, args), name)


Step = Callable[[ir.IRBuilder, ir.Value, ir.Value, ir.Value, bool, bool], ir.Value]
"""(builder, accumulator, four bytes per lane, four more per lane, whether the first are signed, whether the second
are) -> the accumulator plus each lane's four products."""


WordStep = Callable[[ir.IRBuilder, ir.Value, ir.Value, ir.Value, bool], ir.Value]
"""(builder, accumulator, A's four words repeated across the vector, four bytes per lane of B, whether B's are
signed) -> the accumulator plus each lane's four products."""


@dataclass(frozen=True)
class DotProduct:
    """How one ISA adds four u8 x s8 products per int32 lane: the accumulator's type and its step and finish, the
    lanes of C a vector holds, and the register tile (rows x vectors) its registers hold."""

    name: str
    lanes: int
    rows: int
    vectors: int
    accumulator_ways: int
    """int32 elements an accumulator keeps per lane of C (1: the four products are summed at once; 2: vpmaddwd's
    pairs, summed when the tile is done; 4: every product)."""
    tall_rows: int
    """The most rows of a tile one vector wide (its accumulators, B's column sums, one vector of B and one of A
    fill the registers): what reads a B packed at build time once where m is more than `rows` but no more than
    this (a conv over a 4x4 plane, its 16 pixels as rows, its weights as B)."""
    step: Step
    """Its products (vpdpbusd's take the first operand unsigned and the second signed: `Roles` sees to it)."""
    any_signs: bool = False
    """Whether it multiplies bytes of either signedness as they are (widened to int16 or int32 first: AVX2's
    vpmaddwd, the widening multiplies), so that nothing is flipped and no zero point moves (`Roles`)."""
    broadcasts_signed: bool = False
    """Whether the signed operand costs nothing as a broadcast of four bytes from memory (vpdpbusd's third operand
    may be one), so that an int8 A is best broadcast as the signed operand (`Roles`)."""
    word_step: WordStep | None = None
    """The step from A's four bytes already widened to int16 and repeated across a vector (vpmaddwd's operand): the
    emitter then widens A once per unit, not per row and k group, where A is small enough (int_gemm.A_WORDS_MAX_BYTES)."""
    work_divisor: int = 64
    """An IntGemm's products per unit of launch work (launching.work, which the runtime weighs against the cost of
    splitting a launch across threads): one instruction's with VNNI (64 on 16 lanes, 32 on AVX-VNNI's 8). AVX2's
    vpmaddwd path and widening multiplies take about as long per product as float32's FMAs (a 32 x 128 x 128
    MatMulInteger 9.7 us, its float32 MatMul 11.7, one Xeon core running haswell code), so they count them as a
    Gemm does (launching.GEMM_WORK_DIVISOR): at 64, the dynamically quantized bert_style's launches weighed too little
    for a second thread, and its AVX2 code ran no faster on two threads than on one."""
    permutes_bytes: bool = False
    """Whether one instruction permutes a vector's bytes (AVX-512 VBMI's vpermb): packing four rows of B is then
    one permute of the four loads, not the unpack cascade LLVM makes of a shuffle (a third of a 64-channel 16x16
    conv's time went to packing)."""

    @property
    def accumulator(self) -> ir.VectorType:
        return vector_of(I32_T, self.lanes * self.accumulator_ways)

    @property
    def bytes(self) -> ir.VectorType:
        """A vector of four bytes (k values) per lane."""
        return vector_of(I8_T, self.lanes * GROUP)

    def finish(self, b: ir.IRBuilder, accumulator: ir.Value) -> ir.Value:
        """The accumulator as one int32 sum per lane."""
        if self.accumulator_ways == 1:
            return accumulator
        return lanes_of_groups(b, accumulator, self.lanes, self.accumulator_ways)


def _vpdpbusd(lanes: int) -> Step:
    """vpdpbusd on `lanes` int32 lanes (llvm.x86.avx512.vpdpbusd.{512,256}: AVX-512 VNNI, or AVX-VNNI's VEX form):
    the first operand's bytes unsigned, the second's signed."""
    words = vector_of(I32_T, lanes)

    def step(
        b: ir.IRBuilder, acc: ir.Value, unsigned: ir.Value, signed: ir.Value, first_signed: bool, second_signed: bool
    ) -> ir.Value:
        assert not first_signed and second_signed, "vpdpbusd multiplies unsigned by signed bytes"
        name = f"llvm.x86.avx512.vpdpbusd.{lanes * 32}"
        fn = intrinsic(b.module, name, words, [words, words, words])
        return b.call(fn, [acc, b.bitcast(unsigned, words), b.bitcast(signed, words)])

    return step


def extend(b: ir.IRBuilder, value: ir.Value, wide: ir.Type, signed: bool) -> ir.Value:
    """Integers (or vectors) widened to `wide`, sign- or zero-extended."""
    return b.sext(value, wide) if signed else b.zext(value, wide)


def _vpmaddwd_step(
    b: ir.IRBuilder, acc: ir.Value, broadcast: ir.Value, column: ir.Value, first_signed: bool, second_signed: bool
) -> ir.Value:
    """AVX2: both operands widened to int16, each by its own signedness (exact: no flips), then `_vpmaddwd_words`.
    The first operand is a broadcast of four bytes (A's, or ones: the roles never swap here): its four words are
    made once and kept opaque to LLVM (`opaque`), which otherwise spread them over doublewords, half of every
    vpmaddwd's products zeros (half the speed)."""
    undefined = ir.Constant(broadcast.type, ir.Undefined)
    four = b.shuffle_vector(broadcast, undefined, ir.Constant(vector_of(I32_T, GROUP), list(range(GROUP))))
    return _vpmaddwd_words(
        b, acc, repeated_words(b, extend(b, four, vector_of(I16_T, GROUP), first_signed)), column, second_signed
    )


def repeated_words(b: ir.IRBuilder, words: ir.Value) -> ir.Value:
    """Four int16 words repeated across half a vector of bytes' words (vpmaddwd's A operand), opaque to LLVM."""
    halves = 4 * GROUP
    repeat = ir.Constant(vector_of(I32_T, halves), [i % GROUP for i in range(halves)])
    return opaque(b, b.shuffle_vector(words, ir.Constant(words.type, ir.Undefined), repeat))


def _vpmaddwd_words(
    b: ir.IRBuilder, acc: ir.Value, repeated: ir.Value, column: ir.Value, second_signed: bool
) -> ir.Value:
    """vpmaddwd of A's repeated words with each half of B's bytes widened by their signedness (a lane's four
    products as two pair sums, which never overflow: 2 * 255 * 255 < 2**31), the pairs added into the accumulator."""
    halves = column.type.count // 2
    wide_t = vector_of(I16_T, column.type.count)
    s16 = extend(b, column, wide_t, second_signed)
    half_t, pairs_t = vector_of(I16_T, halves), vector_of(I32_T, halves // 2)
    fn = intrinsic(b.module, "llvm.x86.avx2.pmadd.wd", pairs_t, [half_t, half_t])
    sums = []
    for half in range(2):
        mask = ir.Constant(vector_of(I32_T, halves), list(range(half * halves, (half + 1) * halves)))
        sums.append(b.call(fn, [repeated, b.shuffle_vector(s16, ir.Constant(wide_t, ir.Undefined), mask)]))
    joined = b.shuffle_vector(sums[0], sums[1], ir.Constant(vector_of(I32_T, halves), list(range(halves))))
    return b.add(acc, joined)


def _widening_step(
    b: ir.IRBuilder, acc: ir.Value, first: ir.Value, second: ir.Value, first_signed: bool, second_signed: bool
) -> ir.Value:
    """Any ISA: every product in an int32 of its own, each byte widened by its own signedness."""
    wide_t = acc.type
    return b.add(acc, b.mul(extend(b, first, wide_t, first_signed), extend(b, second, wide_t, second_signed)))


_AVX2 = DotProduct(
    "avx2",
    8,
    4,
    1,
    2,
    5,
    _vpmaddwd_step,
    any_signs=True,
    word_step=_vpmaddwd_words,
    work_divisor=launching.GEMM_WORK_DIVISOR,
)
DOT_PRODUCTS: tuple[tuple[str, DotProduct], ...] = (
    ("+avx512vnni", DotProduct("avx512vnni", 16, 6, 4, 1, 24, _vpdpbusd(16), broadcasts_signed=True)),
    ("+avxvnni", DotProduct("avxvnni", 8, 4, 2, 1, 10, _vpdpbusd(8), broadcasts_signed=True, work_divisor=32)),
    ("+avx2", _AVX2),
)
"""The dot products by the target feature that enables them, best first; a target with none of these features uses
widening multiplies (generic_dot_product)."""


def generic_dot_product(lanes: int = 4) -> DotProduct:
    """Widening multiplies on vectors of `lanes` int32 (the target's float32 lanes: NEON's four on AArch64)."""
    return DotProduct(
        "widening", lanes, 4, 1, GROUP, 4, _widening_step, any_signs=True, work_divisor=launching.GEMM_WORK_DIVISOR
    )


def dot_product_for(target: CpuTarget) -> DotProduct:
    """The best dot product `target`'s features allow."""
    enabled = set(target.features.split(","))
    for feature, dot in DOT_PRODUCTS:
        if feature in enabled:
            return dataclasses.replace(dot, permutes_bytes=dot.lanes == 16 and "+avx512vbmi" in enabled)
    return generic_dot_product(target.simd_floats)


@dataclass(frozen=True)
class Roles:
    """How each operand's bytes are read: for vpdpbusd, A (broadcast) as the unsigned operand and B as the signed
    one, an operand of the other signedness flipped; `swapped`, B the unsigned one and A, int8, broadcast as it is;
    for a dot product that takes either signedness (`DotProduct.any_signs`), both as they are."""

    swapped: bool
    a_flip: int
    """The xor applied to A's bytes (FLIP: an int8 A read unsigned)."""
    b_flip: int
    """The xor applied to B's bytes as they are packed (FLIP: a uint8 B read signed, or an int8 B read unsigned)."""
    a_read_signed: bool
    b_read_signed: bool

    @classmethod
    def of(cls, dot: DotProduct, a_signed: bool, b_signed: bool) -> Roles:
        if dot.any_signs:
            return cls(False, 0, 0, a_signed, b_signed)
        if dot.broadcasts_signed and a_signed:
            return cls(True, 0, FLIP if b_signed else 0, True, False)
        return cls(False, FLIP if a_signed else 0, 0 if b_signed else FLIP, False, True)

    def step(self, dot: DotProduct, b: ir.IRBuilder, acc: ir.Value, a: ir.Value, b_bytes: ir.Value) -> ir.Value:
        """The dot product of A's bytes `a` and B's `b_bytes`, each in its role."""
        if self.swapped:
            return dot.step(b, acc, b_bytes, a, self.b_read_signed, self.a_read_signed)
        return dot.step(b, acc, a, b_bytes, self.a_read_signed, self.b_read_signed)


def b_panels_flipped(dot: DotProduct, a_signed: bool, b_signed: bool) -> bool:
    """Whether a B packed at build time (L.IntGemm.b_panels) is stored flipped (packing.pack_byte_panels' `flip`)
    for these operands on `dot`: as the emitter reads B."""
    return bool(Roles.of(dot, a_signed, b_signed).b_flip)
