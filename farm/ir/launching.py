"""How a loop-IR kernel (farm.ir.loopir) runs as launches, one after another, each across many workers.

`launch_groups` splits a kernel into them and gives each its LaunchKind (a Gemm, a parallel loop, or serial
statements) once, so that both renderers and `launch_info` (the CPU runtime's launch table) dispatch on the same
kinds; `work` weighs what a launch runs, which the runtime sets against the cost of splitting it across threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from farm.ir.loopir import Gemm, If, IntGemm, Loop, LoopKernel, Stmt


def peel(stmts: list[Stmt], fixed: list[str]) -> list[Stmt]:
    """Top-level loops of extent 1 (a batch of one, a single group) unwrapped; their variables are fixed at 0."""
    peeled: list[Stmt] = []
    for stmt in stmts:
        if isinstance(stmt, Loop) and stmt.extent == 1:
            fixed.append(stmt.var.name)
            peeled += peel(stmt.body, fixed)
        else:
            peeled.append(stmt)
    return peeled


class LaunchKind(str, Enum):
    """How a launch runs, decided once here so that every backend and the CPU runtime's launch table agree."""

    GEMM = "gemm"
    """A Gemm alone, split by rows (or blocks of columns) of C."""
    PARALLEL = "parallel"
    """A parallel loop alone, split by its iterations."""
    SERIAL = "serial"
    """Consecutive other statements, run in order by one worker."""


@dataclass
class LaunchGroup:
    """The statements of one launch and their kind: a GEMM or PARALLEL launch holds its Gemm or parallel Loop
    alone."""

    kind: LaunchKind
    stmts: list[Stmt]

    @property
    def head(self) -> Stmt:
        """The Gemm of a GEMM launch, the loop of a PARALLEL one (a SERIAL launch's first statement)."""
        return self.stmts[0]

    @property
    def gemm(self) -> Gemm:
        """The Gemm of a GEMM launch."""
        head = self.head
        assert isinstance(head, Gemm), f"a {self.kind.value} launch holds no Gemm"
        return head

    @property
    def loop(self) -> Loop:
        """The parallel loop of a PARALLEL launch."""
        head = self.head
        assert isinstance(head, Loop), f"a {self.kind.value} launch holds no loop"
        return head


def launch_kind(stmt: Stmt) -> LaunchKind:
    """The kind of launch `stmt` starts: a Gemm or a parallel loop runs alone; other statements share one serial
    launch."""
    if isinstance(stmt, Gemm):
        return LaunchKind.GEMM
    if isinstance(stmt, Loop) and stmt.parallel:
        return LaunchKind.PARALLEL
    return LaunchKind.SERIAL


def runs_nothing(stmt: Stmt) -> bool:
    """Whether `stmt` does nothing at all: a loop of extent 0 or of only such statements, or a Gemm with no element
    of C (the loops over an empty tensor). Such a statement becomes no launch: OpenCL refuses a launch of 0
    work-items, and a launch whose work-items do nothing would only cost its start."""
    if isinstance(stmt, Loop):
        return stmt.extent == 0 or all(runs_nothing(inner) for inner in stmt.body)
    return isinstance(stmt, Gemm) and stmt.m * stmt.n == 0


def launch_groups(kernel: LoopKernel) -> tuple[list[str], list[LaunchGroup]]:
    """The fixed variables and the groups of statements that each become one launch: a parallel loop or a Gemm
    alone, consecutive other statements together (run by one worker); top-level statements that run nothing
    (`runs_nothing`) are left out. Both renderers split kernels this way."""
    fixed: list[str] = []
    groups: list[LaunchGroup] = []
    for stmt in peel(kernel.body, fixed):
        if runs_nothing(stmt):
            continue
        kind = launch_kind(stmt)
        if kind is LaunchKind.SERIAL and groups and groups[-1].kind is LaunchKind.SERIAL:
            groups[-1].stmts.append(stmt)
        else:
            groups.append(LaunchGroup(kind, [stmt]))
    return fixed, groups


GEMM_WORK_DIVISOR, INT_GEMM_WORK_DIVISOR, INT_GEMM_BYTES_PER_WORK = 16, 64, 8
"""Products per unit of work: a Gemm's FMAs (gemm_work), an IntGemm's (by default one 16-lane dot-product instruction's;
DotProduct.work_divisor), or its B bytes where more (a few rows streaming a conv's weights: a 2x2 plane's)."""


def work(stmts: list[Stmt], int_gemm_divisor: int = INT_GEMM_WORK_DIVISOR) -> int:
    """A rough measure of the time `stmts` take, in innermost statements run (each about 0.3-1 ns on a 2020s core
    once vectorised); a Gemm counts gemm_work, an IntGemm its products by `int_gemm_divisor` (the target's dot
    product's). What a runtime weighs against the cost of splitting a launch across threads."""
    total = 0
    for stmt in stmts:
        if isinstance(stmt, Loop):
            total += stmt.extent * work(stmt.body, int_gemm_divisor)
        elif isinstance(stmt, If):
            total += 1 + work(stmt.body, int_gemm_divisor)
        elif isinstance(stmt, Gemm):
            total += gemm_work(stmt)
        elif isinstance(stmt, IntGemm):
            total += max(stmt.m * stmt.n * stmt.k // int_gemm_divisor, stmt.n * stmt.k // INT_GEMM_BYTES_PER_WORK)
        else:
            total += 1
    return total


def gemm_work(gemm: Gemm) -> int:
    """A Gemm's FMAs, or its operands' bytes where more (a few-row GEMM streams its weights: by FMAs, resnet18_style's
    2 MB classifier, 76 us on one Xeon core, weighed too little to split), by GEMM_WORK_DIVISOR."""
    return max(gemm.m * gemm.n * gemm.k, 4 * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)) // GEMM_WORK_DIVISOR


@dataclass(frozen=True)
class LaunchInfo:
    """One launch of a kernel as a CPU runtime sees it: its iterations [0, extent) may be split into contiguous
    ranges at multiples of `grain` (the rows of a Gemm, the iterations of a parallel loop); a serial launch has
    extent 1. `work` estimates the whole launch's scalar operations."""

    extent: int
    grain: int
    work: int

    def to_json(self) -> list[int]:
        return [self.extent, self.grain, self.work]


def splits_columns(gemm: Gemm, tile_columns: int) -> bool:
    """Whether a Gemm launch is split by blocks of `tile_columns` columns rather than by rows: when B (k x n) is the
    larger operand. Every range reads all of the operand the split doesn't cut, so cutting rows makes each range
    stream all of B (a conv's 128x1152 weights by a 1152x3136 im2col matrix: 8 ranges read 14 MB 8 times, and two
    threads ran slower than one); cutting columns re-reads only A. 0 columns: always rows."""
    return tile_columns > 0 and gemm.n > gemm.m and gemm.n >= 2 * tile_columns


def column_units(gemm: Gemm, tile_columns: int, vectors: int) -> int:
    """How many units a column-split Gemm launch (splits_columns) is cut in: each vector (tile_columns / vectors
    columns), then one unit for the columns short of a vector. Cut at vectors, a GEMM of few blocks still splits
    evenly: 256 columns in blocks of 48 gave two threads 144 and 112 columns (3 blocks each, the last 16 wide), 8
    vectors of 16 each now; and the vectors past the full blocks are units of their own (512 columns: 32 units,
    where one unit of the last 32 columns left a thread 2 vectors behind on every 7x7 conv of ResNet-50)."""
    return -(-gemm.n // (tile_columns // vectors))


def _gemm_range(gemm: Gemm, gemm_rows: int, gemm_columns: int, gemm_vectors: int) -> tuple[int, int]:
    """Column units (column_units) in grains of a whole block's vectors where splits_columns says so, else rows in
    multiples of the register tile's: a range cut inside a block runs pieces of 1-2 vectors (docs/architecture.md)."""
    if splits_columns(gemm, gemm_columns):
        return column_units(gemm, gemm_columns, gemm_vectors), gemm_vectors
    return gemm.m, gemm_rows


def _parallel_range(loop: Loop, gemm_rows: int, gemm_columns: int, gemm_vectors: int) -> tuple[int, int]:
    return loop.extent, 1


def _serial_range(first: Stmt, gemm_rows: int, gemm_columns: int, gemm_vectors: int) -> tuple[int, int]:
    return 1, 1


LAUNCH_RANGES: dict[LaunchKind, Callable[[Any, int, int, int], tuple[int, int]]] = {
    LaunchKind.GEMM: _gemm_range,
    LaunchKind.PARALLEL: _parallel_range,
    LaunchKind.SERIAL: _serial_range,
}
"""(extent, grain) of a launch of each kind, from its head statement and the Gemm tile's rows, columns and vectors."""


def launch_info(
    kernel: LoopKernel,
    gemm_rows: int,
    gemm_columns: int = 0,
    gemm_vectors: int = 1,
    int_gemm_divisor: int = INT_GEMM_WORK_DIVISOR,
) -> list[LaunchInfo]:
    """Every launch of `kernel`, in order; a Gemm splits by rows in multiples of `gemm_rows` (its register tile),
    or by the column units of a tile `gemm_columns` wide in `gemm_vectors` vectors (see splits_columns and
    column_units). Each launch's work counts an IntGemm's products by `int_gemm_divisor` (the target's dot
    product's, DotProduct.work_divisor)."""
    return [
        LaunchInfo(
            *LAUNCH_RANGES[group.kind](group.head, gemm_rows, gemm_columns, gemm_vectors),
            work(group.stmts, int_gemm_divisor),
        )
        for group in launch_groups(kernel)[1]
    ]
