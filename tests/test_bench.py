"""farm.cli.bench and `farm bench`: per-kernel times and GFLOP/s of a real artifact, and a comparison that flags a
kernel made slower on purpose (the same convolution with a GEMM tile of one row by one 4-float vector)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.target import host_target
from farm.build.assembly import plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.cli.bench import (
    FAMILY_ALPHA,
    FLOPS,
    BenchReport,
    Change,
    StepTime,
    bench_artifact,
    bench_pair,
    compare,
    kernel_label,
    repeats_needed,
    sample_feeds,
    slower_p_value,
)
from farm.store import FileStore
from farm.tuning.database import record
from farm.tuning.space import tunable

SLOW_TILE = GemmBlocking(rows=1, vectors=1, lanes=4)
"""A GEMM tile that reuses nothing it loads: slower than the default one on every CPU (the default holds 4 or 8 rows
by 3 vectors of the widest float vector in registers), where code built for another CPU is slower only on a host
with wider vectors than that CPU's."""


def _conv_relu_model() -> onnx.ModelProto:
    """A 3x3 convolution heavy enough (75 MFLOP) that the baseline build is clearly slower, then a Relu."""
    weight = np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.05
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["y"], name="act"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 32, 32])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> tuple[str, str]:
    """(built for this host, built for it with the convolution's GEMM on SLOW_TILE: the same kernels, slower), as
    if tuning had chosen that tile."""
    folder = tmp_path_factory.mktemp("bench")
    onnx.save(_conv_relu_model(), folder / "m.onnx")
    fast = build_model(folder / "m.onnx", folder / "fast", executor=LocalExecutor(1)).artifact
    slowed = FileStore(folder / "store")
    for spec in filter(tunable, plan_model(folder / "m.onnx").kernels().values()):
        record(slowed, spec, host_target(), {"variant": SLOW_TILE.to_json()})
    slow = build_model(folder / "m.onnx", folder / "slow", executor=LocalExecutor(1), store=slowed).artifact
    return fast, slow


def test_a_report_times_every_step_and_counts_the_convs_flops(artifacts) -> None:
    report = bench_artifact(artifacts[0], repeat=3)
    assert [step.node for step in report.steps] == ["conv", "act"]
    conv = report.steps[0]
    assert conv.op == "Conv" and conv.flops == 2 * 64 * 32 * 32 * 64 * 9
    assert conv.kernel == "Conv 1x64x32x32,64x64x3x3 -> 1x64x32x32"
    assert all(step.seconds > 0 for step in report.steps) and report.latency > 0
    rows = report.kernels()
    assert {row["op"] for row in rows} == {"Conv", "Sigmoid"}
    assert next(row for row in rows if row["op"] == "Conv")["gflops"] > 0
    assert next(row for row in rows if row["op"] == "Sigmoid")["gflops"] is None


def test_the_comparison_flags_the_kernel_made_slower_every_time(artifacts) -> None:
    fast, slow = artifacts
    for _ in range(3):
        changes = {change.node: change for change in compare(*bench_pair([fast, slow], 20))}
        assert changes["conv"].flagged and changes["conv"].ratio > 1.05 and changes["conv"].p_value < FAMILY_ALPHA


def test_an_artifact_compared_with_itself_never_fails(artifacts, tmp_path: Path) -> None:
    """With production defaults (20 alternating repeats), again and again: noise alone never flags a node."""
    for _ in range(3):
        checked = _farm(
            "bench", artifacts[0], "--compare", artifacts[0], "--fail-on-regression", "--json", cwd=tmp_path
        )
        assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr
        report = json.loads(checked.stdout)
        assert report["repeat"] == 20 and not any(c["flagged"] for c in report["comparison"]["changes"])


def test_cli_prints_kernels_and_fails_on_regression_when_asked(artifacts, tmp_path: Path) -> None:
    fast, slow = artifacts
    plain = _farm("bench", fast, "--repeat", "3", cwd=tmp_path)
    assert plain.returncode == 0 and "GFLOP/s" in plain.stdout and "Conv 1x64x32x32" in plain.stdout
    checked = _farm("bench", slow, "--compare", fast, "--fail-on-regression", "--json", cwd=tmp_path)
    assert checked.returncode == 5, checked.stderr
    flagged = [c["node"] for c in json.loads(checked.stdout)["comparison"]["changes"] if c["flagged"]]
    assert "conv" in flagged


def test_too_few_repeats_to_see_past_the_noise_are_refused_when_failing_on_regression(
    artifacts, tmp_path: Path
) -> None:
    result = _farm(
        "bench", artifacts[1], "--compare", artifacts[0], "--repeat", "3", "--fail-on-regression", cwd=tmp_path
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"needs --repeat {repeats_needed(2)} or more" in result.stderr


def test_the_noise_test_ranks_repeats() -> None:
    rng = np.random.default_rng(1)
    same = [list(1 + 0.05 * rng.random(20)) for _ in range(2)]
    assert slower_p_value(*same) > 0.01
    assert slower_p_value(same[0], [value * 1.1 for value in same[1]]) < 1e-6
    assert slower_p_value([1.0] * 10, [1.0] * 10) == 1.0  # all tied: nothing to tell apart
    interrupted = same[1][:-2] + [50.0, 60.0]  # two repeats interrupted: ranks, not means, decide
    assert slower_p_value(same[0], interrupted) > 0.001
    assert repeats_needed(2) < repeats_needed(100) <= 20  # the default repeat covers a hundred nodes


def test_a_missing_artifact_is_bad_input(tmp_path: Path) -> None:
    result = _farm("bench", tmp_path / "nope.farm", cwd=tmp_path)
    assert result.returncode == 2 and "nope.farm" in result.stderr


def test_changes_flag_only_real_slowdowns() -> None:
    assert Change("n", "k", 1e-3, 1.2e-3).flagged
    assert not Change("n", "k", 1e-3, 1.04e-3).flagged  # within 5%
    assert not Change("n", "k", 1e-6, 2e-6).flagged  # 2x, but under the timer's noise
    assert not Change("n", "k", None, 1e-3).flagged and Change("n", "k", 1e-3, None).ratio is None
    assert Change("n", "k", 1e-3, 1.2e-3, p_value=FAMILY_ALPHA / 2).flagged
    assert not Change("n", "k", 1e-3, 1.2e-3, p_value=0.2).flagged  # 20% slower, but within its repeats' noise


def test_unmatched_nodes_are_listed_from_both_sides() -> None:
    step = lambda node: StepTime(node, "Relu", "Relu 4 -> 4", 1e-3, None)  # noqa: E731
    before, after = (
        BenchReport("a", "t", 1.0, [step("x"), step("old")]),
        BenchReport("b", "t", 1.0, [step("x"), step("new")]),
    )
    assert [(c.node, c.before is None, c.after is None) for c in compare(before, after)] == [
        ("x", False, False),
        ("new", True, False),
        ("old", False, True),
    ]


def test_flop_counts_for_gemm_and_matmul() -> None:
    gemm = {
        "op": "Gemm",
        "attrs": {"transA": 1},
        "inputs": [[[8, 3], "float32"], [[8, 5], "float32"]],
        "outputs": [[[3, 5], "float32"]],
        "activation": None,
    }
    matmul = {
        "op": "MatMul",
        "attrs": {},
        "inputs": [[[2, 4, 6], "float32"], [[6, 7], "float32"]],
        "outputs": [[[2, 4, 7], "float32"]],
        "activation": ["relu", []],
    }
    assert FLOPS["Gemm"](gemm) == 2 * 3 * 5 * 8 and FLOPS["MatMul"](matmul) == 2 * 2 * 4 * 7 * 6
    assert kernel_label(matmul) == "MatMul 2x4x6,6x7 -> 2x4x7 +relu"


def _farm(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "farm", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def opencl_artifact(tmp_path_factory) -> str:
    """The conv model built for this host's OpenCL device (PoCL in CI) as well as its CPU."""
    from farm.backends.opencl.devices import opencl_devices
    from farm.backends.opencl.target import OpenClTarget

    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    folder = tmp_path_factory.mktemp("bench-opencl")
    onnx.save(_conv_relu_model(), folder / "m.onnx")
    targets = [host_target(), OpenClTarget(devices[0]["fingerprint"])]
    return build_model(folder / "m.onnx", folder / "out", targets, executor=LocalExecutor(1)).artifact


def test_the_opencl_part_is_timed_step_by_step_and_compared(opencl_artifact, tmp_path: Path) -> None:
    """The OpenCL part's steps, timed and compared node by node. (Two loads of one artifact each get an OpenCL
    context of their own, which on PoCL compete for the same cores: a self-comparison there has flagged a node
    under load, so this test doesn't ask for exit 0 with --fail-on-regression.)"""
    report = bench_artifact(opencl_artifact, repeat=3, device="opencl")
    assert report.target.startswith("opencl-") and [step.node for step in report.steps] == ["conv", "act"]
    assert report.steps[0].kernel == "Conv 1x64x32x32,64x64x3x3 -> 1x64x32x32" and report.steps[0].flops
    checked = _farm(
        "bench", opencl_artifact, "--compare", opencl_artifact, "--device", "opencl", "--json", cwd=tmp_path
    )
    assert checked.returncode == 0, checked.stderr
    compared = json.loads(checked.stdout)
    assert compared["target"] == report.target and [c["node"] for c in compared["comparison"]["changes"]] == [
        "conv",
        "act",
    ]
    assert all(c["p_value"] is not None for c in compared["comparison"]["changes"])


def test_sample_feeds_are_random_for_every_float_dtype_and_zero_for_the_rest() -> None:
    """bfloat16 (ml_dtypes', numpy kind "V") is a float: zeros would time a different path (denormals, skips)."""
    import ml_dtypes

    from farm.runtime.model import TensorSpec

    specs = [
        TensorSpec(name, (4,), np.dtype(dtype).name)
        for name, dtype in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("f64", np.float64), ("ids", np.int64))
    ]
    feeds = sample_feeds(specs)
    assert all(np.any(feeds[name].astype(np.float32) != 0) for name in ("f16", "bf16", "f64"))
    assert not np.any(feeds["ids"]) and feeds["bf16"].dtype == np.dtype(ml_dtypes.bfloat16)
