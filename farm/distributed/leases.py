"""Worker liveness by leases, as build farms that people trust do it (Buildbarn, BuildBuddy): a lost host costs
seconds, not a visibility timeout.

Every worker holds a lease (redis_keys.lease_key: its incarnation, expiring after FARM_WORKER_LEASE_SECONDS) that a
thread of its main process renews. Every task registers itself as running (redis_keys.RUNNING_KEY) while its step
runs, naming its holder. The same thread on every live worker reaps: a running task whose holder's lease is gone
(the host died, or the worker was restarted under the same name) is claimed by exactly one peer (HDEL) and
dispatched again. Steps are idempotent and content-addressed, so the late original (Redis redelivers it after the
visibility timeout) finds its unit finished and returns at once; each start counts as a delivery, so a unit that
kills every worker it lands on still fails its job after FARM_MAX_DELIVERIES. Each job whose tasks were dispatched
again is told which worker it lost and how many of its tasks (JobBoard.lost_worker), so that its waiting clients
say so instead of showing a count that stalls.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from farm import defaults
from farm.distributed import redis_keys
from farm.distributed.task_messages import Message, RunningTask
from farm.errors import BadInputError, UnreachableError

log = logging.getLogger(__name__)

INCARNATION_VARIABLE = "FARM_WORKER_INCARNATION"
"""Set by the worker's main process before its pool forks, so that every task process knows its holder."""


def new_incarnation() -> str:
    return uuid.uuid4().hex


def holder_of(worker: str, incarnation: str) -> str:
    return f"{worker}#{incarnation}"


class Leases:
    """The leases and running tasks of one farm's Redis (a redis.Redis with decoded responses)."""

    def __init__(self, redis: Any, call: Callable[..., Any]) -> None:
        """`call(fn, *args)` runs one Redis command, turning a lost connection into UnreachableError."""
        self.redis, self.call = redis, call

    def renew(self, worker: str, incarnation: str, seconds: float) -> None:
        self.call(self.redis.set, redis_keys.lease_key(worker), incarnation, px=max(1, int(seconds * 1000)))

    def release(self, worker: str, incarnation: str) -> None:
        """Drop the lease if it is still this incarnation's (a restarted worker's new lease stays)."""
        key = redis_keys.lease_key(worker)
        if self.call(self.redis.get, key) == incarnation:
            self.call(self.redis.delete, key)

    def alive(self, holder: RunningTask) -> bool:
        return self.call(self.redis.get, redis_keys.lease_key(holder.worker)) == holder.incarnation

    @contextlib.contextmanager
    def running(self, task_id: str, holder: str, message: Message) -> Iterator[None]:
        """Register a task as running for the time of the block."""
        self.call(self.redis.hset, redis_keys.RUNNING_KEY, task_id, RunningTask(holder, message).encode())
        try:
            yield
        finally:
            with contextlib.suppress(UnreachableError):
                self.call(self.redis.hdel, redis_keys.RUNNING_KEY, task_id)

    def reap(self, dispatch: Callable[[Message], None]) -> list[RunningTask]:
        """Dispatch again every running task whose holder's lease is gone; each is claimed by one reaper only.
        Malformed entries are dropped. Returns the tasks dispatched again."""
        sent = []
        for task_id, text in self.call(self.redis.hgetall, redis_keys.RUNNING_KEY).items():
            try:
                task = RunningTask.decode(text)
            except BadInputError:
                self.call(self.redis.hdel, redis_keys.RUNNING_KEY, task_id)
                continue
            if not self.alive(task) and self.call(self.redis.hdel, redis_keys.RUNNING_KEY, task_id) == 1:
                dispatch(task.message)
                sent.append(task)
        return sent


class LeaseKeeper(threading.Thread):
    """The worker main process's thread: renew this worker's lease, and reap the tasks of dead peers."""

    def __init__(
        self,
        leases: Leases,
        worker: str,
        incarnation: str,
        dispatch: Callable[[Message], None],
        lost: Callable[[str, str, int], object],
        seconds: float | None = None,
    ) -> None:
        """`lost(job id, holder, tasks)` tells a job that it lost the worker `holder` with that many of its tasks,
        dispatched again (JobBoard.lost_worker)."""
        super().__init__(name="farm-lease", daemon=True)
        self.leases, self.worker, self.incarnation, self.dispatch = leases, worker, incarnation, dispatch
        self.lost = lost
        self.seconds = defaults.worker_lease_seconds() if seconds is None else seconds
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.beat()
            self.stopped.wait(self.seconds / 4)

    def beat(self) -> None:
        """One renewal and one reaping round; Redis being away, or any error, only skips the round (a keeper
        that ended would let this worker's lease lapse while it works, and its tasks be run twice)."""
        try:
            self.leases.renew(self.worker, self.incarnation, self.seconds)
            reaped = self.leases.reap(self.dispatch)
            for task in reaped:
                log.warning(
                    "farm: dispatched %s %s again: its worker's lease lapsed", task.message.task, task.message.args[:2]
                )
            for (job_id, holder), tasks in Counter((task.job_id, task.holder) for task in reaped).items():
                self.lost(job_id, holder, tasks)
        except UnreachableError as error:
            log.warning("farm: lease round skipped: %s", error)
        except Exception:  # noqa: BLE001 - logged; e.g. a running-tasks key of the wrong type (FarmStateError)
            log.warning("farm: lease round failed", exc_info=True)

    def stop(self) -> None:
        self.stopped.set()
        with contextlib.suppress(UnreachableError):
            self.leases.release(self.worker, self.incarnation)
