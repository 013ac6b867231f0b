"""The timing harness (farm/tuning/harness.py): every candidate timed, the default never beaten by a slower one,
a variant whose numbers differ rejected, and the agreement check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

from farm.backends.llvm.gemm import GemmBlocking
from farm.backends.llvm.kernel import compile_cpu_kernel, default_blocking
from farm.backends.llvm.render import render_kernel
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import compile_ir
from farm.ir.graph import Activation
from farm.ir.specs import KernelSpec
from farm.ops import lower_kernel
from farm.tuning import harness
from farm.tuning.space import candidate_variants
from tests.test_tuning_space import CASES, HOST, save, tunable_specs

QUICK = "0.001"  # FARM_TUNE_SECONDS_PER_VARIANT in these tests: a few rounds of each variant, not a benchmark


@pytest.fixture(autouse=True)
def quick_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TUNE_SECONDS_PER_VARIANT", QUICK)


def test_time_variants_times_every_candidate_and_never_chooses_a_slower_one(tmp_path: Path) -> None:
    spec = tunable_specs(save(CASES["conv3x3"], tmp_path))[0]
    result = harness.time_variants(spec.to_json(), HOST.to_json())
    names = [v.name for v in candidate_variants(HOST)]
    assert sorted(result["seconds"]) == sorted(names) and result["rejected"] == []
    chosen = GemmBlocking.from_json(result["variant"]).name
    assert result["seconds"][chosen] <= result["default_seconds"] == result["seconds"][names[0]]
    assert result["default"] == default_blocking(HOST).to_json()
    only = harness.time_variants(spec.to_json(), HOST.to_json(), [GemmBlocking(8, 2, 16)], seconds_per_variant=0)
    assert sorted(only["seconds"]) == sorted([names[0], "8x2x16"])  # the default is always timed


def test_a_variant_whose_numbers_differ_is_rejected_never_chosen(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tunable_specs(save(CASES["conv1x1"], tmp_path))[0]
    wrong = GemmBlocking(8, 2, 16)

    def compile_wrongly(variant: KernelSpec, target: CpuTarget) -> bytes:
        """`wrong`'s code computes relu(conv): fast or not, its numbers differ."""
        if variant.variant != wrong.to_json():
            return compile_cpu_kernel(variant, target)
        module = ir.Module(name=variant.symbol)
        module.triple = target.triple
        relu = dataclasses.replace(variant, activation=Activation("relu"))
        render_kernel(module, variant.symbol, lower_kernel(relu), wrong)
        return compile_ir(str(module), target, "wrong kernel")

    monkeypatch.setattr(harness, "compile_cpu_kernel", compile_wrongly)
    result = harness.time_variants(spec.to_json(), HOST.to_json(), [wrong, GemmBlocking(6, 2, 16)])
    assert result["rejected"] == ["8x2x16"] and "8x2x16" not in result["seconds"]
    assert result["variant"] != wrong.to_json()


def test_agreement_is_within_1e_4_of_the_reference_scale() -> None:
    reference = [np.array([100.0, -3.0, np.nan], np.float32)]
    assert harness._agrees([np.array([100.009, -3.0, np.nan], np.float32)], reference)
    assert not harness._agrees([np.array([100.02, -3.0, np.nan], np.float32)], reference)
    assert not harness._agrees([np.array([100.0, -3.0, 0.0], np.float32)], reference)
