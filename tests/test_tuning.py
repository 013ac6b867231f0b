"""Tuning (farm/tuning/variants.py): the variants tried, that every one of them computes what onnxruntime does, timing and
choosing, the tuning database in the store, reuse without timing, the manifest, and `--tune` on a real farm."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from llvmlite import ir

import farm.runtime
from farm.artifact import read_manifest
from farm.backends.llvm.gemm import GemmBlocking
from farm.backends.llvm.kernel import blocking_for, compile_cpu_kernel, compile_ir, default_blocking
from farm.backends.llvm.render import render_kernel
from farm.backends.llvm.target import CpuTarget, host_target, parse_target
from farm.build.assembly import plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.distributed.board import JobBoard
from farm.distributed.celery_app import QUEUES
from farm.distributed.steps import Farm
from farm.ir.graph import Activation
from farm.ir.specs import KernelSpec
from farm.ops import lower_kernel
from farm.store import FileStore, RedisStore, Store
from farm.tools import examples
from farm.tuning import variants as tuning
from tests.farm_services import farm_cli, farm_factory_fixture  # noqa: F401
from tests.numerics import assert_close, rand, random_feeds, run_onnxruntime, single_op_model
from tests.services import RedisServer, redis_server_fixture  # noqa: F401
from tests.test_cli import farm as cli

QUICK = "0.001"  # FARM_TUNE_SECONDS_PER_VARIANT in these tests: a few rounds of each variant, not a benchmark
HOST = host_target()
AARCH64 = parse_target("cpu:aarch64-linux-gnu")


@pytest.fixture(autouse=True)
def quick_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TUNE_SECONDS_PER_VARIANT", QUICK)


# Shapes chosen so that every variant meets edges: m, n and k that no tile divides.
CASES = {
    "conv3x3": single_op_model("Conv", [("x", (1, 5, 9, 9))], {"pads": [1, 1, 1, 1]},
                               {"w": rand(13, 5, 3, 3, seed=1), "b": rand(13, seed=2)}),
    "conv1x1": single_op_model("Conv", [("x", (1, 7, 6, 7))], {}, {"w": rand(10, 7, 1, 1, seed=1)}),
    "conv_strided": single_op_model("Conv", [("x", (1, 3, 11, 11))], {"strides": [2, 2], "pads": [1, 1, 1, 1]},
                                    {"w": rand(9, 3, 3, 3, seed=1)}),
    "conv_grouped": single_op_model("Conv", [("x", (1, 6, 8, 8))], {"group": 2, "pads": [1, 1, 1, 1]},
                                    {"w": rand(10, 3, 3, 3, seed=1)}),
    "gemm": single_op_model("Gemm", [("a", (7, 19))], {"alpha": 0.5}, {"b": rand(19, 37, seed=1),
                                                                         "c": rand(37, seed=2)}),
    "matmul": single_op_model("MatMul", [("a", (3, 9, 21))], {}, {"b": rand(21, 35, seed=1)}),
}
DEPTHWISE = single_op_model("Conv", [("x", (1, 4, 8, 8))], {"group": 4, "pads": [1, 1, 1, 1]},
                            {"w": rand(4, 1, 3, 3, seed=1)})


def save(model: onnx.ModelProto, folder: Path, name: str = "model") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / f"{name}.onnx")
    return folder / f"{name}.onnx"


def tunable_specs(path: Path) -> list[KernelSpec]:
    return [spec for spec in plan_model(path).kernels().values() if tuning.tunable(spec)]


def kernel_entries(artifact: str) -> list[dict[str, Any]]:
    return read_manifest(artifact)["kernels"]


# --- the variants ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [HOST, AARCH64, parse_target("cpu:x86_64-linux-gnu"),
                                    parse_target("cpu:x86_64-linux-gnu:haswell:+avx,+avx2,+fma")], ids=str)
def test_candidates_start_with_the_default_and_fit_the_register_file(target: CpuTarget) -> None:
    variants = tuning.candidate_variants(target)
    assert variants[0] == default_blocking(target) and len(set(variants)) == len(variants)
    assert 4 <= len(variants) <= 14
    assert all(tuning.fits(v, tuning.vector_registers(target)) for v in variants)
    assert {v.lanes for v in variants} == set(tuning.lane_widths(target))
    assert all(v.lanes >= 4 for v in variants)


def test_register_budget_and_lane_widths() -> None:
    avx512 = CpuTarget("x86_64-unknown-linux-gnu", "x", "+avx512f,+avx2,+avx")
    avx2 = CpuTarget("x86_64-unknown-linux-gnu", "x", "+avx2,+avx")
    assert (tuning.vector_registers(avx512), tuning.vector_registers(avx2), tuning.vector_registers(AARCH64)) == (
        32, 16, 32)
    assert tuning.lane_widths(avx512) == [16, 8] and tuning.lane_widths(avx2) == [8, 4]
    assert tuning.lane_widths(AARCH64) == [4]
    assert tuning.fits(GemmBlocking(6, 4, 16), 32) and not tuning.fits(GemmBlocking(6, 4, 8), 16)


def test_only_kernels_with_a_gemm_are_tunable(tmp_path: Path) -> None:
    for name, model in CASES.items():
        assert tunable_specs(save(model, tmp_path / name)), name
    assert not tunable_specs(save(DEPTHWISE, tmp_path / "depthwise"))  # a direct loop: nothing to tune
    relu = single_op_model("Relu", [("x", (2, 3))])
    assert not tunable_specs(save(relu, tmp_path / "relu"))
    transposed = single_op_model("Gemm", [("a", (7, 19))], {"transB": 1}, {"b": rand(37, 19, seed=1)})
    assert not tunable_specs(save(transposed, tmp_path / "transposed"))  # a loop nest, not the Gemm primitive


def test_a_variant_reaches_the_code_and_the_launch_grain() -> None:
    spec = KernelSpec.from_json({"op": "MatMul", "attrs": {}, "inputs": [[[8, 16], "float32"], [[16, 32], "float32"]],
                                 "outputs": [[[8, 32], "float32"]], "activation": None, "target": HOST.id})
    tuned = tuning.variant_spec(spec, HOST, GemmBlocking(6, 2, 8))
    assert blocking_for(tuned, HOST) == GemmBlocking(6, 2, 8) and blocking_for(spec, HOST) == default_blocking(HOST)
    assert tuned.key != spec.key and compile_cpu_kernel(tuned, HOST) != compile_cpu_kernel(spec, HOST)
    assert tuning.variant_spec(spec, HOST, default_blocking(HOST)) == spec  # the default keeps the untuned key
    bad = dataclasses.replace(spec, variant_json='{"rows":0,"vectors":1,"lanes":4}')
    with pytest.raises(Exception, match=f"MatMul {bad.symbol}: unusable variant"):
        compile_cpu_kernel(bad, HOST)


# --- every variant computes what onnxruntime does ------------------------------------------------------------------


def build_with(path: Path, out: Path, store: Store, **options: Any) -> str:
    return build_model(path, out, executor=LocalExecutor(1), store=store, **options).artifact


@pytest.mark.parametrize("name", list(CASES))
def test_every_variant_builds_a_model_that_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    path = save(CASES[name], tmp_path)
    feeds = random_feeds(CASES[name])
    expected = run_onnxruntime(path, feeds)
    specs = tunable_specs(path)
    for variant in tuning.candidate_variants(HOST):
        store = FileStore(tmp_path / variant.name / "store")
        for spec in specs:  # as if tuning had chosen `variant`
            tuning.record(store, spec, HOST, {"variant": variant.to_json()})
        artifact = build_with(path, tmp_path / variant.name, store)
        assert [(e["variant_source"], e["variant"]) for e in kernel_entries(artifact)] == [
            ("tuned", variant.to_json())] * len(specs)
        model = farm.runtime.load(artifact, cache_dir=tmp_path / "cache")
        for output, reference in expected.items():
            assert_close(model.run(feeds)[output], reference, f"{name} with variant {variant.name}")


def test_a_depthwise_conv_keeps_no_variant_and_matches_onnxruntime(tmp_path: Path) -> None:
    path = save(DEPTHWISE, tmp_path)
    artifact = build_with(path, tmp_path / "out", FileStore(tmp_path / "store"), tune=True)
    assert [(e["variant"], e["variant_source"]) for e in kernel_entries(artifact)] == [(None, None)]
    feeds = random_feeds(DEPTHWISE)
    assert_close(farm.runtime.load(artifact, cache_dir=tmp_path / "cache").run(feeds)["y"],
                 run_onnxruntime(path, feeds)["y"])


# --- timing and choosing -------------------------------------------------------------------------------------------


def test_time_variants_times_every_candidate_and_never_chooses_a_slower_one(tmp_path: Path) -> None:
    spec = tunable_specs(save(CASES["conv3x3"], tmp_path))[0]
    result = tuning.time_variants(spec.to_json(), HOST.to_json())
    names = [v.name for v in tuning.candidate_variants(HOST)]
    assert sorted(result["seconds"]) == sorted(names) and result["rejected"] == []
    chosen = GemmBlocking.from_json(result["variant"]).name
    assert result["seconds"][chosen] <= result["default_seconds"] == result["seconds"][names[0]]
    assert result["default"] == default_blocking(HOST).to_json()
    only = tuning.time_variants(spec.to_json(), HOST.to_json(), [GemmBlocking(8, 2, 16)], seconds_per_variant=0)
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

    monkeypatch.setattr(tuning, "compile_cpu_kernel", compile_wrongly)
    result = tuning.time_variants(spec.to_json(), HOST.to_json(), [wrong, GemmBlocking(6, 2, 16)])
    assert result["rejected"] == ["8x2x16"] and "8x2x16" not in result["seconds"]
    assert result["variant"] != wrong.to_json()


def test_agreement_is_within_1e_4_of_the_reference_scale() -> None:
    reference = [np.array([100.0, -3.0, np.nan], np.float32)]
    assert tuning._agrees([np.array([100.009, -3.0, np.nan], np.float32)], reference)
    assert not tuning._agrees([np.array([100.02, -3.0, np.nan], np.float32)], reference)
    assert not tuning._agrees([np.array([100.0, -3.0, 0.0], np.float32)], reference)


# --- the database, reuse and the manifest ------------------------------------------------------------------------


def test_tune_records_every_kernel_and_a_second_build_reuses_them_without_timing(tmp_path: Path) -> None:
    path = save(examples.tiny_cnn(), tmp_path)
    store = FileStore(tmp_path / "store")
    specs = tunable_specs(path)
    plain = build_with(path, tmp_path / "plain", store)
    assert {e["variant_source"] for e in kernel_entries(plain) if e["variant"]} == {"default"}

    first = build_model(path, tmp_path / "first", executor=LocalExecutor(1), store=store, tune=True)
    assert sorted(first.tuning.timed) == sorted(tuning.tune_name(s, HOST.id) for s in specs) and specs
    assert all(tuning.lookup(store, spec, HOST.id) for spec in specs)
    record = json.loads(store.get(store.get_ref(tuning.db_ref(specs[0], HOST.id))))
    assert record["kernel"] == tuning.tuning_key(specs[0]) and record["target"]["id"] == HOST.id
    assert record["farm_version"] and record["default_seconds"] > 0
    entries = kernel_entries(first.artifact)
    assert {e["variant_source"] for e in entries if e["variant"]} == {"tuned"}
    for entry in entries:
        chosen = tuning.lookup(store, KernelSpec.from_json(entry["spec"]), HOST.id)
        assert entry["variant"] == (chosen.to_json() if chosen else None)

    again = build_model(path, tmp_path / "again", executor=LocalExecutor(1), store=store, tune=True)
    assert again.tuning.timed == []  # every kernel came from the database
    assert Path(again.artifact).read_bytes() == Path(first.artifact).read_bytes()
    untuned_flag = build_with(path, tmp_path / "later", store)  # no --tune: the records are used all the same
    assert Path(untuned_flag).read_bytes() == Path(first.artifact).read_bytes()
    retuned = build_model(path, tmp_path / "retune", executor=LocalExecutor(1), store=store, retune=True)
    assert len(retuned.tuning.timed) == len(specs)


def test_submit_tune_on_this_machine_records_in_the_local_store(tmp_path: Path) -> None:
    path = save(CASES["conv1x1"], tmp_path)
    env = {"FARM_CACHE_DIR": str(tmp_path / "cache")}  # the local store: $FARM_CACHE_DIR/store
    tuned = cli("submit", path, "--tune", "--json", "-o", tmp_path / "tuned", cwd=tmp_path, env=env)
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["tuning"] == {"timed": [tuning.tune_name(tunable_specs(path)[0], HOST.id)],
                                                   "notes": []}
    assert "kernels timed" in tuned.stderr
    plain = cli("submit", path, "--json", "-o", tmp_path / "plain", cwd=tmp_path, env=env)
    assert "tuning" not in json.loads(plain.stdout)
    assert [e["variant_source"] for e in kernel_entries(json.loads(plain.stdout)["artifact"])] == ["tuned"]


def test_a_target_this_host_cannot_run_keeps_the_default_and_says_so(tmp_path: Path) -> None:
    path = save(CASES["gemm"], tmp_path)
    result = build_model(path, tmp_path / "out", [AARCH64], executor=LocalExecutor(1),
                         store=FileStore(tmp_path / "store"), tune=True)
    assert result.tuning.timed == [] and AARCH64.id in result.tuning.notes[0]
    assert "default variant" in result.tuning.notes[0]
    assert [e["variant_source"] for e in kernel_entries(result.artifact)] == ["default"]
    assert not tuning.can_time_here(AARCH64) and tuning.can_time_here(HOST)


def test_a_corrupt_record_counts_as_none(tmp_path: Path) -> None:
    path = save(CASES["matmul"], tmp_path)
    store = FileStore(tmp_path / "store")
    spec = tunable_specs(path)[0]
    store.set_ref(tuning.db_ref(spec, HOST.id), store.put(b'{"variant": {"rows": -1}}'))
    assert tuning.lookup(store, spec, HOST.id) is None
    assert [e["variant_source"] for e in kernel_entries(build_with(path, tmp_path / "out", store))] == ["default"]


# --- the farm, in-process: the steps of farm/distributed/steps.py against a real redis-server ---------------------------------

STEPS: dict[str, Callable[[Farm, list[Any]], None]] = {
    "farm.plan_job": lambda farm, a: farm.plan_job(a[0]),
    "farm.tune_kernel": lambda farm, a: farm.tune(a[0], a[1], a[4], a[5]),
    "farm.compile_cpu_kernel": lambda farm, a: farm.compile(a[0], a[4], None),
    "farm.pack_blob": lambda farm, a: farm.compile(a[0], a[3], a[4]),
    "farm.link": lambda farm, a: farm.link(*a),
    "farm.finish": lambda farm, a: farm.finish(*a),
}
"""What each task of farm/distributed/celery_app.py calls."""


class Queues(list):
    """Dispatched tasks as (name, args, queue), run first in, first out by `run`."""

    def dispatch(self, name: str, args: list[Any], queue: str | None = None) -> None:
        self.append((name, json.loads(json.dumps(args)), queue or QUEUES[name]))

    def run(self, farm: Farm) -> list[tuple[str, str]]:
        ran = []
        while self:
            name, args, queue = self.pop(0)
            ran.append((name, queue))
            STEPS[name](farm, args)
        return ran


def submit(farm: Farm, queues: Queues, model: Path, **flags: bool) -> tuple[dict[str, str], list[tuple[str, str]]]:
    data = model.read_bytes()
    job_id = uuid.uuid4().hex[:16]
    farm.board.create(job_id, {"model_key": farm.store.put(data), "model_name": model.stem,
                               "model_sha256": hashlib.sha256(data).hexdigest(), "targets": [HOST.to_json()],
                               **flags})
    queues.append(("farm.plan_job", [job_id], "control"))
    ran = queues.run(farm)
    return farm.board.get(job_id), ran


def manifest(farm: Farm, record: dict[str, str], folder: Path) -> list[dict[str, Any]]:
    path = folder / f"{uuid.uuid4().hex}.farm"
    path.write_bytes(farm.store.get(record["artifact_key"]))
    return kernel_entries(str(path))


def test_farm_tuning_goes_to_the_cpus_queue_and_a_later_job_reuses_the_records(redis_server: RedisServer,
                                                                               tmp_path: Path) -> None:
    path = save(CASES["conv3x3"], tmp_path)
    queues, live = Queues(), {f"tune.{HOST.id}"}
    farm = Farm(JobBoard(redis_server.url), FileStore(tmp_path / "store"), queues.dispatch, live_queues=lambda: live)
    record, ran = submit(farm, queues, path, tune=True)
    assert record["state"] == "done" and ("farm.tune_kernel", f"tune.{HOST.id}") in ran
    assert ran.count(("farm.plan_job", "control")) == 2  # the last tuning task plans the job again
    assert {e["variant_source"] for e in manifest(farm, record, tmp_path)} == {"tuned"}

    again, ran = submit(farm, queues, path, tune=True)
    assert again["cached"] == "True" and again["artifact_key"] == record["artifact_key"]  # nothing to time
    spec = tunable_specs(path)[0]
    farm.store.set_ref(tuning.db_ref(spec, HOST.id), farm.store.put(json.dumps(
        {"variant": GemmBlocking(2, 4, 16).to_json()}).encode()))
    changed, ran = submit(farm, queues, path)
    assert "cached" not in changed and changed["artifact_key"] != record["artifact_key"]  # the record changed
    assert [e["variant"] for e in manifest(farm, changed, tmp_path)] == [GemmBlocking(2, 4, 16).to_json()]

    live.clear()
    farm.store.delete_ref(tuning.db_ref(spec, HOST.id))
    untuned, ran = submit(farm, queues, path, tune=True)
    assert untuned["state"] == "done" and not any(name == "farm.tune_kernel" for name, _ in ran)
    assert f"no live worker consumes tune.{HOST.id}" in untuned["tuning_note"]
    assert [e["variant_source"] for e in manifest(farm, untuned, tmp_path)] == ["default"]


def test_a_failed_tuning_task_leaves_the_default_and_the_job_goes_on(redis_server: RedisServer,
                                                                     tmp_path: Path) -> None:
    path = save(CASES["gemm"], tmp_path)
    queues = Queues()
    farm = Farm(JobBoard(redis_server.url), FileStore(tmp_path / "store"), queues.dispatch,
                live_queues=lambda: {f"tune.{HOST.id}"})
    farm.tune = lambda job_id, name, spec_json, target_json: farm.tune_done(job_id, name, "BuildError: boom")
    record, _ = submit(farm, queues, path, tune=True)
    assert record["state"] == "done"
    assert any(key.startswith("tune_error:") and "boom" in value for key, value in record.items())
    assert [e["variant_source"] for e in manifest(farm, record, tmp_path)] == ["default"]


# --- the farm end to end: a real redis-server, a real worker that consumes tune.<cpu>, the CLI ------------------


def test_submit_tune_on_a_farm_times_on_the_worker_and_records_the_variants(farm_factory, tmp_path: Path) -> None:
    path = save(examples.tiny_cnn(), tmp_path)
    cluster = farm_factory(workers=1, env={"FARM_TUNE_SECONDS_PER_VARIANT": QUICK})
    result = farm_cli("submit", str(path), "--tune", "--json", "-o", str(tmp_path / "out"), broker=cluster.url,
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr + cluster.logs()
    job = json.loads(result.stdout)
    specs = tunable_specs(path)
    assert job["tuning"]["done"] == job["tuning"]["total"] == len(specs) and not job["tuning"]["errors"]
    entries = kernel_entries(job["artifact"])
    assert {e["variant_source"] for e in entries if e["variant"]} == {"tuned"}
    store = RedisStore(cluster.url)
    assert all(tuning.lookup(store, spec, HOST.id) for spec in specs)
    received = sum("Task farm.tune_kernel[" in line and line.endswith("received")
                   for line in cluster.workers[0].log_path.read_text().splitlines())
    assert received == len(specs)
    local = build_with(path, tmp_path / "local", store)  # the same database gives the same bytes here
    assert Path(local).read_bytes() == Path(job["artifact"]).read_bytes()
