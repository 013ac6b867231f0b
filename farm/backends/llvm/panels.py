"""The panel layouts of pre-packed GEMM operands (farm.backends.llvm.packing.PANEL_LAYOUTS) without numpy: what a
client install, which has no numpy, runs to make an artifact's packed weights from their weights
(farm.distributed.recipes.Derivation). Packing moves 4-byte values and computes nothing, so each layout is a few
strided copies of the `array` module per panel lane (C loops, not Python ones), bit for bit what numpy's packing
gives (tests/test_panels.py checks every layout against it).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

WORD = next(code for code in "IL" if array(code).itemsize == 4)
"""An unsigned 4-byte array type: values are copied as integers, so no float conversion can touch a NaN's bits."""


def pack(data: bytes | memoryview, panels: tuple[int, ...]) -> bytes:
    """The 4-byte values `data` in the panel layout `panels` describes: (rows, m, k) for a GEMM's A, (width, k, n,
    transposed) for its B; ValueError as farm.backends.llvm.packing.pack_operand raises it."""
    if len(panels) not in LAYOUTS or min(panels[:3]) < 1 or panels[3:] not in ((), (0,), (1,)):
        raise ValueError(
            f"panels {list(panels)} are neither (rows, m, k) nor (width, k, n, transposed), each "
            f"positive, transposed 0 or 1"
        )
    values = array(WORD)
    values.frombytes(data)
    if len(values) % (panels[1] * panels[2]):
        raise ValueError(f"{len(values)} floats are not float32 blocks of {panels[1]} x {panels[2]}")
    packed = array(WORD, bytes(len(data)))
    LAYOUTS[len(panels)](values, packed, panels)
    return packed.tobytes()


def _pack_a(values: array, packed: array, panels: tuple[int, ...]) -> None:
    """Per m x k block (row-major): the full panels of `rows` rows k-major, then the m % rows edge rows k-major."""
    rows, m, k = panels
    main = m // rows * rows
    for base in range(0, len(values), m * k):
        for panel in range(0, main, rows):
            for row in range(rows):
                start = base + panel * k + row
                packed[start : start + k * rows : rows] = values[
                    base + (panel + row) * k : base + (panel + row + 1) * k
                ]
        _edge(values, packed, base, main, m, k, lambda row: row * k, 1)


def _pack_b(values: array, packed: array, panels: tuple[int, ...]) -> None:
    """Per k x n block (row-major; n x k when transposed): the full column panels of `width` columns k-major, then
    the n % width edge columns row-major."""
    width, k, n, transposed = panels
    main = n // width * width
    for base in range(0, len(values), k * n):
        if transposed:  # a column is contiguous: one strided copy per lane
            for panel in range(0, main, width):
                for lane in range(width):
                    start, column = base + panel * k + lane, base + (panel + lane) * k
                    packed[start : start + k * width : width] = values[column : column + k]
        else:  # a panel row's `width` values are contiguous: one copy of their bytes per row
            source, target, size = memoryview(values).cast("B"), memoryview(packed).cast("B"), 4 * width
            at = 4 * base
            for panel in range(4 * base, 4 * (base + main), size):
                for row in range(panel, panel + 4 * k * n, 4 * n):
                    target[at : at + size] = source[row : row + size]
                    at += size
        _edge(
            values, packed, base, main, n, k, lambda column: column * (k if transposed else 1), 1 if transposed else n
        )


def _edge(
    values: array, packed: array, base: int, main: int, size: int, k: int, first: Callable[[int], int], step: int
) -> None:
    """The edge after the full panels (lines main..size of the block), k-major: line `line`'s k values, which
    start first(line) into the block, `step` apart, go `size - main` apart."""
    edge = size - main
    for line in range(main, size):
        start, source = base + main * k + line - main, base + first(line)
        packed[start : start + k * edge : edge] = values[source : source + k * step : step]


LAYOUTS: dict[int, Callable[[array, array, tuple[int, ...]], None]] = {3: _pack_a, 4: _pack_b}
"""Each layout by the length of its panels tuple, as farm.backends.llvm.packing.PANEL_LAYOUTS."""
