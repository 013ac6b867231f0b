"""farm.backends.llvm.dot_products: which dot product each target gets, and which operand plays which part.
(tests/test_llvm_int_gemm.py runs every dot product the host has on IntGemms and checks them exactly.)"""

from __future__ import annotations

import pytest

from farm.backends.llvm.dot_products import (
    DOT_PRODUCTS,
    FLIP,
    Roles,
    b_panels_flipped,
    dot_product_for,
    generic_dot_product,
)
from farm.backends.llvm.target import CpuTarget
from farm.ir import launching

VNNI = dict(DOT_PRODUCTS)["+avx512vnni"]


@pytest.mark.parametrize(
    "features, name",
    [
        ("+avx2,+avx512f,+avx512vnni", "avx512vnni"),
        ("+avx2,+avxvnni", "avxvnni"),
        ("+avx2,+fma", "avx2"),
        ("+sse2", "widening"),
    ],
)
def test_each_target_gets_its_best_dot_product(features: str, name: str) -> None:
    assert dot_product_for(CpuTarget("x86_64-unknown-linux-gnu", "generic", features)).name == name


def test_vbmi_targets_pack_by_byte_permutes() -> None:
    """AVX-512 VBMI's vpermb packs B on zmm (the 16-lane dot product); AVX-VNNI's ymm and VNNI without VBMI don't."""
    packs = {
        features: dot_product_for(CpuTarget("x86_64-unknown-linux-gnu", "generic", features)).permutes_bytes
        for features in ("+avx512f,+avx512vnni,+avx512vbmi", "+avx512f,+avx512vnni", "+avx2,+avxvnni,+avx512vbmi")
    }
    assert list(packs.values()) == [True, False, False]


def test_aarch64_widens_on_its_float_lanes() -> None:
    dot = dot_product_for(CpuTarget("aarch64-unknown-linux-gnu", "neoverse-n1", "+neon"))
    assert (dot.name, dot.lanes) == ("widening", 4)


@pytest.mark.parametrize(
    ("a_signed", "b_signed", "swapped", "a_flip", "b_flip"),
    [
        (True, True, True, 0, FLIP),
        (True, False, True, 0, 0),
        (False, True, False, 0, 0),
        (False, False, False, 0, FLIP),
    ],
)
def test_an_int8_a_is_broadcast_as_the_signed_operand_where_that_is_free(
    a_signed: bool, b_signed: bool, swapped: bool, a_flip: int, b_flip: int
) -> None:
    """On vpdpbusd an int8 A is the signed operand, broadcast as it is, and B the unsigned one (an int8 B flipped);
    a uint8 A stays the unsigned operand (a uint8 B flipped to signed)."""
    roles = Roles.of(VNNI, a_signed, b_signed)
    assert (roles.swapped, roles.a_flip, roles.b_flip) == (swapped, a_flip, b_flip)
    assert b_panels_flipped(VNNI, a_signed, b_signed) == bool(b_flip)


def test_a_dot_product_of_widened_bytes_flips_nothing() -> None:
    """AVX2's vpmaddwd and the widening multiplies take each operand's bytes as they are."""
    for dot in (dict(DOT_PRODUCTS)["+avx2"], generic_dot_product()):
        for a_signed in (False, True):
            roles = Roles.of(dot, a_signed, not a_signed)
            assert (roles.swapped, roles.a_flip, roles.b_flip) == (False, 0, 0)
            assert (roles.a_read_signed, roles.b_read_signed) == (a_signed, not a_signed)
            assert not b_panels_flipped(dot, a_signed, not a_signed)


@pytest.mark.parametrize(
    "features, divisor",
    [
        ("+avx2,+avx512f,+avx512vnni", 64),
        ("+avx2,+avxvnni", 32),
        ("+avx2,+fma", launching.GEMM_WORK_DIVISOR),
        ("+sse2", launching.GEMM_WORK_DIVISOR),
    ],
)
def test_an_int_gemms_launch_work_weighs_its_products_by_what_they_cost(features: str, divisor: int) -> None:
    """One VNNI instruction's products make a unit of launch work; AVX2's vpmaddwd path and widening multiplies,
    about as slow per product as float32's FMAs, count them as a float32 Gemm does (so the runtime splits them
    across threads where it splits the float32 model's)."""
    assert dot_product_for(CpuTarget("x86_64-unknown-linux-gnu", "generic", features)).work_divisor == divisor
