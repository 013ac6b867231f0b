"""`farm worker`: a Celery worker that consumes the queues this host can serve and advertises its capabilities.

Every worker takes `llvm` (CPU kernels and weight blobs: LLVM cross-compiles, so any host can), `control`
(orchestration) and `tune.<cpu id>` (timing kernel variants, which needs this very CPU class); a worker with OpenCL
devices also takes `opencl.<fingerprint>` for each of them.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from farm.backends.llvm.target import CpuTarget, host_target
from farm.backends.opencl.devices import opencl_devices_of_a_fresh_process
from farm.distributed.board import JobBoard
from farm.distributed.leases import INCARNATION_VARIABLE, LeaseKeeper, Leases, new_incarnation
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


def _lease_keeper(broker: str, name: str) -> LeaseKeeper:
    """This worker's lease, taken now (before any task can start) and kept by a thread from worker_ready on; the
    incarnation goes to the pool's processes through the environment."""
    from farm.distributed.tasks import dispatch

    incarnation = new_incarnation()
    os.environ[INCARNATION_VARIABLE] = incarnation
    board = JobBoard(broker)
    keeper = LeaseKeeper(Leases(board.redis, board.call), name, incarnation, dispatch)
    keeper.leases.renew(name, incarnation, keeper.seconds)
    return keeper


def run_worker(broker: str, concurrency: int | None, hostname: str | None, loglevel: str = "INFO") -> None:
    """Start the worker in this process (blocks until it stops)."""
    os.environ["FARM_BROKER_URL"] = broker
    from celery import signals

    from farm.distributed.tasks import app

    capabilities = detect_capabilities()
    name = hostname or default_hostname()
    preload()
    keeper = _lease_keeper(broker, name)

    @signals.worker_ready.connect(weak=False)
    def advertise(sender: Any = None, **_: Any) -> None:
        from farm.distributed.tasks import farm_context

        farm_context().board.redis.hset(WORKERS_KEY, name, encode_capabilities(capabilities))
        keeper.start()

    @signals.worker_shutdown.connect(weak=False)
    def withdraw(sender: Any = None, **_: Any) -> None:
        from farm.distributed.tasks import farm_context

        keeper.stop()
        farm_context().board.redis.hdel(WORKERS_KEY, name)

    argv = ["worker", "--queues", ",".join(queues_for(capabilities)), "--hostname", name, "--loglevel", loglevel,
            "--task-events", "--without-mingle"]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    app.worker_main(argv)
