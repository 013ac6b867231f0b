"""Which integer products run on IntGemm (farm.ops.integer_gemm) and how they are cut into units; their results
are checked against exact arithmetic in tests/test_ops_quantize.py and, per ISA, in tests/test_llvm_int_gemm.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import single_op_model

from farm.backends.llvm.kernel import cpu_launches, packed_params
from farm.backends.llvm.target import CpuTarget, host_target
from farm.build.assembly import plan_model
from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import argument_bytes, lower_kernel
from farm.ops.integer_gemm import CONV_SCRATCH_MAX_BYTES, conv_gemm


def _spec_of(model: onnx.ModelProto, tmp_path: Path) -> KernelSpec:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return plan_model(path).steps[0].spec


def _int_gemms(stmts: list[L.Stmt]) -> list[L.IntGemm]:
    found: list[L.IntGemm] = []
    for stmt in stmts:
        found += [stmt] if isinstance(stmt, L.IntGemm) else _int_gemms(getattr(stmt, "body", []))
    return found


def _matmul(tmp_path: Path, a: tuple[int, ...], b: tuple[int, ...]) -> KernelSpec:
    weights = np.zeros(b, np.int8)
    inputs = [("a", a, "uint8")]
    return _spec_of(single_op_model("MatMulInteger", inputs, initializers={"b": weights}), tmp_path)


def _conv(tmp_path: Path, x: tuple[int, ...], w: tuple[int, ...], attrs: dict | None = None) -> KernelSpec:
    model = single_op_model("ConvInteger", [("x", x, "uint8")], attrs, {"w": np.zeros(w, np.uint8)})
    return _spec_of(model, tmp_path)


@pytest.mark.parametrize(
    "b, widths",
    [((128, 512), [64]), ((36, 96), [32]), ((12, 100), [64, 36]), ((8, 20), [20]), ((4608, 512), [32])],
    ids=["whole-64", "whole-32", "a-rest", "fewer-than-a-unit", "narrower-for-the-stack"],
)
def test_matmul_integer_units(tmp_path: Path, b: tuple[int, int], widths: list[int]) -> None:
    gemms = _int_gemms(lower_kernel(_matmul(tmp_path, (2, 3, b[0]), b)).body)
    assert [g.n for g in gemms] == widths and all(g.m == 6 for g in gemms)


def test_a_matmul_integers_launch_work_is_the_targets(tmp_path: Path) -> None:
    """kernel.cpu_launches weighs an IntGemm by the target's dot product: AVX2 code counts four times the work of
    AVX-512 VNNI code for the same MatMulInteger (DotProduct.work_divisor), so the runtime splits it where it
    splits the float32 MatMul."""
    spec = _matmul(tmp_path, (32, 128), (128, 128))
    vnni = CpuTarget("x86_64-unknown-linux-gnu", "icelake-server", "+avx2,+fma,+avx512f,+avx512bw,+avx512vnni")
    avx2 = CpuTarget("x86_64-unknown-linux-gnu", "haswell", "+avx2,+fma")
    [[_, _, vnni_work]], [[_, _, avx2_work]] = cpu_launches(spec, vnni), cpu_launches(spec, avx2)
    assert vnni_work == 32 * 128 * 128 // 64
    assert avx2_work == 4 * vnni_work


def test_a_batched_b_is_a_loop_nest(tmp_path: Path) -> None:
    assert not _int_gemms(lower_kernel(_matmul(tmp_path, (2, 3, 12), (2, 12, 16))).body)


def test_any_k_runs_on_int_gemm(tmp_path: Path) -> None:
    assert [g.k for g in _int_gemms(lower_kernel(_matmul(tmp_path, (2, 3, 7), (7, 16))).body)] == [7]
    spec = _conv(tmp_path, (1, 3, 8, 8), (4, 3, 7, 7), {"pads": [3, 3, 3, 3]})
    assert [g.k for g in _int_gemms(lower_kernel(spec).body)] == [147]


def test_conv_integer_is_im2col_into_byte_scratch_then_int_gemms(tmp_path: Path) -> None:
    spec = _conv(tmp_path, (2, 8, 14, 14), (128, 8, 3, 3), {"pads": [1, 1, 1, 1]})
    kernel = lower_kernel(spec)
    gemms = _int_gemms(kernel.body)
    assert kernel.params[-1] == L.Param("scratch", L.U8, output=True)
    assert argument_bytes(spec)[-1] == 2 * 72 * 196  # the im2col matrix of both images, in bytes
    assert [(g.m, g.n, g.k) for g in gemms] == [(64, 64, 72), (64, 4, 72)]  # 196 pixels: 3 units of 64, then 4


@pytest.mark.parametrize(
    "x, w, attrs",
    [((1, 4, 6, 6), (6, 2, 3, 3), {"group": 2})],
    ids=["grouped"],
)
def test_conv_integer_without_a_suitable_shape_is_a_loop_nest(tmp_path: Path, x, w, attrs) -> None:
    spec = _conv(tmp_path, x, w, attrs)
    assert conv_gemm(spec) is None and not _int_gemms(lower_kernel(spec).body)
    assert lower_kernel(spec).params[-1].name != "scratch"


def test_an_im2col_matrix_over_the_cap_is_a_loop_nest(tmp_path: Path) -> None:
    side = 512
    channels = -(-CONV_SCRATCH_MAX_BYTES // (side * side * 9))
    assert conv_gemm(_conv(tmp_path, (1, channels, side, side), (4, channels, 3, 3), {"pads": [1, 1, 1, 1]})) is None


def test_constant_weights_are_read_from_panels_packed_at_build_time(tmp_path: Path) -> None:
    """On a CPU a constant weight whose shape suits the panels is read pre-packed (L.IntGemm.b_panels, its whole
    columns), and the CPU build packs its blob as the IntGemm's byte panels (flipped for uint8 weights); an OpenCL
    spec (or one for no target yet) reads it as stored."""
    host = host_target()
    conv = _conv(tmp_path, (1, 16, 4, 4), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]})
    assert [g.b_panels for g in _int_gemms(lower_kernel(conv).body)] == [0]
    conv = dataclasses.replace(conv, target_id=host.id)
    assert [g.b_panels for g in _int_gemms(lower_kernel(conv).body)] == [32]
    assert packed_params(conv, host) == {2: (16, 144, 32, 1, 1)}  # out0, x, then w
    matmul = dataclasses.replace(_matmul(tmp_path, (2, 3, 32), (32, 48)), target_id=host.id)
    assert packed_params(matmul, host) == {2: (16, 32, 48, 0, 0)}


def test_weights_that_do_not_suit_panels_are_packed_as_they_run(tmp_path: Path) -> None:
    """k not whole groups of four, or columns not whole panels: the unit packs its columns on its stack."""
    for spec in (_matmul(tmp_path, (2, 3, 30), (30, 48)), _conv(tmp_path, (1, 16, 4, 4), (24, 16, 3, 3))):
        assert [g.b_panels for g in _int_gemms(lower_kernel(spec).body)] in ([0], [0, 0])
        assert packed_params(spec, host_target()) == {}
