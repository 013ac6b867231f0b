"""`farm worker` (farm/distributed/worker.py): what it detects on this host, which queues it takes, and what it advertises.

PoCL is installed here, so the host has one OpenCL device; without it these tests fail rather than skip.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pyopencl as cl
import pytest

from farm.backends.llvm.blobs import STALE_SCRATCH_SECONDS
from farm.backends.llvm.target import host_target
from farm.backends.opencl.devices import fingerprint
from farm.distributed.celery_app import make_app
from farm.distributed.task_messages import worker_queues
from farm.distributed.worker import WORKERS_KEY, default_hostname, detect_capabilities
from farm.tools import examples
from tests.farm_services import FarmWorker, farm_cli
from tests.services import RedisServer, free_port, redis_server_fixture, redis_servers_fixture  # noqa: F401
from tests.test_blobs import old_scratch

POCL = "Portable Computing Language"
HEX16 = re.compile(r"[0-9a-f]{16}")


@pytest.fixture(scope="module")
def capabilities() -> dict:
    return detect_capabilities()


def test_capabilities_name_this_hosts_cpu(capabilities: dict) -> None:
    host = host_target()
    assert capabilities["cpu"] == {
        "id": host.id,
        "triple": host.triple,
        "cpu": host.cpu,
        "features": host.features,
        "simd_floats": host.simd_floats,
    }
    assert capabilities["cpu"]["features"].startswith("+") or capabilities["cpu"]["features"].startswith("-")
    assert capabilities["host"] == socket.gethostname() and capabilities["pid"] == os.getpid()
    assert json.loads(json.dumps(capabilities)) == capabilities  # it is advertised as JSON


def test_capabilities_list_pocls_device_with_a_fingerprint(capabilities: dict) -> None:
    pocl = [device for device in capabilities["opencl"] if device["platform"] == POCL]
    assert pocl, f"PoCL's device is missing from {capabilities['opencl']} (install pocl-opencl-icd)"
    for device in capabilities["opencl"]:
        assert HEX16.fullmatch(device["fingerprint"]), device
        info = {name: value for name, value in device.items() if name != "fingerprint"}
        assert fingerprint(info) == device["fingerprint"]
        assert device["device"] and device["driver_version"] and device["opencl_c_version"].startswith("OpenCL C")
    expected = sum(len(platform.get_devices()) for platform in cl.get_platforms())
    assert len(capabilities["opencl"]) == expected


def test_queues_for_takes_control_llvm_this_cpus_tuning_and_each_opencl_device(capabilities: dict) -> None:
    queues = worker_queues(capabilities)
    tune = f"tune.{host_target().id}"
    assert queues[:3] == ["control", "llvm", tune]
    assert queues[3:] == [f"opencl.{device['fingerprint']}" for device in capabilities["opencl"]]
    assert any(re.fullmatch(r"opencl\.[0-9a-f]{16}", queue) for queue in queues)

    cpu = capabilities["cpu"]
    assert worker_queues({"cpu": cpu, "opencl": []}) == ["control", "llvm", tune]  # a CPU-only host
    two = {"cpu": cpu, "opencl": [{"fingerprint": "0" * 16}, {"fingerprint": "f" * 16}]}
    assert worker_queues(two) == ["control", "llvm", tune, f"opencl.{'0' * 16}", f"opencl.{'f' * 16}"]
    other = {"cpu": {**cpu, "cpu": "neoverse-n1", "triple": "aarch64-unknown-linux-gnu"}, "opencl": []}
    assert worker_queues(other)[2] != tune  # another CPU class: another tuning queue


def test_default_hostname_names_the_process_and_host() -> None:
    name = default_hostname()
    assert name == f"farm-{os.getpid()}@{socket.gethostname()}"
    assert re.fullmatch(r"farm-\d+@.+", name)


# --- connection settings and shutdown, with the production defaults ------------------------------------------------


def production_worker(url: str, name: str, folder: Path, **env: str) -> FarmWorker:
    """A `farm worker` with the farm's production limits (tests/farm_services.py keeps them unless told)."""
    return FarmWorker(url, name, folder, env=env)


def stop_and_time(worker: FarmWorker) -> float:
    """SIGTERM the worker's process group, as systemd or `docker stop` does, and return the seconds it took to
    exit; it must exit by itself (status 0), never by the SIGKILL that FarmWorker.stop sends after 20 s."""
    started = time.monotonic()
    worker.stop()
    seconds = time.monotonic() - started
    assert worker.process.returncode == 0, f"exit status {worker.process.returncode}:\n{worker.log_tail()}"
    return seconds


def test_a_worker_sweeps_leaked_scratch_advertises_consumes_its_queues_and_stops_at_a_sigterm(
    redis_servers, tmp_path: Path, capabilities: dict
) -> None:
    """One idle `farm worker` with the production defaults, from its start to its stop: starting, it sweeps the blob
    scratch older versions leaked (not one an older process may still be packing); running, it advertises this
    host's capabilities and consumes its queues; a SIGTERM stops it promptly, without a traceback, and withdraws its
    advertisement."""
    server = redis_servers(password="s3cret")
    client = server.client()
    temp = tmp_path / "tmp"
    temp.mkdir()
    leaked = old_scratch(temp, "farm-blob-crashed", STALE_SCRATCH_SECONDS + 60)
    busy = old_scratch(temp, "farm-blob-busy", 1)  # an older process on this host may still be packing it
    worker = production_worker(server.url, "caps@test", tmp_path, TMPDIR=str(temp)).start()
    try:
        assert not leaked.exists() and busy.exists()
        advertised = json.loads(client.hget(WORKERS_KEY, "caps@test"))
        assert advertised["cpu"] == capabilities["cpu"] and advertised["opencl"] == capabilities["opencl"]
        assert advertised["pid"] != os.getpid() and advertised["host"] == socket.gethostname()

        queues = make_app(server.url).control.inspect(timeout=5, destination=["caps@test"]).active_queues()
        assert queues, f"the worker didn't answer inspect:\n{worker.log_tail()}"
        assert sorted(queue["name"] for queue in queues["caps@test"]) == sorted(worker_queues(capabilities))
    except BaseException:
        worker.kill()
        raise
    seconds = stop_and_time(worker)
    log = worker.log_path.read_text()
    print(f"a SIGTERM'd idle worker exited after {seconds:.2f} s")
    assert "Traceback" not in log and "Warm shutdown" in log
    assert not client.hexists(WORKERS_KEY, "caps@test"), "a stopped worker still advertises itself"


def test_a_sigterm_to_a_busy_workers_group_lets_the_task_in_hand_finish(redis_servers, tmp_path: Path) -> None:
    """The whole process group gets the SIGTERM, pool processes included: the task in hand (planning a ResNet-style
    model, about a second) still finishes, and the worker exits after it, without a traceback."""
    server = redis_servers(password="s3cret")
    model = tmp_path / "resnet18_style.onnx"
    onnx.save(examples.resnet18_style(), model)
    worker = production_worker(server.url, "busy@test", tmp_path).start()
    submitted = farm_cli("submit", str(model), "--no-wait", "--json", broker=server.url, cwd=tmp_path)
    job_key = f"farm:job:{json.loads(submitted.stdout)['job_id']}"
    client = server.client()
    while client.hget(job_key, "state") in (None, b"queued"):
        time.sleep(0.02)
    seconds = stop_and_time(worker)
    log = worker.log_path.read_text()
    print(f"a worker SIGTERM'd while planning exited after {seconds:.2f} s")
    assert "Traceback" not in log and "WorkerLostError" not in log
    assert re.search(r"Warm shutdown.*farm\.plan_job\[[^]]+\] succeeded", log, re.S), log[-3000:]
    assert client.hget(job_key, "state") == b"compiling"  # planned to the end: its units are on the queue


def test_a_worker_whose_redis_is_gone_still_stops_promptly_with_one_line(redis_servers, tmp_path: Path) -> None:
    """Its advertisement can't be withdrawn then: one warning says so (a ping-less entry shows nowhere)."""
    server = redis_servers(password="s3cret")
    worker = production_worker(server.url, "orphan@test", tmp_path).start()
    server.stop()
    seconds = stop_and_time(worker)
    log = worker.log_path.read_text()
    print(f"a SIGTERM'd worker whose Redis was gone exited after {seconds:.2f} s")
    shutdown = log.partition("Warm shutdown")[2]  # (Celery may log its own traceback when the connection drops)
    assert "Traceback" not in shutdown, shutdown
    assert len([line for line in shutdown.splitlines() if "could not withdraw its advertisement" in line]) == 1
    assert "s3cret" not in log


@pytest.mark.services
def test_a_worker_waits_for_a_redis_that_is_down_then_serves_it(tmp_path: Path) -> None:
    """A server that doesn't answer yet is a passing fault: the worker waits for it (Celery's retries), as before."""
    server = RedisServer(password="s3cret", port=free_port())
    worker = production_worker(server.url, "patient@test", tmp_path)
    try:
        with open(worker.log_path, "ab") as log:
            worker.process = subprocess.Popen(
                [sys.executable, "-m", "farm", "worker", "--hostname", worker.name, "--concurrency", "1"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**worker.env, "FARM_BROKER_URL": server.url},
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while "Cannot connect" not in worker.log_tail() and time.monotonic() < deadline:
            assert worker.process.poll() is None, worker.log_tail()
            time.sleep(0.2)
        assert "Trying again" in worker.log_tail()
        server.start()
        worker._wait_until_ready()
        assert stop_and_time(worker) < 20
    finally:
        worker.kill()
        server.close()
    assert "Traceback" not in worker.log_path.read_text()


def test_workers_with_different_toolchains_share_no_cache_entry(redis_server: RedisServer, tmp_path: Path) -> None:
    """Two real workers, one after the other, reporting different toolchains (FARM_TOOLCHAIN_LABEL): the second
    compiles every unit again and caches its own artifact; each advertises its toolchain."""
    model = tmp_path / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), model)
    keys = []
    for label in ("a", "b", "a"):
        worker = FarmWorker(
            redis_server.url, f"toolchain-{label}@test", tmp_path, env={"FARM_TOOLCHAIN_LABEL": label}
        ).start()
        try:
            listed = json.loads(farm_cli("workers", "--json", broker=redis_server.url, cwd=tmp_path).stdout)["workers"]
            keys.append(listed[0]["toolchain"]["key"])
            result = farm_cli(
                "submit", str(model), "--json", "-o", str(tmp_path / label), broker=redis_server.url, cwd=tmp_path
            )
            assert result.returncode == 0, result.stderr + worker.log_tail()
            assert json.loads(result.stdout)["compiled"] == (0 if len(keys) == 3 else 12)  # 0: the cached artifact
        finally:
            worker.stop()
    assert keys[0] == keys[2] != keys[1]
    assert (tmp_path / "a" / "tiny_cnn.farm").read_bytes() == (tmp_path / "b" / "tiny_cnn.farm").read_bytes()


def test_a_worker_prepares_its_process_for_building_before_the_pool_forks() -> None:
    """`farm worker` loads the compiler and prepares the process for building (preload) before Celery forks its
    pool: a forked process starts with the collector's thresholds raised and what was loaded frozen."""
    from farm.build.executor import GC_THRESHOLDS

    code = (
        "import gc, json, os, sys\nfrom farm.distributed.worker import preload\npreload()\n"
        "read, write = os.pipe()\nif os.fork() == 0:\n"
        "    os.write(write, json.dumps([gc.get_threshold(), gc.get_freeze_count() > 0]).encode())\n"
        "    os._exit(0)\nos.wait()\nsys.stdout.write(os.read(read, 200).decode())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == [list(GC_THRESHOLDS), True]
