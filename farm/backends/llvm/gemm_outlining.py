"""How a kernel's code is split into parts: which Gemm launches put their heaviest code into functions of their own
(outlined_functions), how many parts a kernel has at most (MAX_PARTS), and which part each function goes into
(Outlining).

Decided from a Gemm's sizes and blocking alone, before any IR: kernel.py counts a kernel's parts from it, and the
emitter (gemm_emitter.outline) places each outlined function by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from farm.backends.llvm.gemm_blocking import GemmBlocking, column_tiling, small_m_k_block
from farm.ir import launching
from farm.ir import loopir as L

MAX_PARTS = 7
"""The most objects a kernel's code is split into (Outlining): its launches, then up to five parts holding its
outlined functions (light ResNet-50's few-row 3x3 convs: a launch's three pieces, 0.19-0.26 s of a 0.55 s unit
each; its 7x7 stem's four regions, two of which shared a part of 0.3 s; its strided 1x1 convs' twelve regions)."""
ROW_SPLIT_MIN_GROUPS = 3
"""The fewest column groups (column_tiling) for which a row-split GEMM without a window outlines its regions: each
group is two regions of tile code (full row tiles, edge rows), and three or more (light ResNet-50's strided 1x1
convs, n = 504 and 280 columns: full blocks, one or two vectors, a half vector) compiled in 0.2-0.35 s as one
unit."""


def outlined_functions(gemm: L.Gemm, blocking: GemmBlocking) -> int:
    """How many functions of its own a Gemm launch's heaviest code goes into (gemm.emit_gemm with an Outlining): a
    few-row column-split GEMM's (small_m_k_block) three pieces, each with all its k blocks (gemm._column_pieces: the
    vectors before and after the whole blocks, the whole blocks, the vectors past the full blocks); a row-split
    GEMM's regions (every column group's full row tiles and edge rows: gemm._emit_rows) where it is implicit, whose
    tap loops LLVM unrolls (a 7x7 stem: 49 taps a k step), or has many column groups (outlines_rows). Those were
    the longest compile units of a build, serial on one worker however many the farm has; other GEMMs compile in a
    fraction of that and stay whole."""
    if launching.splits_columns(gemm, blocking.tile_columns):
        return 0 if not small_m_k_block(gemm, blocking) else 6 if splits_epilogue(gemm) else 3
    return 2 * _column_groups(gemm, blocking) if outlines_rows(gemm, blocking) else 0


def splits_epilogue(gemm: L.Gemm) -> bool:
    """Whether a few-row GEMM's pieces (small_m_k_block) store their sums through the epilogue in functions of
    their own, apart from their k blocks: an implicit GEMM's, whose 8-row tiles' final store (C transposed, with the
    bias and activation) was 40% of its largest piece's code, light ResNet-50's longest unit (0.3-0.45 s on this
    2-core Zen 4, loaded). A plain GEMM's stay whole: the FC layer's GEMM (1 x 1000 x 2048) ran 1.19x slower split,
    and compiles fast as it is."""
    return gemm.a_window is not None


def _column_groups(gemm: L.Gemm, blocking: GemmBlocking) -> int:
    """How many column groups (column_tiling) of the Gemm's n hold columns."""
    return sum(1 for _, columns, _, _ in column_tiling(gemm.n, blocking) if columns)


def outlines_rows(gemm: L.Gemm, blocking: GemmBlocking) -> bool:
    """Whether a row-split GEMM's regions go into functions of their own (gemm._emit_rows, when the kernel is split):
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
