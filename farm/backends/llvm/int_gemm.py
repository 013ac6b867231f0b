"""The LLVM rendering of the loop IR's IntGemm: byte products exact in int32, on the dot-product instructions the
target has (AVX-512 VNNI's vpdpbusd, AVX-VNNI's, AVX2's vpmaddwd; widening multiplies elsewhere).

vpdpbusd multiplies four unsigned bytes by four signed ones and adds the four products to an int32 lane without
saturating (vpmaddubsw, the older instruction, saturates at 16 bits and so is never used). So each operand is read in
that form: A's bytes as unsigned (an int8 A is flipped by xor 0x80, which adds 128 to every value and to its zero
point), B's as signed (a uint8 B flipped the same way, which subtracts 128). Where the dot product lets its signed
operand be the broadcast one (vpdpbusd takes it from memory, broadcast, at no cost: DotProduct.broadcasts_signed)
and A is int8 (a conv's weights as its rows), the roles swap (`Roles`): A is broadcast as it is, B is read
unsigned (an int8 B flipped, adding 128), and no flip is paid per broadcast. The zero points then come out of the
sum exactly, in int32 arithmetic that wraps as the reference's does:

    sum_k (a - za)(b - zb) = sum_k a*b - za * sum_k b - zb * sum_k a + k * za * zb

B (the IntGemm's columns, C's contiguous dimension) is packed on the launch's stack as it is read: each group of
four k rows of a vector's columns interleaved, so that one vector load gives every lane its four k values (a B
stored transposed has them side by side already: blocks of lanes x lanes 32-bit words are transposed by shuffles),
and its column sums are taken on the way (a dot product with ones). A's row sums are taken before the tiles. Tiles
of `rows` rows x `vectors` vectors of C then keep their sums in registers over all of k; each k group loads the
tile's vectors of B once and broadcasts four bytes of each row of A (one 32-bit load). The rows past the last
whole tile are one shorter tile, the columns past the last whole vector one vector read and written through masks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from farm.backends.llvm.dot_products import (
    FLIP,
    GROUP,
    DotProduct,
    Roles,
    extend,
    intrinsic,
    opaque,
    repeated_words,
    splat,
    vector_of,
)
from farm.backends.llvm.gemm_emitter import counted_loop
from farm.ir import loopir as L

I8_T, I16_T, I32_T, I64_T = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32_T, F64_T = ir.FloatType(), ir.DoubleType()


def _transposed(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The columns of a square matrix of vectors (rows[i][j] -> result[j][i]), by log2(n) stages of two-input
    shuffles: stage h swaps the off-diagonal h x h blocks of each 2h x 2h block."""
    n = len(rows)
    rows = list(rows)
    h = n // 2
    while h:
        for i in (i for i in range(n) if not i & h):
            low = [j if not j & h else n + j - h for j in range(n)]
            high = [j + h if not j & h else n + j for j in range(n)]
            mask_t = vector_of(I32_T, n)
            rows[i], rows[i + h] = (
                b.shuffle_vector(rows[i], rows[i + h], ir.Constant(mask_t, low)),
                b.shuffle_vector(rows[i], rows[i + h], ir.Constant(mask_t, high)),
            )
        h //= 2
    return rows


@dataclass(frozen=True)
class Zeros:
    """One operand's zero points as the renderer resolved them: a pointer (at the IntGemm's first row or column),
    the bytes' signedness and whether there is one per row of A (column of B)."""

    pointer: ir.Value
    signed: bool
    per_line: bool


@dataclass(frozen=True)
class Lines:
    """Values per row or column of C as the renderer resolved them: a pointer (at the first row or column) and
    whether there is one per line or one for all."""

    pointer: ir.Value
    per_line: bool


@dataclass(frozen=True)
class RequantizeOperands:
    """L.Requantize's values as the renderer resolved them (its pointers at their offsets)."""

    x_scale: ir.Value
    w_scale: Lines
    y_scale: ir.Value
    y_zero: Zeros | None
    bias: Lines | None
    on_rows: bool
    low: int
    high: int
    relu: bool


@dataclass(frozen=True)
class DequantizeOperands:
    """L.Dequantize's values as the renderer resolved them (its pointers at their offsets)."""

    scale: Lines
    bias: Lines | None


@dataclass
class IntGemmOperands:
    """The IntGemm's pointers (at their offsets), their bytes' signedness, their zero points (None: 0) and how C is
    requantized or dequantized (both None: C holds the int32 sums)."""

    a: ir.Value
    b: ir.Value
    c: ir.Value
    a_signed: bool
    b_signed: bool
    a_zero: Zeros | None = None
    b_zero: Zeros | None = None
    requantize: RequantizeOperands | None = None
    dequantize: DequantizeOperands | None = None


A_WORDS_MAX_BYTES = 64 << 10
"""The most bytes of A widened to int16 that a unit keeps on its stack (`_Emitter._widen_a`): a MatMulInteger's
activations, not a big conv's weights."""


class _Emitter:
    """One IntGemm's emission: counted loops over allocas (mem2reg promotes them), the packed panel of B, the row
    and column sums, and the tiles. Columns past the last whole vector (n % lanes of them) are one partial vector,
    read and written through masks."""

    def __init__(
        self,
        builder: ir.IRBuilder,
        slot: Callable[[str, ir.Type], ir.AllocaInstr],
        gemm: L.IntGemm,
        ops: IntGemmOperands,
        dot: DotProduct,
    ) -> None:
        self.b, self.slot, self.g, self.ops, self.dot = builder, slot, gemm, ops, dot
        self.roles = Roles.of(dot, ops.a_signed, ops.b_signed)
        # A zero point known to be 0 (None) that no flip shifts multiplies B's column sums (A's row sums) by 0: they
        # are not taken (integer_gemm.zero_constants: a conv's symmetric weights, a Relu's output).
        self.column_sums_needed = ops.a_zero is not None or bool(self.roles.a_flip)
        self.row_sums_needed = ops.b_zero is not None or bool(self._b_shift())
        self.count = 0
        self.full = gemm.n // dot.lanes
        self.edge = gemm.n % dot.lanes
        self.vectors = self.full + (1 if self.edge else 0)
        self.whole_groups, self.tail = divmod(gemm.k, GROUP)
        self.groups = self.whole_groups + (1 if self.tail else 0)
        self.tile_vectors = max((v for v in range(1, dot.vectors + 1) if self.full % v == 0), default=1)

    def loop(self, extent: int, body: Callable[[ir.Value], None]) -> None:
        """A counted loop 0..extent whose body gets the i64 index (inline for one iteration, none for zero)."""
        if extent <= 1:
            if extent == 1:
                body(ir.Constant(I64_T, 0))
            return
        self.count += 1
        counted_loop(self.b, self.slot(f"intgemm.i{self.count}", I64_T), f"intgemm{self.count}", extent, body)

    def index(self, *terms: tuple[ir.Value | int, int]) -> ir.Value:
        """The i64 sum of value * scale."""
        b = self.b
        total: ir.Value = ir.Constant(I64_T, 0)
        for value, scale in terms:
            value = ir.Constant(I64_T, value) if isinstance(value, int) else value
            total = b.add(total, b.mul(value, ir.Constant(I64_T, scale)))
        return total

    def at(self, base: ir.Value, element: ir.Type, *terms: tuple[ir.Value | int, int]) -> ir.Value:
        """base + sum of value * scale elements of `element`."""
        return self.b.gep(base, [self.index(*terms)], inbounds=True, source_etype=element)

    def in_array(self, array: ir.Value, *terms: tuple[ir.Value | int, int]) -> ir.Value:
        """The address of an alloca'd array's element at sum of value * scale."""
        return self.b.gep(array, [ir.Constant(I64_T, 0), self.index(*terms)], inbounds=True)

    def load_lanes(self, address: ir.Value, element: ir.Type, partial: bool) -> ir.Value:
        """A vector of `lanes` elements (integers or float32) from `address`; only the partial vector's columns
        when `partial`, one load each (the others 0: nothing past the operand is read)."""
        lanes = self.dot.lanes
        vec_t = vector_of(element, lanes)
        if not partial:
            return self.b.load(address, align=1, typ=vec_t)
        vector: ir.Value = ir.Constant(vec_t, [0.0 if element == F32_T else 0] * lanes)
        for lane in range(self.edge):
            value = self.b.load(self.b.gep(address, [ir.Constant(I64_T, lane)], source_etype=element), typ=element)
            vector = self.b.insert_element(vector, value, ir.Constant(I32_T, lane))
        return vector

    def store_lanes(self, value: ir.Value, address: ir.Value, partial: bool) -> None:
        """Store a vector at `address`; only the partial vector's columns when `partial`, one store each (LLVM 22
        turned a masked store of bytes with one lane set into a four-byte store, over the next row's first bytes)."""
        element = value.type.element
        if not partial:
            self.b.store(value, address, align=1)
            return
        for lane in range(self.edge):
            target = self.b.gep(address, [ir.Constant(I64_T, lane)], source_etype=element)
            self.b.store(self.b.extract_element(value, ir.Constant(I32_T, lane)), target)

    def emit(self) -> None:
        dot, g = self.dot, self.g
        self.column_sums = self.slot(f"intgemm.colsum.{g.n}", ir.ArrayType(dot.accumulator, self.vectors))
        self.row_sums = self.slot(f"intgemm.rowsum.{g.m}", ir.ArrayType(I32_T, g.m))
        if g.b_panels and self.column_sums_needed and not self._tall() and not g.m % dot.rows:
            self._sum_packed_columns()
        elif not g.b_panels:
            self.panel = self.slot(f"intgemm.panel.{g.k}x{g.n}", ir.ArrayType(dot.bytes, self.groups * self.vectors))
            self.panel.align = 64
            self._pack_b()
        if self.row_sums_needed:
            self._sum_rows()
        self.a_words: ir.AllocaInstr | None = None
        if dot.word_step is not None and g.m * self.groups * GROUP * 2 <= A_WORDS_MAX_BYTES:
            self._widen_a()
        self._tiles()

    def _widen_a(self) -> None:
        """A's bytes widened to int16 once per unit (each row's groups of four words, by A's signedness), for a dot
        product that takes words (DotProduct.word_step): its tiles then broadcast a row's four words straight from
        memory instead of widening them for every row and k group."""
        b, g = self.b, self.g
        words_t = vector_of(I16_T, GROUP)
        words = self.slot(f"intgemm.awords.{g.m}x{self.groups}", ir.ArrayType(words_t, g.m * self.groups))
        self.a_words = words

        def group(m: ir.Value, k4: ir.Value, present: int = GROUP) -> None:
            four = self._four_bytes(self.at(self.ops.a, I8_T, (m, g.lda), (k4, GROUP)), present)
            widened = extend(b, b.bitcast(four, vector_of(I8_T, GROUP)), words_t, self.roles.a_read_signed)
            b.store(widened, self.in_array(words, (m, self.groups), (k4, 1)))

        def row(m: ir.Value) -> None:
            self.loop(self.whole_groups, lambda k4: group(m, k4))
            if self.tail:
                group(m, ir.Constant(I64_T, self.whole_groups), self.tail)

        self.loop(g.m, row)

    def panel_vector(self, k4: ir.Value, vector: ir.Value) -> ir.Value:
        """Vector `vector` of B's packed group k4 (each lane's four bytes): from the panel this unit packed, or from
        B itself when it was packed at build time (L.IntGemm.b_panels: panels of INT_GEMM_PANEL_LANES columns, which
        a narrower vector reads a part of)."""
        b = self.b
        if not self.g.b_panels:
            return b.load(self.in_array(self.panel, (k4, self.vectors), (vector, 1)), align=64)
        lanes, per_panel = self.dot.lanes, L.INT_GEMM_PANEL_LANES // self.dot.lanes
        panel = b.sdiv(vector, ir.Constant(I64_T, per_panel))
        part = b.srem(vector, ir.Constant(I64_T, per_panel))
        offset = (panel, self.g.k * L.INT_GEMM_PANEL_LANES), (k4, GROUP * L.INT_GEMM_PANEL_LANES), (part, lanes * GROUP)
        return b.load(self.at(self.ops.b, I8_T, *offset), align=1, typ=self.dot.bytes)

    def _sum_packed_columns(self) -> None:
        """The column sums of a B packed at build time: each vector's groups through a dot product with ones."""
        zero = ir.Constant(self.dot.accumulator, [0] * self.dot.accumulator.count)

        def vector(v: ir.Value) -> None:
            self.b.store(zero, self.in_array(self.column_sums, (v, 1)))
            self.loop(self.groups, lambda k4: self._add_to_column_sums(v, self.panel_vector(k4, v)))

        self.loop(self.vectors, vector)

    def _add_to_column_sums(self, v: ir.Value, packed: ir.Value) -> None:
        """Vector v's column sums plus one packed group's (a dot product with ones: one instruction where the ISA
        has one)."""
        b, dot = self.b, self.dot
        ones = ir.Constant(dot.bytes, [1] * dot.bytes.count)
        column_sum = self.in_array(self.column_sums, (v, 1))
        b.store(self.roles.step(dot, b, b.load(column_sum), ones, packed), column_sum)

    # -- B: packed, its column sums taken

    def _pack_b(self) -> None:
        accumulator = self.dot.accumulator
        zero = ir.Constant(accumulator, [0] * accumulator.count)
        self.loop(self.vectors, lambda v: self.b.store(zero, self.in_array(self.column_sums, (v, 1))))

        def group(k4: ir.Value, rows: int = GROUP) -> None:
            self.loop(self.full, lambda v: self._pack_vector(k4, v, False, rows))
            if self.edge:
                self._pack_vector(k4, ir.Constant(I64_T, self.full), True, rows)

        first = 0
        if self.g.b_transposed:
            first = self._pack_transposed_blocks()
        self.loop(self.whole_groups - first, lambda j: group(self.b.add(j, ir.Constant(I64_T, first))))
        if self.tail:
            group(ir.Constant(I64_T, self.whole_groups), self.tail)

    def _pack_transposed_blocks(self) -> int:
        """The k groups of a transposed B (L.IntGemm.b_transposed) in blocks of `lanes` groups: each vector's
        lanes x lanes 32-bit words (a column's four k values each) loaded row by row, one vector load per column,
        and transposed by shuffles, so each group's vector gets every column's word; returns the groups packed
        (the rest go one at a time, _pack_columns)."""
        lanes = self.dot.lanes
        blocks = self.whole_groups // lanes

        def block(j: ir.Value) -> None:
            k4 = self.b.mul(j, ir.Constant(I64_T, lanes))
            self.loop(self.full, lambda v: self._pack_transposed_block(k4, v, lanes))
            if self.edge:
                self._pack_transposed_block(k4, ir.Constant(I64_T, self.full), self.edge)

        self.loop(blocks, block)
        return blocks * lanes

    def _pack_transposed_block(self, k4: ir.Value, v: ir.Value, columns: int) -> None:
        """Groups [k4, k4 + lanes) of vector v of a transposed B, its first `columns` columns (the others zero)."""
        b, g, lanes = self.b, self.g, self.dot.lanes
        words_t = vector_of(I32_T, lanes)
        rows = [
            b.load(
                self.at(self.ops.b, I8_T, (v, lanes * g.ldb), (column * g.ldb, 1), (k4, GROUP)), align=1, typ=words_t
            )
            if column < columns
            else ir.Constant(words_t, [0] * lanes)
            for column in range(lanes)
        ]
        flip = ir.Constant(self.dot.bytes, [self.roles.b_flip] * (lanes * GROUP))
        for group, word in enumerate(_transposed(b, rows)):
            packed = b.xor(b.bitcast(word, self.dot.bytes), flip)
            if columns < lanes:  # the missing columns' bytes stay zero: the flip must not touch them
                keep = [0xFF if lane < columns else 0 for lane in range(lanes) for _ in range(GROUP)]
                packed = b.and_(packed, ir.Constant(self.dot.bytes, keep))
            self._store_packed(b.add(k4, ir.Constant(I64_T, group)), v, packed)

    def _pack_vector(self, k4: ir.Value, v: ir.Value, partial: bool, present: int) -> None:
        """Vector v of the k group k4: four rows of B interleaved into the panel (as signed bytes), and added to
        the vector's column sums; the rows past k's end (all but `present`) are zeros, which add nothing."""
        if self.g.b_transposed:
            self._pack_columns(k4, v, partial, present)
            return
        b, g, lanes = self.b, self.g, self.dot.lanes
        row_t = vector_of(I8_T, lanes)
        flip = ir.Constant(row_t, [self.roles.b_flip] * lanes)
        rows = [
            b.xor(
                self.load_lanes(
                    self.at(self.ops.b, I8_T, (k4, GROUP * g.ldb), (v, lanes), (i * g.ldb, 1)), I8_T, partial
                ),
                flip,
            )
            if i < present
            else ir.Constant(row_t, [0] * lanes)
            for i in range(GROUP)
        ]
        self._store_packed(k4, v, self._interleaved(rows))

    def _pack_columns(self, k4: ir.Value, v: ir.Value, partial: bool, present: int) -> None:
        """_pack_vector of a B stored transposed (L.IntGemm.b_transposed): each lane's four k values are already
        side by side, one 32-bit load per column (the `present` bytes one at a time past k's end)."""
        b, g, lanes = self.b, self.g, self.dot.lanes
        bytes_t = self.dot.bytes
        word: ir.Value = ir.Constant(vector_of(I32_T, lanes), [0] * lanes)
        for lane in range(self.edge if partial else lanes):
            address = self.at(self.ops.b, I8_T, (v, lanes * g.ldb), (lane * g.ldb, 1), (k4, GROUP))
            word = b.insert_element(word, self._four_bytes(address, present), ir.Constant(I32_T, lane))
        flips = [self.roles.b_flip if way < present else 0 for _ in range(lanes) for way in range(GROUP)]
        self._store_packed(k4, v, b.xor(b.bitcast(word, bytes_t), ir.Constant(bytes_t, flips)))

    def _store_packed(self, k4: ir.Value, v: ir.Value, packed: ir.Value) -> None:
        """Store one packed vector (each lane's four signed bytes) of group k4, vector v, and add it to the vector's
        column sums."""
        self.b.store(packed, self.in_array(self.panel, (k4, self.vectors), (v, 1)), align=64)
        if self.column_sums_needed:
            self._add_to_column_sums(v, packed)

    def _interleaved(self, rows: list[ir.Value]) -> ir.Value:
        """Four rows of `lanes` bytes as one vector of each lane's four bytes side by side."""
        b, lanes = self.b, self.dot.lanes
        pairs = [
            b.shuffle_vector(rows[i], rows[i + 1], ir.Constant(vector_of(I32_T, 2 * lanes), list(range(2 * lanes))))
            for i in (0, 2)
        ]
        mask = [way * lanes + lane for lane in range(lanes) for way in range(GROUP)]
        if self.dot.permutes_bytes:
            joined = b.shuffle_vector(
                pairs[0], pairs[1], ir.Constant(vector_of(I32_T, GROUP * lanes), list(range(GROUP * lanes)))
            )
            vpermb = intrinsic(b.module, "llvm.x86.avx512.permvar.qi.512", self.dot.bytes, [self.dot.bytes] * 2)
            return b.call(vpermb, [joined, opaque(b, ir.Constant(self.dot.bytes, mask))])
        return b.shuffle_vector(pairs[0], pairs[1], ir.Constant(vector_of(I32_T, GROUP * lanes), mask))

    # -- A: its row sums

    def _sum_rows(self) -> None:
        """Each row's sum of A's bytes as the dot product reads them (flipped and unsigned, or as they are:
        dot_products.Roles): whole vectors of bytes through llvm.vector.reduce.add, then four bytes at a time, then
        the k % 4 last one at a time."""
        b, g = self.b, self.g
        chunk = self.dot.bytes.count
        flip = self.roles.a_flip

        def sum_of(address: ir.Value, count: int) -> ir.Value:
            bytes_t, wide_t = vector_of(I8_T, count), vector_of(I32_T, count)
            values = b.xor(b.load(address, align=1, typ=bytes_t), ir.Constant(bytes_t, [flip] * count))
            reduce = intrinsic(b.module, f"llvm.vector.reduce.add.v{count}i32", I32_T, [wide_t])
            return b.call(reduce, [extend(b, values, wide_t, self.roles.a_read_signed)])

        def row(m: ir.Value) -> None:
            total = self.slot("intgemm.rowsum.acc", I32_T)
            b.store(ir.Constant(I32_T, 0), total)
            whole = g.k // chunk

            def add(address: ir.Value, count: int) -> None:
                b.store(b.add(b.load(total), sum_of(address, count)), total)

            self.loop(whole, lambda j: add(self.at(self.ops.a, I8_T, (m, g.lda), (j, chunk)), chunk))
            fours = (g.k - whole * chunk) // GROUP
            self.loop(
                fours, lambda j: add(self.at(self.ops.a, I8_T, (m, g.lda), (j, GROUP), (whole * chunk, 1)), GROUP)
            )
            for i in range(self.tail):
                add(self.at(self.ops.a, I8_T, (m, g.lda), (g.k - self.tail + i, 1)), 1)
            b.store(b.load(total), self.in_array(self.row_sums, (m, 1)))

        self.loop(g.m, row)

    # -- the tiles

    def _tiles(self) -> None:
        """Every tile of C, the rows past the last whole row tile (m % rows of them) first: where B was packed at
        build time, that tile also takes B's column sums as it reads B (its few rows leave registers for them), so
        that a B of many columns and few rows (the weights of a conv over a 2x2 plane) is streamed once, not twice."""
        g, dot = self.g, self.dot
        if self._tall():
            self._row_tiles(ir.Constant(I64_T, 0), g.m, sums=self.column_sums_needed, vectors=1)
            return
        main, edge = divmod(g.m, dot.rows)
        if edge:
            self._row_tiles(
                ir.Constant(I64_T, main * dot.rows), edge, sums=bool(g.b_panels) and self.column_sums_needed
            )
        self.loop(main, lambda it: self._row_tiles(self.index((it, dot.rows)), dot.rows))

    def _tall(self) -> bool:
        """Whether C is one row tile one vector wide (B packed at build time, m within DotProduct.tall_rows)."""
        return bool(self.g.b_panels) and self.dot.rows < self.g.m <= self.dot.tall_rows

    def _row_tiles(self, m0: ir.Value, rows: int, sums: bool = False, vectors: int = 0) -> None:
        """Rows [m0, m0 + rows) of C, tile by tile, tiles `vectors` wide (0: the widest that divides B's whole
        vectors), with B's column sums taken on the way where `sums`."""
        vectors = vectors or self.tile_vectors
        self.loop(self.full // vectors, lambda jt: self._tile(m0, rows, self.index((jt, vectors)), vectors, sums=sums))
        if self.edge:
            self._tile(m0, rows, ir.Constant(I64_T, self.full), 1, partial=True, sums=sums)

    def _tile(
        self, m0: ir.Value, rows: int, v0: ir.Value, vectors: int, partial: bool = False, sums: bool = False
    ) -> None:
        """Rows [m0, m0 + rows) x vectors [v0, v0 + vectors) of C: sums over all of k in registers (and, where
        `sums`, those vectors' column sums of B), then the zero points' terms, stored."""
        b, dot, g = self.b, self.dot, self.g
        kind = ("edge" if partial else "tile") + ("sums" if sums else "")
        accs = [
            [self.slot(f"intgemm.{kind}{rows}.{r}.{v}", dot.accumulator) for v in range(vectors)] for r in range(rows)
        ]
        column_sums = [
            self.slot(f"intgemm.{kind}{rows}.sum.{v}", dot.accumulator) for v in range(vectors if sums else 0)
        ]
        for acc in [acc for line in accs for acc in line] + column_sums:
            b.store(ir.Constant(dot.accumulator, [0] * dot.accumulator.count), acc)
        flip = ir.Constant(I32_T, self.roles.a_flip * 0x01010101)
        ones = ir.Constant(dot.bytes, [1] * dot.bytes.count)

        def group(k4: ir.Value, present: int = GROUP) -> None:
            columns = [self.panel_vector(k4, b.add(v0, ir.Constant(I64_T, v))) for v in range(vectors)]
            for column_sum, column in zip(column_sums, columns):
                b.store(self.roles.step(dot, b, b.load(column_sum), ones, column), column_sum)
            for r in range(rows):
                if self.a_words is not None and dot.word_step is not None:
                    address = self.in_array(self.a_words, (m0, self.groups), (r, self.groups), (k4, 1))
                    repeated = repeated_words(b, b.load(address))
                    for v in range(vectors):
                        total = dot.word_step(b, b.load(accs[r][v]), repeated, columns[v], self.roles.b_read_signed)
                        b.store(total, accs[r][v])
                    continue
                four = self._four_bytes(self.at(self.ops.a, I8_T, (m0, g.lda), (r, g.lda), (k4, GROUP)), present)
                broadcast = b.bitcast(splat(b, b.xor(four, flip), dot.lanes), dot.bytes)
                for v in range(vectors):
                    b.store(self.roles.step(dot, b, b.load(accs[r][v]), broadcast, columns[v]), accs[r][v])

        self.loop(self.whole_groups, group)
        if self.tail:
            group(ir.Constant(I64_T, self.whole_groups), self.tail)
        for v, column_sum in enumerate(column_sums):
            b.store(b.load(column_sum), self.in_array(self.column_sums, (b.add(v0, ir.Constant(I64_T, v)), 1)))
        for r in range(rows):
            m = b.add(m0, ir.Constant(I64_T, r))
            for v in range(vectors):
                vector = b.add(v0, ir.Constant(I64_T, v))
                total = self._zero_point_terms(dot.finish(b, b.load(accs[r][v])), m, vector, partial)
                if self.ops.requantize is not None:
                    total = self._requantized(self.ops.requantize, total, m, vector, partial)
                elif self.ops.dequantize is not None:
                    total = self._dequantized(self.ops.dequantize, total, vector, partial)
                self._store_c(total, m, vector, partial)

    def _zero_point_terms(self, total: ir.Value, m: ir.Value, vector: ir.Value, partial: bool) -> ir.Value:
        """sum a*b - za * sum_k b - zb * sum_k a + k * za * zb for row m and a vector of columns, the terms of a
        zero point known to be 0 left out (their sums were never taken)."""
        b, lanes = self.b, self.dot.lanes
        if self.column_sums_needed:
            column_sum = self.dot.finish(b, b.load(self.in_array(self.column_sums, (vector, 1))))
            total = b.sub(total, b.mul(splat(b, self._a_zero(m), lanes), column_sum))
        if self.row_sums_needed:
            row_sum = splat(b, b.load(self.in_array(self.row_sums, (m, 1))), lanes)
            total = b.sub(total, b.mul(self._b_zero(vector, partial), row_sum))
        if self.column_sums_needed and self.row_sums_needed:
            both = b.mul(splat(b, self._a_zero(m), lanes), self._b_zero(vector, partial))
            total = b.add(total, b.mul(both, splat(b, ir.Constant(I32_T, self.g.k), lanes)))
        return total

    def _column_values(self, values: Lines, element: ir.Type, vector: ir.Value, partial: bool) -> ir.Value:
        """One value per lane of this vector of C: the one value, or each column's."""
        b, lanes = self.b, self.dot.lanes
        if values.per_line:
            return self.load_lanes(self.at(values.pointer, element, (vector, lanes)), element, partial)
        return splat(b, b.load(values.pointer, align=4, typ=element), lanes)

    def _dequantized(self, d: DequantizeOperands, total: ir.Value, vector: ir.Value, partial: bool) -> ir.Value:
        """float32(total) * scale + bias (L.Dequantize): each step rounded on its own, as the Cast, Mul and Add
        kernels it replaces round (no fast-math flags, so LLVM never fuses the multiply and the add)."""
        b = self.b
        value = b.sitofp(total, vector_of(F32_T, self.dot.lanes))
        value = b.fmul(value, self._column_values(d.scale, F32_T, vector, partial))
        return value if d.bias is None else b.fadd(value, self._column_values(d.bias, F32_T, vector, partial))

    def _requantized(
        self, q: RequantizeOperands, total: ir.Value, m: ir.Value, vector: ir.Value, partial: bool
    ) -> ir.Value:
        """(total + bias) * multiplier + y_zero (L.Requantize) as C's bytes: in float64 without fast-math flags (so
        the multiply and the add are never fused into one rounding), rounded half to even and saturated (maxnum and
        minnum, so that a NaN, from a zero y_scale, saturates low as the reference's)."""
        b, lanes = self.b, self.dot.lanes
        f64v = vector_of(F64_T, lanes)

        def lines(values: Lines, element: ir.Type) -> ir.Value:
            """One value per lane of this vector of C: the one value, the row's, or each column's."""
            if not (values.per_line and q.on_rows):
                return self._column_values(values, element, vector, partial)
            return splat(b, b.load(self.at(values.pointer, element, (m, 1)), align=4, typ=element), lanes)

        if q.bias is not None:
            total = b.add(total, lines(q.bias, I32_T))
        x_scale = splat(b, b.load(q.x_scale, align=4, typ=F32_T), lanes)
        y_scale = splat(b, b.load(q.y_scale, align=4, typ=F32_T), lanes)
        multiplier = b.fdiv(b.fmul(x_scale, lines(q.w_scale, F32_T)), y_scale)
        zero: ir.Value = ir.Constant(F64_T, 0.0)
        if q.y_zero is not None:
            to_float = b.sitofp if q.y_zero.signed else b.uitofp
            zero = to_float(b.load(q.y_zero.pointer, align=1, typ=I8_T), F64_T)
        value = b.fadd(b.fmul(b.sitofp(total, f64v), b.fpext(multiplier, f64v)), splat(b, zero, lanes))
        rounded = b.call(intrinsic(b.module, f"llvm.roundeven.v{lanes}f64", f64v, [f64v]), [value])
        low, high = float(q.low), float(q.high)
        floor: ir.Value = ir.Constant(F64_T, low)
        if q.relu:
            floor = b.call(intrinsic(b.module, "llvm.maxnum.f64", F64_T, [F64_T, F64_T]), [floor, zero])
        maxnum = intrinsic(b.module, f"llvm.maxnum.v{lanes}f64", f64v, [f64v, f64v])
        minnum = intrinsic(b.module, f"llvm.minnum.v{lanes}f64", f64v, [f64v, f64v])
        clamped = b.call(minnum, [b.call(maxnum, [rounded, splat(b, floor, lanes)]), ir.Constant(f64v, [high] * lanes)])
        return b.trunc(b.fptosi(clamped, vector_of(I32_T, lanes)), vector_of(I8_T, lanes))

    def _store_c(self, value: ir.Value, m: ir.Value, vector: ir.Value, partial: bool) -> None:
        """Row m's vector of C: one store (a store per column when partial), or one per column when C is stored transposed
        (L.IntGemm.c_transposed: once per tile, after all of k, so the scattered stores cost little)."""
        b, g, lanes = self.b, self.g, self.dot.lanes
        element = value.type.element
        if not g.c_transposed:
            self.store_lanes(value, self.at(self.ops.c, element, (m, g.ldc), (vector, lanes)), partial)
            return
        for lane in range(self.edge if partial else lanes):
            address = self.at(self.ops.c, element, (vector, lanes * g.ldc), (lane * g.ldc, 1), (m, 1))
            b.store(b.extract_element(value, ir.Constant(I32_T, lane)), address, align=element.width // 8)

    def _four_bytes(self, address: ir.Value, present: int) -> ir.Value:
        """A's four bytes at `address` as one int32 (one load); of a group past k's end, only the `present` first,
        one load each, the others 0 (B's rows there are zeros, so they add nothing; nothing past A is read)."""
        b = self.b
        if present == GROUP:
            return b.load(address, align=1, typ=I32_T)
        word: ir.Value = ir.Constant(I32_T, 0)
        for i in range(present):
            byte = b.zext(b.load(b.gep(address, [ir.Constant(I64_T, i)], source_etype=I8_T), align=1, typ=I8_T), I32_T)
            word = b.or_(word, b.shl(byte, ir.Constant(I32_T, 8 * i)))
        return word

    def _a_zero(self, m: ir.Value) -> ir.Value:
        """Row m's zero point as the flipped bytes see it (an int32)."""
        zeros = self.ops.a_zero
        shift = ir.Constant(I32_T, self.roles.a_flip)
        if zeros is None:
            return shift
        address = self.at(zeros.pointer, I8_T, (m, 1)) if zeros.per_line else zeros.pointer
        return self.b.add(extend(self.b, self.b.load(address, align=1, typ=I8_T), I32_T, zeros.signed), shift)

    def _b_shift(self) -> int:
        """What B's flip adds to its values (and so to its zero points): -128 read signed, +128 read unsigned."""
        if not self.roles.b_flip:
            return 0
        return -FLIP if self.roles.b_read_signed else FLIP

    def _b_zero(self, vector: ir.Value, partial: bool) -> ir.Value:
        """B's zero points for a vector of columns as the flipped bytes see them (one value, or one per column)."""
        b, lanes = self.b, self.dot.lanes
        word_t = vector_of(I32_T, lanes)
        shift = ir.Constant(word_t, [self._b_shift()] * lanes)
        zeros = self.ops.b_zero
        if zeros is None:
            return shift
        if zeros.per_line:
            loaded = self.load_lanes(self.at(zeros.pointer, I8_T, (vector, lanes)), I8_T, partial)
            values = extend(b, loaded, word_t, zeros.signed)
        else:
            values = splat(b, extend(b, b.load(zeros.pointer, align=1, typ=I8_T), I32_T, zeros.signed), lanes)
        return b.add(values, shift)


def emit_int_gemm(
    builder: ir.IRBuilder,
    slot: Callable[[str, ir.Type], ir.AllocaInstr],
    gemm: L.IntGemm,
    operands: IntGemmOperands,
    dot: DotProduct,
) -> None:
    """Emit C = (A - a_zero) @ (B - b_zero) for `gemm`'s shapes, exact in int32 (see the module docstring)."""
    _Emitter(builder, slot, gemm, operands, dot).emit()
