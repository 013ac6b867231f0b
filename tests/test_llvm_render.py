"""The LLVM renderer of the loop IR: hand-built kernels compiled at O3, linked and run through farm_run."""

from __future__ import annotations

import re
import subprocess

import llvmlite.binding as llvm
import ml_dtypes
import numpy as np
import onnx
import pytest
from llvmlite import ir
from native_helpers import (
    EM_AARCH64,
    aarch64,
    compile_kernels,
    elf_header,
    host,
    kernel_module_ir,
    run_kernel,
    run_kernels,
)

from farm.backends.llvm import render
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.toolchain import compile_ir
from farm.backends.opencl import render as cl_render
from farm.build.assembly import plan_model
from farm.ir import launching
from farm.ir import loopir as L
from farm.ops import lower_kernel
from farm.tools.examples import EXAMPLES


def unary_kernel(fn, n: int, in_dtype: str = L.F32, out_dtype: str = L.F32) -> L.LoopKernel:
    """out[i] = fn(in[i]) for i < n."""
    i = L.Var("i")
    return L.LoopKernel(
        [L.Param("out", out_dtype, output=True), L.Param("in", in_dtype)],
        [L.Loop(i, n, [L.Store("out", i, fn(L.Load("in", i, in_dtype)))])],
    )


def run_unary(fn, x: np.ndarray, tmp_path, out_dtype=np.float32) -> np.ndarray:
    in_dtype = L.I64 if x.dtype == np.int64 else L.F32
    ir_out = L.I64 if np.dtype(out_dtype) == np.int64 else L.F32
    out, _ = run_kernel(unary_kernel(fn, x.size, in_dtype, ir_out), [np.zeros(x.shape, out_dtype), x], tmp_path)
    return out


# -- math functions ----------------------------------------------------------------------------------------------------


def test_exp_is_accurate_over_a_wide_range(tmp_path):
    x = np.concatenate(
        [
            np.linspace(-80, 80, 200_001, dtype=np.float32),
            np.array([0.0, -0.0, 1.0, -1.0, 1e-7, -1e-7, 0.5, 88.0, -87.0], np.float32),
        ]
    )
    out = run_unary(lambda v: L.call("exp", v), x, tmp_path)
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)), rtol=2e-7, atol=0)
    assert out[-9:-7].tolist() == [1.0, 1.0]  # exp(+0), exp(-0) exactly


def test_log_is_accurate_over_a_wide_range(tmp_path):
    x = np.concatenate(
        [
            np.logspace(-30, 30, 200_001, dtype=np.float32),
            np.array([1.0, 0.5, 2.0, 0.999, 1.001, 1.17549435e-38, 3.4e38], np.float32),
        ]
    )
    out = run_unary(lambda v: L.call("log", v), x, tmp_path)
    np.testing.assert_allclose(out, np.log(x.astype(np.float64)), rtol=2e-7, atol=1e-12)
    assert out[-7] == 0.0  # log(1) exactly


def test_exp_propagates_nan_and_underflows_to_exactly_zero(tmp_path):
    """Below -87.3 (where expf turns subnormal) the result is 0, never a subnormal or the clamp's 1.2e-38: masked
    attention scores (-10000) would otherwise feed subnormal products to the next MatMul, which are slow."""
    x = np.array([np.nan, -np.inf, -1000.0, -10000.0, -100.0, -87.5, -87.0], np.float32)
    out = run_unary(lambda v: L.call("exp", v), x, tmp_path)
    assert np.isnan(out[0])
    assert out[1:6].tolist() == [0.0] * 5
    np.testing.assert_allclose(out[6], np.exp(-87.0), rtol=2e-7)


def test_exp_overflows_like_float32_near_the_top_of_its_range(tmp_path):
    """float32 exp is finite up to ln(FLT_MAX) = 88.7228 and +inf beyond; farm's clamp at 88.37 returns
    exp(88.37) = 2.39e38 for every larger x (16 % low at 88.5, finite for +inf)."""
    x = np.array([88.4, 88.5, 88.7, 89.0, 100.0, np.inf], np.float32)
    out = run_unary(lambda v: L.call("exp", v), x, tmp_path)
    with np.errstate(over="ignore"):
        expected = np.exp(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(out, expected, rtol=2e-7)


def test_log_of_nan_inf_and_zero_follow_ieee(tmp_path):
    """log(NaN) = NaN, log(+inf) = +inf, log(0) = -inf, log(x < 0) = NaN, as onnxruntime gives.

    farm's inline logf gives 89.13, 88.72, -87.34 and -87.34: the bit tricks treat NaN/inf as huge normals and the
    clamp to FLT_MIN maps zero and negatives to log(FLT_MIN).
    """
    x = np.array([np.nan, np.inf, 0.0, -1.0], np.float32)
    out = run_unary(lambda v: L.call("log", v), x, tmp_path)
    assert np.isnan(out[0]), f"log(nan) = {out[0]}"
    assert out[1] == np.inf, f"log(inf) = {out[1]}"
    assert out[2] == -np.inf, f"log(0) = {out[2]}"
    assert np.isnan(out[3]), f"log(-1) = {out[3]}"


def test_log_of_subnormals_is_accurate(tmp_path):
    x = np.array([1e-38, 5e-39, 1e-40, 1e-44, 1.4e-45, 1.1754942e-38], np.float32)
    out = run_unary(lambda v: L.call("log", v), x, tmp_path)
    np.testing.assert_allclose(out, np.log(x.astype(np.float64)), rtol=2e-7)


def test_sqrt_is_correctly_rounded(tmp_path):
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            rng.uniform(0, 1e6, 4099).astype(np.float32),
            np.array([0.0, 1.0, 2.0, 1e-38, 3.4e38, np.inf, -1.0, np.nan], np.float32),
        ]
    )
    out = run_unary(lambda v: L.call("sqrt", v), x, tmp_path)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, np.sqrt(x))


def test_floor_matches_numpy(tmp_path):
    rng = np.random.default_rng(2)
    x = np.concatenate(
        [
            rng.uniform(-1000, 1000, 1027).astype(np.float32),
            np.array([-0.5, 0.5, -1.0, 1.0, 0.0, -2.5, 1e10, -1e10, 8388607.5, np.inf, -np.inf, np.nan], np.float32),
        ]
    )
    np.testing.assert_array_equal(run_unary(lambda v: L.call("floor", v), x, tmp_path), np.floor(x))


# -- max/min and NaN -----------------------------------------------------------------------------------------------------


SPECIALS = np.array([np.nan, -1.0, 2.0, 7.0, np.inf, -np.inf, 0.0, -3.5], np.float32)


def test_relu_style_maximum_propagates_nan(tmp_path):
    out = run_unary(lambda v: L.maximum(v, 0.0), SPECIALS, tmp_path)
    assert np.isnan(out[0])
    np.testing.assert_array_equal(out[1:], np.maximum(SPECIALS[1:], 0.0))


def test_clip_style_min_max_propagates_nan(tmp_path):
    out = run_unary(lambda v: L.minimum(L.maximum(v, 0.0), 6.0), SPECIALS, tmp_path)
    assert np.isnan(out[0])
    np.testing.assert_array_equal(out[1:], np.clip(SPECIALS[1:], 0.0, 6.0))


def test_relu_of_nan_survives_vectorisation(tmp_path):
    """A long loop vectorises; NaN must still come through in every lane position."""
    x = np.linspace(-5, 5, 1000, dtype=np.float32)
    x[::7] = np.nan
    out = run_unary(lambda v: L.maximum(v, 0.0), x, tmp_path)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(x))
    np.testing.assert_array_equal(out[~np.isnan(x)], np.maximum(x[~np.isnan(x)], 0.0))


# -- statements -------------------------------------------------------------------------------------------------------


def row_reduce_kernel(rows: int, cols: int, combine, init: float) -> L.LoopKernel:
    """out[r] = combine over c of in[r, c], through a scalar local (Assign)."""
    names = L.Names()
    r, c, acc = names.var("r"), names.var("c"), names.local()
    body = [
        L.Loop(
            r,
            rows,
            [
                L.Assign(acc, L.const(init)),
                L.Loop(c, cols, [L.Assign(acc, combine(acc, L.Load("in", r * cols + c)))]),
                L.Store("out", r, acc),
            ],
        )
    ]
    return L.LoopKernel([L.Param("out", output=True), L.Param("in")], body)


def test_sum_reduction_with_assign(tmp_path):
    x = np.random.default_rng(3).standard_normal((13, 257)).astype(np.float32)
    out, _ = run_kernel(row_reduce_kernel(13, 257, lambda a, v: a + v, 0.0), [np.zeros(13, np.float32), x], tmp_path)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_max_reduction_with_assign(tmp_path):
    x = np.random.default_rng(4).standard_normal((9, 100)).astype(np.float32)
    out, _ = run_kernel(row_reduce_kernel(9, 100, L.maximum, -np.inf), [np.zeros(9, np.float32), x], tmp_path)
    np.testing.assert_array_equal(out, x.max(axis=1))


def test_if_statement_stores_only_where_the_condition_holds(tmp_path):
    i = L.Var("i")
    x = np.linspace(-3, 3, 61, dtype=np.float32)
    kernel = L.LoopKernel(
        [L.Param("out", output=True), L.Param("in")],
        [
            L.Loop(
                i, x.size, [L.If(L.compare("gt", L.Load("in", i), 0.0), [L.Store("out", i, L.Load("in", i) * 2.0)])]
            ),
        ],
    )
    out, _ = run_kernel(kernel, [np.full(x.size, -7.0, np.float32), x], tmp_path)
    np.testing.assert_array_equal(out, np.where(x > 0, x * 2, -7.0).astype(np.float32))


def test_if_on_integer_conditions(tmp_path):
    """Every third index, and only inside [5, 20): integer mod, comparisons and a logical and."""
    i = L.Var("i")
    cond = L.logical_and(L.compare("eq", i % 3, 0), L.compare("ge", i, 5), L.compare("lt", i, 20))
    kernel = L.LoopKernel(
        [L.Param("out", output=True)],
        [
            L.Loop(i, 30, [L.If(cond, [L.Store("out", i, L.to_float(i))])]),
        ],
    )
    (out,) = run_kernel(kernel, [np.full(30, -1.0, np.float32)], tmp_path)
    index = np.arange(30)
    np.testing.assert_array_equal(out, np.where((index % 3 == 0) & (index >= 5) & (index < 20), index, -1.0))


def test_select_leaky_relu(tmp_path):
    x = np.linspace(-4, 4, 101, dtype=np.float32)
    out = run_unary(lambda v: L.select(L.compare("lt", v, 0.0), v * 0.1, v), x, tmp_path)
    np.testing.assert_allclose(out, np.where(x < 0, x * np.float32(0.1), x), rtol=1e-7)


def test_select_on_integers(tmp_path):
    i = L.Var("i")
    kernel = L.LoopKernel(
        [L.Param("out", L.I64, output=True)],
        [
            L.Loop(i, 10, [L.Store("out", i, L.select(L.compare("lt", i, 4), i * 10, L.const(-1)))]),
        ],
    )
    (out,) = run_kernel(kernel, [np.zeros(10, np.int64)], tmp_path)
    assert out.tolist() == [0, 10, 20, 30, -1, -1, -1, -1, -1, -1]


def test_cast_i64_to_f32(tmp_path):
    i = L.Var("i")
    kernel = L.LoopKernel([L.Param("out", output=True)], [L.Loop(i, 50, [L.Store("out", i, L.to_float(i * 3 - 70))])])
    (out,) = run_kernel(kernel, [np.zeros(50, np.float32)], tmp_path)
    np.testing.assert_array_equal(out, (np.arange(50) * 3 - 70).astype(np.float32))


def test_cast_of_loaded_i64_values_to_f32(tmp_path):
    x = np.array([0, 1, -1, 2**24, -(2**24), 123456789, -5], np.int64)
    np.testing.assert_array_equal(run_unary(L.to_float, x, tmp_path), x.astype(np.float32))


def test_cast_f32_to_i64_truncates_toward_zero(tmp_path):
    x = np.array([0.0, 1.9, -1.9, 2.5, -2.5, 1e6 + 0.5, -7.0], np.float32)
    out = run_unary(lambda v: L.Cast(v, L.I64), x, tmp_path, out_dtype=np.int64)
    np.testing.assert_array_equal(out, np.trunc(x).astype(np.int64))


def test_cast_f32_to_i32_and_on_to_i64_keeps_the_sign(tmp_path):
    """I32 is only ever a cast's value (quantize.saturate); cast on to I64 it is sign-extended."""
    x = np.array([0.0, 1.9, -1.9, 255.0, -128.0, 65535.0, -70000.5], np.float32)
    out = run_unary(lambda v: L.Cast(L.Cast(v, L.I32), L.I64), x, tmp_path, out_dtype=np.int64)
    np.testing.assert_array_equal(out, np.trunc(x).astype(np.int64))


def test_cast_bool_to_f32_gives_one_for_true(tmp_path):
    """A comparison is an i1; true must become 1.0. `sitofp i1 true` is -1.0, so this needs uitofp (or zext)."""
    x = np.array([-1.0, 0.0, 2.0, 3.0], np.float32)
    out = run_unary(lambda v: L.to_float(L.compare("gt", v, 0.0)), x, tmp_path)
    np.testing.assert_array_equal(out, (x > 0).astype(np.float32))


def test_integer_division_and_modulo_in_indices_transpose(tmp_path):
    """out[i] = in[(i % R) * C + i // R]: the transpose of an R x C matrix, indexed through div and mod."""
    rows, cols = 7, 11
    i = L.Var("i")
    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    kernel = L.LoopKernel(
        [L.Param("out", output=True), L.Param("in")],
        [
            L.Loop(i, rows * cols, [L.Store("out", i, L.Load("in", (i % rows) * cols + i // rows))]),
        ],
    )
    out, _ = run_kernel(kernel, [np.zeros(rows * cols, np.float32), x], tmp_path)
    np.testing.assert_array_equal(out, x.T.reshape(-1))


def test_integer_div_mod_folding_agrees_with_the_rendered_code(tmp_path):
    """An expression must compute the same whether or not its operands are constants.

    loopir folds constant div/mod with Python's // and % (floor), the renderer emits sdiv/srem (truncation), so
    for negative operands `const(-7) // 2` folds to -4 while the same expression over loaded values gives -3.
    """
    pairs = [(-7, 2), (7, -2), (-7, -2), (-1, 3), (7, 2)]
    i = L.Var("i")
    body = [
        L.Loop(
            i,
            len(pairs),
            [
                L.Store("out", i * 4, L.Load("a", i, L.I64) // L.Load("b", i, L.I64)),
                L.Store("out", i * 4 + 1, L.Load("a", i, L.I64) % L.Load("b", i, L.I64)),
            ],
        )
    ]
    for index, (a, b) in enumerate(pairs):
        body.append(L.Store("out", L.const(index * 4 + 2), L.const(a) // L.const(b)))
        body.append(L.Store("out", L.const(index * 4 + 3), L.const(a) % L.const(b)))
    kernel = L.LoopKernel([L.Param("out", L.I64, output=True), L.Param("a", L.I64), L.Param("b", L.I64)], body)
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    out, _, _ = run_kernel(kernel, [np.zeros(4 * len(pairs), np.int64), a, b], tmp_path)
    rendered, folded = out.reshape(-1, 4)[:, :2], out.reshape(-1, 4)[:, 2:]
    np.testing.assert_array_equal(folded, rendered)


def test_gather_through_an_i64_index_buffer(tmp_path):
    x = np.arange(10, dtype=np.float32) * 1.5
    idx = np.array([9, 0, 3, 3, 7], np.int64)
    i = L.Var("i")
    kernel = L.LoopKernel(
        [L.Param("out", output=True), L.Param("in"), L.Param("idx", L.I64)],
        [
            L.Loop(i, idx.size, [L.Store("out", i, L.Load("in", L.Load("idx", i, L.I64)))]),
        ],
    )
    out, _, _ = run_kernel(kernel, [np.zeros(idx.size, np.float32), x, idx], tmp_path)
    np.testing.assert_array_equal(out, x[idx])


def test_broadcasting_add_through_loop_nest(tmp_path):
    """out = a + b with b broadcast from (3, 1), written by loop_nest / flat_index / broadcast_index."""
    out_shape, b_shape = (2, 3, 4), (3, 1)
    body, _ = L.loop_nest(
        L.Names(),
        out_shape,
        lambda v: [
            L.Store(
                "out",
                L.flat_index(out_shape, v),
                L.Load("a", L.flat_index(out_shape, v)) + L.Load("b", L.broadcast_index(b_shape, out_shape, v)),
            )
        ],
    )
    kernel = L.LoopKernel([L.Param("out", output=True), L.Param("a"), L.Param("b")], body)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(out_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    out, _, _ = run_kernel(kernel, [np.zeros(out_shape, np.float32), a, b], tmp_path)
    np.testing.assert_array_equal(out, a + b)


def test_loops_of_extent_zero_and_one(tmp_path):
    i, j = L.Var("i"), L.Var("j")
    kernel = L.LoopKernel(
        [L.Param("out", output=True)],
        [
            L.Loop(i, 0, [L.Store("out", L.const(0), L.const(5.0))]),
            L.Loop(j, 1, [L.Store("out", j + 1, L.const(6.0))]),
        ],
    )
    (out,) = run_kernel(kernel, [np.full(3, -1.0, np.float32)], tmp_path)
    assert out.tolist() == [-1.0, 6.0, -1.0]


def test_several_kernels_in_one_module(tmp_path):
    """Two kernels rendered into one module, each called by farm_run on its own buffers."""
    x = np.arange(8, dtype=np.float32)
    results = run_kernels(
        [
            (unary_kernel(lambda v: v * 2.0, 8), [np.zeros(8, np.float32), x]),
            (unary_kernel(lambda v: v + 1.0, 8), [np.zeros(8, np.float32), x]),
        ],
        tmp_path,
    )
    np.testing.assert_array_equal(results[0][0], x * 2)
    np.testing.assert_array_equal(results[1][0], x + 1)


# -- the IR itself ------------------------------------------------------------------------------------------------------


def sample_kernels() -> list[tuple[str, L.LoopKernel]]:
    names = L.Names()
    r, c, acc = names.var("r"), names.var("c"), names.local()
    gemm = L.Gemm("a", L.const(0), 5, "b", L.const(0), 7, "c", L.const(0), 7, 3, 7, 5)
    return [
        ("k_exp", unary_kernel(lambda v: L.call("exp", v) + L.call("log", v) * L.call("sqrt", v), 64)),
        (
            "k_reduce",
            L.LoopKernel(
                [L.Param("out", output=True), L.Param("in")],
                [
                    L.Loop(
                        r,
                        4,
                        [
                            L.Assign(acc, L.const(0.0)),
                            L.Loop(
                                c,
                                8,
                                [
                                    L.If(
                                        L.compare("gt", L.Load("in", r * 8 + c), 0.0),
                                        [L.Assign(acc, acc + L.Load("in", r * 8 + c))],
                                    )
                                ],
                            ),
                            L.Store("out", r, L.select(L.compare("gt", acc, 1.0), acc, L.to_float(r))),
                        ],
                    )
                ],
            ),
        ),
        ("k_gemm", L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])),
    ]


def test_ir_round_trips_through_parse_assembly_and_verifies():
    text = kernel_module_ir(sample_kernels(), host(), GemmBlocking(rows=2, vectors=2, lanes=4))
    module = llvm.parse_assembly(text)
    module.verify()
    functions = {f.name: f for f in module.functions}
    for symbol in ("k_exp", "k_reduce", "k_gemm"):
        assert not functions[symbol].is_declaration
    assert str(llvm.parse_assembly(str(module))) == str(module)


def test_kernel_signature_is_hidden_nounwind_with_noalias_pointers():
    """declare_kernel documents the kernel as hidden inside the model library; llvmlite.ir has no `visibility`
    attribute, so `fn.visibility = "hidden"` is silently dropped and the kernel is defined with default
    visibility (and then exported from the .so)."""
    text = kernel_module_ir(sample_kernels()[:1], host())
    define = next(line for line in text.splitlines() if re.match(r'define .*@"?k_exp"?\(', line))
    assert re.search(r'define hidden void @"?k_exp"?\(ptr noalias %"?out"?, ptr noalias %"?in"?\)', define), define
    launch = next(line for line in text.splitlines() if re.match(r'define .*@"?k_exp_0"?\(', line))
    assert re.search(
        r'define hidden void @"?k_exp_0"?\(ptr noalias %"?out"?, ptr noalias %"?in"?, i64 %"?begin"?, '
        r'i64 %"?end"?\)',
        launch,
    ), launch
    assert "nounwind" in text


def test_float_math_is_fast_but_keeps_nan_and_inf():
    text = kernel_module_ir(sample_kernels(), host())
    assert re.search(r"fadd reassoc contract nsz arcp float", text)
    assert "nnan" not in text and "ninf" not in text and " fast " not in text


def test_math_functions_are_inline_no_libm(tmp_path):
    """exp/log are expanded inline and sqrt/floor are instructions: the object needs no external symbol."""
    target = host()
    obj = compile_ir(kernel_module_ir(sample_kernels(), target), target, "sample")
    path = tmp_path / "k.o"
    path.write_bytes(obj)
    symbols = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    undefined = [
        line.split()[-1]
        for line in symbols.splitlines()
        if re.match(r"\s*\d+:", line) and " UND " in line and len(line.split()) >= 8
    ]
    assert undefined == [], symbols


def test_kernels_compile_for_aarch64_too():
    obj = compile_kernels(sample_kernels(), aarch64(), GemmBlocking(rows=4, vectors=3, lanes=4))
    assert elf_header(obj) == (2, 1, EM_AARCH64)


@pytest.mark.parametrize("lanes", [1, 4, 8, 16])
def test_rendering_is_deterministic(lanes):
    blocking = GemmBlocking(rows=3, vectors=2, lanes=lanes)
    assert kernel_module_ir(sample_kernels(), host(), blocking) == kernel_module_ir(sample_kernels(), host(), blocking)
    assert compile_kernels(sample_kernels(), host(), blocking) == compile_kernels(sample_kernels(), host(), blocking)


def mask_and_narrow_kernel(n: int) -> L.LoopKernel:
    """mask[i] = a[i] < b[i] (int32 vs int32), flags[i] = !keep[i], wide[i] = a[i] * 2 (int32 in, int64 out),
    narrow[i] = b[i] - 1 (int32 out): every buffer dtype's loads and stores."""
    i = L.Var("i")
    a, b = L.Load("a", i, L.I64), L.Load("b", i, L.I64)
    keep = L.Load("keep", i, L.BOOL)
    params = [
        L.Param("mask", L.BOOL, output=True),
        L.Param("flags", L.BOOL, output=True),
        L.Param("wide", L.I64, output=True),
        L.Param("narrow", L.I32, output=True),
        L.Param("a", L.I32),
        L.Param("b", L.I32),
        L.Param("keep", L.BOOL),
    ]
    body = [
        L.Store("mask", i, L.compare("lt", a, b)),
        L.Store("flags", i, L.select(keep, L.const(False, L.BOOL), L.const(True, L.BOOL))),
        L.Store("wide", i, a * 2),
        L.Store("narrow", i, b - 1),
    ]
    return L.LoopKernel(params, [L.Loop(i, n, body, True)])


def mask_and_narrow_arrays(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(arrays to pass, expected outputs) for _mask_and_narrow_kernel."""
    rng = np.random.default_rng(3)
    a, b = (rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32) for _ in range(2))
    keep = rng.integers(0, 2, n).astype(bool)
    outputs = [np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int32)]
    expected = [a < b, ~keep, a.astype(np.int64) * 2, (b.astype(np.int64) - 1).astype(np.int32)]
    return outputs + [a, b, keep], expected


def test_bool_and_int32_buffers_load_and_store_as_numpy_lays_them_out(tmp_path):
    arrays, expected = mask_and_narrow_arrays(37)
    results = run_kernel(mask_and_narrow_kernel(37), arrays, tmp_path)
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


BIT_OPS = {
    "shl": lambda a, s: a << s,
    "shr": lambda a, s: a >> s,
    "bitand": lambda a, b: a & b,
    "bitor": lambda a, b: a | b,
    "bitxor": lambda a, b: a ^ b,
}
"""Each loop-IR bit operation and its meaning on Python ints (shr: arithmetic, as Python's >> is)."""


def bit_operations_kernel(n: int) -> L.LoopKernel:
    """wide[i, k] = BIT_OPS[k](a[i], s[i]) on int64, then the narrow buffers: right[i] = u8[i] >> t[i] and
    left[i] = u8[i] << t[i] (a uint8 value zero-extended, the left shift wrapping as it is stored), arith[i] =
    i8[i] >> t[i] (sign-extended: an arithmetic shift)."""
    i = L.Var("i")
    a, s, t = L.Load("a", i, L.I64), L.Load("s", i, L.I64), L.Load("t", i, L.I64)
    u8, i8 = L.Load("u8", i, L.I64), L.Load("i8", i, L.I64)
    params = [
        L.Param("wide", L.I64, output=True),
        L.Param("right", L.U8, output=True),
        L.Param("left", L.U8, output=True),
        L.Param("arith", L.I8, output=True),
        L.Param("a", L.I64),
        L.Param("s", L.I64),
        L.Param("t", L.I64),
        L.Param("u8", L.U8),
        L.Param("i8", L.I8),
    ]
    body = [L.Store("wide", i * len(BIT_OPS) + k, L.binary(op, a, s)) for k, op in enumerate(BIT_OPS)]
    body += [
        L.Store("right", i, L.binary("shr", u8, t)),
        L.Store("left", i, L.binary("shl", u8, t)),
        L.Store("arith", i, L.binary("shr", i8, t)),
    ]
    return L.LoopKernel(params, [L.Loop(i, n, body, True)])


def bit_operations_arrays(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(arrays to pass, expected outputs) for bit_operations_kernel: values of both signs up to int64's extremes,
    shifts over [0, 64) and [0, 8)."""
    rng = np.random.default_rng(4)
    a = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    a[:3] = [-(2**63), -1, 2**63 - 1]
    s = np.resize(np.arange(64, dtype=np.int64), n)
    t = np.resize(np.arange(8, dtype=np.int64), n)
    u8 = rng.integers(0, 256, n, dtype=np.uint8)
    i8 = rng.integers(-128, 128, n, dtype=np.int8)
    wide = [[_wrapped(fn(int(x), int(y)), 64) for fn in BIT_OPS.values()] for x, y in zip(a, s)]
    expected = [
        np.asarray(wide, np.int64).reshape(-1),
        u8 >> t.astype(np.uint8),
        u8 << t.astype(np.uint8),
        i8 >> t.astype(np.int8),
    ]
    outputs = [np.zeros(n * len(BIT_OPS), np.int64), np.zeros(n, np.uint8), np.zeros(n, np.uint8), np.zeros(n, np.int8)]
    return outputs + [a, s, t, u8, i8], expected


def _wrapped(value: int, bits: int) -> int:
    """`value`'s low `bits` bits as a signed integer."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def test_bit_operations_on_int64_and_narrow_buffers(tmp_path):
    arrays, expected = bit_operations_arrays(70)
    results = run_kernel(bit_operations_kernel(70), arrays, tmp_path)
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def bfloat16_kernel(n: int) -> L.LoopKernel:
    """from32[i] = x32[i], from64[i] = x64[i] (both bfloat16 out: rounded), wide[i] = b[i] (bfloat16 in, float32
    out), in a parallel loop (the vectoriser widens it)."""
    i = L.Var("i")
    params = [
        L.Param("from32", L.BF16, output=True),
        L.Param("from64", L.BF16, output=True),
        L.Param("wide", L.F32, output=True),
        L.Param("x32", L.F32),
        L.Param("x64", L.F64),
        L.Param("b", L.BF16),
    ]
    body = [
        L.Store("from32", i, L.Load("x32", i, L.F32)),
        L.Store("from64", i, L.Load("x64", i, L.F64)),
        L.Store("wide", i, L.Load("b", i, L.F32)),
    ]
    return L.LoopKernel(params, [L.Loop(i, n, body, True)])


def bfloat16_arrays(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(arrays to pass, expected outputs) for bfloat16_kernel, bfloat16 buffers as their uint16 bits (OpenCL's
    buffers take only dtypes of Python's buffer protocol): random bit patterns (NaNs with payloads included), ties
    to even both ways, the largest finite values and the overflow to infinity, subnormals, and doubles just off a
    tie (which a rounding through float32's nearest would put on it); expected: ml_dtypes' conversions."""
    rng = np.random.default_rng(4)
    special = np.asarray(
        [
            0x3F808000,
            0x3F818000,
            0xBF808000,
            0x7F7F7FFF,
            0x7F7F8000,
            0x7F7FFFFF,
            0x00008000,
            0x00018000,
            0x80008001,
            0x00000001,
            0x7F800000,
            0xFF800000,
            0x7F800001,
            0xFFC12345,
            0,
            1 << 31,
        ],
        np.uint32,
    )
    x32 = np.resize(np.concatenate([special, rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)]), n)
    x32 = x32.view(np.float32)
    ties = (1.0 + np.arange(1, 64) * 2.0**-8) * 2.0 ** rng.integers(-133, 127, 63)
    wide = np.concatenate([ties + ties * 2.0**-40, ties - ties * 2.0**-40, ties, [1e300, -1e-300, np.nan, -np.inf]])
    x64 = np.resize(np.concatenate([wide, rng.standard_normal(n) * 10.0 ** rng.integers(-40, 39, n)]), n)
    b = rng.integers(0, 2**16, n, dtype=np.uint16)
    outputs = [np.zeros(n, np.uint16), np.zeros(n, np.uint16), np.zeros(n, np.float32)]
    bfloat16 = ml_dtypes.bfloat16
    with np.errstate(invalid="ignore", over="ignore"):
        expected = [
            x32.astype(bfloat16).view(np.uint16),
            x64.astype(bfloat16).view(np.uint16),
            b.view(bfloat16).astype(np.float32),
        ]
    return outputs + [x32, x64, b], expected


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit (NaNs included), the first differences shown in hex."""
    bits = {2: np.uint16, 4: np.uint32}[want.itemsize]
    got, want = got.view(bits), want.view(bits)
    wrong = np.flatnonzero(got != want)
    assert wrong.size == 0, [(int(i), hex(got[i]), hex(want[i])) for i in wrong[:5]]


def test_bfloat16_buffers_round_to_nearest_even_and_widen_exactly(tmp_path):
    arrays, expected = bfloat16_arrays(1001)
    results = run_kernel(bfloat16_kernel(1001), arrays, tmp_path)
    for got, want in zip(results, expected):
        assert_same_bits(got, want)


# -- launches: the kind loopir gives each launch, as both renderers and launch_info see it -------------------------------


def test_every_launch_kind_has_an_emitter():
    assert set(render.LAUNCH_EMITTERS) == set(launching.LaunchKind)


@pytest.fixture(scope="module")
def example_kernels(tmp_path_factory) -> dict[str, L.LoopKernel]:
    """Every distinct kernel of three example models: im2col convs with a serial epilogue, pointwise and depthwise
    convs, pools, attention and layer norms."""
    folder = tmp_path_factory.mktemp("examples")
    kernels = {}
    for name in ("tiny_cnn", "mobilenetv2_style", "bert_style"):
        path = folder / f"{name}.onnx"
        onnx.save(EXAMPLES[name](), str(path))
        kernels.update({spec.symbol: lower_kernel(spec) for spec in plan_model(path).kernels().values()})
    return kernels


def _record_kinds(monkeypatch, table: dict, seen: list) -> None:
    """Make each handler of a launch-kind table note the kind it was called for."""
    for kind, handler in list(table.items()):

        def recording(*args, kind=kind, handler=handler):
            seen.append(kind)
            return handler(*args)

        monkeypatch.setitem(table, kind, recording)


def _kind_of_launch_info(info: launching.LaunchInfo, gemm_rows: int) -> launching.LaunchKind:
    """A Gemm's grain is its tile rows; a serial launch is one iteration; a parallel loop is never peeled to one."""
    if info.grain == gemm_rows:
        return launching.LaunchKind.GEMM
    return launching.LaunchKind.SERIAL if info.extent == 1 else launching.LaunchKind.PARALLEL


def _kind_of_global_size(size: tuple[int, ...]) -> launching.LaunchKind:
    if len(size) == 2:
        return launching.LaunchKind.GEMM
    return launching.LaunchKind.SERIAL if size == (1,) else launching.LaunchKind.PARALLEL


def test_renderers_and_launch_info_agree_on_the_launches_of_real_kernels(example_kernels, monkeypatch):
    emitted, shaped, bodies = [], [], []
    _record_kinds(monkeypatch, render.LAUNCH_EMITTERS, emitted)
    _record_kinds(monkeypatch, cl_render.LAUNCH_SHAPES, shaped)
    _record_kinds(monkeypatch, cl_render.LAUNCH_BODIES, bodies)
    seen_kinds = set()
    for symbol, kernel in example_kernels.items():
        kinds = [group.kind for group in launching.launch_groups(kernel)[1]]
        for seen in (emitted, shaped, bodies):
            seen.clear()
        module = ir.Module(name=symbol)
        render.render_kernel(module, "k", kernel, GemmBlocking(rows=3, vectors=1, lanes=4))
        assert emitted == kinds, symbol
        assert [f.name for f in module.functions if f.name.startswith("k_")] == [f"k_{i}" for i in range(len(kinds))]
        global_sizes = [size for _, size in cl_render.launches("k", kernel)]
        assert shaped == kinds and [_kind_of_global_size(size) for size in global_sizes] == kinds, symbol
        assert cl_render.render_opencl("k", kernel).count("__kernel void") == len(kinds) and bodies == kinds, symbol
        infos = launching.launch_info(kernel, gemm_rows=3)
        assert [_kind_of_launch_info(info, 3) for info in infos] == kinds, symbol
        seen_kinds.update(kinds)
    assert seen_kinds == set(launching.LaunchKind)
