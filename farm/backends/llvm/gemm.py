"""The LLVM rendering of the loop IR's Gemm: a register-blocked micro-kernel over explicit vector types.

The output is cut into tiles of `rows` x (`vectors` x lanes) held in vector accumulators for the whole k loop;
each k step loads `vectors` vectors of B and broadcasts `rows` scalars of A, so every load feeds several FMAs.
Edges use the same tile code with fewer rows, one vector, or scalars (lanes = 1). Tile sizes and the vector
width are parameters (GemmBlocking), not constants, so that tuning can try others.

This module holds emit_gemm and the paths a launch takes over C (row ranges, column blocks and their pieces, k
blocks); the blocking (gemm_blocking), the split into parts (gemm_outlining), the emitter they share (gemm_emitter),
one register tile (gemm_tiles) and the epilogue (gemm_epilogue) have modules of their own.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from llvmlite import ir

from farm.backends.llvm.gemm_blocking import GemmBlocking, Region, column_tiling, edge_rows, regions, small_m_k_block
from farm.backends.llvm.gemm_emitter import I64_T, GemmEmitter, i64, load_floats, outline, prefetch, vector_type
from farm.backends.llvm.gemm_outlining import Outlining, outlines_rows, splits_epilogue
from farm.backends.llvm.gemm_tiles import emit_tile, panel_vector
from farm.ir import launching
from farm.ir import loopir as L

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
PARTIAL_ALIGNMENT = 4096
"""Where a few-row GEMM's partial sums (gemm_blocking.small_m_k_block) start on the stack: at a page, so their
addresses modulo 4096 are the same whichever thread and stack depth runs the kernel. Left to the caller's depth,
they fell for some depths on the lines of the GEMM's other operands: resnet18_style's 4x4-plane 3x3 convs (AVX2
code) ran 2.5x slower on a helper thread whose farm_serve frame moved them, and the model on two threads took
2.77-3.49 ms by the frame's size."""
SMALL_M_PREFETCH_BLOCKS = 2
"""How many k blocks ahead the tiles of a few-row GEMM run k block by k block (gemm_blocking.small_m_k_block)
prefetch B (the weights, cold from memory once a run): the next block's lines, requested while the few row tiles of
this one run, were not all in L2 when its first tile came; two blocks ahead beat one and four on light ResNet-50 and
a two-layer BERT (docs/architecture.md, Code generation)."""


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
    (runtime i64 values begin, end), only part of C, as launching.launch_info cut it: column blocks [begin, end) when
    the launch splits columns (launching.splits_columns), else rows [begin, end) (_emit_rows). `epilogue` points at
    the gemm.epilogue's bias and residual (at their offsets).
    `outlining`: how the kernel's code is split into parts (Outlining); a launch's heaviest code then goes into
    functions of their own (gemm_outlining.outlined_functions)."""
    gen = GemmEmitter(builder, slot, a, b, c, gemm, blocking)
    gen.bias, gen.residual = epilogue
    gen.outlining = outlining if launch_range is not None else None
    if launch_range is None:
        for region in regions(gemm.m, gemm.n, blocking):
            _emit_region(gen, region)
    elif launching.splits_columns(gemm, blocking.tile_columns):
        _emit_column_blocks(gen, blocking, *launch_range)
    else:
        _emit_rows(gen, blocking, *launch_range)


def _emit_rows(gen: GemmEmitter, blocking: GemmBlocking, begin: ir.Value, end: ir.Value) -> None:
    """Rows [begin, end) of C: whole register tiles from begin, then the rows past them as one tile of the m % rows
    rows past C's full tiles (gemm_blocking.edge_rows) where as many are left (the range that ends C: ranges are cut
    at multiples of the tile's rows), then any rows still left one at a time. ResNet's and Inception's 14x14 3x3
    convs (196 rows) ran their last 4 rows as single-row tiles, each reading every vector of B again."""
    builder, gemm = gen.b, gen.gemm
    size = ir.Constant(I64_T, blocking.rows)
    main = builder.mul(builder.sdiv(builder.sub(end, begin), size), size)
    edge_begin = builder.add(begin, main)
    rest = edge_rows(gemm.m, blocking)
    tall = builder.mul(builder.sdiv(builder.sub(end, edge_begin), ir.Constant(I64_T, rest)), ir.Constant(I64_T, rest))
    singles_begin = builder.add(edge_begin, tall) if rest > 1 else edge_begin
    outlined = outlines_rows(gemm, blocking)
    for n0, nc, vectors, lanes in column_tiling(gemm.n, blocking):
        if nc:
            for region in (
                Region(begin, main, n0, nc, blocking.rows, vectors, lanes),
                *([Region(edge_begin, tall, n0, nc, rest, vectors, lanes)] if rest > 1 else []),
                Region(singles_begin, builder.sub(end, singles_begin), n0, nc, 1, vectors, lanes),
            ):
                if outlined:
                    outline(gen, [i64(region.m0), i64(region.m)], functools.partial(_emit_region_at, region))
                else:
                    _emit_region(gen, region)


def _emit_region_at(region: Region, gen: GemmEmitter, values: list[ir.Value]) -> None:
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


def _pack_b_panel(
    gen: GemmEmitter, n0: ir.Value, vectors: int, k0: ir.Value, steps: int | ir.Value, most_steps: int
) -> None:
    """Copy B[k0:k0 + steps, n0:n0 + vectors * lanes] into a scratch panel on the stack (room for `most_steps`
    steps: steps may be a runtime value), k-major, and have the tiles read B there (gen.b_packed) until reset.
    Each k step of B is a row of C's width apart (12.5 KB at 56x56 planes): every row tile that read its panel in
    place walked hundreds of pages, the lines falling in a few L1 sets; the packed panel is contiguous. Each row
    read prefetches gen.prefetch floats ahead, as the tiles would."""
    b, g, lanes = gen.b, gen.gemm, gen.blocking.lanes
    width, vec_t = vectors * lanes, vector_type(lanes)
    panel = gen.slot(f"gemm.b_panel.{most_steps}x{width}", ir.ArrayType(vec_t, most_steps * vectors))
    panel.align = 64

    def row(step: ir.Value) -> None:
        source = b.add(gen.offset((b.add(k0, step), g.ldb)), n0)
        for j in range(vectors):
            index = b.add(source, ir.Constant(I64_T, j * lanes))
            value = load_floats(b, gen.address(gen.bm, index), vec_t)
            if gen.prefetch:
                prefetch(gen, gen.address(gen.bm, b.add(index, ir.Constant(I64_T, gen.prefetch))))
            b.store(value, panel_vector(gen, panel, gen.offset((step, vectors), (j, 1))))

    gen.loop(steps, row)
    gen.b_packed = (panel, k0, vectors)


def _emit_column_blocks(gen: GemmEmitter, blocking: GemmBlocking, begin: ir.Value, end: ir.Value) -> None:
    """Column units [begin, end) of C (launching.column_units: each vector of columns, then one unit for the
    columns short of a vector), every row: the range's columns as pieces (_column_pieces: a partial block, whole
    blocks, a partial block, then the whole vectors past the full blocks), each down all row tiles and then the
    edge rows; the range holding the last unit also does the columns short of a vector.
    A GEMM of few rows and a deep k (small_m_k_block) runs each piece k block by k block, every row tile per k
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
    edge, edge_tiles = edge_rows(gemm.m, blocking), int(gemm.m > m_main)

    def piece_regions(n0: ir.Value, vectors: int, in_block: bool) -> tuple[Region, Region]:
        """The piece's full row tiles and its edge rows."""
        columns = vectors * blocking.lanes
        return (
            Region(0, m_main, n0, columns, blocking.rows, vectors, blocking.lanes, in_block),
            Region(m_main, gemm.m - m_main, n0, columns, edge, vectors, blocking.lanes, in_block),
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
        g: GemmEmitter = gen,
    ) -> None:
        """The piece's row tiles, then its edge rows, over k steps [k0, k0 + steps): at most `most_steps` when
        steps is a runtime value (_k_block_loop); emitted through `g` (an outlined function's, or the launch's)."""
        tiles, edge_region = piece_regions(n0, vectors, in_block)
        zero = ir.Constant(I64_T, 0)
        if g.c_prefetch is not None:  # the next block's lines, while it is this range's (never another thread's)
            g.c_prefetch = zero if ahead is None else g.b.select(ahead, ir.Constant(I64_T, width), zero)
        panel_steps = steps if isinstance(steps, int) else most_steps
        if _packs_b_panel(gemm, blocking, panel_steps):
            _pack_b_panel(g, n0, vectors, k0, steps, panel_steps)
        g.loop(m_main // blocking.rows, lambda it: emit_tile(g, tiles, it, zero, k0, steps, accumulate, final))
        g.loop(edge_tiles, lambda it: emit_tile(g, edge_region, it, zero, k0, steps, accumulate, final))
        g.b_packed = None

    size = small_m_k_block(gemm, blocking)
    if size:
        partials = ir.ArrayType(vector_type(blocking.lanes), gemm.m * blocking.vectors)

        def few_rows(
            g: GemmEmitter, n0: ir.Value, vectors: int, in_block: bool, partial: ir.Value, last_stores: bool = True
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

        def finished(g: GemmEmitter, n0: ir.Value, vectors: int, in_block: bool, partial: ir.Value) -> None:
            """The piece's sums, all of k, from `partial` through the Gemm's epilogue into C."""
            g.partial = partial
            tiles, edge_region = piece_regions(n0, vectors, in_block)
            for region, count in ((tiles, m_main // blocking.rows), (edge_region, edge_tiles)):

                def tile(it: ir.Value, region: Region = region) -> None:
                    emit_tile(g, region, it, ir.Constant(I64_T, 0), steps=0, accumulate=True, final=True)

                g.loop(count, tile)
            g.partial = None

        def piece(n0: ir.Value, vectors: int, ahead: ir.Value | None, in_block: bool) -> None:
            """The piece in one function, or (splits_epilogue) its k blocks and its epilogue in two."""
            if not splits_epilogue(gemm):
                outline(
                    gen,
                    [n0],
                    lambda g, values: few_rows(
                        g, values[0], vectors, in_block, _page_aligned(g.slot("gemm.partial", partials))
                    ),
                )
                return
            partial = _page_aligned(gen.slot("gemm.partial", partials))
            outline(
                gen,
                [n0, partial],
                lambda g, values: few_rows(g, values[0], vectors, in_block, values[1], last_stores=False),
            )
            outline(gen, [n0, partial], lambda g, values: finished(g, values[0], vectors, in_block, values[1]))

        _column_pieces(gen, blocking, begin, end, piece)
    elif gemm.k * gemm.n * 4 <= SWEEP_MAX_B_BYTES:

        def sweeps(k0: ir.Value, steps: int, accumulate: bool, final: bool) -> None:
            def sweep(edge: bool, it: ir.Value) -> None:
                _column_pieces(
                    gen,
                    blocking,
                    begin,
                    end,
                    lambda n0, vectors, ahead, in_block: emit_tile(
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
            gen.loop(edge_tiles, lambda it: sweep(True, it))

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


def _page_aligned(slot: ir.AllocaInstr) -> ir.AllocaInstr:
    """`slot` aligned to PARTIAL_ALIGNMENT."""
    slot.align = PARTIAL_ALIGNMENT
    return slot


def _column_pieces(
    gen: GemmEmitter,
    blocking: GemmBlocking,
    begin: ir.Value,
    end: ir.Value,
    piece: Callable[[ir.Value, int, ir.Value | None, bool], None],
) -> None:
    """piece(first column, vectors, ahead, in_block) over the whole vectors among column units [begin, end): in
    the full column blocks, the vectors before the first whole block and those after the last (fewer than a
    tile's, in one block; `ahead` None), then every whole block (`ahead`: whether the next whole block is this
    range's too), each within one block (`in_block`: a pre-packed B's panel holds it whole, gemm_tiles._b_index);
    then each whole vector past the full blocks on its own. The partial pieces run a vector at a time, both through
    one loop: one single-vector body instead of one per vector count and side, a fraction of the code LLVM
    compiles (a few-row conv's k blocks multiply each body), for a few single-vector tiles in a range at the cut."""
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


def _k_blocks(gen: GemmEmitter, emit: Callable[[ir.Value, int, bool, bool], None], size: int | None = None) -> None:
    """emit(k0, steps, accumulate, final) over the k loop cut into blocks of `size` steps (the blocking's k_block
    by default): the first block writes C (or adds to it when C holds the residual and the sums are kept there: the
    first write would lose it), the later ones (a runtime loop over the middle blocks, then the last, which may be
    shorter) add to it, and only the last (`final`) applies the epilogue. With no size, or k no
    larger, one pass over all of k. An implicit GEMM's k is cut only by small_m_k_block's blocks (whole channels)."""
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


def _k_block_loop(gen: GemmEmitter, emit: Callable[[ir.Value, ir.Value, ir.Value, ir.Value], None], size: int) -> None:
    """emit(k0, steps, accumulate, final) once, in a runtime loop over k cut into blocks of `size` steps (at least
    two: small_m_k_block): accumulate (every block but the first), final (the last) and, unless size divides k
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


def _emit_region(gen: GemmEmitter, region: Region) -> None:
    """Every tile of the region, k block by k block, the tile loops in the blocking's order."""
    width = region.vectors * region.lanes
    if isinstance(region.m, int):
        row_tiles = region.m // region.rows
    else:
        row_tiles = region.m if region.rows == 1 else gen.b.sdiv(region.m, ir.Constant(I64_T, region.rows))
    column_tiles = region.n // width

    def tiles(k0: ir.Value, steps: int, accumulate: bool, final: bool) -> None:
        tile = lambda it, jt: emit_tile(gen, region, it, jt, k0, steps, accumulate, final)  # noqa: E731
        if gen.blocking.order == "rows":
            gen.loop(row_tiles, lambda it: gen.loop(column_tiles, lambda jt: tile(it, jt)))
        else:
            gen.loop(column_tiles, lambda jt: gen.loop(row_tiles, lambda it: tile(it, jt)))

    _k_blocks(gen, tiles)
