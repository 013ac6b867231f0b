"""The LLVM rendering of the loop IR's Gemm: a register-blocked micro-kernel over explicit vector types.

The output is cut into tiles of `rows` x (`vectors` x lanes) held in vector accumulators for the whole k loop;
each k step loads `vectors` vectors of B and broadcasts `rows` scalars of A, so every load feeds several FMAs.
Edges use the same tile code with fewer rows, one vector, or scalars (lanes = 1). Tile sizes and the vector
width are parameters (GemmBlocking), not constants, so that tuning can try others.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from farm.ir import loopir as L

F32_T, I64_T, I32_T = ir.FloatType(), ir.IntType(64), ir.IntType(32)


LOOP_ORDERS = ("columns", "rows")
"""Which tile loop is outer: "columns" (each column panel of B stays in cache while every row tile passes over
it) or "rows" (each row panel of A stays while every column tile passes)."""


SMALL_M_ROWS = 256
"""The most rows of C for which a column-split GEMM keeps partial sums per k block (_small_m_k_block)."""
C_PREFETCH_MIN_BYTES = 1 << 20
"""The least bytes of C for which a column-split GEMM's tiles prefetch the next column block's C (_emit_column_blocks):
half of a 2 MB L2. Smaller outputs stay in cache, and there the prefetch costs time (MobileNetV2's 28x28 pointwise
convs on one thread)."""
SWEEP_MAX_B_BYTES = 1 << 20
"""The most bytes of B (k x n) for which a column-split GEMM sweeps each row tile across the range's column blocks
(_emit_column_blocks) instead of taking each column block down every row tile: B then stays in L2 while every row
tile passes over it, and C is written `rows` rows at a time, streams the hardware prefetcher follows."""
PACK_B_MAX_BYTES = 256 << 10
"""The most bytes of a B panel packed on the fly (_pack_b_panel): it lives on the launch's stack; a k block of a
few-row GEMM (256 steps of a 48-column piece) takes 48 KB, a 1024-channel pointwise conv's whole k 192 KB."""
PACK_B_MIN_ROW_TILES = 16
"""The fewest row tiles of C for which a column-split GEMM packs B on the fly: the copy is paid once per panel, the
gain once per row tile (packing lost with 8 row tiles and won with 16). Row-split GEMMs read B in place: each range
would pack all of B, and packing there, faster launch by launch, left ResNet-50 no faster on one thread or two."""
SMALL_M_K_BLOCK = 256
"""k steps per block there (rounded down to whole channels of an implicit GEMM): a panel block of 256 x 48 floats
(48 KB) stays in L1/L2 while every row tile uses it."""
SMALL_M_PREFETCH_BLOCKS = 2
"""How many k blocks ahead those tiles prefetch B (the weights, cold from memory once a run): the next block's
lines, requested while the few row tiles of this one run, were not all in L2 when its first tile came; two
blocks ahead beat one and four on light ResNet-50 and a two-layer BERT (docs/architecture.md, Code generation)."""


@dataclass(frozen=True)
class GemmBlocking:
    """The micro-kernel's shape: register tiles of output rows x vectors of `lanes` floats, the cache tiling of the
    k loop (`k_block` k steps per pass over C, 0: all of k in one pass) and the tile loop order."""

    rows: int = 4
    vectors: int = 3
    lanes: int = 16
    k_block: int = 0
    order: str = "columns"

    @property
    def tile_columns(self) -> int:
        """Columns of one register tile: the block a column-split launch claims (loopir.splits_columns)."""
        return self.vectors * self.lanes

    @property
    def name(self) -> str:
        """rows x vectors x lanes, then k block and order when not the default: "4x3x16", "4x3x16-k256-rows"."""
        suffix = (f"-k{self.k_block}" if self.k_block else "") + (f"-{self.order}" if self.order != "columns" else "")
        return f"{self.rows}x{self.vectors}x{self.lanes}{suffix}"

    def to_json(self) -> dict[str, Any]:
        """rows, vectors and lanes; k_block and order only when not the default (so older records stay equal)."""
        data: dict[str, Any] = {"rows": self.rows, "vectors": self.vectors, "lanes": self.lanes}
        if self.k_block:
            data["k_block"] = self.k_block
        if self.order != "columns":
            data["order"] = self.order
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GemmBlocking:
        """The blocking of a variant's JSON form; ValueError unless it is rows, vectors and lanes (positive
        integers), optionally k_block (an integer >= 0) and order (one of LOOP_ORDERS): a variant comes from a store
        or a message, so it is checked before code is made."""
        required, optional = {"rows", "vectors", "lanes"}, {"k_block", "order"}
        if not isinstance(data, dict) or not required <= set(data) <= required | optional:
            raise ValueError(f"a GEMM variant is {{rows, vectors, lanes[, k_block, order]}}, got {data!r}")
        if not all(type(data[key]) is int and data[key] > 0 for key in required):
            raise ValueError(f"a GEMM variant's rows, vectors and lanes are positive integers, got {data!r}")
        k_block, order = data.get("k_block", 0), data.get("order", "columns")
        if type(k_block) is not int or k_block < 0 or order not in LOOP_ORDERS:
            raise ValueError(
                f"a GEMM variant's k_block is an integer >= 0 and its order one of {LOOP_ORDERS}, got {data!r}"
            )
        return cls(data["rows"], data["vectors"], data["lanes"], k_block, order)


@dataclass(frozen=True)
class _Region:
    """A rectangle of C tiled uniformly: [m0, m0+m) x [n0, n0+n) in tiles of rows x (vectors * lanes). A runtime
    n0 is a piece of a column-split launch (_column_pieces): `in_block` when it lies within one full column block
    (a pre-packed B's panel holds it), else one vector past them (in the edge columns)."""

    m0: int | ir.Value
    m: int | ir.Value
    n0: int | ir.Value
    n: int
    rows: int
    vectors: int
    lanes: int
    in_block: bool = False


def _columns(n: int, blocking: GemmBlocking) -> list[tuple[int, int, int, int]]:
    """(first column, columns, vectors, lanes): full tiles, then tiles of one vector fewer down to single vectors,
    then narrower vectors (half the lanes, down to 4), then scalars. A tile of two vectors does the 32 columns past
    three-vector blocks (128 or 512 output channels) with two FMAs per broadcast, where two single-vector tiles
    broadcast each value twice. The narrower vectors matter when n is small: a 2x2 feature map's 4 columns would
    otherwise all be scalar tails under 16-lane tiles, at a quarter of the speed of 4-lane vectors."""
    widths = [(vectors, blocking.lanes) for vectors in range(blocking.vectors, 0, -1)]
    widths += [(1, lanes) for lanes in _halvings(blocking.lanes) if lanes >= 4] + [(1, 1)]
    columns, n0 = [], 0
    for vectors, lanes in widths:
        count = (n - n0) // (vectors * lanes) * (vectors * lanes)
        columns.append((n0, count, vectors, lanes))
        n0 += count
    return columns


def regions(m: int, n: int, blocking: GemmBlocking) -> list[_Region]:
    """Cover an m x n output with the column groups of `_columns`, each in full row tiles then single rows."""
    m_main = m // blocking.rows * blocking.rows
    rows = [(0, m_main, blocking.rows), (m_main, m - m_main, 1)]
    return [
        _Region(m0, mc, n0, nc, r, v, lanes)
        for n0, nc, v, lanes in _columns(n, blocking)
        for m0, mc, r in rows
        if mc and nc
    ]


def _halvings(lanes: int) -> list[int]:
    return [lanes >> shift for shift in range(1, lanes.bit_length()) if lanes >> shift]


def emit_gemm(
    builder: ir.IRBuilder,
    slot: Callable[[str, ir.Type], ir.AllocaInstr],
    a: ir.Value,
    b: ir.Value,
    c: ir.Value,
    gemm: L.Gemm,
    blocking: GemmBlocking,
    launch_range: tuple[ir.Value, ir.Value] | None = None,
    epilogue: tuple[ir.Value | None, ir.Value | None] = (None, None),
    outlining: Outlining | None = None,
) -> None:
    """Emit C = A @ B for `gemm`'s shapes; a, b, c point at the panels' first elements. With `launch_range`
    (runtime i64 values begin, end), only part of C, as loopir.launch_info cut it: column blocks [begin, end) when
    the launch splits columns (loopir.splits_columns), else rows [begin, end): whole register tiles from begin,
    then one row at a time. `epilogue` points at the gemm.epilogue's bias and residual (at their offsets).
    `outlining`: how the kernel's code is split into parts (Outlining); a launch's heaviest code then goes into
    functions of their own (outlined_functions)."""
    gen = _Gen(builder, slot, a, b, c, gemm, blocking)
    gen.bias, gen.residual = epilogue
    gen.outlining = outlining if launch_range is not None else None
    if launch_range is None:
        for region in regions(gemm.m, gemm.n, blocking):
            _emit_region(gen, region)
    elif L.splits_columns(gemm, blocking.tile_columns):
        _emit_column_blocks(gen, blocking, *launch_range)
    else:
        _emit_rows(gen, blocking, *launch_range)


def _emit_rows(gen: _Gen, blocking: GemmBlocking, begin: ir.Value, end: ir.Value) -> None:
    builder, gemm = gen.b, gen.gemm
    size = ir.Constant(I64_T, blocking.rows)
    main = builder.mul(builder.sdiv(builder.sub(end, begin), size), size)
    edge_begin = builder.add(begin, main)
    outline = _outlines_rows(gemm, blocking)
    for n0, nc, vectors, lanes in _columns(gemm.n, blocking):
        if nc:
            for region in (
                _Region(begin, main, n0, nc, blocking.rows, vectors, lanes),
                _Region(edge_begin, builder.sub(end, edge_begin), n0, nc, 1, vectors, lanes),
            ):
                if outline:
                    _outline(gen, [_i64(region.m0), _i64(region.m)], functools.partial(_emit_region_at, region))
                else:
                    _emit_region(gen, region)


def _emit_region_at(region: _Region, gen: _Gen, values: list[ir.Value]) -> None:
    """The region with its rows [values[0], values[0] + values[1]) (an outlined function's arguments)."""
    _emit_region(gen, dataclasses.replace(region, m0=values[0], m=values[1]))


def _packs_b_panel(gemm: L.Gemm, blocking: GemmBlocking, steps: int) -> bool:
    """Whether tiles read B through a panel packed on the fly (_pack_b_panel): B row-major and not pre-packed (an
    activation: a pointwise conv's input), a panel of `steps` k steps at most PACK_B_MAX_BYTES, and at least
    PACK_B_MIN_ROW_TILES row tiles to share it."""
    return (
        not gemm.b_panels
        and not gemm.b_transposed
        and gemm.m >= PACK_B_MIN_ROW_TILES * blocking.rows
        and steps * blocking.tile_columns * 4 <= PACK_B_MAX_BYTES
    )


def _pack_b_panel(gen: _Gen, n0: ir.Value, vectors: int, k0: ir.Value, steps: int | ir.Value, most_steps: int) -> None:
    """Copy B[k0:k0 + steps, n0:n0 + vectors * lanes] into a scratch panel on the stack (room for `most_steps`
    steps: steps may be a runtime value), k-major, and have the tiles read B there (gen.b_packed) until reset.
    Each k step of B is a row of C's width apart (12.5 KB at 56x56 planes): every row tile that read its panel in
    place walked hundreds of pages, the lines falling in a few L1 sets; the packed panel is contiguous. Each row
    read prefetches gen.prefetch floats ahead, as the tiles would."""
    b, g, lanes = gen.b, gen.gemm, gen.blocking.lanes
    width, vec_t = vectors * lanes, _vector_type(lanes)
    panel = gen.slot(f"gemm.b_panel.{most_steps}x{width}", ir.ArrayType(vec_t, most_steps * vectors))
    panel.align = 64

    def row(step: ir.Value) -> None:
        source = b.add(gen.offset((b.add(k0, step), g.ldb)), n0)
        for j in range(vectors):
            index = b.add(source, ir.Constant(I64_T, j * lanes))
            value = _load(b, gen.address(gen.bm, index), vec_t)
            if gen.prefetch:
                _prefetch(gen, gen.address(gen.bm, b.add(index, ir.Constant(I64_T, gen.prefetch))))
            b.store(value, _panel_vector(gen, panel, gen.offset((step, vectors), (j, 1))))

    gen.loop(steps, row)
    gen.b_packed = (panel, k0, vectors)


def _panel_vector(gen: _Gen, panel: ir.Value, index: ir.Value) -> ir.Value:
    """The address of vector `index` of a panel packed on the fly (_pack_b_panel)."""
    return gen.b.gep(panel, [ir.Constant(I32_T, 0), index], inbounds=True)


def _emit_column_blocks(gen: _Gen, blocking: GemmBlocking, begin: ir.Value, end: ir.Value) -> None:
    """Column units [begin, end) of C (loopir.column_units: each vector of columns, then one unit for the
    columns short of a vector), every row: the range's columns as pieces (_column_pieces: a partial block, whole
    blocks, a partial block, then the whole vectors past the full blocks), each down all row tiles and then the
    edge rows; the range holding the last unit also does the columns short of a vector.
    A GEMM of few rows and a deep k (_small_m_k_block) runs each piece k block by k block, every row tile per k
    block, its partial sums in a scratch tile; one body serves every k block (_k_block_loop). A GEMM whose B has at most SWEEP_MAX_B_BYTES sweeps each row tile
    across the range's pieces instead (faster for ResNet-50's 64 -> 256 channel pointwise convs at 56x56 planes,
    slower for its 256 -> 64 ones, whose B is 3.2 MB: docs/architecture.md, Code generation).
    Otherwise, when C has C_PREFETCH_MIN_BYTES or more, each tile of a whole block, as it starts, prefetches the
    lines of C (for writing) and of the residual that the same rows of the next block will touch: a block's tiles
    store to every row of C, a plane apart, too many streams for the hardware prefetcher, and at 56x56 planes C and
    the residual (3.2 MB each) live beyond L2 (ResNet-50's 64 -> 256 pointwise convs with the residual). The range's last block prefetches nothing ahead: the next block is
    another thread's, and taking its lines for writing made MobileNetV2's 28x28 pointwise convs slower on two
    threads than on one."""
    builder, gemm, width = gen.b, gen.gemm, blocking.tile_columns
    m_main = gemm.m // blocking.rows * blocking.rows

    def piece_regions(n0: ir.Value, vectors: int, in_block: bool) -> tuple[_Region, _Region]:
        """The piece's full row tiles and its edge rows."""
        columns = vectors * blocking.lanes
        return (
            _Region(0, m_main, n0, columns, blocking.rows, vectors, blocking.lanes, in_block),
            _Region(m_main, gemm.m - m_main, n0, columns, 1, vectors, blocking.lanes, in_block),
        )

    def rows(
        n0: ir.Value,
        vectors: int,
        ahead: ir.Value | None,
        in_block: bool,
        k0: ir.Value,
        steps: int | ir.Value,
        accumulate: bool | ir.Value,
        final: bool | ir.Value,
        most_steps: int = 0,
        g: _Gen = gen,
    ) -> None:
        """The piece's row tiles, then its edge rows, over k steps [k0, k0 + steps): at most `most_steps` when
        steps is a runtime value (_k_block_loop); emitted through `g` (an outlined function's, or the launch's)."""
        tiles, edge = piece_regions(n0, vectors, in_block)
        zero = ir.Constant(I64_T, 0)
        if g.c_prefetch is not None:  # the next block's lines, while it is this range's (never another thread's)
            g.c_prefetch = zero if ahead is None else g.b.select(ahead, ir.Constant(I64_T, width), zero)
        panel_steps = steps if isinstance(steps, int) else most_steps
        if _packs_b_panel(gemm, blocking, panel_steps):
            _pack_b_panel(g, n0, vectors, k0, steps, panel_steps)
        g.loop(m_main // blocking.rows, lambda it: _emit_tile(g, tiles, it, zero, k0, steps, accumulate, final))
        g.loop(gemm.m - m_main, lambda it: _emit_tile(g, edge, it, zero, k0, steps, accumulate, final))
        g.b_packed = None

    size = _small_m_k_block(gemm, blocking)
    if size:
        partials = ir.ArrayType(_vector_type(blocking.lanes), gemm.m * blocking.vectors)

        def few_rows(
            g: _Gen, n0: ir.Value, vectors: int, in_block: bool, partial: ir.Value, last_stores: bool = True
        ) -> None:
            """One piece, every k block (a piece runs all of k), its sums kept in `partial` between blocks; the last
            block stores them through the epilogue when `last_stores`, else into `partial` too (for `finished`)."""
            g.partial, g.prefetch = partial, SMALL_M_PREFETCH_BLOCKS * size * (width if gemm.b_panels else gemm.ldb)
            _k_block_loop(
                g,
                lambda k0, steps, accumulate, final: rows(
                    n0, vectors, None, in_block, k0, steps, accumulate, final if last_stores else False, size, g
                ),
                size,
            )
            g.partial, g.prefetch = None, 0

        def finished(g: _Gen, n0: ir.Value, vectors: int, in_block: bool, partial: ir.Value) -> None:
            """The piece's sums, all of k, from `partial` through the Gemm's epilogue into C."""
            g.partial = partial
            tiles, edge = piece_regions(n0, vectors, in_block)
            for region, count in ((tiles, m_main // blocking.rows), (edge, gemm.m - m_main)):

                def tile(it: ir.Value, region: _Region = region) -> None:
                    _emit_tile(g, region, it, ir.Constant(I64_T, 0), steps=0, accumulate=True, final=True)

                g.loop(count, tile)
            g.partial = None

        def piece(n0: ir.Value, vectors: int, ahead: ir.Value | None, in_block: bool) -> None:
            """The piece in one function, or (_splits_epilogue) its k blocks and its epilogue in two."""
            if not _splits_epilogue(gemm):
                _outline(
                    gen,
                    [n0],
                    lambda g, values: few_rows(g, values[0], vectors, in_block, g.slot("gemm.partial", partials)),
                )
                return
            partial = gen.slot("gemm.partial", partials)
            _outline(
                gen,
                [n0, partial],
                lambda g, values: few_rows(g, values[0], vectors, in_block, values[1], last_stores=False),
            )
            _outline(gen, [n0, partial], lambda g, values: finished(g, values[0], vectors, in_block, values[1]))

        _column_pieces(gen, blocking, begin, end, piece)
    elif gemm.k * gemm.n * 4 <= SWEEP_MAX_B_BYTES:

        def sweeps(k0: ir.Value, steps: int, accumulate: bool, final: bool) -> None:
            def sweep(edge: bool, it: ir.Value) -> None:
                _column_pieces(
                    gen,
                    blocking,
                    begin,
                    end,
                    lambda n0, vectors, ahead, in_block: _emit_tile(
                        gen,
                        piece_regions(n0, vectors, in_block)[edge],
                        it,
                        ir.Constant(I64_T, 0),
                        k0,
                        steps,
                        accumulate,
                        final,
                    ),
                )

            gen.loop(m_main // blocking.rows, lambda it: sweep(False, it))
            gen.loop(gemm.m - m_main, lambda it: sweep(True, it))

        gen.prefetch = 0 if gemm.b_panels else width
        _k_blocks(gen, sweeps)
        gen.prefetch = 0
    else:
        gen.prefetch = 0 if gemm.b_panels else width
        gen.c_prefetch = ir.Constant(I64_T, 0) if gemm.m * gemm.n * 4 >= C_PREFETCH_MIN_BYTES else None
        _k_blocks(
            gen,
            lambda k0, steps, accumulate, final: _column_pieces(
                gen,
                blocking,
                begin,
                end,
                lambda n0, vectors, ahead, in_block: rows(n0, vectors, ahead, in_block, k0, steps, accumulate, final),
            ),
        )
        gen.prefetch, gen.c_prefetch = 0, None
    tails = [
        region
        for region in regions(gemm.m, gemm.n, blocking)
        if region.n0 >= gemm.n // width * width and region.lanes < blocking.lanes
    ]
    if tails:
        with builder.if_then(builder.icmp_signed(">", end, ir.Constant(I64_T, gemm.n // blocking.lanes))):
            for region in tails:
                _emit_region(gen, region)


def _column_pieces(
    gen: _Gen,
    blocking: GemmBlocking,
    begin: ir.Value,
    end: ir.Value,
    piece: Callable[[ir.Value, int, ir.Value | None, bool], None],
) -> None:
    """piece(first column, vectors, ahead, in_block) over the whole vectors among column units [begin, end): in
    the full column blocks, the vectors before the first whole block and those after the last (fewer than a
    tile's, in one block; `ahead` None), then every whole block (`ahead`: whether the next whole block is this
    range's too), each within one block (`in_block`: a pre-packed B's panel holds it whole, _b_index); then each
    whole vector past the full blocks on its own. The partial pieces run a vector at a time, both through one
    loop: one single-vector body instead of one per vector count and side, a fraction of the code LLVM compiles
    (a few-row conv's k blocks multiply each body), for a few single-vector tiles in a range at the cut."""
    b, vectors, gemm = gen.b, blocking.vectors, gen.gemm
    full_units = ir.Constant(I64_T, gemm.n // blocking.tile_columns * vectors)
    stop = b.select(b.icmp_signed("<", end, full_units), end, full_units)
    per_block = ir.Constant(I64_T, vectors)
    first_block = b.sdiv(b.add(begin, ir.Constant(I64_T, vectors - 1)), per_block)
    last_block = b.sdiv(stop, per_block)
    lead_end = b.mul(first_block, per_block)
    lead_end = b.select(b.icmp_signed("<", lead_end, stop), lead_end, stop)
    trail_begin = b.mul(last_block, per_block)
    trail_begin = b.select(b.icmp_signed(">", trail_begin, lead_end), trail_begin, lead_end)
    lanes = ir.Constant(I64_T, blocking.lanes)

    def partial(trail: ir.Value) -> None:
        """The vectors before the whole blocks (trail 0) or after them (1), one at a time."""
        is_trail = b.icmp_signed("!=", trail, ir.Constant(I64_T, 0))
        first = b.select(is_trail, trail_begin, begin)
        count = b.sub(b.select(is_trail, stop, lead_end), first)
        gen.loop(count, lambda index: piece(b.mul(b.add(first, index), lanes), 1, None, True))

    def whole(index: ir.Value) -> None:
        block = b.add(first_block, index)
        ahead = b.icmp_signed("<", b.add(block, ir.Constant(I64_T, 1)), last_block)
        piece(b.mul(block, ir.Constant(I64_T, blocking.tile_columns)), vectors, ahead, True)

    gen.loop(2, partial)
    gen.loop(b.sub(last_block, first_block), whole)
    edge_units = ir.Constant(I64_T, gemm.n // blocking.lanes)
    first_edge = b.select(b.icmp_signed(">", begin, full_units), begin, full_units)
    last_edge = b.select(b.icmp_signed("<", end, edge_units), end, edge_units)
    gen.loop(b.sub(last_edge, first_edge), lambda index: piece(b.mul(b.add(first_edge, index), lanes), 1, None, False))


def _small_m_k_block(gemm: L.Gemm, blocking: GemmBlocking) -> int:
    """k steps per block when a column block of a few-row GEMM runs k block by k block (0: it doesn't). With at
    most SMALL_M_ROWS rows, each column panel of B serves only a handful of row tiles: over all of k, the first
    tile reads the panel from memory and the others from cache, so that first pass is bound by memory bandwidth
    (light ResNet-50's 7x7-plane convs: 4608 x 48 floats of weights a panel, 46-57% of a core's peak). A block
    of SMALL_M_K_BLOCK steps (whole channels of an implicit GEMM) is read once and used by every row tile while it
    is in L1, the weights streaming at the pace of the FMAs. Where k allows, a block is the largest number of
    whole channels down to half of SMALL_M_K_BLOCK that divides k, so that every block has the same, constant
    number of steps (_k_block_loop): ResNet's 3x3 convs of 256 or 512 channels take 144 steps, not 252."""
    if gemm.m > SMALL_M_ROWS:
        return 0
    taps = gemm.a_window.kernel_height * gemm.a_window.kernel_width if gemm.a_window else 1
    size = max(1, SMALL_M_K_BLOCK // taps) * taps
    if gemm.k < 2 * size:
        return 0
    dividing = [steps for steps in range(size, size // 2 - 1, -taps) if gemm.k % steps == 0]
    return dividing[0] if dividing else size


MAX_PARTS = 7
"""The most objects a kernel's code is split into (Outlining): its launches, then up to five parts holding its
outlined functions (light ResNet-50's few-row 3x3 convs: a launch's three pieces, 0.19-0.26 s of a 0.55 s unit
each; its 7x7 stem's four regions, two of which shared a part of 0.3 s; its strided 1x1 convs' twelve regions)."""
ROW_SPLIT_MIN_GROUPS = 3
"""The fewest column groups (_columns) for which a row-split GEMM without a window outlines its regions: each group
is two regions of tile code (full row tiles, edge rows), and three or more (light ResNet-50's strided 1x1 convs, n
= 504 and 280 columns: full blocks, one or two vectors, a half vector) compiled in 0.2-0.35 s as one unit."""


def outlined_functions(gemm: L.Gemm, blocking: GemmBlocking) -> int:
    """How many functions of its own a Gemm launch's heaviest code goes into (emit_gemm with an Outlining): a few-row
    column-split GEMM's (_small_m_k_block) three pieces, each with all its k blocks (_column_pieces: the vectors
    before and after the whole blocks, the whole blocks, the vectors past the full blocks); a row-split GEMM's
    regions (every column group's full row tiles and edge rows: _emit_rows) where it is implicit, whose tap loops
    LLVM unrolls (a 7x7 stem: 49 taps a k step), or has many column groups (_outlines_rows). Those were the longest
    compile units of a build, serial on one worker however many the farm has; other GEMMs compile in a fraction of
    that and stay whole."""
    if L.splits_columns(gemm, blocking.tile_columns):
        return 0 if not _small_m_k_block(gemm, blocking) else 6 if _splits_epilogue(gemm) else 3
    return 2 * _column_groups(gemm, blocking) if _outlines_rows(gemm, blocking) else 0


def _splits_epilogue(gemm: L.Gemm) -> bool:
    """Whether a few-row GEMM's pieces (_small_m_k_block) store their sums through the epilogue in functions of
    their own, apart from their k blocks: an implicit GEMM's, whose 8-row tiles' final store (C transposed, with the
    bias and activation) was 40% of its largest piece's code, light ResNet-50's longest unit (0.3-0.45 s on this
    2-core Zen 4, loaded). A plain GEMM's stay whole: the FC layer's GEMM (1 x 1000 x 2048) ran 1.19x slower split,
    and compiles fast as it is."""
    return gemm.a_window is not None


def _column_groups(gemm: L.Gemm, blocking: GemmBlocking) -> int:
    """How many column groups (_columns) of the Gemm's n hold columns."""
    return sum(1 for _, columns, _, _ in _columns(gemm.n, blocking) if columns)


def _outlines_rows(gemm: L.Gemm, blocking: GemmBlocking) -> bool:
    """Whether a row-split GEMM's regions go into functions of their own (_emit_rows, when the kernel is split):
    an implicit GEMM's (its tap loops are unrolled), or one of ROW_SPLIT_MIN_GROUPS column groups or more."""
    return gemm.a_window is not None or _column_groups(gemm, blocking) >= ROW_SPLIT_MIN_GROUPS


@dataclass
class Outlining:
    """How a kernel's code is split into `parts` objects, and which of them a render makes (`part`; None: all of
    them, in one object). Part 0 holds the kernel and its launches, which call their outlined functions
    (outlined_functions); outlined function i (numbered in the order the launches emit them) is part
    1 + i mod (parts - 1)'s. Each part is a unit of its own, compiled anywhere and linked with the others: a
    kernel's code then compiles on up to `parts` workers at once, and the linked library runs the same code."""

    parts: int
    part: int | None = None
    count: int = 0

    def owner(self, index: int) -> int:
        return 1 + index % (self.parts - 1)

    def emits(self, index: int) -> bool:
        """Whether this render makes outlined function `index`'s body (else it only declares and calls it)."""
        return self.part is None or self.part == self.owner(index)


def _outline(gen: _Gen, values: list[ir.Value], body: Callable[[_Gen, list[ir.Value]], None]) -> None:
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
        inner = _Gen(builder, slot, args[0], args[1], args[2], gen.gemm, gen.blocking)
        extras = iter(args[3 : len(pointers)])
        inner.bias = None if gen.bias is None else next(extras)
        inner.residual = None if gen.residual is None else next(extras)
        inner.prefetch, inner.c_prefetch, inner.residual_summed = gen.prefetch, gen.c_prefetch, gen.residual_summed
        body(inner, args[len(pointers) :])
        builder.ret_void()
        ir.IRBuilder(entry).branch(start)
    gen.b.call(fn, [*pointers, *values])


class _Gen:
    def __init__(self, builder, slot, a, b, c, gemm: L.Gemm, blocking: GemmBlocking) -> None:
        self.b, self.slot, self.a, self.bm, self.c, self.gemm = builder, slot, a, b, c, gemm
        self.blocking = blocking
        self.outlining: Outlining | None = None
        """How the kernel is split into parts (emit_gemm); None: in one function."""
        self.count = 0
        self.bias: ir.Value | None = None
        self.residual: ir.Value | None = None
        self.prefetch = 0
        """Floats ahead of each B load to prefetch (SMALL_M_PREFETCH_BLOCKS k blocks ahead in _small_m_k_block's path,
        the next column block's elsewhere); 0: none."""
        self.c_prefetch: ir.Value | None = None
        """Columns ahead (a runtime i64) of each tile's C (and residual) to prefetch as the tile starts: the next
        column block's in a column-split GEMM with a big C (_emit_column_blocks), 0 in the range's last block;
        None: no prefetch."""
        self.b_packed: tuple[ir.Value, ir.Value, int] | None = None
        """Where tiles read B while a panel of it is packed on the fly (_pack_b_panel): the panel, its first k and its
        vectors per k; None: B itself."""
        self.partial: ir.Value | None = None
        """Where tiles keep their partial sums between k blocks (_small_m_k_block): m x vectors vectors, the
        column block's own; None: in C itself."""
        self.residual_in_c = gemm.epilogue is not None and gemm.epilogue.residual_in_c(gemm)
        """C holds the residual as the kernel starts (L.GemmEpilogue.residual_in_c)."""
        self.residual_summed = False
        """The sums being emitted started from the residual in C (_k_blocks), so the epilogue doesn't add it."""

    def loop(self, extent: int | ir.Value, body: Callable[[ir.Value], None]) -> None:
        """A counted loop 0..extent (a constant or a runtime i64) whose body gets the i64 index."""
        if isinstance(extent, int) and extent == 1:
            body(ir.Constant(I64_T, 0))
            return
        b = self.b
        self.count += 1
        counter = self.slot(f"gemm.i{self.count}", I64_T)
        b.store(ir.Constant(I64_T, 0), counter)
        head, loop_body, done = (b.append_basic_block(f"gemm{self.count}.{s}") for s in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        b.cbranch(b.icmp_signed("<", b.load(counter), _i64(extent)), loop_body, done)
        b.position_at_end(loop_body)
        body(b.load(counter))
        b.store(b.add(b.load(counter), ir.Constant(I64_T, 1)), counter)
        b.branch(head)
        b.position_at_end(done)

    def address(self, base: ir.Value, index: ir.Value) -> ir.Value:
        return self.b.gep(base, [index], inbounds=True, source_etype=F32_T)

    def offset(self, *terms: tuple[ir.Value | int, int]) -> ir.Value:
        """sum of value * scale, as i64."""
        total: ir.Value = ir.Constant(I64_T, 0)
        for value, scale in terms:
            value = ir.Constant(I64_T, value) if isinstance(value, int) else value
            total = self.b.add(total, self.b.mul(value, ir.Constant(I64_T, scale)))
        return total


def _i64(value: int | ir.Value) -> ir.Value:
    return ir.Constant(I64_T, value) if isinstance(value, int) else value


def intrinsic(module: ir.Module, name: str, typ: ir.Type, arity: int) -> ir.Function:
    """Declare an overloaded float intrinsic (llvm.fmuladd, llvm.sqrt, ...) for f32, f64 or a vector of f32."""
    suffix = f"v{typ.count}f32" if isinstance(typ, ir.VectorType) else "f64" if typ == ir.DoubleType() else "f32"
    full = f"{name}.{suffix}"
    if full in module.globals:
        return module.globals[full]
    return ir.Function(module, ir.FunctionType(typ, [typ] * arity), full)


def _vector_type(lanes: int) -> ir.Type:
    return F32_T if lanes == 1 else ir.VectorType(F32_T, lanes)


def _k_blocks(gen: _Gen, emit: Callable[[ir.Value, int, bool, bool], None], size: int | None = None) -> None:
    """emit(k0, steps, accumulate, final) over the k loop cut into blocks of `size` steps (the blocking's k_block
    by default): the first block writes C (or adds to it when C holds the residual and the sums are kept there: the
    first write would lose it), the later ones (a runtime loop over the middle blocks, then the last, which may be
    shorter) add to it, and only the last (`final`) applies the epilogue. With no size, or k no
    larger, one pass over all of k. An implicit GEMM's k is cut only by _small_m_k_block's blocks (whole channels)."""
    k = gen.gemm.k
    size = gen.blocking.k_block if size is None else size
    if not size or k <= size or (gen.gemm.a_window is not None and gen.partial is None):
        emit(ir.Constant(I64_T, 0), k, False, True)
        return
    blocks, b = -(-k // size), gen.b
    gen.residual_summed = gen.residual_in_c and gen.partial is None
    emit(ir.Constant(I64_T, 0), size, gen.residual_summed, False)
    gen.loop(
        blocks - 2, lambda j: emit(b.mul(b.add(j, ir.Constant(I64_T, 1)), ir.Constant(I64_T, size)), size, True, False)
    )
    emit(ir.Constant(I64_T, (blocks - 1) * size), k - (blocks - 1) * size, True, True)
    gen.residual_summed = False


def _k_block_loop(gen: _Gen, emit: Callable[[ir.Value, ir.Value, ir.Value, ir.Value], None], size: int) -> None:
    """emit(k0, steps, accumulate, final) once, in a runtime loop over k cut into blocks of `size` steps (at least
    two: _small_m_k_block): accumulate (every block but the first), final (the last) and, unless size divides k
    (the last block's are then fewer), steps are runtime values (constant steps keep the k loop's trip count
    known), so a piece's tiles are emitted once, not once per phase (first, middle, last) as _k_blocks does: a
    third of the code for LLVM to optimise (light ResNet-50's 14x14 and 7x7 3x3 convs took 1.7-1.8 s each to
    compile, the longest units of its build)."""
    b, k = gen.b, gen.gemm.k
    blocks = -(-k // size)
    last, full, short = (ir.Constant(I64_T, value) for value in (blocks - 1, size, k - (blocks - 1) * size))

    def block(j: ir.Value) -> None:
        final = b.icmp_signed("==", j, last)
        steps = size if k % size == 0 else b.select(final, short, full)
        emit(b.mul(j, full), steps, b.icmp_signed("!=", j, ir.Constant(I64_T, 0)), final)

    gen.loop(blocks, block)


def _emit_region(gen: _Gen, region: _Region) -> None:
    """Every tile of the region, k block by k block, the tile loops in the blocking's order."""
    width = region.vectors * region.lanes
    if isinstance(region.m, int):
        row_tiles = region.m // region.rows
    else:
        row_tiles = region.m if region.rows == 1 else gen.b.sdiv(region.m, ir.Constant(I64_T, region.rows))
    column_tiles = region.n // width

    def tiles(k0: ir.Value, steps: int, accumulate: bool, final: bool) -> None:
        tile = lambda it, jt: _emit_tile(gen, region, it, jt, k0, steps, accumulate, final)  # noqa: E731
        if gen.blocking.order == "rows":
            gen.loop(row_tiles, lambda it: gen.loop(column_tiles, lambda jt: tile(it, jt)))
        else:
            gen.loop(column_tiles, lambda jt: gen.loop(row_tiles, lambda it: tile(it, jt)))

    _k_blocks(gen, tiles)


def _emit_tile(
    gen: _Gen,
    region: _Region,
    it: ir.Value,
    jt: ir.Value,
    k0: ir.Value | None = None,
    steps: int | ir.Value | None = None,
    accumulate: bool | ir.Value = False,
    final: bool | ir.Value = True,
) -> None:
    """One register tile of C over k steps [k0, k0 + steps) (all of k by default): accumulators start at zero, or
    at C's values when `accumulate` (a later k block), and are stored to C at the end, through the Gemm's
    epilogue when `final` (the last k block). `steps`, `accumulate` and `final` may be runtime values (an i64, i1s:
    _k_block_loop), so that one body serves every k block."""
    b, g = gen.b, gen.gemm
    k0 = ir.Constant(I64_T, 0) if k0 is None else k0
    steps = g.k if steps is None else steps
    vec_t = _vector_type(region.lanes)
    m0 = b.add(_i64(region.m0), b.mul(it, ir.Constant(I64_T, region.rows)))
    n0 = b.add(_i64(region.n0), b.mul(jt, ir.Constant(I64_T, region.vectors * region.lanes)))
    accs = [[gen.slot(f"acc.{region.lanes}.{i}.{j}", vec_t) for j in range(region.vectors)] for i in range(region.rows)]
    places = [
        [
            (b.add(m0, ir.Constant(I64_T, i)), b.add(n0, ir.Constant(I64_T, j * region.lanes)))
            for j in range(region.vectors)
        ]
        for i in range(region.rows)
    ]
    outputs = [[_c_index(gen, m, n) for m, n in row] for row in places]
    kept = [[_partial_index(gen, region, m, j) for j, (m, _) in enumerate(row)] for row in places]
    for row, indices, partials in zip(accs, outputs, kept):
        for acc, index, partial in zip(row, indices, partials):
            start = ir.Constant(vec_t, None)
            if accumulate is not False:
                kept_sums = _load_c(gen, gen.c, index, vec_t) if gen.partial is None else b.load(partial)
                start = kept_sums if accumulate is True else b.select(accumulate, kept_sums, start)
            b.store(start, acc)
    fma = intrinsic(b.module, "llvm.fmuladd", vec_t, 3)
    # A pre-packed A (a conv's weights) is read panel after panel, one per row tile; each k step prefetches the
    # next panel's values at the same k, so they come from L2, not memory, when the next tile starts: a layer's
    # weights are cold once a run (docs/architecture.md, Code generation: ResNet-50's 14x14 pointwise convs).
    a_ahead = ir.Constant(I64_T, region.rows * g.k) if g.a_panels and region.rows == gen.blocking.rows else None
    if gen.c_prefetch is not None and final is True and not g.c_transposed:  # see _emit_column_blocks
        ahead = gen.c_prefetch
        for row in outputs:
            for start, _ in row:
                _prefetch(gen, gen.address(gen.c, b.add(start, ahead)), write=True)
                if g.epilogue is not None and g.epilogue.residual is not None and not gen.residual_in_c:
                    _prefetch(gen, gen.address(gen.residual, b.add(start, ahead)))

    def step(k: ir.Value, a_indices: list[ir.Value]) -> None:
        if gen.b_packed is not None:
            panel, packed_k0, packed_vectors = gen.b_packed
            row_start = gen.offset((b.sub(k, packed_k0), packed_vectors))
            loaded = [
                b.load(_panel_vector(gen, panel, b.add(row_start, ir.Constant(I64_T, j))))
                for j in range(region.vectors)
            ]
        else:
            b_indices = [_b_index(gen, region, n0, j, k) for j in range(region.vectors)]
            loaded = [_load(b, gen.address(gen.bm, index), vec_t) for index in b_indices]
            if gen.prefetch:
                for index in b_indices:
                    _prefetch(gen, gen.address(gen.bm, b.add(index, ir.Constant(I64_T, gen.prefetch))))
        if a_ahead:
            _prefetch(gen, gen.address(gen.a, b.add(a_indices[0], a_ahead)))
        for row, a_index in zip(accs, a_indices):
            scalar = b.load(gen.address(gen.a, a_index), align=4, typ=F32_T)
            a_value = _splat(b, scalar, region.lanes)
            for acc, b_value in zip(row, loaded):
                b.store(b.call(fma, [a_value, b_value, b.load(acc)]), acc)

    if isinstance(steps, int) and steps == 0:  # kept sums through the epilogue alone (_emit_column_blocks)
        pass
    elif g.a_window is None:
        gen.loop(
            steps,
            lambda k: step(b.add(k0, k), [_a_index(gen, region, m0, i, b.add(k0, k)) for i in range(region.rows)]),
        )
    else:
        _window_steps(gen, g.a_window, [b.add(m0, ir.Constant(I64_T, i)) for i in range(region.rows)], step, k0, steps)
    if isinstance(final, bool):
        _store_tile(gen, region, accs, places, outputs, kept, m0, n0, final)
        return
    with b.if_else(final) as (last, partial_sums):
        with last:
            _store_tile(gen, region, accs, places, outputs, kept, m0, n0, True)
        with partial_sums:
            _store_tile(gen, region, accs, places, outputs, kept, m0, n0, False)


def _store_tile(
    gen: _Gen,
    region: _Region,
    accs: list[list[ir.Value]],
    places: list[list[tuple[ir.Value, ir.Value]]],
    outputs: list[list[tuple[ir.Value, int]]],
    kept: list[list[ir.Value | None]],
    m0: ir.Value,
    n0: ir.Value,
    final: bool,
) -> None:
    """Store a tile's accumulators: to C through the Gemm's epilogue when `final`, else to the partial sums
    (gen.partial) or, without them, to C as they are."""
    b, g = gen.b, gen.gemm
    epilogue = g.epilogue if final else None
    if final and _transposes_in_registers(g, region):
        for j in range(region.vectors):
            _store_transposed(
                gen, epilogue, [b.load(row[j]) for row in accs], m0, b.add(n0, ir.Constant(I64_T, j * region.lanes))
            )
        return
    for row, indices, row_places, partials in zip(accs, outputs, places, kept):
        for acc, index, place, partial in zip(row, indices, row_places, partials):
            value = b.load(acc)
            if not final and gen.partial is not None:
                b.store(value, partial)
            else:
                _store_c(gen, _apply_epilogue(gen, epilogue, value, place, index) if epilogue else value, index)


def _transposes_in_registers(gemm: L.Gemm, region: _Region) -> bool:
    """Whether a tile's final store to a transposed C (L.Gemm.c_transposed) goes through _store_transposed: tiles
    of a power-of-two count of rows, at least 2 and at most the lanes (a power of two too)."""
    rows, lanes = region.rows, region.lanes
    return gemm.c_transposed and 2 <= rows <= lanes and not rows & (rows - 1) and not lanes & (lanes - 1)


def _interleave(b: ir.IRBuilder, x: ir.Value, y: ir.Value, high: bool) -> ir.Value:
    """x0 y0 x1 y1 ... of the low (or high) halves of two vectors: one two-source permute (vpermt2ps on AVX-512)."""
    lanes = _lanes(x.type)
    first = lanes // 2 if high else 0
    mask = [index for lane in range(first, first + lanes // 2) for index in (lane, lane + lanes)]
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32_T, lanes), mask))


def _store_transposed(
    gen: _Gen, epilogue: L.GemmEpilogue | None, values: list[ir.Value], m0: ir.Value, n0: ir.Value
) -> None:
    """Store one vector column of a tile (R rows of C[m0 + i, n0:n0 + lanes]) to a transposed C, where each column
    n holds the R rows side by side. log2(R) rounds of interleaving the vectors i and i + R/2 (a perfect shuffle)
    turn the R x lanes block around: vector v then holds columns n0 + v * lanes/R ..., each as R contiguous rows.
    Each such piece is one vector store (and its epilogue runs along m), instead of one scalar store per value:
    a 3x3 conv run pixels as rows made 384 scalar stores per 8 x 48 tile."""
    b, rows, lanes = gen.b, len(values), _lanes(values[0].type)
    for _ in range(rows.bit_length() - 1):
        half = rows // 2
        values = [
            _interleave(b, values[pair], values[pair + half], high) for pair in range(half) for high in (False, True)
        ]
    per_vector = lanes // rows
    for column in range(lanes):
        vector, slot = divmod(column, per_vector)
        mask = ir.Constant(ir.VectorType(I32_T, rows), list(range(slot * rows, slot * rows + rows)))
        piece = b.shuffle_vector(values[vector], ir.Constant(values[vector].type, ir.Undefined), mask)
        n = b.add(n0, ir.Constant(I64_T, column))
        start, _ = _c_index(gen, m0, n)  # the column's rows lie side by side from there
        if epilogue is not None:
            piece = _apply_epilogue(gen, epilogue, piece, (m0, n), (start, 1), along_rows=True)
        gen.b.store(piece, gen.address(gen.c, start), align=4)


def _prefetch(gen: _Gen, address: ir.Value, write: bool = False) -> None:
    """A read (or write) prefetch of `address` into L2 (llvm.prefetch, locality 2; it never faults)."""
    module = gen.b.module
    name = "llvm.prefetch.p0"
    function = module.globals.get(name) or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [address.type, I32_T, I32_T, I32_T]), name
    )
    gen.b.call(function, [address, ir.Constant(I32_T, int(write)), ir.Constant(I32_T, 2), ir.Constant(I32_T, 1)])


def _partial_index(gen: _Gen, region: _Region, m: ir.Value, j: int) -> ir.Value | None:
    """The address of a tile's partial sums for row m, vector j (gen.partial: the `vectors` vectors of each row,
    row after row); None without a partial buffer."""
    if gen.partial is None:
        return None
    index = gen.b.add(gen.b.mul(m, ir.Constant(I64_T, region.vectors)), ir.Constant(I64_T, j))
    return gen.b.gep(gen.partial, [ir.Constant(I32_T, 0), index], inbounds=True)


def _window_steps(
    gen: _Gen,
    window: L.ImplicitColumns,
    rows: list[ir.Value],
    step: Callable[[ir.Value, list[ir.Value]], None],
    k0: ir.Value,
    steps: int | ir.Value,
) -> None:
    """The k steps [k0, k0 + steps) of an implicit GEMM (L.ImplicitColumns; whole channels) as loops over
    channels, kernel rows and kernel columns: each row's base in the padded plane is computed once per tile, and
    each k step adds the tap's offset."""
    b, width = gen.b, ir.Constant(I64_T, window.out_width)
    bases = [gen.offset((b.sdiv(m, width), window.row_step), (b.srem(m, width), window.column_step)) for m in rows]
    taps = window.kernel_height * window.kernel_width
    first = b.sdiv(k0, ir.Constant(I64_T, taps))

    def tap(index: ir.Value, r: ir.Value, s: ir.Value) -> None:
        channel = b.add(first, index)
        k = gen.offset((channel, taps), (r, window.kernel_width), (s, 1))
        offset = gen.offset((channel, window.plane), (r, window.tap_row_step), (s, window.tap_column_step))
        step(k, [b.add(base, offset) for base in bases])

    channels = steps // taps if isinstance(steps, int) else b.sdiv(steps, ir.Constant(I64_T, taps))
    gen.loop(
        channels,
        lambda index: gen.loop(
            window.kernel_height, lambda r: gen.loop(window.kernel_width, lambda s: tap(index, r, s))
        ),
    )


def _c_index(gen: _Gen, m: ir.Value, n: ir.Value) -> tuple[ir.Value, int]:
    """Where C[m, n] is, and the element stride along n: 1 row-major, ldc when C is stored transposed
    (L.Gemm.c_transposed)."""
    g = gen.gemm
    if g.c_transposed:
        return gen.offset((n, g.ldc), (m, 1)), g.ldc
    return gen.offset((m, g.ldc), (n, 1)), 1


def _apply_epilogue(
    gen: _Gen,
    epilogue: L.GemmEpilogue,
    value: ir.Value,
    place: tuple[ir.Value, ir.Value],
    index: tuple[ir.Value, int],
    along_rows: bool = False,
) -> ir.Value:
    """value (the accumulators of C[m, n:n+lanes], or of C[m:m+lanes, n] `along_rows`) + bias + residual, through
    the activation."""
    b, (m, n), vec_t = gen.b, place, value.type
    if epilogue.bias is not None:
        at = gen.address(gen.bias, n if epilogue.bias_on_columns else m)
        bias = (
            _load(b, at, vec_t)
            if epilogue.bias_on_columns != along_rows
            else _splat(b, b.load(at, align=4, typ=F32_T), _lanes(vec_t))
        )
        value = b.fadd(value, bias)
    if epilogue.residual is not None and not gen.residual_summed:
        value = b.fadd(value, _load_c(gen, gen.residual, index, vec_t))
    if epilogue.activation is not None:
        kind, params = epilogue.activation
        value = VECTOR_ACTIVATIONS[kind](b, value, params)
    return value


def _constant(typ: ir.Type, number: float) -> ir.Constant:
    return ir.Constant(typ, [number] * typ.count if isinstance(typ, ir.VectorType) else number)


def fmax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """max of floats or float vectors that returns x when x is NaN, as onnxruntime's Relu/Clip/MaxPool do (the
    loop IR's "max" renders through it too)."""
    return b.select(b.fcmp_ordered("<", x, y), y, x)


def fmin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """min of floats or float vectors, returning x when x is NaN (the loop IR's "min" renders through it too)."""
    return b.select(b.fcmp_ordered(">", x, y), y, x)


def _leaky_relu(b: ir.IRBuilder, x: ir.Value, params: tuple[float, ...]) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, _constant(x.type, 0.0)), b.fmul(x, _constant(x.type, params[0])), x)


VECTOR_ACTIVATIONS: dict[str, Callable[[ir.IRBuilder, ir.Value, tuple[float, ...]], ir.Value]] = {
    "relu": lambda b, x, p: fmax(b, x, _constant(x.type, 0.0)),
    "leakyrelu": _leaky_relu,
    "clip": lambda b, x, p: fmin(b, fmax(b, x, _constant(x.type, p[0])), _constant(x.type, p[1])),
}
"""ops.registry.ACTIVATIONS on a vector of C (or one float), as the loop IR renders max and min: a Gemm's epilogue."""


def _load_c(gen: _Gen, base: ir.Value, index: tuple[ir.Value, int], vec_t: ir.Type) -> ir.Value:
    """Values laid out like C (C itself for a later k block, or a residual) for one accumulator: one vector load,
    or one load per lane when C is transposed."""
    start, stride = index
    if stride == 1:
        return _load(gen.b, gen.address(base, start), vec_t)
    lanes = _lanes(vec_t)
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


def _store_c(gen: _Gen, value: ir.Value, index: tuple[ir.Value, int]) -> None:
    """Store an accumulator into C: one vector store, or one store per lane when C is transposed (once per tile
    per k pass: over a conv's thousands of k steps, the scattered stores cost little)."""
    start, stride = index
    if stride == 1:
        gen.b.store(value, gen.address(gen.c, start), align=4)
        return
    lanes = _lanes(value.type)
    for lane in range(lanes):
        scalar = value if lanes == 1 else gen.b.extract_element(value, ir.Constant(I32_T, lane))
        gen.b.store(scalar, gen.address(gen.c, gen.b.add(start, ir.Constant(I64_T, lane * stride))), align=4)


def _lanes(typ: ir.Type) -> int:
    return typ.count if isinstance(typ, ir.VectorType) else 1


def _a_index(gen: _Gen, region: _Region, m0: ir.Value, i: int, k: ir.Value) -> ir.Value:
    """Where A[m0 + i, k] is: row-major, transposed (L.Gemm.a_transposed), or in the pre-packed panels (L.Gemm.a_panels) of the blocking's rows R:
    a full tile's panel starts at m0 * k (m0 a multiple of R: row ranges are cut at multiples of the grain, R)
    and holds the R values of each k side by side; one-row tiles are the m % R rows past the full panels, in the
    last panel."""
    b, g = gen.b, gen.gemm
    if g.a_transposed:
        return b.add(gen.offset((k, g.lda)), b.add(m0, ir.Constant(I64_T, i)))
    if not g.a_panels:
        return b.add(gen.offset((b.add(m0, ir.Constant(I64_T, i)), g.lda)), k)
    rows = gen.blocking.rows
    if region.rows == rows:
        return b.add(gen.offset((m0, g.k), (k, rows)), ir.Constant(I64_T, i))
    main = g.m // rows * rows
    edge_row = b.sub(b.add(m0, ir.Constant(I64_T, i)), ir.Constant(I64_T, main))
    return b.add(gen.offset((main, g.k), (k, g.m - main)), edge_row)


def _b_index(gen: _Gen, region: _Region, n0: ir.Value, j: int, k: ir.Value) -> ir.Value:
    """Where B[k, n0 + j * lanes] is: row-major, or in the pre-packed column panels (L.Gemm.b_panels) of the
    blocking's tile width W: a full tile's panel starts at n0 * k (n0 a multiple of W: full tiles and column blocks
    start so) and holds the W values of each k side by side; a piece of a block (a runtime region.n0) starts
    n0 % W into its block's panel; the narrower edge tiles read the n % W columns past the full panels, stored
    row-major after them."""
    b, g = gen.b, gen.gemm
    column = ir.Constant(I64_T, j * region.lanes)
    if not g.b_panels:
        return b.add(gen.offset((k, g.ldb)), b.add(n0, column))
    width, main = gen.blocking.tile_columns, g.n // gen.blocking.tile_columns * gen.blocking.tile_columns
    if region.in_block and region.vectors < gen.blocking.vectors:
        within = b.srem(n0, ir.Constant(I64_T, width))
        return b.add(gen.offset((b.sub(n0, within), g.k), (k, width)), b.add(within, column))
    if region.in_block or (isinstance(region.n0, int) and region.n0 + region.n <= main):
        return b.add(gen.offset((n0, g.k), (k, width)), column)
    edge_column = b.sub(b.add(n0, column), ir.Constant(I64_T, main))
    return b.add(gen.offset((main, g.k), (k, g.n - main)), edge_column)


def _load(b: ir.IRBuilder, address: ir.Value, vec_t: ir.Type) -> ir.Value:
    return b.load(address, align=4, typ=vec_t)


def _splat(b: ir.IRBuilder, scalar: ir.Value, lanes: int) -> ir.Value:
    if lanes == 1:
        return scalar
    vec_t = ir.VectorType(F32_T, lanes)
    single = b.insert_element(ir.Constant(vec_t, ir.Undefined), scalar, ir.Constant(I32_T, 0))
    mask = ir.Constant(ir.VectorType(I32_T, lanes), [0] * lanes)
    return b.shuffle_vector(single, ir.Constant(vec_t, ir.Undefined), mask)
