"""`farm worker`: a Celery worker that consumes the queues this host can serve and advertises its capabilities.

Every worker takes `llvm` (CPU kernels and weight blobs: LLVM cross-compiles, so any host can), `control`
(orchestration) and `tune.<cpu id>` (timing kernel variants, which needs this very CPU class); a worker with OpenCL
devices also takes `opencl.<fingerprint>` for each of them.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from farm import defaults
from farm.backends.llvm.target import CpuTarget, host_target
from farm.backends.opencl.devices import opencl_devices_of_a_fresh_process
from farm.distributed.protocol import WORKERS_KEY, encode_capabilities, worker_queues


def detect_capabilities() -> dict[str, Any]:
    """This host's CPU (triple, cpu name, features) and OpenCL devices (listed by a child process: the pool forks)."""
    cpu = host_target()
    return {"host": socket.gethostname(), "pid": os.getpid(), "cpu": {"id": cpu.id, "triple": cpu.triple,
            "cpu": cpu.cpu, "features": cpu.features, "simd_floats": cpu.simd_floats},
            "opencl": opencl_devices_of_a_fresh_process()}


def queues_for(capabilities: dict[str, Any]) -> list[str]:
    """control and llvm (any host), tune.<cpu id> (this CPU class), opencl.<fingerprint> for each device."""
    cpu = capabilities["cpu"]
    return worker_queues(CpuTarget(cpu["triple"], cpu["cpu"], cpu["features"]).id,
                         [device["fingerprint"] for device in capabilities["opencl"]])


def default_hostname() -> str:
    return f"farm-{os.getpid()}@{socket.gethostname()}"


def preload() -> None:
    """Import the compiler and initialise LLVM before the pool forks, so no task pays for it."""
    import farm.distributed.steps  # noqa: F401
    from farm.backends.llvm.target import init_llvm

    init_llvm()


def run_worker(broker: str, concurrency: int | None, hostname: str | None, loglevel: str = "INFO") -> None:
    """Start the worker in this process (blocks until it stops)."""
    os.environ["FARM_BROKER_URL"] = broker
    from celery import signals

    from farm.distributed.tasks import app

    capabilities = detect_capabilities()
    name = hostname or default_hostname()
    store_max_bytes = defaults.store_max_bytes()  # a bad FARM_STORE_MAX_BYTES stops the worker before it starts
    preload()

    @signals.worker_ready.connect(weak=False)
    def advertise(sender: Any = None, **_: Any) -> None:
        from farm.distributed.tasks import farm_context

        farm_context().board.redis.hset(WORKERS_KEY, name, encode_capabilities(capabilities))
        farm_context().store.set_max_bytes(store_max_bytes)

    @signals.worker_shutdown.connect(weak=False)
    def withdraw(sender: Any = None, **_: Any) -> None:
        from farm.distributed.tasks import farm_context

        farm_context().board.redis.hdel(WORKERS_KEY, name)

    argv = ["worker", "--queues", ",".join(queues_for(capabilities)), "--hostname", name, "--loglevel", loglevel,
            "--task-events", "--without-mingle"]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    app.worker_main(argv)
