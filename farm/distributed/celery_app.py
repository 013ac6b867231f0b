"""The Celery app of the farm, configured in one place, and its thin tasks over farm.distributed.steps.

Each task only unpacks its JSON arguments and calls one step of farm.distributed.steps.Farm; the steps call the same pure compile
functions as the local executor. Arguments name the job, the unit (target id / symbol), the op and the target, so
Flower shows what every task serves.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

from celery import Celery, Task
from kombu.exceptions import OperationalError

from farm import defaults
from farm.store import StoreUnreachableError

QUEUES = {"farm.plan_job": "control", "farm.finish": "control", "farm.compile_cpu_kernel": "llvm",
          "farm.pack_blob": "llvm", "farm.link": "llvm"}
"""Fixed routes; farm.compile_cl_kernel goes to the queue of its device, opencl.<fingerprint>, and farm.tune_kernel
to the queue of its CPU class, tune.<cpu id>."""


def make_app(broker: str | None = None) -> Celery:
    """A Celery app for the broker (default: FARM_BROKER_URL) with the settings production needs."""
    url = broker or defaults.broker_url() or "redis://127.0.0.1:6379/0"
    app = Celery("farm", broker=url, backend=url)
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"], result_accept_content=["json"],
        task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
        task_soft_time_limit=defaults.task_soft_time_limit(), task_time_limit=defaults.task_time_limit(),
        broker_transport_options={"visibility_timeout": defaults.visibility_timeout(), "socket_connect_timeout": 3,
                                  "unacked_restore_throttle": 1},
        result_backend_transport_options={"visibility_timeout": defaults.visibility_timeout()},
        broker_connection_retry_on_startup=True, broker_connection_timeout=3,
        worker_send_task_events=True, task_send_sent_event=True, task_track_started=True,
        task_routes={name: {"queue": queue} for name, queue in QUEUES.items()}, task_default_queue="control",
        task_ignore_result=True,
        worker_hijack_root_logger=False, worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


app = make_app()


@functools.cache
def farm_context():
    """The job board, store and dispatcher of this worker process (made once, on first use)."""
    from farm.distributed.steps import Farm, JobBoard
    from farm.store import open_store

    url = app.conf.broker_url
    retries = defaults.worker_redis_retries()
    return Farm(JobBoard(url, retries), open_store(defaults.store_url(url), retries), dispatch,
                before_build=die_if_told, live_queues=live_queues)


def live_queues() -> set[str]:
    """The queues that live workers (those answering a ping) consume now."""
    from farm.distributed.client import list_workers

    return {queue for worker in list_workers(app.conf.broker_url) for queue in worker["queues"]}


def dispatch(task_name: str, args: list[Any], queue: str | None = None) -> None:
    """Enqueue a task on a fresh broker connection, retrying through a Redis restart: kombu's own publish retry can
    fail on a channel the outage broke (AttributeError inside kombu), so each attempt starts from scratch."""
    attempts = defaults.worker_redis_retries()
    for attempt in range(attempts + 1):
        try:
            with app.connection_for_write() as connection:
                app.send_task(task_name, args=args, queue=queue or QUEUES[task_name], connection=connection,
                              retry=False)
            return
        except (OperationalError, ConnectionError, AttributeError):
            if attempt == attempts:
                raise
            time.sleep(0.5)


class FarmTask(Task):
    """A farm task: retried while Redis is away; when it finally fails, its job fails with the error named."""

    autoretry_for = (StoreUnreachableError, ConnectionError)
    retry_backoff = True
    retry_backoff_max = 10
    max_retries = 8

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if args:
            farm_context().board.fail(args[0], f"{self.name} failed: {type(exc).__name__}: {exc}")


class TuneTask(FarmTask):
    """A tuning task: when it finally fails, its kernel keeps the default variant and the job goes on (tuning
    never fails a build)."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if args:
            farm_context().tune_done(args[0], args[1], f"{self.name} failed: {type(exc).__name__}: {exc}")


@app.task(name="farm.plan_job", base=FarmTask)
def plan_job(job_id: str) -> None:
    farm_context().plan_job(job_id)


def die_if_told(unit: str) -> None:
    """Fault injection for failover drills: FARM_FAULT_KILL_UNIT=<text> SIGKILLs the process running any unit
    whose name contains <text>, as a crashing compiler would. Unset (the default), it does nothing."""
    marker = os.environ.get("FARM_FAULT_KILL_UNIT")
    if marker and marker in unit:
        os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="farm.compile_cpu_kernel", base=FarmTask)
def compile_cpu_kernel(job_id: str, unit: str, op: str, target: str, unit_json: dict[str, Any]) -> None:
    farm_context().compile(job_id, unit_json, None)


@app.task(name="farm.pack_blob", base=FarmTask)
def pack_blob(job_id: str, unit: str, target: str, unit_json: dict[str, Any], data_key: str) -> None:
    farm_context().compile(job_id, unit_json, data_key)


@app.task(name="farm.compile_cl_kernel", base=FarmTask)
def compile_cl_kernel(job_id: str, unit: str, op: str, device: str, spec_json: dict[str, Any]) -> None:
    farm_context().compile_cl(job_id, unit, spec_json, device)


@app.task(name="farm.link", base=FarmTask)
def link(job_id: str, target: str) -> None:
    farm_context().link(job_id, target)


@app.task(name="farm.finish", base=FarmTask)
def finish(job_id: str) -> None:
    farm_context().finish(job_id)


@app.task(name="farm.tune_kernel", base=TuneTask)
def tune_kernel(job_id: str, unit: str, op: str, target: str, spec_json: dict[str, Any],
                target_json: dict[str, Any]) -> None:
    farm_context().tune(job_id, unit, spec_json, target_json)
