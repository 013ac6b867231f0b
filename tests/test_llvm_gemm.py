"""The register-blocked GEMM's numerics (compiled, linked and run) on each of its paths, and the code those paths
emit; its tiling of C is tests/test_llvm_gemm_blocking.py's."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from native_helpers import host, kernel_module_ir, run_kernel, run_kernels
from test_llvm_gemm_blocking import BLOCKINGS, blocking_id

from farm.backends.llvm.gemm import (
    PACK_B_MIN_ROW_TILES,
    PARTIAL_ALIGNMENT,
    SMALL_M_PREFETCH_BLOCKS,
    SWEEP_MAX_B_BYTES,
)
from farm.backends.llvm.gemm_blocking import SMALL_M_PACKED_K_BLOCK, GemmBlocking
from farm.backends.llvm.gemm_outlining import MAX_PARTS, outlined_functions
from farm.backends.llvm.gemm_tiles import F32_BYTES, STRIDE_PREFETCHER_BYTES, WINDOW_PREFETCH_CHANNELS
from farm.backends.llvm.packing import pack_columns, pack_operand, pack_panels
from farm.ir import launching
from farm.ir import loopir as L

# -- numerics ----------------------------------------------------------------------------------------------------------


SHAPES = [(1, 1, 1), (5, 47, 3), (17, 100, 33), (64, 3136, 27), (3, 16, 1), (13, 70, 5), (7, 49, 64), (70, 21, 30)]


def gemm_kernel(
    m: int,
    n: int,
    k: int,
    *,
    a_offset: int = 0,
    lda: int | None = None,
    b_offset: int = 0,
    ldb: int | None = None,
    c_offset: int = 0,
    ldc: int | None = None,
) -> L.LoopKernel:
    gemm = L.Gemm(
        "a", L.const(a_offset), lda or k, "b", L.const(b_offset), ldb or n, "c", L.const(c_offset), ldc or n, m, n, k
    )
    return L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def assert_gemm_close(actual: np.ndarray, expected: np.ndarray) -> None:
    """1e-4 relative to the magnitude of the result (per-element relative error is meaningless near 0)."""
    scale = max(float(np.abs(expected).max()), 1.0)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * scale)


CACHE_TILED = [
    GemmBlocking(rows=4, vectors=2, lanes=8, k_block=8),
    GemmBlocking(rows=3, vectors=1, lanes=4, k_block=5),
    GemmBlocking(rows=4, vectors=3, lanes=16, k_block=16, order="rows"),
    GemmBlocking(rows=2, vectors=2, lanes=4, order="rows"),
    GemmBlocking(rows=1, vectors=1, lanes=1, k_block=2),
]


@pytest.mark.parametrize(
    "blocking",
    BLOCKINGS + CACHE_TILED + [GemmBlocking(rows=6, vectors=1, lanes=8), GemmBlocking(rows=2, vectors=4, lanes=4)],
    ids=blocking_id,
)
def test_gemm_matches_numpy_for_odd_shapes(blocking, tmp_path):
    """Every shape, with k shorter than, equal to, a multiple of and not a multiple of the k block."""
    rng = np.random.default_rng(blocking.rows * 100 + blocking.vectors * 10 + blocking.lanes)
    cases = []
    for m, n, k in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        cases.append((gemm_kernel(m, n, k), [np.full((m, n), np.nan, np.float32), a, b]))
    for (_, arrays), result in zip(cases, run_kernels(cases, tmp_path, blocking)):
        c, a, b = result
        assert_gemm_close(c, reference(a, b))
        np.testing.assert_array_equal(a, arrays[1])  # inputs untouched
        np.testing.assert_array_equal(b, arrays[2])


@pytest.mark.parametrize(
    "blocking",
    [
        GemmBlocking(),
        GemmBlocking(rows=3, vectors=2, lanes=4),
        GemmBlocking(rows=1, vectors=1, lanes=1),
        GemmBlocking(rows=5, vectors=3, lanes=8),
        GemmBlocking(rows=2, vectors=2, lanes=4, k_block=7, order="rows"),
    ],
    ids=blocking_id,
)
@pytest.mark.parametrize("m, n, k", [(5, 47, 3), (17, 100, 33), (9, 35, 12)])
def test_gemm_with_panel_offsets_and_wide_leading_dimensions(m, n, k, blocking, tmp_path):
    """A, B and C are panels inside bigger row-major buffers; C cells outside the panel keep their values."""
    rng = np.random.default_rng(m * n * k)
    lda, ldb, ldc = k + 5, n + 19, n + 3
    a_row0, a_col0, b_row0, b_col0, c_row0, c_col0 = 2, 3, 1, 7, 3, 1
    a_full = rng.standard_normal((a_row0 + m + 1, lda)).astype(np.float32)
    b_full = rng.standard_normal((b_row0 + k + 2, ldb)).astype(np.float32)
    c_full = rng.standard_normal((c_row0 + m + 2, ldc)).astype(np.float32)
    kernel = gemm_kernel(
        m,
        n,
        k,
        a_offset=a_row0 * lda + a_col0,
        lda=lda,
        b_offset=b_row0 * ldb + b_col0,
        ldb=ldb,
        c_offset=c_row0 * ldc + c_col0,
        ldc=ldc,
    )
    c_out, _, _ = run_kernel(kernel, [c_full, a_full, b_full], tmp_path, blocking)
    a = a_full[a_row0 : a_row0 + m, a_col0 : a_col0 + k]
    b = b_full[b_row0 : b_row0 + k, b_col0 : b_col0 + n]
    assert_gemm_close(c_out[c_row0 : c_row0 + m, c_col0 : c_col0 + n], reference(a, b))
    outside = np.ones(c_full.shape, bool)
    outside[c_row0 : c_row0 + m, c_col0 : c_col0 + n] = False
    np.testing.assert_array_equal(c_out[outside], c_full[outside])


def test_gemm_overwrites_c_rather_than_accumulating(tmp_path):
    a = np.ones((3, 2), np.float32)
    b = np.ones((2, 5), np.float32)
    c, _, _ = run_kernel(gemm_kernel(3, 5, 2), [np.full((3, 5), 100.0, np.float32), a, b], tmp_path)
    np.testing.assert_array_equal(c, np.full((3, 5), 2.0, np.float32))


def test_batched_gemm_in_a_loop_with_variable_offsets(tmp_path):
    """A Gemm inside a Loop whose panel offsets depend on the loop variable, as Conv lowers per batch/group."""
    batches, m, n, k = 3, 6, 37, 10
    rng = np.random.default_rng(7)
    a = rng.standard_normal((batches, m, k)).astype(np.float32)
    b = rng.standard_normal((batches, k, n)).astype(np.float32)
    t = L.Var("t")
    gemm = L.Gemm("a", t * (m * k), k, "b", t * (k * n), n, "c", t * (m * n), n, m, n, k)
    kernel = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [L.Loop(t, batches, [gemm])])
    c, _, _ = run_kernel(
        kernel, [np.zeros((batches, m, n), np.float32), a, b], tmp_path, GemmBlocking(rows=4, vectors=2, lanes=8)
    )
    assert_gemm_close(c, np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64)))


def test_two_gemms_in_one_kernel(tmp_path):
    """C1 = A @ B then C2 = C1 @ D in one kernel: the second reads what the first stored."""
    rng = np.random.default_rng(8)
    a, b, d = (rng.standard_normal(s).astype(np.float32) for s in ((5, 9), (9, 21), (21, 4)))
    kernel = L.LoopKernel(
        [L.Param("c2", output=True), L.Param("c1", output=True), L.Param("a"), L.Param("b"), L.Param("d")],
        [
            L.Gemm("a", L.const(0), 9, "b", L.const(0), 21, "c1", L.const(0), 21, 5, 21, 9),
            L.Gemm("c1", L.const(0), 21, "d", L.const(0), 4, "c2", L.const(0), 4, 5, 4, 21),
        ],
    )
    c2, c1, *_ = run_kernel(
        kernel,
        [np.zeros((5, 4), np.float32), np.zeros((5, 21), np.float32), a, b, d],
        tmp_path,
        GemmBlocking(rows=2, vectors=2, lanes=4),
    )
    assert_gemm_close(c1, reference(a, b))
    assert_gemm_close(c2, reference(a, b) @ d.astype(np.float64))


def test_gemm_with_k_zero_writes_zeros(tmp_path):
    c, _, _ = run_kernel(
        gemm_kernel(3, 20, 0),
        [np.full((3, 20), 5.0, np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32)],
        tmp_path,
        GemmBlocking(2, 1, 8),
    )
    np.testing.assert_array_equal(c, np.zeros((3, 20), np.float32))


def test_gemm_propagates_nan_and_inf(tmp_path):
    a = np.ones((4, 3), np.float32)
    b = np.ones((3, 40), np.float32)
    a[1, 2] = np.nan
    b[0, 33] = np.inf
    c, _, _ = run_kernel(gemm_kernel(4, 40, 3), [np.zeros((4, 40), np.float32), a, b], tmp_path)
    expected = reference(a, b)
    np.testing.assert_array_equal(np.isnan(c), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(c), np.isinf(expected))


# -- pre-packed A -----------------------------------------------------------------------------------------------------


def test_pack_panels_lays_out_full_panels_then_edge_rows_k_major():
    """m = 5 rows of k = 3 in panels of 2: rows (0, 1) then (2, 3) side by side for each k, then row 4."""
    a = np.arange(15, dtype=np.float32).reshape(1, 5, 3)
    expected = [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11, 12, 13, 14]
    np.testing.assert_array_equal(pack_panels(a, 2).ravel(), expected)
    np.testing.assert_array_equal(pack_panels(a, 1).ravel(), a.ravel())  # one-row panels are row-major
    two_blocks = np.concatenate([a, a + 100])
    np.testing.assert_array_equal(pack_panels(two_blocks, 2)[1], np.asarray(expected) + 100)


@pytest.mark.parametrize(
    "blocking",
    [
        GemmBlocking(),
        GemmBlocking(rows=3, vectors=2, lanes=4),
        GemmBlocking(rows=1, vectors=1, lanes=1),
        GemmBlocking(rows=8, vectors=3, lanes=16),
        GemmBlocking(rows=4, vectors=2, lanes=8, k_block=8, order="rows"),
    ],
    ids=blocking_id,
)
def test_gemm_reads_a_prepacked_in_panels_of_its_tile_rows(blocking, tmp_path):
    """a_panels: A arrives in pack_panels(A, blocking.rows); every shape (edge rows included) matches numpy."""
    rng = np.random.default_rng(7)
    cases = []
    for m, n, k in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k, a_panels=True)
        kernel = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])
        cases.append(
            (kernel, [np.full((m, n), np.nan, np.float32), pack_panels(a[None], blocking.rows)[0], b], reference(a, b))
        )
    results = run_kernels([(kernel, arrays) for kernel, arrays, _ in cases], tmp_path, blocking)
    for (_, _, expected), (c, _, _) in zip(cases, results):
        assert_gemm_close(c, expected)


# -- pre-packed B -----------------------------------------------------------------------------------------------------


def test_pack_columns_lays_out_full_column_panels_k_major_then_edge_columns_row_major():
    """k = 2 rows of n = 5 columns in panels of 2: columns (0, 1) for k 0 and 1, then (2, 3), then column 4."""
    b = np.arange(10, dtype=np.float32).reshape(1, 2, 5)
    expected = [0, 1, 5, 6, 2, 3, 7, 8, 4, 9]
    np.testing.assert_array_equal(pack_columns(b, 2).ravel(), expected)
    np.testing.assert_array_equal(pack_columns(b, 5).ravel(), b.ravel())  # one panel as wide as B is row-major
    np.testing.assert_array_equal(pack_columns(b, 8).ravel(), b.ravel())  # all edge: row-major
    np.testing.assert_array_equal(pack_columns(b.transpose(0, 2, 1).copy(), 2, transposed=True).ravel(), expected)
    two_blocks = np.concatenate([b, b + 100])
    np.testing.assert_array_equal(pack_columns(two_blocks, 2)[1], np.asarray(expected) + 100)


def test_pack_operand_dispatches_on_the_panels_form_and_refuses_partial_blocks():
    a = np.arange(15, dtype=np.float32)
    np.testing.assert_array_equal(pack_operand(a, (2, 5, 3)), pack_panels(a.reshape(1, 5, 3), 2).ravel())
    np.testing.assert_array_equal(pack_operand(a, (2, 3, 5, 0)), pack_columns(a.reshape(1, 3, 5), 2).ravel())
    np.testing.assert_array_equal(
        pack_operand(a, (2, 3, 5, 1)), pack_columns(a.reshape(1, 5, 3), 2, transposed=True).ravel()
    )
    for bad in ((2, 4, 3), (2, 2, 2, 0), (2, 5)):
        with pytest.raises(ValueError):
            pack_operand(a, bad)


@pytest.mark.parametrize(
    "blocking",
    [
        GemmBlocking(),
        GemmBlocking(rows=3, vectors=2, lanes=4),
        GemmBlocking(rows=1, vectors=1, lanes=1),
        GemmBlocking(rows=8, vectors=3, lanes=16),
        GemmBlocking(rows=4, vectors=2, lanes=8, k_block=8, order="rows"),
        GemmBlocking(rows=4, vectors=1, lanes=16, k_block=16),
    ],
    ids=blocking_id,
)
@pytest.mark.parametrize("transposed", [False, True], ids=["b", "b-transposed"])
def test_gemm_reads_b_prepacked_in_column_panels_of_its_tile_width(blocking, transposed, tmp_path):
    """b_panels: B arrives in pack_columns(B, blocking.tile_columns), from n x k when transposed; every shape (edge
    columns of every narrower width included) matches numpy, with A pre-packed too or not."""
    rng = np.random.default_rng(11)
    cases = []
    for index, (m, n, k) in enumerate(SHAPES):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        stored = b.T.copy() if transposed else b
        a_panels = index % 2 == 1
        gemm = L.Gemm(
            "a",
            L.const(0),
            k,
            "b",
            L.const(0),
            k if transposed else n,
            "c",
            L.const(0),
            n,
            m,
            n,
            k,
            a_panels=a_panels,
            b_panels=True,
            b_transposed=transposed,
        )
        kernel = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])
        packed_a = pack_panels(a[None], blocking.rows)[0] if a_panels else a
        packed_b = pack_columns(stored[None], blocking.tile_columns, transposed)[0]
        cases.append((kernel, [np.full((m, n), np.nan, np.float32), packed_a, packed_b], reference(a, b)))
    results = run_kernels([(kernel, arrays) for kernel, arrays, _ in cases], tmp_path, blocking)
    for (_, _, expected), (c, _, _) in zip(cases, results):
        assert_gemm_close(c, expected)


def test_batched_gemm_reads_each_block_of_b_prepacked(tmp_path):
    """A Gemm per batch whose B offset is a whole k x n block: each block packed on its own."""
    batches, m, n, k = 3, 6, 37, 10
    blocking = GemmBlocking(rows=4, vectors=2, lanes=8)
    rng = np.random.default_rng(12)
    a = rng.standard_normal((batches, m, k)).astype(np.float32)
    b = rng.standard_normal((batches, k, n)).astype(np.float32)
    t = L.Var("t")
    gemm = L.Gemm("a", t * (m * k), k, "b", t * (k * n), n, "c", t * (m * n), n, m, n, k, b_panels=True)
    kernel = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [L.Loop(t, batches, [gemm])])
    c, _, _ = run_kernel(
        kernel, [np.zeros((batches, m, n), np.float32), a, pack_columns(b, blocking.tile_columns)], tmp_path, blocking
    )
    assert_gemm_close(c, np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64)))


EPILOGUE_BLOCKINGS = [
    GemmBlocking(),
    GemmBlocking(rows=3, vectors=2, lanes=4),
    GemmBlocking(rows=1, vectors=1, lanes=1),
    GemmBlocking(rows=4, vectors=2, lanes=8, k_block=8),
    GemmBlocking(rows=2, vectors=3, lanes=4, k_block=5, order="rows"),
    GemmBlocking(rows=8, vectors=3, lanes=16),
    GemmBlocking(rows=16, vectors=1, lanes=16),
]
EPILOGUE_ACTIVATIONS = [None, ("relu", ()), ("leakyrelu", (0.1,)), ("clip", (-0.5, 0.75))]


def _activated(value: np.ndarray, activation: tuple[str, tuple[float, ...]] | None) -> np.ndarray:
    if activation is None:
        return value
    kind, params = activation
    return {
        "relu": lambda: np.maximum(value, 0),
        "leakyrelu": lambda: np.where(value < 0, value * params[0], value),
        "clip": lambda: np.clip(value, *params),
    }[kind]()


def _epilogue_cases(transposed: bool, residual_in_c: bool) -> list[tuple[L.LoopKernel, list[np.ndarray], np.ndarray]]:
    """(kernel, arrays, expected C) per SHAPES entry: C = act(A @ B + bias + residual), the residual its own
    parameter or C's values as the kernel starts (residual_in_c)."""
    rng = np.random.default_rng(21)
    cases = []
    for index, (m, n, k) in enumerate(SHAPES):
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        on_columns, activation = index % 2 == 1, EPILOGUE_ACTIVATIONS[index % len(EPILOGUE_ACTIVATIONS)]
        bias = rng.standard_normal(n if on_columns else m).astype(np.float32)
        residual = rng.standard_normal((m, n)).astype(np.float32)
        epilogue = L.GemmEpilogue(
            bias="bias",
            bias_offset=L.const(2),
            bias_on_columns=on_columns,
            residual="c" if residual_in_c else "residual",
            residual_offset=L.const(0),
            activation=activation,
        )
        gemm = L.Gemm(
            "a",
            L.const(0),
            m if transposed else k,
            "b",
            L.const(0),
            n,
            "c",
            L.const(0),
            m if transposed else n,
            m,
            n,
            k,
            a_transposed=transposed,
            c_transposed=transposed,
            epilogue=epilogue,
        )
        params = [L.Param("c", output=True), L.Param("a"), L.Param("b"), L.Param("bias"), L.Param("residual")]
        stored = (lambda x: x.T.copy()) if transposed else (lambda x: x)
        c = stored(residual) if residual_in_c else np.full((n, m) if transposed else (m, n), np.nan, np.float32)
        arrays = [c, stored(a), b, np.concatenate([np.zeros(2, np.float32), bias]), stored(residual)]
        expected = reference(a, b) + (bias[None, :] if on_columns else bias[:, None]) + residual
        cases.append((L.LoopKernel(params, [gemm]), arrays, stored(_activated(expected, activation))))
    return cases


@pytest.mark.parametrize("blocking", EPILOGUE_BLOCKINGS, ids=blocking_id)
@pytest.mark.parametrize("transposed", [False, True], ids=["row-major", "a-and-c-transposed"])
def test_gemm_epilogue_adds_bias_and_residual_then_activates_as_it_stores(blocking, transposed, tmp_path):
    """GemmEpilogue: C = act(A @ B + bias + residual), the bias per row or per column, for every shape and every
    activation, with A read transposed and C stored transposed (a small-plane conv's GEMM) or not; with a k block
    only the last block applies it."""
    cases = _epilogue_cases(transposed, residual_in_c=False)
    results = run_kernels([(kernel, arrays) for kernel, arrays, _ in cases], tmp_path, blocking)
    for (_, _, expected), (c, *_) in zip(cases, results):
        assert_gemm_close(c, expected)


@pytest.mark.parametrize("rows", [3, 5, 6, 7])
def test_a_transposed_tile_of_any_row_count_is_turned_around_in_registers(rows, tmp_path):
    """A tile whose rows are not a power of two stores to a transposed C as the next power of two turned around in
    registers (gemm_tiles._store_transposed), each column's rows in runs of 4, 2 and 1 with the epilogue along them,
    not one value at a time: the 6 x 4 tiles of 64-channel convs (gemm_blocking.single_tile_blocking)."""
    blocking = GemmBlocking(rows=rows, vectors=2, lanes=16)
    cases = _epilogue_cases(True, residual_in_c=False)
    results = run_kernels([(kernel, arrays) for kernel, arrays, _ in cases], tmp_path, blocking)
    for (_, _, expected), (c, *_) in zip(cases, results):
        assert_gemm_close(c, expected)
    largest = max(cases, key=lambda case: case[1][0].size)[0]
    text = kernel_module_ir([("farm_k_test", largest)], host(), blocking)
    runs = [size for size in (4, 2) if rows & size]
    assert all(re.search(rf"store <{size} x float>", text) for size in runs)


@pytest.mark.parametrize("blocking", [GemmBlocking(), *(b for b in EPILOGUE_BLOCKINGS if b.k_block)], ids=blocking_id)
@pytest.mark.parametrize("transposed", [False, True], ids=["row-major", "a-and-c-transposed"])
def test_gemm_adds_the_residual_it_finds_in_c(blocking, transposed, tmp_path):
    """A residual that is C itself (a conv writing over a residual that dies there): each value is read before C is
    first written, and k blocks that keep their sums in C start from it and don't add it again at the end."""
    cases = _epilogue_cases(transposed, residual_in_c=True)
    results = run_kernels([(kernel, arrays) for kernel, arrays, _ in cases], tmp_path, blocking)
    for (_, _, expected), (c, *_) in zip(cases, results):
        assert_gemm_close(c, expected)


@pytest.mark.parametrize(
    "blocking",
    [
        GemmBlocking(),
        GemmBlocking(rows=3, vectors=2, lanes=4),
        GemmBlocking(rows=1, vectors=1, lanes=1),
        GemmBlocking(rows=4, vectors=2, lanes=8, k_block=8),
    ],
    ids=blocking_id,
)
@pytest.mark.parametrize("stride, dilation", [((1, 1), (1, 1)), ((2, 1), (1, 2))], ids=["plain", "strided-dilated"])
def test_implicit_gemm_reads_a_padded_plane_as_its_im2col_matrix(blocking, stride, dilation, tmp_path):
    """a_window (L.ImplicitColumns): C^T = columns(x)^T @ W^T with A the padded input plane itself, every output
    row's pixels in tiles that straddle output rows; a k block is ignored (the k loop is channels x taps)."""
    channels, out_channels, kernel, out_size = 5, 19, (3, 2), (6, 7)
    rows = (out_size[0] - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1
    columns = (out_size[1] - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1
    rng = np.random.default_rng(31)
    x = rng.standard_normal((channels, rows, columns)).astype(np.float32)
    w = rng.standard_normal((out_channels, channels, *kernel)).astype(np.float32)
    window = L.ImplicitColumns(
        out_size[1], stride[0] * columns, stride[1], rows * columns, *kernel, dilation[0] * columns, dilation[1]
    )
    m, n, k = out_size[0] * out_size[1], out_channels, channels * kernel[0] * kernel[1]
    gemm = L.Gemm(
        "a",
        L.const(0),
        0,
        "b",
        L.const(0),
        k,
        "c",
        L.const(0),
        m,
        m,
        n,
        k,
        b_panels=True,
        b_transposed=True,
        c_transposed=True,
        a_window=window,
    )
    kernel_ir = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])
    packed = pack_columns(w.reshape(1, n, k), blocking.tile_columns, transposed=True)[0]
    [c, _, _] = run_kernel(kernel_ir, [np.full((n, m), np.nan, np.float32), x, packed], tmp_path, blocking)
    expected = np.zeros((out_channels, *out_size))
    for r in range(kernel[0]):
        for s in range(kernel[1]):
            taps = x[:, r * dilation[0] :: stride[0], s * dilation[1] :: stride[1]][:, : out_size[0], : out_size[1]]
            expected += np.einsum("chw,oc->ohw", taps.astype(np.float64), w[:, :, r, s].astype(np.float64))
    assert_gemm_close(c, expected.reshape(n, m))
    assert [window.row_base(p) + window.tap_offset(q) for p, q in ((0, 0), (m - 1, k - 1))] == [
        0,
        (out_size[0] - 1) * stride[0] * columns
        + (out_size[1] - 1) * stride[1]
        + (channels - 1) * rows * columns
        + (kernel[0] - 1) * dilation[0] * columns
        + (kernel[1] - 1) * dilation[1],
    ]


@pytest.mark.parametrize(
    "blocking",
    [GemmBlocking(), GemmBlocking(rows=3, vectors=2, lanes=4), GemmBlocking(rows=4, vectors=1, lanes=8, k_block=64)],
    ids=blocking_id,
)
@pytest.mark.parametrize(
    "m, n, k, residual_in_c",
    [(20, 100, 600, False), (9, 130, 513, False), (9, 130, 513, True)],
    ids=["20x100x600", "9x130x513", "9x130x513-residual-in-c"],
)
def test_few_rows_and_a_deep_k_keep_partial_sums_per_k_block(m, n, k, residual_in_c, blocking, tmp_path):
    """A column-split GEMM with few rows (gemm_blocking.small_m_k_block) runs each column block k block by k block, the
    partial sums in a scratch tile; the epilogue (bias per column, residual, clip) only at the last block, and the
    narrower column tails past the last full block as usual. A residual in C is read there, before C is written."""
    rng = np.random.default_rng(m + n + k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    bias, residual = rng.standard_normal(n).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    epilogue = L.GemmEpilogue(
        bias="bias",
        bias_offset=L.const(0),
        bias_on_columns=True,
        residual="c" if residual_in_c else "residual",
        residual_offset=L.const(0),
        activation=("clip", (-20.0, 20.0)),
    )
    gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k, b_panels=True, epilogue=epilogue)
    params = [L.Param("c", output=True), L.Param("a"), L.Param("b"), L.Param("bias"), L.Param("residual")]
    packed = pack_columns(b[None], blocking.tile_columns)[0]
    c = residual.copy() if residual_in_c else np.full((m, n), np.nan, np.float32)
    [c, *_] = run_kernel(L.LoopKernel(params, [gemm]), [c, a, packed, bias, residual], tmp_path, blocking)
    assert_gemm_close(c, np.clip(reference(a, b) + bias[None, :] + residual, -20, 20))


def _prefetches(kernel: L.LoopKernel) -> set[int]:
    """The rw flags (0 read, 1 write) of the llvm.prefetch calls in the kernel's IR."""
    text = kernel_module_ir([("farm_k_test", kernel)], host())
    return {int(flag) for flag in re.findall(r'call void @"?llvm\.prefetch\.p0"?\(ptr [^,]+, i32 (\d)', text)}


def test_column_split_tiles_prefetch_the_next_blocks_c_for_writing():
    """A column-split GEMM's tiles store to every row of C, a plane apart (too many streams for the hardware
    prefetcher): with a C bigger than gemm.C_PREFETCH_MIN_BYTES each prefetches, for writing, the C lines of the
    next column block, and the residual's. Not where C is small, nor where B is small enough for the row tiles to
    sweep across the blocks (their stores are then a few streams)."""
    epilogue = L.GemmEpilogue(residual="residual", residual_offset=L.const(0))
    gemm = L.Gemm("a", L.const(0), 256, "b", L.const(0), 3136, "c", L.const(0), 3136, 256, 3136, 256, epilogue=epilogue)
    params = [L.Param("c", output=True), L.Param("a"), L.Param("b"), L.Param("residual")]
    assert launching.splits_columns(gemm, GemmBlocking().tile_columns) and gemm.k * gemm.n * 4 > SWEEP_MAX_B_BYTES
    assert _prefetches(L.LoopKernel(params, [gemm])) == {0, 1}
    small = dataclasses.replace(gemm, ldb=784, ldc=784, m=32, n=784)  # 100 KB of C stays in cache: no prefetch
    assert launching.splits_columns(small, GemmBlocking().tile_columns) and 1 not in _prefetches(
        L.LoopKernel(params, [small])
    )
    swept = dataclasses.replace(gemm, lda=64, k=64)
    assert swept.k * swept.n * 4 <= SWEEP_MAX_B_BYTES and 1 not in _prefetches(L.LoopKernel(params, [swept]))


@pytest.mark.parametrize("blocking", [GemmBlocking(), GemmBlocking(rows=3, vectors=2, lanes=4)], ids=blocking_id)
def test_column_split_gemm_with_a_small_b_sweeps_each_row_tile_across_the_blocks(blocking, tmp_path):
    """A column-split GEMM whose B fits gemm.SWEEP_MAX_B_BYTES runs row tile by row tile, each across every column
    block: edge rows, the narrower column tails and the epilogue (bias per row, residual, relu) as usual."""
    m, n, k = 37, 5 * blocking.tile_columns + 21, 33
    rng = np.random.default_rng(m + n + k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    bias, residual = rng.standard_normal(m).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    epilogue = L.GemmEpilogue(
        bias="bias", bias_offset=L.const(0), residual="residual", residual_offset=L.const(0), activation=("relu", ())
    )
    gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k, epilogue=epilogue)
    assert launching.splits_columns(gemm, blocking.tile_columns) and k * n * 4 <= SWEEP_MAX_B_BYTES
    params = [L.Param("c", output=True), L.Param("a"), L.Param("b"), L.Param("bias"), L.Param("residual")]
    [c, *_] = run_kernel(
        L.LoopKernel(params, [gemm]), [np.full((m, n), np.nan, np.float32), a, b, bias, residual], tmp_path, blocking
    )
    assert_gemm_close(c, np.maximum(reference(a, b) + bias[:, None] + residual, 0))


def test_few_rows_and_a_deep_k_prefetch_b_blocks_ahead():
    """A few-row GEMM with a deep k (gemm_blocking.small_m_k_block) prefetches, with each B load, the same columns
    SMALL_M_PREFETCH_BLOCKS k blocks ahead in B's panel (the weights come from memory once a run)."""
    gemm = L.Gemm("a", L.const(0), 768, "b", L.const(0), 100, "c", L.const(0), 100, 20, 100, 768, b_panels=True)
    kernel = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])
    ahead = SMALL_M_PREFETCH_BLOCKS * SMALL_M_PACKED_K_BLOCK * GemmBlocking().tile_columns
    assert SMALL_M_PREFETCH_BLOCKS >= 2 and _prefetches(kernel) == {0}
    assert re.search(rf"= add i64 %\S+, {ahead}\n", kernel_module_ir([("farm_k_test", kernel)], host()))


def test_few_rows_keep_their_partial_sums_on_a_page_of_the_stack():
    """The partial sums of a few-row GEMM start at a page (PARTIAL_ALIGNMENT), wherever the calling thread's stack
    is: their addresses modulo 4096, and so the lines they share with the other operands, don't depend on it."""
    gemm = L.Gemm("a", L.const(0), 768, "b", L.const(0), 100, "c", L.const(0), 100, 20, 100, 768, b_panels=True)
    kernel = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])
    text = kernel_module_ir([("farm_k_test", kernel)], host())
    assert PARTIAL_ALIGNMENT == 4096 and re.search(r"alloca \[\d+ x <\d+ x float>\], align 4096", text)


def test_tiles_reading_packed_a_prefetch_the_next_panel():
    """Row-split GEMMs whose A is pre-packed (a conv's weights) read it panel after panel: each k step prefetches
    the next panel (a read), and nothing is written ahead."""
    gemm = L.Gemm("a", L.const(0), 256, "b", L.const(0), 196, "c", L.const(0), 196, 1024, 196, 256, a_panels=True)
    plain = dataclasses.replace(gemm, a_panels=False)
    params = [L.Param("c", output=True), L.Param("a"), L.Param("b")]
    assert not launching.splits_columns(gemm, GemmBlocking().tile_columns)
    assert _prefetches(L.LoopKernel(params, [gemm])) == {0}
    assert _prefetches(L.LoopKernel(params, [plain])) == set()


@pytest.mark.parametrize("m, n, k", [(136, 300, 600), (300, 1000, 300)], ids=["few-rows-deep-k", "column-blocks"])
def test_gemm_packs_an_activation_b_panel_on_the_fly(m, n, k, tmp_path):
    """With PACK_B_MIN_ROW_TILES row tiles or more, a column-split GEMM copies a B read in place (an activation)
    piece by piece (per k block with few rows and a deep k) into a scratch panel on the stack that every row tile
    reads. Same values as numpy, edge rows, column tails and the epilogue included; fewer rows, or a row-split
    GEMM, read B in place."""
    rng = np.random.default_rng(m + n + k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    epilogue = L.GemmEpilogue(bias="bias", bias_offset=L.const(0), activation=("relu", ()))
    gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k, a_panels=True, epilogue=epilogue)
    params = [L.Param("c", output=True), L.Param("a"), L.Param("b"), L.Param("bias")]
    kernel = L.LoopKernel(params, [gemm])
    assert m >= PACK_B_MIN_ROW_TILES * GemmBlocking().rows and "gemm.b_panel" in kernel_module_ir(
        [("farm_k_test", kernel)], host()
    )
    few = L.LoopKernel(params, [dataclasses.replace(gemm, m=PACK_B_MIN_ROW_TILES * GemmBlocking().rows - 1)])
    assert "gemm.b_panel" not in kernel_module_ir([("farm_k_test", few)], host())
    tall = L.LoopKernel(params, [dataclasses.replace(gemm, m=n + 8)])
    assert not launching.splits_columns(tall.body[0], GemmBlocking().tile_columns)
    assert "gemm.b_panel" not in kernel_module_ir([("farm_k_test", tall)], host())
    packed_a = pack_panels(a[None], GemmBlocking().rows)[0]
    [c, *_] = run_kernel(kernel, [np.full((m, n), np.nan, np.float32), packed_a, b, bias], tmp_path)
    assert_gemm_close(c, np.maximum(reference(a, b) + bias[:, None], 0))


def _few_row_kernel(m: int, n: int, k: int) -> tuple[L.LoopKernel, list[np.ndarray]]:
    """A few-row column-split GEMM (gemm_blocking.small_m_k_block) with a residual in C and a bias, and its arrays."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    epilogue = L.GemmEpilogue(
        bias="bias",
        bias_offset=L.const(0),
        bias_on_columns=True,
        residual="c",
        residual_offset=L.const(0),
        activation=("relu", ()),
    )
    gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k, b_panels=True, epilogue=epilogue)
    params = [L.Param("c", output=True), L.Param("a"), L.Param("b"), L.Param("bias")]
    packed = pack_columns(b[None], GemmBlocking().tile_columns)[0]
    return L.LoopKernel(params, [gemm]), [
        rng.standard_normal((m, n)).astype(np.float32),
        a,
        packed,
        rng.standard_normal(n).astype(np.float32),
    ]


def _implicit_operands(channels: int, out_channels: int, out_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A 3x3 conv's padded input (channels, rows + 2, columns + 2) and its weights (out_channels, channels * 9)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((channels, out_size[0] + 2, out_size[1] + 2)).astype(np.float32)
    return x, rng.standard_normal((out_channels, channels * 9)).astype(np.float32)


def _implicit_kernel(
    channels: int = 4, out_channels: int = 40, out_size: tuple[int, int] = (20, 21)
) -> tuple[L.LoopKernel, list[np.ndarray]]:
    """An implicit GEMM (a 3x3 conv, by default of 4 channels at 20 x 21 pixels, 40 output channels: row-split),
    its arrays."""
    rows, columns = out_size[0] + 2, out_size[1] + 2
    x, w = _implicit_operands(channels, out_channels, out_size)
    window = L.ImplicitColumns(out_size[1], columns, 1, rows * columns, 3, 3, columns, 1)
    m, n, k = out_size[0] * out_size[1], out_channels, channels * 9
    gemm = L.Gemm(
        "a",
        L.const(0),
        0,
        "b",
        L.const(0),
        k,
        "c",
        L.const(0),
        m,
        m,
        n,
        k,
        b_panels=True,
        b_transposed=True,
        c_transposed=True,
        a_window=window,
    )
    packed = pack_columns(w.reshape(1, n, k), GemmBlocking().tile_columns, transposed=True)[0]
    params = [L.Param("c", output=True), L.Param("a"), L.Param("b")]
    return L.LoopKernel(params, [gemm]), [np.full((n, m), np.nan, np.float32), x, packed]


def test_implicit_gemm_over_planes_apart_beyond_the_stride_prefetcher_prefetches_channels_ahead(tmp_path):
    """A tile of an implicit GEMM whose planes lie further apart than STRIDE_PREFETCHER_BYTES prefetches, per kernel
    row, the lines of its first and last pixel WINDOW_PREFETCH_CHANNELS channels ahead; over closer planes (the
    hardware follows those) nothing. Prefetching past the input's end (the last channels) computes the same."""
    big, arrays = _implicit_kernel(5, 40, (30, 31))
    small, _ = _implicit_kernel(5, 40, (14, 14))
    assert 32 * 33 * F32_BYTES > STRIDE_PREFETCHER_BYTES >= 16 * 16 * F32_BYTES
    text = kernel_module_ir([("farm_k_test", big)], host())
    assert _prefetches(big) == {0} and _prefetches(small) == set()
    assert re.search(rf"= add i64 %\S+, {WINDOW_PREFETCH_CHANNELS * 32 * 33}\n", text)
    [c, *_] = run_kernel(big, arrays, tmp_path)
    x, w = _implicit_operands(5, 40, (30, 31))
    taps = np.stack([x[:, r : r + 30, s : s + 31] for r in range(3) for s in range(3)], axis=1)
    assert_gemm_close(c, w.astype(np.float64) @ taps.reshape(5 * 9, 30 * 31))


@pytest.mark.parametrize(
    "case, outlined",
    [(lambda: _few_row_kernel(9, 130, 513), 3), (lambda: _implicit_kernel(64, 130, (7, 9)), 6), (_implicit_kernel, 4)],
    ids=["few-rows", "implicit-few-rows", "implicit-rows"],
)
def test_a_kernel_split_into_parts_computes_what_the_whole_one_does(case, outlined, tmp_path):
    """The heaviest GEMM launches go into functions of their own (outlined_functions: a few-row GEMM's three pieces,
    an implicit one's with their epilogues apart, a row-split implicit GEMM's column groups' full and edge rows), each
    part an object of its own: linked, the
    parts compute bit for bit what the kernel compiled whole computes."""
    kernel, arrays = case()
    [gemm] = [stmt for stmt in kernel.body if isinstance(stmt, L.Gemm)]
    assert outlined_functions(gemm, GemmBlocking()) == outlined
    parts = 1 + min(outlined, MAX_PARTS - 1)
    whole = kernel_module_ir([("farm_k_test", kernel)], host(), GemmBlocking(), parts)
    assert len(re.findall(r'define hidden void @"?farm_k_test_\d+_o\d+"?', whole)) == outlined
    for part in range(parts):
        text = kernel_module_ir([("farm_k_test", kernel)], host(), GemmBlocking(), parts, part)
        defined = re.findall(r'define hidden void @"?(farm_k_test\w*)"?', text)
        assert (defined[-1] == "farm_k_test") == (part == 0)  # the kernel, last after its launches, is part 0's
        assert all(name.rsplit("_o", 1)[-1].isdigit() == (part > 0) for name in defined)
    [expected] = [run_kernel(kernel, arrays, tmp_path)[0]]
    [split] = [run_kernel(kernel, arrays, tmp_path, parts=parts)[0]]
    np.testing.assert_array_equal(split, expected)


def test_an_offset_folds_its_constant_terms_and_multiplies_by_one_not_at_all() -> None:
    """GemmEmitter.offset: (x, 1) + (3, 4) + (y, 0) + (z, 5) is x + z * 5 + 12, two adds and one multiply (llvmlite
    folds nothing), and a sum of constants alone is a constant."""
    from llvmlite import ir

    from farm.backends.llvm.gemm_emitter import I64_T, GemmEmitter

    fn = ir.Function(ir.Module(), ir.FunctionType(I64_T, [I64_T] * 3), "f")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = L.const(0)
    gemm = L.Gemm("in0", zero, 1, "in1", zero, 1, "out0", zero, 1, m=1, n=1, k=1)
    gen = GemmEmitter(builder, None, None, None, None, gemm, GemmBlocking())
    x, y, z = fn.args
    builder.ret(gen.offset((x, 1), (3, 4), (y, 0), (z, 5)))
    text = str(fn)
    assert text.count(" mul ") == 1 and text.count(" add ") == 2 and ", 12" in text
    assert gen.offset((2, 3), (ir.Constant(I64_T, 4), 5)).constant == 26
