"""The search space of tuning (farm/tuning/space.py): the variants tried, which kernels are tunable, how a spec
carries its variant, and that every variant computes what onnxruntime does.

The models and helpers here are shared by the other tuning tests (test_tuning_harness.py, test_tuning_database.py,
test_tuning_variants.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx
import pytest

import farm.runtime
from farm.artifact import read_manifest
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.kernel import blocking_for, compile_cpu_kernel, default_blocking
from farm.backends.llvm.target import CpuTarget, host_target, parse_target
from farm.build.assembly import plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.ir.specs import KernelSpec
from farm.store import FileStore, Store
from farm.tuning.database import record
from farm.tuning.space import candidate_variants, fits, lane_widths, tunable, variant_spec
from tests.numerics import assert_close, rand, random_feeds, run_onnxruntime, single_op_model

HOST = host_target()
AARCH64 = parse_target("cpu:aarch64-linux-gnu")


# Shapes chosen so that every variant meets edges: m, n and k that no tile divides.
CASES = {
    "conv3x3": single_op_model(
        "Conv", [("x", (1, 5, 9, 9))], {"pads": [1, 1, 1, 1]}, {"w": rand(13, 5, 3, 3, seed=1), "b": rand(13, seed=2)}
    ),
    "conv1x1": single_op_model("Conv", [("x", (1, 7, 6, 7))], {}, {"w": rand(10, 7, 1, 1, seed=1)}),
    "conv_strided": single_op_model(
        "Conv", [("x", (1, 3, 11, 11))], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, {"w": rand(9, 3, 3, 3, seed=1)}
    ),
    "conv_grouped": single_op_model(
        "Conv", [("x", (1, 6, 8, 8))], {"group": 2, "pads": [1, 1, 1, 1]}, {"w": rand(10, 3, 3, 3, seed=1)}
    ),
    "gemm": single_op_model(
        "Gemm", [("a", (7, 19))], {"alpha": 0.5}, {"b": rand(19, 37, seed=1), "c": rand(37, seed=2)}
    ),
    "gemm_transposed": single_op_model(
        "Gemm", [("a", (7, 19))], {"transB": 1}, {"b": rand(37, 19, seed=1), "c": rand(37, seed=2)}
    ),
    "matmul": single_op_model("MatMul", [("a", (3, 9, 21))], {}, {"b": rand(21, 35, seed=1)}),
}
DEPTHWISE = single_op_model(
    "Conv", [("x", (1, 4, 8, 8))], {"group": 4, "pads": [1, 1, 1, 1]}, {"w": rand(4, 1, 3, 3, seed=1)}
)


def save(model: onnx.ModelProto, folder: Path, name: str = "model") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / f"{name}.onnx")
    return folder / f"{name}.onnx"


def tunable_specs(path: Path) -> list[KernelSpec]:
    return [spec for spec in plan_model(path).kernels().values() if tunable(spec)]


def kernel_entries(artifact: str) -> list[dict[str, Any]]:
    return read_manifest(artifact)["kernels"]


def build_with(path: Path, out: Path, store: Store, **options: Any) -> str:
    return build_model(path, out, executor=LocalExecutor(1), store=store, **options).artifact


# --- the variants ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [HOST, AARCH64, parse_target("cpu:x86_64-linux-gnu"), parse_target("cpu:x86_64-linux-gnu:haswell:+avx,+avx2,+fma")],
    ids=str,
)
def test_candidates_start_with_the_default_and_fit_the_register_file(target: CpuTarget) -> None:
    variants = candidate_variants(target)
    assert variants[0] == default_blocking(target) and len(set(variants)) == len(variants)
    assert 4 <= len(variants) <= 14
    assert all(fits(v, target.vector_registers) for v in variants)
    assert {v.lanes for v in variants} == set(lane_widths(target))
    assert all(v.lanes >= 4 for v in variants)


def test_register_budget_and_lane_widths() -> None:
    avx512 = CpuTarget("x86_64-unknown-linux-gnu", "x", "+avx512f,+avx2,+avx")
    avx2 = CpuTarget("x86_64-unknown-linux-gnu", "x", "+avx2,+avx")
    assert lane_widths(avx512) == [16, 8] and lane_widths(avx2) == [8, 4]
    assert lane_widths(AARCH64) == [4]
    assert fits(GemmBlocking(6, 4, 16), 32) and not fits(GemmBlocking(6, 4, 8), 16)


def test_only_kernels_with_a_gemm_are_tunable(tmp_path: Path) -> None:
    for name, model in CASES.items():
        assert tunable_specs(save(model, tmp_path / name)), name
    assert not tunable_specs(save(DEPTHWISE, tmp_path / "depthwise"))  # a direct loop: nothing to tune
    relu = single_op_model("Relu", [("x", (2, 3))])
    assert not tunable_specs(save(relu, tmp_path / "relu"))
    transposed = single_op_model("Gemm", [("a", (7, 19)), ("b", (37, 19))], {"transB": 1})
    assert not tunable_specs(save(transposed, tmp_path / "transposed"))  # B not constant: a loop nest


def test_a_variant_reaches_the_code_and_the_launch_grain() -> None:
    spec = KernelSpec.from_json(
        {
            "op": "MatMul",
            "attrs": {},
            "inputs": [[[8, 16], "float32"], [[16, 32], "float32"]],
            "outputs": [[[8, 32], "float32"]],
            "activation": None,
            "target": HOST.id,
        }
    )
    tuned = variant_spec(spec, HOST, GemmBlocking(6, 2, 8))
    assert blocking_for(tuned, HOST) == GemmBlocking(6, 2, 8) and blocking_for(spec, HOST) == default_blocking(HOST)
    assert tuned.key != spec.key and compile_cpu_kernel(tuned, HOST) != compile_cpu_kernel(spec, HOST)
    assert variant_spec(spec, HOST, default_blocking(HOST)) == spec  # the default keeps the untuned key
    bad = dataclasses.replace(spec, variant_json='{"rows":0,"vectors":1,"lanes":4}')
    with pytest.raises(Exception, match=f"MatMul {bad.symbol}: unusable variant"):
        compile_cpu_kernel(bad, HOST)


# --- every variant computes what onnxruntime does ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_every_variant_builds_a_model_that_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    path = save(CASES[name], tmp_path)
    feeds = random_feeds(CASES[name])
    expected = run_onnxruntime(path, feeds)
    specs = tunable_specs(path)
    for variant in candidate_variants(HOST):
        store = FileStore(tmp_path / variant.name / "store")
        for spec in specs:  # as if tuning had chosen `variant`
            record(store, spec, HOST, {"variant": variant.to_json()})
        artifact = build_with(path, tmp_path / variant.name, store)
        assert [(e["variant_source"], e["variant"]) for e in kernel_entries(artifact)] == [
            ("tuned", variant.to_json())
        ] * len(specs)
        model = farm.runtime.load(artifact, cache_dir=tmp_path / "cache")
        for output, reference in expected.items():
            assert_close(model.run(feeds)[output], reference, f"{name} with variant {variant.name}")


def test_a_depthwise_conv_keeps_no_variant_and_matches_onnxruntime(tmp_path: Path) -> None:
    path = save(DEPTHWISE, tmp_path)
    artifact = build_with(path, tmp_path / "out", FileStore(tmp_path / "store"), tune=True)
    assert [(e["variant"], e["variant_source"]) for e in kernel_entries(artifact)] == [(None, None)]
    feeds = random_feeds(DEPTHWISE)
    assert_close(
        farm.runtime.load(artifact, cache_dir=tmp_path / "cache").run(feeds)["y"], run_onnxruntime(path, feeds)["y"]
    )
