"""The farm end to end: real redis-server, real `farm worker` processes, the real CLI in other processes."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from farm import runtime
from farm.backends.opencl.target import OpenClTarget
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.distributed.board import JobBoard
from farm.distributed.job_record import JobState
from farm.distributed.redis_keys import RUNNING_KEY
from farm.distributed.task_messages import RunningTask, TaskName
from farm.errors import ExitStatus
from farm.tools import examples
from tests.dynamic_models import dynamic_cnn
from tests.farm_services import FarmWorker, farm_cli, farm_factory_fixture, packed_weight_symbol  # noqa: F401
from tests.services import free_port
from tests.test_cli import Running, _submitted_job


def _sha(path: str | Path) -> bytes:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).digest()


@pytest.fixture(scope="module")
def resnet(tmp_path_factory) -> tuple[Path, Path]:
    """resnet18_style.onnx and its local build."""
    folder = tmp_path_factory.mktemp("resnet")
    path = folder / "resnet18_style.onnx"
    onnx.save(examples.resnet18_style(), path)
    local = build_model(path, folder / "local", executor=LocalExecutor(1)).artifact
    return path, Path(local)


def _submit(farm, model: Path, cwd: Path, *extra: str) -> dict:
    result = farm_cli("submit", str(model), "--json", "-o", str(cwd / "out"), *extra, broker=farm.url, cwd=cwd)
    assert result.returncode == 0, result.stderr + farm.logs()
    return json.loads(result.stdout)


def _status(farm, job_id: str, cwd: Path) -> dict:
    return json.loads(farm_cli("status", job_id, "--json", broker=farm.url, cwd=cwd).stdout)


def _corrupt(client, ref_pattern: str) -> tuple[str, bytes]:
    """Flip a byte in the first chunk of the entry a ref points at; returns the chunk's key and its bad bytes."""
    object_key = client.get(client.keys(ref_pattern)[0]).decode()
    chunk = f"farm:store:obj:{object_key}:0"
    data = bytearray(client.get(chunk))
    data[len(data) // 2] ^= 0xFF
    client.set(chunk, bytes(data))
    return chunk, bytes(data)


def test_two_workers_build_the_local_artifact_and_a_resubmit_compiles_nothing(farm_factory, resnet, tmp_path):
    """The first job is submitted with --no-wait, then waited for and downloaded from other processes; a resubmit
    compiles nothing; entries corrupted in the store are then rebuilt, never shipped."""
    model, local = resnet
    farm = farm_factory(workers=2)
    submitted = farm_cli("submit", str(model), "--no-wait", "--json", broker=farm.url, cwd=tmp_path)
    job_id = json.loads(submitted.stdout)["job_id"]
    waited = farm_cli("wait", job_id, broker=farm.url, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr + farm.logs()
    downloaded = farm_cli("download", job_id, "-o", str(tmp_path / "dl"), broker=farm.url, cwd=tmp_path)
    assert downloaded.returncode == 0
    assert _sha(downloaded.stdout.strip()) == _sha(local)
    job = _status(farm, job_id, tmp_path)
    assert job["state"] == "done" and job["compiled"] == job["kernels"] + job["blobs"] > 0 and job["cached"] == 0
    again = _submit(farm, model, tmp_path)
    assert again["compiled"] == 0 and again["cached"] == job["compiled"] and again["job_id"] != job["job_id"]
    assert _sha(again["artifact"]) == _sha(local)
    listed = farm_cli("workers", "--json", broker=farm.url, cwd=tmp_path)
    names = {w["name"] for w in json.loads(listed.stdout)["workers"]}
    assert names == {w.name for w in farm.workers}
    assert all("llvm" in w["queues"] and w["cpu"]["triple"] for w in json.loads(listed.stdout)["workers"])

    client = farm.redis.client()  # corrupt entries are rebuilt, never shipped
    kernel_chunk, bad_kernel = _corrupt(client, "farm:store:ref:kernel:*")
    artifact_chunk, bad_artifact = _corrupt(client, "farm:store:ref:artifact:*")
    rebuilt = _submit(farm, model, tmp_path)
    assert rebuilt["compiled"] == 0 and rebuilt["job_id"] != again["job_id"]
    assert _sha(rebuilt["artifact"]) == _sha(local)
    assert client.get(kernel_chunk) != bad_kernel and client.get(artifact_chunk) != bad_artifact


def test_a_killed_host_costs_seconds_and_the_waiting_client_says_so(farm_factory, resnet, tmp_path):
    """Production defaults (FARM_VISIBILITY_TIMEOUT 720 s, FARM_WORKER_LEASE_SECONDS 10): a worker SIGKILLed with its
    pool mid-job, as when its host dies: the one still planning (dispatching units, putting weights) once units
    compile. Its lease lapses after FARM_WORKER_LEASE_SECONDS and a peer dispatches its task again, so the job
    finishes long before Redis would redeliver it (bench_farm.py measures the extra seconds). The waiting `farm
    submit` says which worker was lost and how many tasks run again, and its progress never goes back (the plan task
    run again used to move the job back to planning: `compiling 40/40`, then `planning`, with units still
    compiling)."""
    model, local = resnet
    farm = farm_factory(workers=2)
    waiting = Running("submit", str(model), "--json", "-o", str(tmp_path / "out"), broker=farm.url, cwd=tmp_path)
    job_id = _submitted_job(waiting.wait_for("submitted", 60))
    victim, held = _kill_a_busy_worker(farm, job_id)
    killed = time.monotonic()
    status, stdout = waiting.finish()
    assert status == 0, waiting.stderr + farm.logs()
    assert time.monotonic() - killed < 120, "the lost tasks waited for the visibility timeout, not for the lease"
    survivor = next(worker for worker in farm.workers if worker is not victim)
    assert "again: its worker's lease lapsed" in survivor.log_path.read_text()
    assert f"farm: worker {victim.name} lost; re-running {held} task{'' if held == 1 else 's'}\n" in waiting.stderr
    prefix = f"farm: {model.name} on the farm: "
    phases = [
        line[len(prefix) :]
        for line in waiting.stderr.splitlines()
        if line.startswith(prefix)
        and not re.fullmatch(r"compiling \d+/\d+ \(\d+%\), \d+\.\d s|done, \d+\.\d s", line[len(prefix) :])
    ]
    assert phases[phases.index("compiling") :] == ["compiling", "linking"], waiting.stderr
    assert _sha(json.loads(stdout)["artifact"]) == _sha(local)


def _kill_a_busy_worker(farm, job_id: str) -> tuple[FarmWorker, int]:
    """Once the job compiles, SIGKILL the worker that still plans it (else one that compiles one of its units), as
    when its host dies; returns it and how many of the job's tasks it held, which its peers dispatch again (read
    after the kill, when no task of its can end any more)."""
    board, deadline = JobBoard(farm.worker_url), time.monotonic() + 60
    while time.monotonic() < deadline:
        record = board.get(job_id)
        mine = sorted(
            (task for task in _running(farm) if task.job_id == job_id),
            key=lambda task: task.message.task != TaskName.PLAN_JOB.value,
        )
        if record is not None and record.state == JobState.COMPILING and mine:
            victim = next(worker for worker in farm.workers if worker.name == mine[0].worker)
            victim.kill()
            held = sum(task.job_id == job_id and task.holder == mine[0].holder for task in _running(farm))
            assert held, f"{victim.name}'s task ended between the look and the kill"
            return victim, held
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} never compiled with a task running:\n{farm.logs()}")


def _running(farm) -> list[RunningTask]:
    """The farm tasks running now, with their holders (the running-task registry)."""
    return [RunningTask.decode(text) for text in farm.redis.client().hgetall(RUNNING_KEY).values()]


def test_a_unit_that_kills_its_worker_every_time_fails_the_job_by_name(farm_factory, tmp_path):

    model = tmp_path / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), model)
    doomed = packed_weight_symbol(model)
    farm = farm_factory(workers=1, env={"FARM_FAULT_KILL_UNIT": doomed})
    started = time.monotonic()
    result = farm_cli("submit", str(model), "--json", broker=farm.url, cwd=tmp_path, timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    assert doomed in result.stderr and "started 3 times and never finished" in result.stderr
    assert (
        "packed weight of node" in result.stderr
    )  # named by the ONNX nodes that read the weights, not only the symbol
    assert time.monotonic() - started < 60  # seconds, with the production defaults
    assert farm.workers[0].process.poll() is None


def _bad_model(path: Path) -> Path:
    node = helper.make_node("RandomNormalLike", ["x"], ["y"], name="the_node")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_bad_input_fails_fast_with_the_node_named_and_no_worker_dies(farm_factory, tmp_path):
    farm = farm_factory(workers=1)
    started = time.monotonic()
    unsupported = farm_cli("submit", str(_bad_model(tmp_path / "bad.onnx")), "--json", broker=farm.url, cwd=tmp_path)
    assert (
        unsupported.returncode == 2
        and "'the_node'" in unsupported.stderr
        and "'RandomNormalLike'" in unsupported.stderr
    )
    model = examples.tiny_cnn().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(model[: len(model) // 3])
    truncated = farm_cli("submit", str(tmp_path / "cut.onnx"), broker=farm.url, cwd=tmp_path)
    assert truncated.returncode == 2 and "cut.onnx" in truncated.stderr
    assert time.monotonic() - started < 30
    assert farm.workers[0].process.poll() is None
    assert not (tmp_path / "artifacts").exists()


def test_a_dynamic_model_builds_on_the_farm_with_shape_as_it_does_locally(farm_factory, tmp_path):
    """--shape travels in the job request, several sizes too: the farm builds the artifact a local build with the
    same sizes makes (a library per size, linked by a task each), and without a pin the job fails with the local
    build's message."""
    model = tmp_path / "dyn.onnx"
    dynamic_cnn(model)
    sizes = [{"batch": (2,)}, {"batch": (3,)}]
    local = build_model(model, tmp_path / "local", executor=LocalExecutor(1), sizes=sizes).artifact
    farm = farm_factory(workers=1)
    job = _submit(farm, model, tmp_path, "--shape", "batch=2,3")
    assert job["state"] == "done" and _sha(job["artifact"]) == _sha(local)
    model_of_sizes = runtime.load(job["artifact"], threads=1)
    assert [pins for pins, _ in model_of_sizes.sizes] == sizes
    again = _submit(farm, model, tmp_path, "--shape", "batch=2,3")
    assert again["compiled"] == 0 and _sha(again["artifact"]) == _sha(local)
    other = _submit(farm, model, tmp_path, "--shape", "batch=3,2")  # another artifact, of units all cached
    assert other["compiled"] == 0 and _sha(other["artifact"]) != _sha(local)
    assert [pins for pins, _ in runtime.load(other["artifact"], threads=1).sizes] == sizes[::-1]
    unpinned = farm_cli("submit", str(model), broker=farm.url, cwd=tmp_path)
    assert unpinned.returncode == 2 and "pin it with --shape batch=N" in unpinned.stderr


def test_cancel_stops_the_job_and_leaves_no_artifact(farm_factory, resnet, tmp_path):
    model, _ = resnet
    farm = farm_factory(workers=1)
    job_id = json.loads(
        farm_cli("submit", str(model), "--no-wait", "--no-cache", "--json", broker=farm.url, cwd=tmp_path).stdout
    )["job_id"]
    cancelled = farm_cli("cancel", job_id, broker=farm.url, cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    time.sleep(3)
    status = _status(farm, job_id, tmp_path)
    assert status["state"] == "cancelled" and status["artifact_key"] is None
    assert status["done"] < status["total"] or status["total"] == 0
    assert farm_cli("wait", job_id, broker=farm.url, cwd=tmp_path).returncode == 3
    assert farm_cli("download", job_id, broker=farm.url, cwd=tmp_path).returncode == 3
    assert farm_cli("status", "no-such-job", broker=farm.url, cwd=tmp_path).returncode == 3


def test_unreachable_broker_exits_4_within_seconds(tmp_path):
    model = tmp_path / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), model)
    started = time.monotonic()
    result = farm_cli("submit", str(model), broker=f"redis://127.0.0.1:{free_port()}/0", cwd=tmp_path, timeout=60)
    assert result.returncode == 4, result.stderr
    assert "reach" in result.stderr and "127.0.0.1" in result.stderr
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("moment", ["planning", "compiling"])
def test_redis_restarted_mid_job_the_job_completes(farm_factory, resnet, tmp_path, moment):
    model, local = resnet
    farm = farm_factory(workers=2)
    job_id = json.loads(
        farm_cli("submit", str(model), "--no-wait", "--no-cache", "--json", broker=farm.url, cwd=tmp_path).stdout
    )["job_id"]
    board = farm.redis.client()
    deadline = time.monotonic() + 60
    while board.hget(f"farm:job:{job_id}", "state") != moment.encode() and time.monotonic() < deadline:
        time.sleep(0.005)
    farm.redis.kill()
    time.sleep(1)
    farm.redis.restart()
    try:
        waited = farm_cli("wait", job_id, broker=farm.url, cwd=tmp_path, timeout=240)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"the job did not finish within 240 s of the restart: {timeout.stderr!r}\n{farm.logs()}")
    assert waited.returncode == 0, waited.stderr + farm.logs()
    downloaded = farm_cli("download", job_id, "-o", str(tmp_path / "dl"), broker=farm.url, cwd=tmp_path)
    assert _sha(downloaded.stdout.strip()) == _sha(local)


def test_opencl_tasks_go_to_the_worker_that_has_the_device(farm_factory, tmp_path):
    from farm.backends.llvm.target import host_target
    from farm.backends.opencl.devices import opencl_devices

    model = tmp_path / "small_cnn.onnx"
    onnx.save(examples.small_cnn(), model)
    (tmp_path / "no-icd").mkdir()
    farm = farm_factory(workers=0)
    with_device = farm.add_worker("gpu@test")
    without = farm.add_worker("cpu@test", env={"OCL_ICD_VENDORS": str(tmp_path / "no-icd")})
    fingerprint = opencl_devices()[0]["fingerprint"]
    job = _submit(farm, model, tmp_path, "--target", "cpu", "--target", "opencl")
    local = build_model(
        model, tmp_path / "local", [host_target(), OpenClTarget(fingerprint)], executor=LocalExecutor(1)
    )
    assert _sha(job["artifact"]) == _sha(local.artifact)

    def received(worker) -> int:
        return sum(
            "Task farm.compile_cl_kernel[" in line and line.endswith("received")
            for line in worker.log_path.read_text().splitlines()
        )

    from farm.build import assembly

    cpu_units = sum(unit.kind != "blob" for unit in assembly.compile_units(assembly.plan_model(model), [host_target()]))
    assert received(with_device) == job["kernels"] - cpu_units and received(without) == 0  # the rest: OpenCL
    queues = {
        w["name"]: w["queues"]
        for w in json.loads(farm_cli("workers", "--json", broker=farm.url, cwd=tmp_path).stdout)["workers"]
    }
    assert f"opencl.{fingerprint}" in queues["gpu@test"] and f"opencl.{fingerprint}" not in queues["cpu@test"]


def test_a_device_no_live_worker_owns_is_named_by_status_and_wait(farm_factory, tmp_path):
    from farm.backends.llvm.target import host_target
    from farm.distributed.client import FarmClient

    (tmp_path / "no-icd").mkdir()
    farm = farm_factory(workers=0)
    farm.add_worker("cpu@test", env={"OCL_ICD_VENDORS": str(tmp_path / "no-icd")})
    model = tmp_path / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), model)
    absent = "0123456789abcdef"  # no worker has this device; control and llvm are served
    client = FarmClient(farm.url)
    job_id = client.submit(model, [host_target(), OpenClTarget(absent)])
    said = (
        f"farm: no live worker consumes queue opencl.{absent}; start 'farm worker' on a host with OpenCL "
        f"device {absent}\n"
    )
    status = farm_cli("status", job_id, broker=farm.url, cwd=tmp_path)
    assert status.returncode == 0 and status.stderr == said, status.stderr + farm.logs()
    started = time.monotonic()
    waited = farm_cli("wait", job_id, "--timeout", "12", broker=farm.url, cwd=tmp_path)
    assert waited.returncode == ExitStatus.STILL_RUNNING and waited.stderr.count(said) == 1, waited.stderr
    assert time.monotonic() - started < 60
    assert client.status(job_id)["state"] in ("planning", "compiling")  # its OpenCL units wait for a worker
    workers = farm_cli("workers", broker=farm.url, cwd=tmp_path)
    assert workers.returncode == 0 and workers.stderr == "" and "cpu@test" in workers.stdout
    assert client.cancel(job_id)
