"""farm.backends.llvm.panels: the packed weights' panel layouts without numpy (a client install makes them so),
bit for bit what the workers' numpy packing gives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from farm.backends.llvm.packing import pack_operand
from farm.backends.llvm.panels import pack

RNG = np.random.default_rng(11)


@pytest.mark.parametrize(
    ("rows", "m", "k", "blocks"), list(itertools.product([1, 4, 6], [1, 5, 8, 13], [1, 3, 16], [1, 2]))
)
def test_a_panels_are_the_workers_bytes(rows: int, m: int, k: int, blocks: int) -> None:
    values = RNG.standard_normal(blocks * m * k).astype(np.float32)
    assert pack(values.tobytes(), (rows, m, k)) == pack_operand(values, (rows, m, k)).tobytes()


@pytest.mark.parametrize(
    ("width", "k", "n", "transposed", "blocks"),
    list(itertools.product([1, 4, 48], [1, 3, 17], [1, 5, 48, 100], [0, 1], [1, 3])),
)
def test_b_panels_are_the_workers_bytes(width: int, k: int, n: int, transposed: int, blocks: int) -> None:
    values = RNG.standard_normal(blocks * k * n).astype(np.float32)
    panels = (width, k, n, transposed)
    assert pack(values.tobytes(), panels) == pack_operand(values, panels).tobytes()


def test_values_are_moved_bit_for_bit_nans_included() -> None:
    """Values are copied as 4-byte integers: a signalling NaN's payload survives, as numpy's copy keeps it."""
    values = np.array([0x7FA00001, 0xFFC12345, 0x00000001, 0x80000000] * 6, dtype=np.uint32)
    assert pack(values.tobytes(), (4, 6, 4, 0)) == pack_operand(values.view(np.float32), (4, 6, 4, 0)).tobytes()


@pytest.mark.parametrize(
    ("panels", "size", "error"),
    [
        ((2, 3), 6, "neither"),
        ((0, 3, 2), 6, "neither"),
        ((2, 3, 2, 2), 6, "neither"),
        ((2, 4, 4, 0), 6, "blocks"),
    ],
)
def test_panels_that_are_not_a_layout_or_values_that_are_not_whole_blocks_are_refused(
    panels: tuple[int, ...], size: int, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        pack(bytes(4 * size), panels)
    with pytest.raises(ValueError, match=error):
        pack_operand(np.zeros(size, np.float32), panels)


@pytest.mark.parametrize(
    ("k", "n", "transposed", "flip", "blocks"),
    list(itertools.product([4, 36, 128], [16, 48], [0, 1], [0, 1], [1, 2])),
)
def test_byte_panels_are_the_workers_bytes(k: int, n: int, transposed: int, flip: int, blocks: int) -> None:
    """An IntGemm's byte B (L.IntGemm.b_panels): each column's four k bytes side by side, 16 columns a panel."""
    values = RNG.integers(0, 256, blocks * k * n).astype(np.uint8)
    panels = (16, k, n, transposed, flip)
    assert pack(values.tobytes(), panels) == pack_operand(values.view(np.float32), panels).tobytes()


@pytest.mark.parametrize("panels", [(16, 6, 16, 0, 0), (16, 8, 24, 1, 0), (16, 8, 16, 0, 2)])
def test_byte_panels_of_partial_groups_or_panels_are_refused(panels: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="not byte panels"):
        pack(bytes(8 * 16 * 3), panels)
    with pytest.raises(ValueError, match="not byte panels"):
        pack_operand(np.zeros(8 * 16 * 3 // 4, np.float32), panels)
