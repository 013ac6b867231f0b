"""One register tile of the GEMM (emit_tile): its accumulators, its k loop (plain, or an implicit GEMM's window of
taps), the addresses of A, B and C it reads and writes in each of their layouts, and its store (through the epilogue,
into partial sums, or turned around in registers for a transposed C).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from farm.backends.llvm.gemm_blocking import Region
from farm.backends.llvm.gemm_emitter import (
    F32_T,
    I32_T,
    I64_T,
    GemmEmitter,
    i64,
    intrinsic,
    lanes_of,
    load_c,
    load_floats,
    prefetch,
    splat,
    store_c,
    vector_type,
)
from farm.backends.llvm.gemm_epilogue import apply_epilogue
from farm.ir import loopir as L


def panel_vector(gen: GemmEmitter, panel: ir.Value, index: ir.Value) -> ir.Value:
    """The address of vector `index` of a panel packed on the fly (gemm._pack_b_panel)."""
    return gen.b.gep(panel, [ir.Constant(I32_T, 0), index], inbounds=True)


def emit_tile(
    gen: GemmEmitter,
    region: Region,
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
    gemm._k_block_loop), so that one body serves every k block."""
    b, g = gen.b, gen.gemm
    k0 = ir.Constant(I64_T, 0) if k0 is None else k0
    steps = g.k if steps is None else steps
    vec_t = vector_type(region.lanes)
    m0 = b.add(i64(region.m0), b.mul(it, ir.Constant(I64_T, region.rows)))
    n0 = b.add(i64(region.n0), b.mul(jt, ir.Constant(I64_T, region.vectors * region.lanes)))
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
                kept_sums = load_c(gen, gen.c, index, vec_t) if gen.partial is None else b.load(partial)
                start = kept_sums if accumulate is True else b.select(accumulate, kept_sums, start)
            b.store(start, acc)
    fma = intrinsic(b.module, "llvm.fmuladd", vec_t, 3)
    # A pre-packed A (a conv's weights) is read panel after panel, one per row tile; each k step prefetches the
    # next panel's values at the same k, so they come from L2, not memory, when the next tile starts: a layer's
    # weights are cold once a run (docs/architecture.md, Code generation: ResNet-50's 14x14 pointwise convs).
    a_ahead = ir.Constant(I64_T, region.rows * g.k) if g.a_panels and region.rows == gen.blocking.rows else None
    if gen.c_prefetch is not None and final is True and not g.c_transposed:  # see gemm._emit_column_blocks
        ahead = gen.c_prefetch
        for row in outputs:
            for start, _ in row:
                prefetch(gen, gen.address(gen.c, b.add(start, ahead)), write=True)
                if g.epilogue is not None and g.epilogue.residual is not None and not gen.residual_in_c:
                    prefetch(gen, gen.address(gen.residual, b.add(start, ahead)))

    def step(k: ir.Value, a_indices: list[ir.Value]) -> None:
        if gen.b_packed is not None:
            panel, packed_k0, packed_vectors = gen.b_packed
            row_start = gen.offset((b.sub(k, packed_k0), packed_vectors))
            loaded = [
                b.load(panel_vector(gen, panel, b.add(row_start, ir.Constant(I64_T, j)))) for j in range(region.vectors)
            ]
        else:
            b_indices = [_b_index(gen, region, n0, j, k) for j in range(region.vectors)]
            loaded = [load_floats(b, gen.address(gen.bm, index), vec_t) for index in b_indices]
            if gen.prefetch:
                for index in b_indices:
                    prefetch(gen, gen.address(gen.bm, b.add(index, ir.Constant(I64_T, gen.prefetch))))
        if a_ahead:
            prefetch(gen, gen.address(gen.a, b.add(a_indices[0], a_ahead)))
        for row, a_index in zip(accs, a_indices):
            scalar = b.load(gen.address(gen.a, a_index), align=4, typ=F32_T)
            a_value = splat(b, scalar, region.lanes)
            for acc, b_value in zip(row, loaded):
                b.store(b.call(fma, [a_value, b_value, b.load(acc)]), acc)

    if isinstance(steps, int) and steps == 0:  # kept sums through the epilogue alone (gemm._emit_column_blocks)
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
    gen: GemmEmitter,
    region: Region,
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
                store_c(gen, apply_epilogue(gen, epilogue, value, place, index) if epilogue else value, index)


def _transposes_in_registers(gemm: L.Gemm, region: Region) -> bool:
    """Whether a tile's final store to a transposed C (L.Gemm.c_transposed) goes through _store_transposed: tiles
    of at least 2 rows whose count rounded up to a power of two is at most the lanes (a power of two too)."""
    rows, lanes = region.rows, region.lanes
    return gemm.c_transposed and 2 <= _transposed_height(rows) <= lanes and not lanes & (lanes - 1)


def _transposed_height(rows: int) -> int:
    """The rows of the square block a tile of `rows` rows is turned around as: rows rounded up to a power of two,
    the extra rows undefined and never stored."""
    return 1 << (rows - 1).bit_length()


def _interleave(b: ir.IRBuilder, x: ir.Value, y: ir.Value, high: bool) -> ir.Value:
    """x0 y0 x1 y1 ... of the low (or high) halves of two vectors: one two-source permute (vpermt2ps on AVX-512)."""
    lanes = lanes_of(x.type)
    first = lanes // 2 if high else 0
    mask = [index for lane in range(first, first + lanes // 2) for index in (lane, lane + lanes)]
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32_T, lanes), mask))


def _store_transposed(
    gen: GemmEmitter, epilogue: L.GemmEpilogue | None, values: list[ir.Value], m0: ir.Value, n0: ir.Value
) -> None:
    """Store one vector column of a tile (R rows of C[m0 + i, n0:n0 + lanes]) to a transposed C, where each column
    n holds the R rows side by side. log2(R) rounds of interleaving the vectors i and i + R/2 (a perfect shuffle)
    turn the R x lanes block around: vector v then holds columns n0 + v * lanes/R ..., each as R contiguous rows.
    Each such piece is one vector store (and its epilogue runs along m), instead of one scalar store per value:
    a 3x3 conv run pixels as rows made 384 scalar stores per 8 x 48 tile."""
    b, rows, lanes = gen.b, len(values), lanes_of(values[0].type)
    height = _transposed_height(rows)
    values = values + [ir.Constant(values[0].type, ir.Undefined)] * (height - rows)
    for _ in range(height.bit_length() - 1):
        half = height // 2
        values = [
            _interleave(b, values[pair], values[pair + half], high) for pair in range(half) for high in (False, True)
        ]
    per_vector = lanes // height
    for column in range(lanes):
        vector, slot = divmod(column, per_vector)
        n = b.add(n0, ir.Constant(I64_T, column))
        start, _ = _c_index(gen, m0, n)  # the column's rows lie side by side from there
        for first, size in _row_runs(rows):
            piece = _lanes(b, values[vector], slot * height + first, size)
            m, at = b.add(m0, ir.Constant(I64_T, first)), b.add(start, ir.Constant(I64_T, first))
            if epilogue is not None:
                piece = apply_epilogue(gen, epilogue, piece, (m, n), (at, 1), along_rows=True)
            gen.b.store(piece, gen.address(gen.c, at), align=4)


def _row_runs(rows: int) -> list[tuple[int, int]]:
    """(first row, rows) of the power-of-two runs, largest first, that a column of a transposed tile of `rows` rows
    is stored in: 6 rows as 4 and 2. LLVM's x86 backend failed to select some vectors of 3, 5, 6 or 7 floats."""
    runs, first = [], 0
    for bit in reversed(range(rows.bit_length())):
        if rows >> bit & 1:
            runs.append((first, 1 << bit))
            first += 1 << bit
    return runs


def _lanes(b: ir.IRBuilder, vector: ir.Value, first: int, count: int) -> ir.Value:
    """Lanes [first, first + count) of `vector`: a vector of `count` floats, or one float."""
    if count == 1:
        return b.extract_element(vector, ir.Constant(I32_T, first))
    mask = ir.Constant(ir.VectorType(I32_T, count), list(range(first, first + count)))
    return b.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined), mask)


def _partial_index(gen: GemmEmitter, region: Region, m: ir.Value, j: int) -> ir.Value | None:
    """The address of a tile's partial sums for row m, vector j (gen.partial: the `vectors` vectors of each row,
    row after row); None without a partial buffer."""
    if gen.partial is None:
        return None
    index = gen.b.add(gen.b.mul(m, ir.Constant(I64_T, region.vectors)), ir.Constant(I64_T, j))
    return gen.b.gep(gen.partial, [ir.Constant(I32_T, 0), index], inbounds=True)


WINDOW_PREFETCH_CHANNELS = 2
"""How many channels ahead an implicit GEMM's tile prefetches its window rows (_window_steps). 1, 4 and 8 gave the
same times as 2 on VGG-19's big-plane convs; without it, they ran 5% slower on one thread and 8% on two."""

STRIDE_PREFETCHER_BYTES, F32_BYTES = 2048, 4
"""The largest stride that the cores' own stride prefetcher follows (Intel's L1 IP prefetcher: 2 KB). A tile's
k loop steps from one channel's plane to the next; past this stride each channel's rows are fetched on demand
from L3, unless the tile prefetches them itself."""


def _prefetches_window(window: L.ImplicitColumns) -> bool:
    """Whether a tile prefetches its window rows a few channels ahead: only where the planes are further apart than
    the hardware follows (padded planes of over 512 floats, 23x23 and up). ResNet-18's 2x2-plane 512-channel conv
    ran 13% slower with it."""
    return window.plane * F32_BYTES > STRIDE_PREFETCHER_BYTES


def _window_steps(
    gen: GemmEmitter,
    window: L.ImplicitColumns,
    rows: list[ir.Value],
    step: Callable[[ir.Value, list[ir.Value]], None],
    k0: ir.Value,
    steps: int | ir.Value,
) -> None:
    """The k steps [k0, k0 + steps) of an implicit GEMM (L.ImplicitColumns; whole channels) as loops over
    channels and kernel rows, a row's kernel columns one after another: each row's base in the padded plane is
    computed once per tile, and each k step adds the tap's offset. The columns are laid out here, not left to
    LLVM's unroller, which a GEMM part is compiled without (kernel.kernel_pipeline)."""
    b, width = gen.b, ir.Constant(I64_T, window.out_width)
    bases = [gen.offset((b.sdiv(m, width), window.row_step), (b.srem(m, width), window.column_step)) for m in rows]
    taps = window.kernel_height * window.kernel_width
    first = b.sdiv(k0, ir.Constant(I64_T, taps))

    prefetches = _prefetches_window(window)

    def tap(channel: ir.Value, r: ir.Value, s: int) -> None:
        k = gen.offset((channel, taps), (r, window.kernel_width), (s, 1))
        offset = gen.offset((channel, window.plane), (r, window.tap_row_step), (s, window.tap_column_step))
        step(k, [b.add(base, offset) for base in bases])

    def tap_row(index: ir.Value, r: ir.Value) -> None:
        channel = b.add(first, index)
        if prefetches:
            ahead = gen.offset(
                (channel, window.plane), (r, window.tap_row_step), (WINDOW_PREFETCH_CHANNELS, window.plane)
            )
            last_tap = ir.Constant(I64_T, (window.kernel_width - 1) * window.tap_column_step)
            prefetch(gen, gen.address(gen.a, b.add(bases[0], ahead)))
            prefetch(gen, gen.address(gen.a, b.add(bases[-1], b.add(ahead, last_tap))))
        for s in range(window.kernel_width):
            tap(channel, r, s)

    channels = steps // taps if isinstance(steps, int) else b.sdiv(steps, ir.Constant(I64_T, taps))
    gen.loop(channels, lambda index: gen.loop(window.kernel_height, lambda r: tap_row(index, r)))


def _c_index(gen: GemmEmitter, m: ir.Value, n: ir.Value) -> tuple[ir.Value, int]:
    """Where C[m, n] is, and the element stride along n: 1 row-major, ldc when C is stored transposed
    (L.Gemm.c_transposed)."""
    g = gen.gemm
    if g.c_transposed:
        return gen.offset((n, g.ldc), (m, 1)), g.ldc
    return gen.offset((m, g.ldc), (n, 1)), 1


def _a_index(gen: GemmEmitter, region: Region, m0: ir.Value, i: int, k: ir.Value) -> ir.Value:
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


def _b_index(gen: GemmEmitter, region: Region, n0: ir.Value, j: int, k: ir.Value) -> ir.Value:
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
