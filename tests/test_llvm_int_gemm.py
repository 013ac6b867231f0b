"""IntGemm's LLVM rendering (farm.backends.llvm.int_gemm) with each dot product this host's CPU runs, checked
against exact integer arithmetic: every signedness, zero points over the whole byte range (one value, one per row
of A and column of B, none), register tiles and their edge rows, partial vectors of columns, row sums past whole
vectors, and units at offsets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from native_helpers import host, run_kernel

from farm.backends.llvm.dot_products import (
    DOT_PRODUCTS,
    DotProduct,
    b_panels_flipped,
    dot_product_for,
    generic_dot_product,
)
from farm.backends.llvm.packing import pack_byte_panels
from farm.ir import loopir as L

DTYPES = {"uint8": L.U8, "int8": L.I8}


def _host_dots() -> list[DotProduct]:
    """Every dot product the host's features allow (the widening ones at 4, 8 and 16 lanes always), and the one
    dot_product_for gives the host where it differs (packing B by vpermb with AVX-512 VBMI)."""
    enabled = set(host().features.split(","))
    dots = [dot for feature, dot in DOT_PRODUCTS if feature in enabled]
    best = dot_product_for(host())
    return dots + [generic_dot_product(lanes) for lanes in (4, 8, 16)] + ([best] if best not in dots else [])


def _dot_id(dot: DotProduct) -> str:
    return f"{dot.name}-{dot.lanes}" + ("-vpermb" if dot.permutes_bytes else "")


DOTS = _host_dots()


def _ints(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)


def _kernel(
    m: int, k: int, n: int, a_dtype: str, b_dtype: str, zeros: str, units: int, transposed: bool = False
) -> tuple[L.LoopKernel, list[np.ndarray], np.ndarray]:
    """An IntGemm per unit of n columns of a k x (units * n) B, in a parallel loop; its arrays and the exact C.
    `zeros`: "scalar" (one value each), "per-line" (A's per row, B's per column) or "none"; `transposed`: B and C
    stored transposed (L.IntGemm.b_transposed, c_transposed; the arrays then hold them so)."""
    width = units * n
    a, b = _ints((m, k), a_dtype, 1), _ints((k, width), b_dtype, 2)
    per_line = zeros == "per-line"
    a_zero = _ints((m,) if per_line else (1,), a_dtype, 3)
    b_zero = _ints((width,) if per_line else (1,), b_dtype, 4)
    if zeros == "none":
        a_zero, b_zero = np.zeros(1, a_dtype), np.zeros(1, b_dtype)
    shifted_a = a.astype(np.int64) - a_zero.astype(np.int64).reshape(-1, 1)
    exact = shifted_a @ (b.astype(np.int64) - b_zero.astype(np.int64))
    unit = L.Names().var("u")
    with_zeros = zeros != "none"
    gemm = L.IntGemm(
        "in0",
        L.const(0),
        k,
        "in1",
        unit * n * (k if transposed else 1),
        k if transposed else width,
        "out0",
        unit * n * (m if transposed else 1),
        m if transposed else width,
        m,
        n,
        k,
        a_zero=L.LineValues("in2", L.const(0), per_line) if with_zeros else None,
        b_zero=L.LineValues("in3", unit * n if per_line else L.const(0), per_line) if with_zeros else None,
        b_transposed=transposed,
        c_transposed=transposed,
    )
    params = [
        L.Param("out0", L.I32, output=True),
        L.Param("in0", DTYPES[a_dtype]),
        L.Param("in1", DTYPES[b_dtype]),
        L.Param("in2", DTYPES[a_dtype]),
        L.Param("in3", DTYPES[b_dtype]),
    ]
    kernel = L.LoopKernel(params, [L.Loop(unit, units, [gemm], parallel=True)])
    if transposed:
        arrays = [np.zeros((width, m), np.int32), a, np.ascontiguousarray(b.T), a_zero, b_zero]
        return kernel, arrays, np.ascontiguousarray(exact.astype(np.int32).T)
    arrays = [np.zeros((m, width), np.int32), a, b, a_zero, b_zero]
    return kernel, arrays, exact.astype(np.int32)


SHAPES = [
    # m, k, n, units: one tile and edge rows; k past whole vectors of the row sums; several units; one row; columns
    # past whole vectors (a partial vector after whole ones, and one alone).
    (13, 36, 16, 1),
    (7, 132, 64, 2),
    (1, 4, 32, 3),
    (20, 256, 48, 1),
    (9, 8, 21, 2),
    (6, 12, 5, 3),
    # k past whole groups of four: 1, 3 or 2 bytes of the last.
    (7, 1, 16, 1),
    (8, 147, 19, 2),
    (3, 66, 64, 1),
    # A past int_gemm.A_WORDS_MAX_BYTES widened: AVX2 widens it per row and k group instead.
    (33, 2048, 16, 1),
]


OPERANDS = [
    # a_dtype, b_dtype, zeros, transposed: every signedness, every kind of zero point, both layouts of B and C; zero
    # points known to be 0 ("none") where B's column sums are skipped, and where (an int8 A broadcast as the signed
    # operand) the row sums are too.
    ("uint8", "int8", "per-line", False),
    ("int8", "uint8", "scalar", True),
    ("uint8", "uint8", "none", False),
    ("int8", "int8", "per-line", True),
    ("int8", "uint8", "none", False),
]


@pytest.mark.parametrize("dot", DOTS, ids=_dot_id)
@pytest.mark.parametrize("a_dtype, b_dtype, zeros, transposed", OPERANDS)
def test_int_gemm_is_exact(
    dot: DotProduct, a_dtype: str, b_dtype: str, zeros: str, transposed: bool, tmp_path: Path
) -> None:
    for index, (m, k, n, units) in enumerate(SHAPES):
        kernel, arrays, exact = _kernel(m, k, n, a_dtype, b_dtype, zeros, units, transposed)
        (tmp_path / str(index)).mkdir()
        out = run_kernel(kernel, arrays, tmp_path / str(index), dot=dot)[0]
        np.testing.assert_array_equal(out, exact, err_msg=f"m={m} k={k} n={n} units={units}")


def test_extreme_values_are_exact(tmp_path: Path) -> None:
    """The largest products of both signs (255 * 127 and 255 * -128, four at a time: vpmaddubsw would saturate
    their pairs at 16 bits) over a long k."""
    for dot in DOTS:
        m, k, n = 3, 4096, 16
        kernel, arrays, _ = _kernel(m, k, n, "uint8", "int8", "none", 1)
        arrays[1][:] = 255
        arrays[2][:] = -128
        arrays[2][:, ::2] = 127
        exact = arrays[1].astype(np.int64) @ arrays[2].astype(np.int64)
        folder = tmp_path / _dot_id(dot)
        folder.mkdir()
        out = run_kernel(kernel, arrays, folder, dot=dot)[0]
        np.testing.assert_array_equal(out, exact.astype(np.int32))


def _requantized_kernel(
    m: int, k: int, n: int, on_rows: bool, relu: bool, out_dtype: str
) -> tuple[L.LoopKernel, list[np.ndarray], np.ndarray]:
    """One IntGemm (uint8 A, int8 B, per-line weight scales and bias along rows or columns) requantized into
    `out_dtype`, its arrays and the reference's bytes (float64 as QLinearConv defines it)."""
    a, b = _ints((m, k), "uint8", 1), _ints((k, n), "int8", 2)
    lines = m if on_rows else n
    rng = np.random.default_rng(5)
    x_scale = np.array([0.0213], np.float32)
    w_scale = (rng.random(lines) * 0.01 + 0.001).astype(np.float32)
    y_scale = np.array([0.9], np.float32)
    y_zero = _ints((1,), out_dtype, 6)
    bias = rng.integers(-3000, 3000, lines).astype(np.int32)
    a_zero = _ints((1,), "uint8", 3)
    sums = (a.astype(np.int64) - a_zero.astype(np.int64)) @ b.astype(np.int64)
    along = (slice(None), None) if on_rows else (None, slice(None))
    multiplier = ((x_scale * w_scale) / y_scale).astype(np.float32).astype(np.float64)
    value = (sums + bias[along]).astype(np.float64) * multiplier[along] + np.float64(y_zero[0])
    low, high = (-128, 127) if out_dtype == "int8" else (0, 255)
    floor = max(low, int(y_zero[0])) if relu else low
    expected = np.clip(np.rint(value), floor, high).astype(out_dtype)
    gemm = L.IntGemm(
        "in0",
        L.const(0),
        k,
        "in1",
        L.const(0),
        n,
        "out0",
        L.const(0),
        n,
        m,
        n,
        k,
        a_zero=L.LineValues("in2", L.const(0)),
        requantize=L.Requantize(
            x_scale=L.LineValues("in3", L.const(0)),
            w_scale=L.LineValues("in4", L.const(0), True),
            y_scale=L.LineValues("in5", L.const(0)),
            y_zero=L.LineValues("in6", L.const(0)),
            bias=L.LineValues("in7", L.const(0), True),
            on_rows=on_rows,
            low=low,
            high=high,
            relu=relu,
        ),
    )
    params = [
        L.Param("out0", DTYPES[out_dtype], output=True),
        L.Param("in0", L.U8),
        L.Param("in1", L.I8),
        L.Param("in2", L.U8),
        L.Param("in3", L.F32),
        L.Param("in4", L.F32),
        L.Param("in5", L.F32),
        L.Param("in6", DTYPES[out_dtype]),
        L.Param("in7", L.I32),
    ]
    arrays = [np.zeros((m, n), out_dtype), a, b, a_zero, x_scale, w_scale, y_scale, y_zero, bias]
    return L.LoopKernel(params, [gemm]), arrays, expected


@pytest.mark.parametrize("dot", DOTS, ids=_dot_id)
@pytest.mark.parametrize("on_rows, relu, out_dtype", [(True, True, "uint8"), (False, False, "int8")])
def test_requantized_int_gemm_matches_the_reference(
    dot: DotProduct, on_rows: bool, relu: bool, out_dtype: str, tmp_path: Path
) -> None:
    for index, (m, k, n) in enumerate([(4, 27, 49), (13, 64, 37), (7, 130, 64)]):
        kernel, arrays, expected = _requantized_kernel(m, k, n, on_rows, relu, out_dtype)
        (tmp_path / str(index)).mkdir()
        out = run_kernel(kernel, arrays, tmp_path / str(index), dot=dot)[0]
        np.testing.assert_array_equal(out, expected, err_msg=f"m={m} k={k} n={n}")


@pytest.mark.parametrize("dot", DOTS, ids=_dot_id)
@pytest.mark.parametrize(
    "a_dtype, b_dtype, transposed",
    [("uint8", "uint8", True), ("uint8", "int8", False), ("int8", "int8", True), ("int8", "uint8", False)],
)
def test_a_b_packed_at_build_time_is_read_from_its_panels(
    dot: DotProduct, a_dtype: str, b_dtype: str, transposed: bool, tmp_path: Path
) -> None:
    """B as a CPU build packs a constant weight (packing.pack_byte_panels: 16-column panels, which 8- and 4-lane
    vectors read in halves and quarters), each unit's B at its first column times k. The shapes take every way the
    column sums of such a B are taken: by a tile one vector wide of all m rows (DotProduct.tall_rows), by the tile of
    the rows past the last whole row tile, or in a pass of their own (m a multiple of the tile's rows)."""
    shapes = [(13, 36, 16, 1), (7, 132, 64, 2), (20, 256, 48, 1), (4, 40, 32, 2), (6, 20, 32, 1), (24, 36, 80, 1)]
    for index, (m, k, n, units) in enumerate(shapes):
        kernel, arrays, exact = _kernel(m, k, n, a_dtype, b_dtype, "per-line", units, transposed)
        stored = arrays[2].reshape(1, units * n, k) if transposed else arrays[2].reshape(1, k, units * n)
        flip = b_panels_flipped(dot, a_dtype == "int8", b_dtype == "int8")
        arrays[2] = pack_byte_panels(stored, L.INT_GEMM_PANEL_LANES, transposed, flip).reshape(-1)
        loop = kernel.body[0]
        assert isinstance(loop, L.Loop) and isinstance(loop.body[0], L.IntGemm)
        loop.body[0] = dataclasses.replace(loop.body[0], b_offset=loop.var * (n * k), b_panels=units * n)
        (tmp_path / str(index)).mkdir()
        out = run_kernel(kernel, arrays, tmp_path / str(index), dot=dot)[0]
        np.testing.assert_array_equal(out, exact, err_msg=f"m={m} k={k} n={n}")


@pytest.mark.parametrize("dot", DOTS, ids=_dot_id)
@pytest.mark.parametrize("per_column, biased", [(False, True), (True, True), (True, False)])
def test_int_gemm_dequantizes_as_the_cast_mul_and_add_would(
    dot: DotProduct, per_column: bool, biased: bool, tmp_path: Path
) -> None:
    """L.Dequantize: C = float32(sum) * scale + bias, every step rounded to float32 as the Cast, Mul and Add kernels
    it replaces round (bit for bit, the multiply and the add never fused), the scale one value or one per column,
    with or without a bias; over partial vectors of columns and several units, with sums past 2^24 (where the
    conversion to float32 rounds)."""
    for index, (m, k, n, units) in enumerate([(13, 1024, 16, 2), (9, 8, 21, 2), (7, 132, 64, 1)]):
        kernel, arrays, exact = _kernel(m, k, n, "uint8", "int8", "scalar", units)
        if not index:  # A's bytes high and B's positive: sums of 2^24 and more, most of them not floats
            arrays[1], arrays[2] = np.full_like(arrays[1], 250) - arrays[1] % 7, arrays[2] % 28 + 100
            arrays[3], arrays[4] = np.zeros(1, np.uint8), np.zeros(1, np.int8)
            exact = (arrays[1].astype(np.int64) @ arrays[2].astype(np.int64)).astype(np.int32)
            assert (np.abs(exact) > 1 << 24).mean() > 0.9 and (exact.astype(np.float32) != exact).any()
        [gemm] = [stmt for stmt in kernel.body[0].body if isinstance(stmt, L.IntGemm)]  # type: ignore[attr-defined]
        width, unit = units * n, kernel.body[0].var  # type: ignore[attr-defined]
        rng = np.random.default_rng(index)
        scale = rng.uniform(1e-4, 1e-2, width if per_column else 1).astype(np.float32)
        bias = rng.standard_normal(width).astype(np.float32)
        gemm.dequantize = L.Dequantize(
            L.LineValues("in4", unit * n if per_column else L.const(0), per_column),
            L.LineValues("in5", unit * n, True) if biased else None,
        )
        kernel.params[0] = L.Param("out0", L.F32, output=True)
        kernel.params += [L.Param("in4", L.F32), L.Param("in5", L.F32)]
        arrays[0] = np.zeros((m, width), np.float32)
        expected = exact.astype(np.float32) * (scale if per_column else scale[0])
        expected = expected + bias if biased else expected
        (tmp_path / str(index)).mkdir()
        out = run_kernel(kernel, [*arrays, scale, bias], tmp_path / str(index), dot=dot)[0]
        np.testing.assert_array_equal(out, expected, err_msg=f"m={m} k={k} n={n} units={units}")
