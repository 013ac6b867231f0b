"""farm.backends.llvm.gemm_outlining: which Gemm launches put their heaviest code into functions of their own (the
split kernels' numerics are tests/test_llvm_gemm.py's)."""

from __future__ import annotations

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.gemm_outlining import outlined_functions
from farm.ir import loopir as L


def test_a_gemm_outside_the_few_row_and_implicit_paths_stays_whole():
    gemm = L.Gemm("a", L.const(0), 64, "b", L.const(0), 300, "c", L.const(0), 300, 40, 300, 64)
    assert outlined_functions(gemm, GemmBlocking()) == 0


def test_a_row_split_gemm_of_many_column_groups_outlines_its_regions():
    """504 columns: full blocks, a vector, a half vector (a strided 1x1 conv's band): each group's two regions."""
    gemm = L.Gemm("a", L.const(0), 64, "b", L.const(0), 504, "c", L.const(0), 504, 512, 504, 64)
    assert outlined_functions(gemm, GemmBlocking()) == 6
