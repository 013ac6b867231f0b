"""The panel layouts of pre-packed GEMM operands with numpy: how a constant A or B is laid out for the kernels of
farm.backends.llvm.gemm (a_panels, b_panels), the pure step of a packed weight (farm.backends.llvm.blobs) and of
tuning's copies. It imports numpy and nothing of LLVM, so a client that makes an artifact's packed weights
(farm.distributed.recipes.Derivation) loads no compiler; farm.backends.llvm.panels is the same layouts without
numpy, for a client install.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def pack_panels(a: np.ndarray, rows: int) -> np.ndarray:
    """A (blocks x m x k, row-major) in the layout a_panels reads: per block, the full panels of `rows` rows
    k-major, then the m % rows edge rows k-major."""
    blocks, m, k = a.shape
    main = m // rows * rows
    panels = a[:, :main].reshape(blocks, main // rows, rows, k).transpose(0, 1, 3, 2).reshape(blocks, -1)
    edge = a[:, main:].transpose(0, 2, 1).reshape(blocks, -1)
    return np.ascontiguousarray(np.concatenate([panels, edge], axis=1))


def pack_columns(b: np.ndarray, width: int, transposed: bool = False) -> np.ndarray:
    """B (blocks x k x n, row-major; blocks x n x k when `transposed`) in the layout b_panels reads: per block,
    the full column panels of `width` columns k-major, then the n % width edge columns row-major."""
    b = b.transpose(0, 2, 1) if transposed else b
    blocks, k, n = b.shape
    main = n // width * width
    panels = b[:, :, :main].reshape(blocks, k, main // width, width).transpose(0, 2, 1, 3).reshape(blocks, -1)
    edge = b[:, :, main:].reshape(blocks, -1)
    return np.ascontiguousarray(np.concatenate([panels, edge], axis=1))


def _pack_a(data: np.ndarray, panels: tuple[int, ...]) -> np.ndarray:
    rows, m, k = panels
    return pack_panels(data.reshape(-1, m, k), rows)


def _pack_b(data: np.ndarray, panels: tuple[int, ...]) -> np.ndarray:
    width, k, n, transposed = panels
    return pack_columns(data.reshape(-1, n, k) if transposed else data.reshape(-1, k, n), width, bool(transposed))


def pack_byte_panels(b: np.ndarray, lanes: int, transposed: bool, flip: bool) -> np.ndarray:
    """Bytes B (blocks x k x n, row-major; blocks x n x k when `transposed`) in the layout an IntGemm's b_panels
    reads: per block, per `lanes` columns, per group of four k, each column's four bytes side by side
    (L.IntGemm.b_panels); each byte xor 0x80 when `flip` (a uint8 B read as int8, or an int8 B read as uint8:
    dot_products.b_panels_flipped)."""
    columns_first = b if transposed else b.transpose(0, 2, 1)
    blocks, n, k = columns_first.shape
    grouped = columns_first.reshape(blocks, n // lanes, lanes, k // 4, 4).transpose(0, 1, 3, 2, 4)
    packed = np.ascontiguousarray(grouped).reshape(blocks, -1)
    return (packed.view(np.uint8) ^ np.uint8(0x80)).view(packed.dtype) if flip else packed


def _pack_bytes(data: np.ndarray, panels: tuple[int, ...]) -> np.ndarray:
    lanes, k, n, transposed, flip = panels
    b = data.view(np.uint8)
    packed = pack_byte_panels(
        b.reshape(-1, n, k) if transposed else b.reshape(-1, k, n), lanes, bool(transposed), bool(flip)
    )
    return packed.view(np.float32)


PANEL_LAYOUTS: dict[int, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {3: _pack_a, 4: _pack_b, 5: _pack_bytes}
"""How a constant is pre-packed, by the form of its BlobSpec.panels: (rows, m, k) for A (a_panels), (width, k, n,
transposed) for B (b_panels), (lanes, k, n, transposed, flip) for an IntGemm's byte B (L.IntGemm.b_panels). Each
takes the values as float32, flat (bytes four to a float for the byte form), and gives them packed (flat per
block, the byte form's bytes as float32 again)."""


def check_panels(panels: tuple[int, ...], nbytes: int) -> None:
    """ValueError unless `panels` is one of PANEL_LAYOUTS's forms (it may come from a message) and `nbytes` bytes are
    whole blocks of its shape: sizes positive, `transposed` (and a byte form's `flip`) 0 or 1, a byte form's k a
    multiple of four and n of its lanes."""
    if len(panels) not in PANEL_LAYOUTS or min(panels[:3]) < 1 or panels[3:4] not in ((), (0,), (1,)):
        raise ValueError(
            f"panels {list(panels)} are neither (rows, m, k), (width, k, n, transposed) nor (lanes, k, n, "
            f"transposed, flip), each size positive, transposed 0 or 1"
        )
    if len(panels) == 5:
        lanes, k, n, _, flip = panels
        if flip not in (0, 1) or k % 4 or n % lanes or nbytes % (k * n):
            raise ValueError(f"{nbytes} bytes are not byte panels {list(panels)}")
    elif nbytes % (4 * panels[1] * panels[2]):
        raise ValueError(f"{nbytes // 4} floats are not float32 blocks of {panels[1]} x {panels[2]}")


def pack_operand(data: np.ndarray, panels: tuple[int, ...]) -> np.ndarray:
    """The float32 values `data` (flat) in the panel layout `panels` describes (PANEL_LAYOUTS), as one flat array;
    ValueError unless check_panels accepts them."""
    check_panels(panels, data.nbytes)
    return PANEL_LAYOUTS[len(panels)](data, panels).ravel()
