"""`farm worker`: a Celery worker that consumes the queues this host can serve and advertises its capabilities;
its main process also keeps its lease (farm.distributed.leases) and takes in submitted jobs
(farm.distributed.intake).

Every worker takes `llvm` (CPU kernels and weight blobs: LLVM cross-compiles, so any host can), `control`
(orchestration) and `tune.<cpu id>` (timing kernel variants, which needs this very CPU class); a worker with OpenCL
devices also takes `opencl.<fingerprint>` for each of them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
from typing import Any

from farm import defaults
from farm.backends.llvm.blobs import sweep_stale_scratch
from farm.backends.llvm.toolchain import toolchain
from farm.backends.registry import BACKENDS
from farm.distributed.board import JobBoard
from farm.distributed.intake import Intake
from farm.distributed.leases import INCARNATION_VARIABLE, LeaseKeeper, Leases, new_incarnation
from farm.distributed.redis_keys import RUNNING_KEY, WORKERS_KEY, encode_capabilities
from farm.distributed.task_messages import worker_queues
from farm.errors import CredentialsRefusedError, TlsRefusedError, UnreachableError
from farm.store.base import REDIS_SCHEMES

logger = logging.getLogger(__name__)


def detect_capabilities() -> dict[str, Any]:
    """This host's CPU (triple, cpu name, features), OpenCL devices (listed by a child process: the pool forks) and
    toolchain (its keys show which workers share compile caches)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **{kind: backend.host_capabilities() for kind, backend in BACKENDS.items()},
        "toolchain": toolchain().to_json(),
    }


def default_hostname() -> str:
    return f"farm-{os.getpid()}@{socket.gethostname()}"


def preload() -> None:
    """Import the compiler and the ONNX parser and initialise LLVM before the pool forks, so no task pays for it,
    then prepare the process for building (the pool inherits it: farm.build.executor.prepare_building_process)."""
    import farm.distributed.steps  # noqa: F401
    import farm.frontend.onnx_import  # noqa: F401  (plan_job parses models: onnx once, before the pool forks)
    from farm.backends.llvm.target import init_llvm
    from farm.build.executor import prepare_building_process

    init_llvm()
    prepare_building_process()


def _lease_keeper(broker: str, name: str) -> LeaseKeeper:
    """This worker's lease, taken now (before any task can start) and kept by a thread from worker_ready on; the
    incarnation goes to the pool's processes through the environment."""
    from farm.distributed.tasks import dispatch

    incarnation = new_incarnation()
    os.environ[INCARNATION_VARIABLE] = incarnation
    board = JobBoard(broker)
    keeper = LeaseKeeper(Leases(board.redis, board.call), name, incarnation, dispatch, board.lost_worker)
    with contextlib.suppress(UnreachableError):  # a Redis that is down is waited for by Celery; the keeper renews
        keeper.leases.renew(name, incarnation, keeper.seconds)
    return keeper


def limit_step_memory(limit: int) -> None:
    """In a pool process: let it write at most `limit` bytes (defaults.step_memory_bytes; 0: no limit) as its
    RLIMIT_DATA, soft and hard alike, so that nothing it runs can lift it. An allocation past it fails (a MemoryError,
    which fails the job naming the limit: farm.distributed.steps.Farm.run) instead of the host running out."""
    if not limit:
        return
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    capped = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (capped, capped))


def recycle_argv(step_memory: int) -> list[str]:
    """Celery's replacement of a pool process whose resident memory passed half the step memory limit after a task:
    freed heap stays in a process (glibc keeps it: 1.9 GB after building light VGG-19), and what one job's step
    left must not count against the next step's limit."""
    return ["--max-memory-per-child", str(step_memory // 2 // 1024)] if step_memory else []


def check_credentials(url: str) -> None:
    """PING the Redis at `url` once, before Celery starts, and read a key only workers may read: credentials it
    refuses, or a user that isn't a worker's (a submitter's URL, farm.distributed.acl), raise
    CredentialsRefusedError at once (exit status 4), since no wait fixes a password and Celery would retry it a
    hundred times. A server that doesn't answer is left to Celery, which waits for it as it always has."""
    board = JobBoard(url, retries=0)
    try:
        board.call(board.redis.ping)
        board.call(board.redis.exists, RUNNING_KEY)
    except (CredentialsRefusedError, TlsRefusedError):
        raise
    except UnreachableError:
        return
    finally:
        board.redis.close()


def run_worker(broker: str, concurrency: int | None, hostname: str | None, loglevel: str = "INFO") -> None:
    """Start the worker in this process (blocks until it stops). A broker that isn't a Redis URL (exit status 2)
    or whose Redis refuses its credentials (4) stops it before Celery starts."""
    defaults.redis_url(broker)
    for url in dict.fromkeys([broker, defaults.store_url(broker)]):
        if url.startswith(REDIS_SCHEMES):
            check_credentials(url)
    os.environ["FARM_BROKER_URL"] = broker
    from celery import signals

    from farm.distributed.tasks import app, farm_context

    capabilities = detect_capabilities()
    name = hostname or default_hostname()
    registry = JobBoard(broker)
    store_max_bytes = defaults.store_max_bytes()  # a bad FARM_STORE_MAX_BYTES stops the worker before it starts
    step_memory = defaults.step_memory_bytes(concurrency or os.cpu_count() or 1)  # Celery's pool: every core
    defaults.max_folded_bytes()  # a bad FARM_STEP_MEMORY_BYTES or FARM_MAX_FOLDED_BYTES stops it too
    defaults.blob_store_url()  # so does a bad FARM_BLOB_STORE
    blob_store_client_url = defaults.blob_store_client_url()
    sweep_stale_scratch()  # what older versions' crashed packers left in /dev/shm
    preload()
    keeper = _lease_keeper(broker, name)
    intake = Intake(
        JobBoard(broker),
        lambda job_id: farm_context().accept(job_id),
        lambda: farm_context().housekeep(),
        lambda token, key: farm_context().admit(token, key),
        lambda key: farm_context().repair(key),
    )

    @signals.worker_ready.connect(weak=False)
    def advertise(sender: Any = None, **_: Any) -> None:
        advertised = {**capabilities, "queues": worker_queues(capabilities)}
        farm_context().store.set_max_bytes(store_max_bytes)
        # Published before the advertisement: a client that sees a live worker stages where the workers admit.
        farm_context().store.publish_blob_store(blob_store_client_url)
        registry.call(registry.redis.hset, WORKERS_KEY, name, encode_capabilities(advertised))
        keeper.start()
        intake.start()
        logger.info(
            "%s: each pool process may write %s (FARM_STEP_MEMORY_BYTES)",
            name,
            f"{step_memory} bytes" if step_memory else "without limit",
        )

    @signals.worker_process_init.connect(weak=False)
    def leave_the_process_group(**_: Any) -> None:
        """In each pool process: a SIGTERM sent to the worker's whole process group (`kill -TERM -PGID`, a shell's
        job control, tests/farm_services.py) then reaches only the main process, whose warm shutdown lets the task
        in hand finish, instead of killing the task mid-way (a WorkerLostError traceback and a redelivery). Celery
        has already set the pool process to die with the main one (PR_SET_PDEATHSIG), so a SIGKILL to the group,
        or a host's death, still takes the pool with it."""
        os.setpgid(0, 0)

    @signals.worker_process_init.connect(weak=False)
    def limit_memory(**_: Any) -> None:
        limit_step_memory(step_memory)

    @signals.worker_shutdown.connect(weak=False)
    def withdraw(sender: Any = None, **_: Any) -> None:
        """Remove the advertisement; a Redis that is gone by then costs one log line, not the shutdown (`farm
        workers` lists only workers that answer a ping, so a stale entry shows nowhere)."""
        keeper.stop()
        intake.stop()
        try:
            registry.call(registry.redis.hdel, WORKERS_KEY, name)
        except UnreachableError as error:
            logger.warning("%s: could not withdraw its advertisement: %s", name, error)

    argv = [
        "worker",
        "--queues",
        ",".join(worker_queues(capabilities)),
        "--hostname",
        name,
        "--loglevel",
        loglevel,
        "--task-events",
        "--without-mingle",
        "--without-gossip",
        *recycle_argv(step_memory),
    ]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    app.worker_main(argv)
