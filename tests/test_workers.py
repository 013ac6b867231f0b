"""`farm worker` (farm/distributed/worker.py): what it detects on this host, which queues it takes, and what it advertises.

PoCL is installed here, so the host has one OpenCL device; without it these tests fail rather than skip.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pyopencl as cl
import pytest
import redis

from farm.backends.llvm.target import host_target
from farm.backends.opencl.devices import fingerprint
from farm.distributed.celery_app import make_app
from farm.distributed.worker import WORKERS_KEY, default_hostname, detect_capabilities, queues_for
from tests.farm_services import FarmWorker
from tests.services import RedisServer, redis_server_fixture  # noqa: F401

POCL = "Portable Computing Language"
HEX16 = re.compile(r"[0-9a-f]{16}")


@pytest.fixture(scope="module")
def capabilities() -> dict:
    return detect_capabilities()


def test_capabilities_name_this_hosts_cpu(capabilities: dict) -> None:
    host = host_target()
    assert capabilities["cpu"] == {"id": host.id, "triple": host.triple, "cpu": host.cpu, "features": host.features,
                                   "simd_floats": host.simd_floats}
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
    queues = queues_for(capabilities)
    tune = f"tune.{host_target().id}"
    assert queues[:3] == ["control", "llvm", tune]
    assert queues[3:] == [f"opencl.{device['fingerprint']}" for device in capabilities["opencl"]]
    assert any(re.fullmatch(r"opencl\.[0-9a-f]{16}", queue) for queue in queues)

    cpu = capabilities["cpu"]
    assert queues_for({"cpu": cpu, "opencl": []}) == ["control", "llvm", tune]  # a CPU-only host
    two = {"cpu": cpu, "opencl": [{"fingerprint": "0" * 16}, {"fingerprint": "f" * 16}]}
    assert queues_for(two) == ["control", "llvm", tune, f"opencl.{'0' * 16}", f"opencl.{'f' * 16}"]
    other = {"cpu": {**cpu, "cpu": "neoverse-n1", "triple": "aarch64-unknown-linux-gnu"}, "opencl": []}
    assert queues_for(other)[2] != tune  # another CPU class: another tuning queue


def test_default_hostname_names_the_process_and_host() -> None:
    name = default_hostname()
    assert name == f"farm-{os.getpid()}@{socket.gethostname()}"
    assert re.fullmatch(r"farm-\d+@.+", name)


def test_a_running_worker_advertises_its_capabilities_and_consumes_its_queues(redis_server: RedisServer,
                                                                             tmp_path: Path,
                                                                             capabilities: dict) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    worker = FarmWorker(redis_server.url, "caps@test", tmp_path).start()
    try:
        advertised = json.loads(client.hget(WORKERS_KEY, "caps@test"))
        assert advertised["cpu"] == capabilities["cpu"] and advertised["opencl"] == capabilities["opencl"]
        assert advertised["pid"] != os.getpid() and advertised["host"] == socket.gethostname()

        queues = make_app(redis_server.url).control.inspect(timeout=5, destination=["caps@test"]).active_queues()
        assert queues, f"the worker didn't answer inspect:\n{worker.log_tail()}"
        assert sorted(queue["name"] for queue in queues["caps@test"]) == sorted(queues_for(capabilities))
    finally:
        worker.stop()
    assert not client.hexists(WORKERS_KEY, "caps@test"), "a stopped worker still advertises itself"
