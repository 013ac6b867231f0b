"""Choosing a build's variants (farm/tuning/variants.py): the plan left unchanged, records made with --tune and
reused without timing, the manifest, targets this host can't time, and `--tune` on a real farm."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.build.assembly import plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.distributed import recipes, task_messages
from farm.distributed.board import JobBoard
from farm.distributed.job_record import JobRecord, JobState
from farm.distributed.steps import Farm
from farm.distributed.task_messages import Message, PlanJob
from farm.ir.specs import KernelSpec
from farm.store import FileStore, RedisStore
from farm.tools import examples
from farm.tuning import database, variants
from farm.tuning.space import candidate_variants, variant_spec
from tests.farm_services import farm_cli, farm_factory_fixture  # noqa: F401
from tests.services import RedisServer, redis_server_fixture  # noqa: F401
from tests.test_cli import farm as cli
from tests.test_tuning_harness import (  # noqa: F401
    QUICK,
    lock_held_by_another_process,
    quick_timing,
    temp_folder_fixture,
)
from tests.test_tuning_space import AARCH64, CASES, HOST, build_with, kernel_entries, save, tunable_specs

# --- the plan is a value -----------------------------------------------------------------------------------------


def test_with_variants_and_choose_variants_leave_the_plan_unchanged(tmp_path: Path) -> None:
    path = save(CASES["matmul"], tmp_path)
    store = FileStore(tmp_path / "store")
    plan = plan_model(path)
    spec = tunable_specs(path)[0]
    chosen = candidate_variants(HOST)[1]
    database.record(store, spec, HOST, {"variant": chosen.to_json()})

    tuned = variants.with_variants(store, plan, [HOST])
    [again], report = variants.choose_variants([plan], [HOST], store)
    assert plan.tuned == {} and plan.kernel_for(spec, HOST.id).variant_json == ""
    assert tuned.kernel_for(spec, HOST.id) == again.kernel_for(spec, HOST.id) == variant_spec(spec, HOST, chosen)
    assert tuned.tuned == again.tuned == {(spec.key, HOST.id): variant_spec(spec, HOST, chosen).variant_json}
    assert report.timed == [] and report.notes == []
    with pytest.raises(dataclasses.FrozenInstanceError):  # a plan can't be given variants in place
        plan.tuned = tuned.tuned


# --- records made with --tune, reuse without timing and the manifest -------------------------------------------


def test_tune_records_every_kernel_and_a_second_build_reuses_them_without_timing(tmp_path: Path) -> None:
    path = save(examples.tiny_cnn(), tmp_path)
    store = FileStore(tmp_path / "store")
    specs = tunable_specs(path)
    plain = build_with(path, tmp_path / "plain", store)
    assert {e["variant_source"] for e in kernel_entries(plain) if e["variant"]} == {"default"}

    first = build_model(path, tmp_path / "first", executor=LocalExecutor(1), store=store, tune=True)
    assert sorted(first.tuning.timed) == sorted(variants.tune_name(s, HOST.id) for s in specs) and specs
    assert all(database.lookup(store, spec, HOST.id) for spec in specs)
    record = json.loads(store.get(store.get_ref(database.db_ref(specs[0], HOST.id))))
    assert record["kernel"] == database.tuning_key(specs[0]) and record["target"]["id"] == HOST.id
    assert record["farm_version"] and record["default_seconds"] > 0
    entries = kernel_entries(first.artifact)
    assert {e["variant_source"] for e in entries if e["variant"]} == {"tuned"}
    for entry in entries:
        chosen = database.lookup(store, KernelSpec.from_json(entry["spec"]), HOST.id)
        assert entry["variant"] == (chosen.to_json() if chosen else None)

    again = build_model(path, tmp_path / "again", executor=LocalExecutor(1), store=store, tune=True)
    assert again.tuning.timed == []  # every kernel came from the database
    assert Path(again.artifact).read_bytes() == Path(first.artifact).read_bytes()
    untuned_flag = build_with(path, tmp_path / "later", store)  # no --tune: the records are used all the same
    assert Path(untuned_flag).read_bytes() == Path(first.artifact).read_bytes()
    retuned = build_model(path, tmp_path / "retune", executor=LocalExecutor(1), store=store, retune=True)
    assert len(retuned.tuning.timed) == len(specs)


def test_retune_of_several_sizes_times_a_kernel_they_share_once(tmp_path: Path) -> None:
    """A GEMM whose shapes no pin reaches is one kernel of every size: `--retune` of two sizes times it once."""
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.ones((64, 48), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"]), helper.make_node("Relu", ["b"], ["z"])],
        "shared",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [32, 64]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 48]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n"]),
        ],
        [weights],
    )
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path)
    result = build_model(
        path,
        tmp_path / "out",
        executor=LocalExecutor(1),
        store=FileStore(tmp_path / "store"),
        retune=True,
        sizes=[{"n": (1,)}, {"n": (2,)}],
    )
    assert len(result.tuning.timed) == len(set(result.tuning.timed)) == 1


def test_submit_tune_on_this_machine_records_in_the_local_store(tmp_path: Path) -> None:
    path = save(CASES["conv1x1"], tmp_path)
    env = {"FARM_CACHE_DIR": str(tmp_path / "cache")}  # the local store: $FARM_CACHE_DIR/store
    tuned = cli("submit", path, "--tune", "--json", "-o", tmp_path / "tuned", cwd=tmp_path, env=env)
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["tuning"] == {"timed": 1, "notes": []} and len(tunable_specs(path)) == 1
    assert "tuning 1/1 (100%)" in tuned.stderr
    plain = cli("submit", path, "--json", "-o", tmp_path / "plain", cwd=tmp_path, env=env)
    assert json.loads(plain.stdout)["tuning"] is None
    assert [e["variant_source"] for e in kernel_entries(json.loads(plain.stdout)["artifact"])] == ["tuned"]


def test_a_target_this_host_cannot_run_keeps_the_default_and_says_so(tmp_path: Path) -> None:
    path = save(CASES["gemm"], tmp_path)
    result = build_model(
        path, tmp_path / "out", [AARCH64], executor=LocalExecutor(1), store=FileStore(tmp_path / "store"), tune=True
    )
    assert result.tuning.timed == [] and AARCH64.id in result.tuning.notes[0]
    assert "default variant" in result.tuning.notes[0]
    assert [e["variant_source"] for e in kernel_entries(result.artifact)] == ["default"]
    assert not variants.can_time_here(AARCH64) and variants.can_time_here(HOST)


@pytest.mark.slow
def test_a_tuning_lock_held_past_the_default_timeout_keeps_the_default_and_the_build_succeeds(
    temp_folder: Path,
) -> None:
    """With the production FARM_TUNE_LOCK_TIMEOUT (120 s): another process holds the host's tuning lock
    throughout a build of four tunable kernels; the first waits the timeout, the others are not waited for again
    (one timeout in all, not one per kernel), every kernel keeps its default variant, the report says why of
    each, and the build succeeds."""
    path = save(examples.mlp(), temp_folder)
    specs = tunable_specs(path)
    assert len(specs) == 4
    started = time.monotonic()
    with lock_held_by_another_process(temp_folder):
        result = build_model(
            path, temp_folder / "out", executor=LocalExecutor(1), store=FileStore(temp_folder / "store"), tune=True
        )
    assert 120 <= time.monotonic() - started < 2 * 120
    assert result.tuning.timed == []
    lock = temp_folder / f"farm-{os.getuid()}" / "tune.lock"
    waited = (
        f"tuning lock {lock}: still held by another tuning process after 120 s (FARM_TUNE_LOCK_TIMEOUT) (the "
        "default variant is used)"
    )
    skipped = (
        "tuning lock still held by another tuning process, not waited for again in this build (the default "
        "variant is used)"
    )
    names = [note.split(": ", 1)[0] for note in result.tuning.notes]
    assert sorted(names) == sorted(variants.tune_name(spec, HOST.id) for spec in specs)
    assert [note.split(": ", 1)[1] for note in result.tuning.notes] == [waited, skipped, skipped, skipped]
    assert [e["variant_source"] for e in kernel_entries(result.artifact) if e["variant"]] == ["default"] * 4


# --- the farm, in-process: the steps of farm/distributed/steps.py against a real redis-server ------------------


class Queues(list):
    """Dispatched tasks as (name, args, queue), run first in, first out by `run` as farm/distributed/tasks.py would."""

    def dispatch(self, message: Message) -> None:
        self.append((message.task, json.loads(json.dumps(message.args)), message.queue))

    def run(self, farm: Farm) -> list[tuple[str, str]]:
        ran = []
        while self:
            name, args, queue = self.pop(0)
            ran.append((name, queue))
            farm.run(task_messages.decode(name, args))
        return ran


def submit(farm: Farm, queues: Queues, model: Path, **flags: bool) -> tuple[JobRecord, list[tuple[str, str]]]:
    data = model.read_bytes()
    job_id = uuid.uuid4().hex[:16]
    farm.board.create(
        job_id,
        JobRecord(JobState.QUEUED, farm.store.put(data), model.stem, hashlib.sha256(data).hexdigest(), [HOST], **flags),
    )
    queues.dispatch(PlanJob(job_id).message())
    ran = queues.run(farm)
    return farm.board.get(job_id), ran


def manifest(farm: Farm, record: JobRecord, folder: Path) -> list[dict[str, Any]]:
    path = folder / f"{uuid.uuid4().hex}.farm"
    recipes.write_artifact_from(path, recipes.read_recipe(farm.store.get(record.artifact_key)), farm.store.get)
    return kernel_entries(str(path))


def test_farm_tuning_goes_to_the_cpus_queue_and_a_later_job_reuses_the_records(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    path = save(CASES["conv3x3"], tmp_path)
    queues, live = Queues(), {f"tune.{HOST.id}"}
    farm = Farm(JobBoard(redis_server.url), FileStore(tmp_path / "store"), queues.dispatch, live_queues=lambda: live)
    record, ran = submit(farm, queues, path, tune=True)
    assert record.state == "done" and ("farm.tune_kernel", f"tune.{HOST.id}") in ran
    assert ran.count(("farm.plan_job", "control")) == 2  # the last tuning task plans the job again
    assert {e["variant_source"] for e in manifest(farm, record, tmp_path)} == {"tuned"}

    again, ran = submit(farm, queues, path, tune=True)
    assert again.cached and again.artifact_key == record.artifact_key  # nothing to time
    spec = tunable_specs(path)[0]
    farm.store.set_ref(
        database.db_ref(spec, HOST.id),
        farm.store.put(json.dumps({"variant": GemmBlocking(2, 4, 16).to_json()}).encode()),
    )
    changed, ran = submit(farm, queues, path)
    assert not changed.cached and changed.artifact_key != record.artifact_key  # the record changed
    assert [e["variant"] for e in manifest(farm, changed, tmp_path)] == [GemmBlocking(2, 4, 16).to_json()]

    live.clear()
    farm.store.delete_ref(database.db_ref(spec, HOST.id))
    untuned, ran = submit(farm, queues, path, tune=True)
    assert untuned.state == "done" and not any(name == "farm.tune_kernel" for name, _ in ran)
    assert f"no live worker consumes tune.{HOST.id}" in untuned.tuning_note
    assert [e["variant_source"] for e in manifest(farm, untuned, tmp_path)] == ["default"]


def test_a_failed_tuning_task_leaves_the_default_and_the_job_goes_on(redis_server: RedisServer, tmp_path: Path) -> None:
    path = save(CASES["gemm"], tmp_path)
    queues = Queues()
    farm = Farm(
        JobBoard(redis_server.url),
        FileStore(tmp_path / "store"),
        queues.dispatch,
        live_queues=lambda: {f"tune.{HOST.id}"},
    )
    farm.tune = lambda args: farm.tune_done(args.job_id, args.name, "BuildError: boom")
    record, _ = submit(farm, queues, path, tune=True)
    assert record.state == "done"
    assert any("boom" in error for error in record.tune_errors.values())
    assert [e["variant_source"] for e in manifest(farm, record, tmp_path)] == ["default"]


# --- the farm end to end: a real redis-server, a real worker that consumes tune.<cpu>, the CLI ------------------


def test_submit_tune_on_a_farm_times_on_the_worker_and_records_the_variants(farm_factory, tmp_path: Path) -> None:
    path = save(examples.tiny_cnn(), tmp_path)
    cluster = farm_factory(workers=1, env={"FARM_TUNE_SECONDS_PER_VARIANT": QUICK})
    result = farm_cli(
        "submit", str(path), "--tune", "--json", "-o", str(tmp_path / "out"), broker=cluster.url, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr + cluster.logs()
    job = json.loads(result.stdout)
    specs = tunable_specs(path)
    assert job["tuning"] == {"timed": len(specs), "notes": []}
    entries = kernel_entries(job["artifact"])
    assert {e["variant_source"] for e in entries if e["variant"]} == {"tuned"}
    store = RedisStore(cluster.worker_url)  # the tuning database is the workers' to read and write
    assert all(database.lookup(store, spec, HOST.id) for spec in specs)
    received = sum(
        "Task farm.tune_kernel[" in line and line.endswith("received")
        for line in cluster.workers[0].log_path.read_text().splitlines()
    )
    assert received == len(specs)
    local = build_with(path, tmp_path / "local", store)  # the same database gives the same bytes here
    assert Path(local).read_bytes() == Path(job["artifact"]).read_bytes()
