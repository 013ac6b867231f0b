"""farm.backends.llvm.gemm_blocking: the blockings the GEMM tests run with, the tiling of C into regions, a
variant's JSON form, the k blocks of a few-row GEMM and the tile of a few-row GEMM that splits unevenly (pure Python,
nothing compiled)."""

from __future__ import annotations

import numpy as np
import pytest

from farm.backends.llvm.gemm_blocking import (
    SMALL_M_PACKED_K_BLOCK,
    GemmBlocking,
    balanced_blocking,
    edge_rows,
    regions,
    single_tile_blocking,
    small_m_k_block,
    two_thread_excess,
)
from farm.ir import loopir as L

BLOCKINGS = [
    GemmBlocking(),
    GemmBlocking(rows=1, vectors=1, lanes=1),
    GemmBlocking(rows=6, vectors=4, lanes=8),
    GemmBlocking(rows=3, vectors=2, lanes=4),
    GemmBlocking(rows=5, vectors=1, lanes=16),
    GemmBlocking(rows=2, vectors=3, lanes=1),
    GemmBlocking(rows=4, vectors=2, lanes=16),
    GemmBlocking(rows=1, vectors=4, lanes=4),
]


def blocking_id(blocking: GemmBlocking) -> str:
    return blocking.name


# -- regions -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("blocking", BLOCKINGS, ids=blocking_id)
def test_regions_cover_every_cell_exactly_once(blocking):
    for m in range(1, 14):
        for n in range(1, 71):
            covered = np.zeros((m, n), np.int64)
            for region in regions(m, n, blocking):
                assert region.m > 0 and region.n > 0, (m, n, region)
                covered[region.m0 : region.m0 + region.m, region.n0 : region.n0 + region.n] += 1
            assert (covered == 1).all(), (m, n, blocking, covered)


@pytest.mark.parametrize("blocking", BLOCKINGS, ids=blocking_id)
def test_regions_are_whole_tiles_of_the_allowed_shapes(blocking):
    for m in range(1, 14):
        for n in range(1, 71):
            for region in regions(m, n, blocking):
                assert region.m % region.rows == 0 and region.n % (region.vectors * region.lanes) == 0, region
                assert region.rows == blocking.rows or (
                    region.m0 == m // blocking.rows * blocking.rows and region.rows == region.m
                )
                narrower = {(1, lanes) for lanes in (8, 4) if lanes < blocking.lanes}
                fewer = {(vectors, blocking.lanes) for vectors in range(1, blocking.vectors + 1)}
                assert (region.vectors, region.lanes) in {*fewer, *narrower, (1, 1)}
                assert 0 <= region.m0 and region.m0 + region.m <= m and 0 <= region.n0 and region.n0 + region.n <= n


def test_regions_use_full_tiles_where_they_fit():
    blocking = GemmBlocking(rows=4, vectors=3, lanes=16)
    # 9 x 100: rows 0..8 in 4-row tiles + 1 row; columns 96 in 48-wide tiles, then no 16-vector, one 4-lane
    got = {(r.m0, r.m, r.n0, r.n, r.rows, r.vectors, r.lanes) for r in regions(9, 100, blocking)}
    assert got == {(0, 8, 0, 96, 4, 3, 16), (8, 1, 0, 96, 1, 3, 16), (0, 8, 96, 4, 4, 1, 4), (8, 1, 96, 4, 1, 1, 4)}
    # 8 x 128: two 48-wide tiles, then one tile of two vectors (not two single-vector tiles)
    assert {(r.n0, r.n, r.vectors) for r in regions(8, 128, blocking)} == {(0, 96, 3), (96, 32, 2)}
    # 4 x 48: exactly one region of full tiles
    assert [(r.m0, r.m, r.n0, r.n) for r in regions(4, 48, blocking)] == [(0, 4, 0, 48)]
    # 2 x 23: too few rows for a 4-row tile, so one tile of both rows: one 16-lane vector, a 4-lane vector, then 3
    # scalar columns
    got = {(r.m0, r.m, r.n0, r.n, r.rows, r.vectors, r.lanes) for r in regions(2, 23, blocking)}
    assert got == {(0, 2, 0, 16, 2, 1, 16), (0, 2, 16, 4, 2, 1, 4), (0, 2, 20, 3, 2, 1, 1)}
    # 11 x 48: two 4-row tiles, then one tile of the 3 rows past them
    assert {(r.m0, r.m, r.rows) for r in regions(11, 48, blocking)} == {(0, 8, 4), (8, 3, 3)}


def test_edge_rows_are_one_tile_of_the_rows_past_the_full_tiles():
    blocking = GemmBlocking(rows=8, vectors=3, lanes=16)
    assert [edge_rows(m, blocking) for m in (1, 4, 7, 8, 9, 49, 196)] == [1, 4, 7, 1, 1, 1, 4]


# -- JSON form ---------------------------------------------------------------------------------------------------------


def test_blocking_json_round_trips_and_keeps_the_short_form_for_the_defaults():
    """k_block and order appear in a variant's JSON only when set, so records and keys made before they existed
    stay equal; anything malformed is refused."""
    plain = GemmBlocking(rows=8, vectors=3, lanes=16)
    assert plain.to_json() == {"rows": 8, "vectors": 3, "lanes": 16} and plain.name == "8x3x16"
    tiled = GemmBlocking(rows=4, vectors=3, lanes=16, k_block=256, order="rows")
    assert tiled.to_json() == {"rows": 4, "vectors": 3, "lanes": 16, "k_block": 256, "order": "rows"}
    assert tiled.name == "4x3x16-k256-rows"
    for blocking in (plain, tiled):
        assert GemmBlocking.from_json(blocking.to_json()) == blocking
    for bad in (
        {"rows": 4, "vectors": 3, "lanes": 16, "k_block": -1},
        {"rows": 4, "vectors": 3, "lanes": 16, "order": "diagonal"},
        {"rows": 4, "vectors": 3, "lanes": 16, "k_block": 1.5},
        {"rows": 4, "vectors": 3, "lanes": 16, "x": 1},
    ):
        with pytest.raises(ValueError):
            GemmBlocking.from_json(bad)


# -- k blocks ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k, taps, steps",
    [(768, 1, 256), (600, 1, 200), (4608, 9, 144), (2304, 9, 144), (601, 1, 256)],
    ids=["256", "200", "3x3-512", "3x3-256", "prime"],
)
def test_a_few_row_gemms_k_block_divides_k_where_it_can(k, taps, steps):
    """Every k block of a few-row GEMM has the same constant number of steps when whole channels from half of
    SMALL_M_K_BLOCK up divide k (a runtime count made resnet18_style's 2x2 and 4x4 planes 5-12% slower); a k
    with no such divisor keeps SMALL_M_K_BLOCK's whole channels and a shorter last block."""
    window = L.ImplicitColumns(4, 6, 1, 36, 3, 3, 6, 1) if taps > 1 else None
    gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), 100, "c", L.const(0), 100, 20, 100, k, a_window=window)
    assert small_m_k_block(gemm, GemmBlocking()) == steps


@pytest.mark.parametrize(
    "k, taps, steps", [(768, 1, 128), (4608, 9, 72), (512, 1, 128), (255, 1, 0)], ids=["128", "3x3-512", "two", "short"]
)
def test_a_few_row_gemm_of_packed_weights_takes_half_the_k_block(k, taps, steps):
    """Where B is a pre-packed constant (a layer's weights), a few-row GEMM's k blocks are SMALL_M_PACKED_K_BLOCK
    steps (whole channels, dividing k where they can, as above); a k under two blocks is one pass."""
    window = L.ImplicitColumns(4, 6, 1, 36, 3, 3, 6, 1) if taps > 1 else None
    gemm = L.Gemm(
        "a", L.const(0), k, "b", L.const(0), 100, "c", L.const(0), 100, 20, 100, k, a_window=window, b_panels=True
    )
    assert SMALL_M_PACKED_K_BLOCK == 128 and small_m_k_block(gemm, GemmBlocking()) == steps


# -- tiles that two threads share evenly -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("units", "grain", "excess"),
    [(16, 3, 0.125), (32, 3, 0.0625), (8, 3, 0.25), (12, 3, 0.0), (16, 4, 0.0), (3, 3, 1.0)],
)
def test_two_thread_excess_is_the_busier_threads_share_over_half(units, grain, excess):
    assert two_thread_excess(units, grain) == pytest.approx(excess)


def _wide_gemm(m: int, n: int, k: int = 2304) -> L.Gemm:
    return L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k)


@pytest.mark.parametrize(
    ("m", "n", "wide"),
    [
        (196, 256, True),  # 5 blocks of 48 and a vector: 9 and 7 vectors; 4 blocks of 64: 2 each
        (144, 256, True),
        (150, 128, False),  # 2 blocks and 2 vectors (5 and 3), but taller than wide: split by rows
        (128, 192, False),  # 4 whole blocks of 48: 2 each already
        (64, 256, False),  # too few rows: the 6-row tiles' edges weigh
        (196, 320, False),  # 20 vectors: 11 and 9, within UNEVEN_SPLIT
        (49, 512, False),  # 10 blocks and 2 vectors: 17 and 15, within UNEVEN_SPLIT
        (196, 288, False),  # 6 blocks, and not a multiple of 64
        (3136, 4096, False),  # too many rows: not a few-row GEMM
        (300, 200, False),  # taller than wide: split by rows
    ],
)
def test_a_few_row_gemm_takes_the_wide_tile_where_the_default_splits_unevenly(m, n, wide):
    default = GemmBlocking(8, 3, 16)
    chosen = balanced_blocking([_wide_gemm(m, n)], default)
    assert chosen == (GemmBlocking(6, 4, 16) if wide else default)


def test_the_wide_tile_needs_every_gemm_a_deep_k_and_the_default_of_32_registers():
    uneven, even = _wide_gemm(196, 256), _wide_gemm(196, 192)
    assert balanced_blocking([uneven, even], GemmBlocking(8, 3, 16)) == GemmBlocking(8, 3, 16)
    assert balanced_blocking([], GemmBlocking(8, 3, 16)) == GemmBlocking(8, 3, 16)
    assert balanced_blocking([uneven], GemmBlocking(4, 3, 8)) == GemmBlocking(4, 3, 8)  # 16 registers (AVX2)
    assert balanced_blocking([_wide_gemm(169, 256, 576)], GemmBlocking(8, 3, 16)) == GemmBlocking(8, 3, 16)  # k


@pytest.mark.parametrize(
    ("n", "k", "wide"),
    [
        (64, 576, True),  # a 64-channel 3x3 conv: 8 x 3 leaves a 1-vector tile, one 6 x 4 tile covers it
        (64, 512, True),
        (64, 288, False),  # too short a k to pay for storing 6 rows through a block of 8
        (64, 147, False),  # ResNet-50's 7x7 stem
        (128, 1152, False),  # 8 x 3 leaves a 2-vector tile, which ran as fast
        (48, 576, False),
        (256, 2304, False),
    ],
)
def test_a_gemm_one_wide_tile_wide_with_a_deep_k_takes_the_wide_tile(n, k, wide):
    default = GemmBlocking(8, 3, 16)
    chosen = single_tile_blocking([_wide_gemm(3136, n, k)], default)
    assert chosen == (GemmBlocking(6, 4, 16) if wide else default)


def test_the_single_wide_tile_needs_every_gemm_so_and_the_default_of_32_registers():
    one, two = _wide_gemm(3136, 64, 576), _wide_gemm(3136, 128, 576)
    assert single_tile_blocking([one, two], GemmBlocking(8, 3, 16)) == GemmBlocking(8, 3, 16)
    assert single_tile_blocking([], GemmBlocking(8, 3, 16)) == GemmBlocking(8, 3, 16)
    assert single_tile_blocking([_wide_gemm(3136, 32, 576)], GemmBlocking(4, 3, 8)) == GemmBlocking(4, 3, 8)  # AVX2
