"""The search space of tuning: which GEMM variants are tried on a CPU target, and how a kernel's spec carries one.

A variant is a GemmBlocking (rows x vectors x lanes of the register-blocked micro-kernel). A kernel is tunable when
its lowering holds a Gemm (Conv other than depthwise, Gemm, MatMul, ConvTranspose, matmul-shaped Einsum). The
chosen variant travels in the KernelSpec (`variant_json`), so compiling stays a pure function of (spec, target).
"""

from __future__ import annotations

import dataclasses
import functools

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.kernel import default_blocking, gemms, untuned_blocking
from farm.backends.llvm.target import CpuTarget
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import lower_kernel

TILE_SHAPES = ((8, 3), (4, 3), (6, 4), (4, 4), (8, 2), (6, 2), (2, 4), (4, 2))
"""(rows, vectors) of the tiles tried, in this order; the first that fits is the default's. Those that don't fit the
register file are left out."""
CACHE_TILINGS = ((4, 3, 256, "columns"), (8, 3, 256, "columns"), (8, 3, 0, "rows"))
"""(rows, vectors, k_block, order) of the cache-tiled and row-ordered variants also tried at full width, where
they fit: on a 2-core Zen 4 (1 MB L2) they were within 3% of the plain tiles on ResNet-50's convolutions, but
cores with smaller caches or other bandwidths may choose them."""
HALF_LANE_SHAPES = 3
"""How many of the fitting tiles are also tried at half the vector width (narrow outputs waste fewer lanes)."""


def fits(blocking: GemmBlocking, registers: int) -> bool:
    """Whether a tile's rows x vectors accumulators, its `vectors` loaded B vectors and the broadcast A value are
    all held in registers at once (a tile that spills is slower than a smaller one)."""
    return blocking.rows * blocking.vectors + blocking.vectors + 1 <= registers


def lane_widths(target: CpuTarget) -> list[int]:
    """The target's widest float vector, and half of it while that still holds 4 floats."""
    full = target.simd_floats
    return [full] + ([full // 2] if full // 2 >= 4 else [])


def candidate_variants(target: CpuTarget) -> list[GemmBlocking]:
    """The variants tuning times on `target`, the default first: every tile of TILE_SHAPES that fits the register
    file at full width, the first HALF_LANE_SHAPES of them at half width, then the CACHE_TILINGS that fit (at
    most 14)."""
    registers = target.vector_registers
    variants = [default_blocking(target)]
    for index, lanes in enumerate(lane_widths(target)):
        fitting = [b for b in (GemmBlocking(r, v, lanes) for r, v in TILE_SHAPES) if fits(b, registers)]
        variants += [b for b in fitting[: HALF_LANE_SHAPES if index else None] if b not in variants]
    tiled = (GemmBlocking(r, v, target.simd_floats, k, order) for r, v, k, order in CACHE_TILINGS)
    return variants + [b for b in tiled if fits(b, registers) and b not in variants]


@functools.lru_cache(maxsize=4096)
def tunable(spec: KernelSpec) -> bool:
    """Whether the kernel's lowering holds a Gemm: only then does the variant change its code. Kept per spec: the
    manifest asks for every kernel of a build, and lowering each again was 0.12 s of light DenseNet-121's finish."""
    return bool(gemms(lower_kernel(spec).body))


def variant_json(blocking: GemmBlocking, spec: KernelSpec, target: CpuTarget) -> str:
    """What `spec` carries for `blocking` on `target`: "" for its untuned blocking (kernel.untuned_blocking), so
    that a kernel whose tuning kept the default shares the untuned kernel's key, symbol and cache entry."""
    return "" if blocking == untuned_blocking(spec, target) else canonical_json(blocking.to_json())


def variant_spec(spec: KernelSpec, target: CpuTarget, blocking: GemmBlocking) -> KernelSpec:
    """`spec` for `target` with `blocking` as its variant."""
    return dataclasses.replace(spec, target_id=target.id, variant_json=variant_json(blocking, spec, target))
