"""The GEMM micro-kernel's blocking, decided before any IR is emitted: the register tile's shape (GemmBlocking, what
tuning varies), how an output is cut into regions of uniform tiles (regions, column_tiling), and the k blocks of a
few-row GEMM (small_m_k_block).

Pure Python over a Gemm's sizes: the tuning space, the kernel planner and the emitter (gemm.py) all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from farm.ir import launching
from farm.ir import loopir as L

LOOP_ORDERS = ("columns", "rows")
"""Which tile loop is outer: "columns" (each column panel of B stays in cache while every row tile passes over
it) or "rows" (each row panel of A stays while every column tile passes)."""


SMALL_M_ROWS = 256
"""The most rows of C for which a column-split GEMM keeps partial sums per k block (small_m_k_block)."""
SMALL_M_K_BLOCK = 256
"""k steps per block there (rounded down to whole channels of an implicit GEMM): a panel block of 256 x 48 floats
(48 KB) stays in L1/L2 while every row tile uses it."""
SMALL_M_PACKED_K_BLOCK = 128
"""k steps per block where B is a pre-packed constant (L.Gemm.b_panels: a layer's weights): 24 KB of the panel and
a tile's rows of A stay in L1 together. On one Xeon core, in the model: SqueezeNet's 13x13 classifier 0-5% and
ResNet-50's 7x7 convs 3-10% faster than with 256 (since the pointwise ones read a pixel-major copy,
conv._copies_pixel_major; read transposed, it was no faster); a B of activations keeps 256 (ResNet-50's 56x56
256 -> 64 pointwise convs, k = 256, ran 24-28% slower cut in two blocks)."""


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
        """Columns of one register tile: the block a column-split launch claims (launching.splits_columns)."""
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


WIDE_TILE = (6, 4)
"""(rows, vectors) of the tile that some GEMMs take instead of the 8 x 3 default: few-row column-split ones where that
one splits unevenly (balanced_blocking), and those exactly one such tile wide (single_tile_blocking). The same 24
accumulators, in blocks of 4 vectors (64 columns on AVX-512)."""
SINGLE_TILE_MIN_K = 512
"""The shallowest k for which single_tile_blocking takes WIDE_TILE: its 6-row tiles store a transposed C through a
block of 8 rows, which a short k pays for less. On one Xeon core ResNet-50's 7x7 stem (k = 147) ran 9% slower with
it, a 32 -> 64 channel 3x3 conv (k = 288) as fast, and 64 -> 64 ones (k = 576) 5-6% faster."""
UNEVEN_SPLIT = 0.12
"""How much more than half of a launch's columns the busier of two threads may run, cut at whole blocks
(two_thread_excess), before balanced_blocking takes WIDE_TILE."""
WIDE_TILE_MIN_ROWS = 128
"""The fewest rows for which balanced_blocking takes WIDE_TILE: 6-row tiles leave other edges than 8-row ones, and
with few rows those edges weigh: resnet18_style's 4x4 and 8x8 planes (16 and 64 rows, whole 8-row tiles) ran 7-15%
and 0-4% slower on one thread, Inception-v2's 7x7 convs (49 rows) 2-7%."""
WIDE_TILE_MIN_K = 1024
"""The shallowest k for which balanced_blocking takes WIDE_TILE: a tile of 6 rows costs more to store than one of 8
(a transposed C is turned around in registers), which a short k doesn't pay back. SqueezeNet's 13x13 convs of 256
output channels ran 25-28% slower on one thread at k = 64 (1x1) and 0-5% at k = 576 (3x3); ResNet-50's 14x14
ones, k = 1024 and 2304, 0.96-1.01x."""


def two_thread_excess(units: int, grain: int) -> float:
    """How much more than half of `units` the busier of two threads runs when the units are cut in two at a
    multiple of `grain` (the best such cut): 16 units in blocks of 3 are 9 and 7, 0.125."""
    halves = [max(cut, units - cut) for cut in range(grain, units, grain)]
    return min(halves, default=units) / (units / 2) - 1


def balanced_blocking(gemms: list[L.Gemm], blocking: GemmBlocking) -> GemmBlocking:
    """`blocking`, or WIDE_TILE of its lanes where every Gemm is a few-row column-split one (WIDE_TILE_MIN_ROWS to
    SMALL_M_ROWS rows, split by columns, k at least WIDE_TILE_MIN_K) as wide as whole WIDE_TILE blocks, whose whole
    blocks of `blocking` two threads can't share within UNEVEN_SPLIT; only where `blocking` holds as many
    accumulators as WIDE_TILE (the 8 x 3 default of 32 vector registers).

    Threads' ranges are cut at whole blocks (loopir._gemm_range), so ResNet-50's 14x14 convs of 256 output
    channels, 5 blocks of 48 and a vector, ran 9 vectors on one thread and 7 on the other, which then waited; in 4
    blocks of 64 each thread runs 2. On two Xeon threads light ResNet-50 ran 0.97-0.99x (alternating, whole model)
    and on one 0.99x. In practice this is 256 columns: with 6 x 4 tiles for every few-row GEMM a multiple of 64
    wide, the 7x7 convs of 512 and 2048 channels (their 8 x 3 cut within 6%) ran 2-10% slower on one thread, and
    320 columns (20 vectors: 11 and 9) gained nothing."""
    wide = GemmBlocking(WIDE_TILE[0], WIDE_TILE[1], blocking.lanes)
    if not gemms or blocking.rows * blocking.vectors != wide.rows * wide.vectors:
        return blocking
    for gemm in gemms:
        shaped = WIDE_TILE_MIN_ROWS <= gemm.m <= SMALL_M_ROWS and gemm.k >= WIDE_TILE_MIN_K
        if not shaped or gemm.n % wide.tile_columns or not launching.splits_columns(gemm, blocking.tile_columns):
            return blocking
        units = launching.column_units(gemm, blocking.tile_columns, blocking.vectors)
        if two_thread_excess(units, blocking.vectors) <= UNEVEN_SPLIT:
            return blocking
    return wide


def single_tile_blocking(gemms: list[L.Gemm], blocking: GemmBlocking) -> GemmBlocking:
    """`blocking`, or WIDE_TILE of its lanes where every Gemm is exactly one WIDE_TILE wide (64 columns on AVX-512)
    with k at least SINGLE_TILE_MIN_K; only where `blocking` holds as many accumulators as WIDE_TILE (the 8 x 3
    default of 32 vector registers).

    8 x 3 covers 64 columns as a 3-vector tile and a 1-vector one, which broadcasts each of its 8 A values for a
    single FMA: a quarter of the FMAs at half the rate. One 6 x 4 tile loads 10 values per 24 FMAs. On one Xeon
    core the 64-channel 3x3 convs (k = 576) ran 5-6% faster at 14x14, 28x28, 56x56 and 112x112 (ResNet-50's at
    56x56 172 -> 196 GFLOP/s), since 6-row tiles store a transposed C as vectors (gemm_tiles._store_transposed);
    wider GEMMs, with a 2-vector remainder or none, ran as fast or slower (7x7 512-channel convs 4-6%)."""
    wide = GemmBlocking(WIDE_TILE[0], WIDE_TILE[1], blocking.lanes)
    if not gemms or blocking.rows * blocking.vectors != wide.rows * wide.vectors:
        return blocking
    if all(gemm.n == wide.tile_columns and gemm.k >= SINGLE_TILE_MIN_K for gemm in gemms):
        return wide
    return blocking


@dataclass(frozen=True)
class Region:
    """A rectangle of C tiled uniformly: [m0, m0+m) x [n0, n0+n) in tiles of rows x (vectors * lanes). A runtime
    n0 is a piece of a column-split launch (gemm._column_pieces): `in_block` when it lies within one full column
    block (a pre-packed B's panel holds it), else one vector past them (in the edge columns)."""

    m0: int | ir.Value
    m: int | ir.Value
    n0: int | ir.Value
    n: int
    rows: int
    vectors: int
    lanes: int
    in_block: bool = False


def column_tiling(n: int, blocking: GemmBlocking) -> list[tuple[int, int, int, int]]:
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


def regions(m: int, n: int, blocking: GemmBlocking) -> list[Region]:
    """Cover an m x n output with the column groups of `column_tiling`, each in full row tiles then one tile of the
    rows past them (edge_rows)."""
    m_main = m // blocking.rows * blocking.rows
    rows = [(0, m_main, blocking.rows), (m_main, m - m_main, edge_rows(m, blocking))]
    return [
        Region(m0, mc, n0, nc, r, v, lanes)
        for n0, nc, v, lanes in column_tiling(n, blocking)
        for m0, mc, r in rows
        if mc and nc
    ]


def edge_rows(m: int, blocking: GemmBlocking) -> int:
    """Rows of the one tile that covers the m % rows rows of C past the full row tiles (1 when there are none).
    As single-row tiles, each of those rows read every vector of B again: a 512-channel 3x3 conv on a 2x2 plane (4
    rows of C, all past the full tiles) read its 9.4 MB of weights four times through L1, 466 us on one Xeon core
    against onnxruntime's 373."""
    return max(1, m % blocking.rows)


def _halvings(lanes: int) -> list[int]:
    return [lanes >> shift for shift in range(1, lanes.bit_length()) if lanes >> shift]


def small_m_k_block(gemm: L.Gemm, blocking: GemmBlocking) -> int:
    """k steps per block when a column block of a few-row GEMM runs k block by k block (0: it doesn't). With at
    most SMALL_M_ROWS rows, each column panel of B serves only a handful of row tiles: over all of k, the first
    tile reads the panel from memory and the others from cache, so that first pass is bound by memory bandwidth
    (light ResNet-50's 7x7-plane convs: 4608 x 48 floats of weights a panel, 46-57% of a core's peak). A block
    of SMALL_M_K_BLOCK steps (whole channels of an implicit GEMM) is read once and used by every row tile while it
    is in L1, the weights streaming at the pace of the FMAs. Where k allows, a block is the largest number of
    whole channels down to half of SMALL_M_K_BLOCK that divides k, so that every block has the same, constant
    number of steps (gemm._k_block_loop): ResNet's 3x3 convs of 256 or 512 channels take 144 steps, not 252."""
    if gemm.m > SMALL_M_ROWS:
        return 0
    taps = gemm.a_window.kernel_height * gemm.a_window.kernel_width if gemm.a_window else 1
    size = max(1, (SMALL_M_PACKED_K_BLOCK if gemm.b_panels else SMALL_M_K_BLOCK) // taps) * taps
    if gemm.k < 2 * size:
        return 0
    dividing = [steps for steps in range(size, size // 2 - 1, -taps) if gemm.k % steps == 0]
    return dividing[0] if dividing else size
