"""The farm's Celery tasks: thin wrappers that decode their arguments (farm.distributed.task_messages) and run one
step of farm.distributed.steps.Farm. `celery -A tasks.app` finds `app` here through tasks/app.py.

Arguments name the job, the unit (target id / symbol), the op and the target, so Flower shows what every task
serves.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

from celery import Task
from kombu.exceptions import OperationalError

from farm import defaults
from farm.distributed import redis_keys, task_messages
from farm.distributed.celery_app import make_app
from farm.distributed.leases import INCARNATION_VARIABLE, Leases, holder_of
from farm.distributed.task_messages import Message, TaskName
from farm.errors import BadInputError, JobFailed, UnreachableError

app = make_app()


@functools.cache
def farm_context():
    """The job board, store and dispatcher of this worker process (made once, on first use)."""
    from farm.distributed.board import JobBoard
    from farm.distributed.steps import Farm
    from farm.store import open_store

    url = app.conf.broker_url
    retries = defaults.worker_redis_retries()
    return Farm(
        JobBoard(url, retries),
        open_store(defaults.store_url(url), retries),
        dispatch,
        before_build=die_if_told,
        live_queues=live_queues,
    )


@functools.cache
def farm_leases() -> Leases:
    """Leases and running tasks on this worker process's board."""
    board = farm_context().board
    return Leases(board.redis, board.call)


def live_queues() -> set[str]:
    """The queues that live workers (those answering a ping) consume now."""
    from farm.distributed.fleet import live_queues as of_broker

    return of_broker(app.conf.broker_url)


def dispatch(message: Message) -> None:
    """Enqueue a task on a fresh broker connection, retrying through a Redis restart: kombu's own publish retry can
    fail on a channel the outage broke (AttributeError inside kombu), so each attempt starts from scratch."""
    attempts = defaults.worker_redis_retries()
    for attempt in range(attempts + 1):
        try:
            with app.connection_for_write() as connection:
                app.send_task(message.task, args=message.args, queue=message.queue, connection=connection, retry=False)
            return
        except (OperationalError, ConnectionError, AttributeError):
            if attempt == attempts:
                raise
            time.sleep(0.5)


def die_if_told(unit: str) -> None:
    """Fault injection for failover drills: FARM_FAULT_KILL_UNIT=<text> SIGKILLs the process running any unit
    whose name contains <text>, as a crashing compiler would. Unset (the default), it does nothing."""
    marker = os.environ.get("FARM_FAULT_KILL_UNIT")
    if marker and marker in unit:
        os.kill(os.getpid(), signal.SIGKILL)


class FarmTask(Task):
    """A farm task: retried while Redis is away; when it finally fails, its job fails with the error named."""

    autoretry_for = (UnreachableError, ConnectionError)
    throws = (JobFailed,)
    """A step that failed its job with farm's own error (a refusal naming what is wrong) is logged in one line, not
    with a traceback: a hostile model per second made 70,000 lines of tracebacks per worker in half an hour."""
    retry_backoff = True
    retry_backoff_max = 10
    max_retries = 8

    def run_step(self, *args: Any) -> str | None:
        """Decode the arguments and run the step, registered as running under this worker's lease (so that its
        peers dispatch it again if this host dies). A step that fails its job raises JobFailed: the task ends in
        state FAILURE with the job's error, which Flower shows; a step skipped for an ended job returns a note."""
        step = task_messages.decode(self.name, list(args))
        incarnation = os.environ.get(INCARNATION_VARIABLE)
        if not incarnation:  # not started by `farm worker`: no lease, so nothing to hand over
            return farm_context().run(step)
        with farm_leases().running(self.request.id, holder_of(self.request.hostname, incarnation), step.message()):
            return farm_context().run(step)

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        job_id = _job_id(args)
        if job_id:
            farm_context().board.fail(job_id, f"{self.name} failed: {type(exc).__name__}: {exc}")


class TuneTask(FarmTask):
    """A tuning task: when it finally fails, its kernel keeps the default variant and the job goes on (tuning
    never fails a build)."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        job_id = _job_id(args)
        if job_id and len(args) > 1 and isinstance(args[1], str):
            farm_context().tune_done(job_id, args[1], f"{self.name} failed: {type(exc).__name__}: {exc}")


def _job_id(args: Any) -> str | None:
    """The job a failed task served, if its arguments name a well-formed one."""
    try:
        return redis_keys.check_job_id(args[0])
    except (IndexError, TypeError, KeyError, ValueError, BadInputError):
        return None


def _register(task: TaskName, base: type[FarmTask]) -> None:
    """One Celery task per task name (task_messages.TaskName), each running its step."""

    def step(self: FarmTask, *args: Any) -> str | None:
        return self.run_step(*args)

    step.__name__ = task.value.removeprefix("farm.")
    app.task(name=task.value, base=base, bind=True)(step)


for _task in TaskName:
    _register(_task, TuneTask if _task is TaskName.TUNE_KERNEL else FarmTask)
