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
    transposed) for its B, (lanes, k, n, transposed, flip) for an IntGemm's byte B; ValueError as
    farm.backends.llvm.packing.pack_operand raises it."""
    if len(panels) not in (3, 4, 5) or min(panels[:3]) < 1 or panels[3:4] not in ((), (0,), (1,)):
        raise ValueError(
            f"panels {list(panels)} are neither (rows, m, k), (width, k, n, transposed) nor (lanes, k, n, "
            f"transposed, flip), each size positive, transposed 0 or 1"
        )
    if len(panels) == 5:
        return _pack_bytes(memoryview(data).cast("B"), panels)
    values = array(WORD)
    values.frombytes(data)
    if len(values) % (panels[1] * panels[2]):
        raise ValueError(f"{len(values)} floats are not float32 blocks of {panels[1]} x {panels[2]}")
    packed = array(WORD, bytes(len(data)))
    LAYOUTS[len(panels)](values, packed, panels)
    return packed.tobytes()


FLIPPED = bytes(value ^ 0x80 for value in range(256))
"""bytes.translate's table for a uint8 B read as int8 (each byte xor 0x80)."""


def _pack_bytes(data: memoryview, panels: tuple[int, ...]) -> bytes:
    """Per k x n block of bytes (n x k when transposed), per `lanes` columns, per group of four k, each column's four
    bytes side by side, as farm.backends.llvm.packing.pack_byte_panels: a transposed block's column is contiguous,
    so its groups are 4-byte words copied to every lanes-th word of the panel, one strided copy per column; a
    row-major block's bytes go one row of a panel's columns at a time."""
    lanes, k, n, transposed, flip = panels
    if flip not in (0, 1) or k % 4 or n % lanes or len(data) % (k * n):
        raise ValueError(f"{len(data)} bytes are not byte panels {list(panels)}")
    packed = bytearray(len(data))
    groups = k // 4
    for base in range(0, len(data), k * n):
        if transposed:
            words, out = array(WORD, bytes(data[base : base + k * n])), array(WORD, bytes(k * n))
            for column in range(n):
                panel, lane = divmod(column, lanes)
                first = panel * groups * lanes + lane
                out[first : first + groups * lanes : lanes] = words[column * groups : (column + 1) * groups]
            packed[base : base + k * n] = out.tobytes()
            continue
        for panel in range(n // lanes):
            for group in range(groups):
                at = base + (panel * groups + group) * lanes * 4
                for way in range(4):
                    row = base + (group * 4 + way) * n + panel * lanes
                    packed[at + way : at + lanes * 4 : 4] = data[row : row + lanes]
    return bytes(packed).translate(FLIPPED) if flip else bytes(packed)


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
