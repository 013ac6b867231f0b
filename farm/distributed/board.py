"""The job board: one Redis hash per farm job, and the counters its tasks share.

Kept apart from the orchestration (farm/distributed/steps.py) so that clients, which only read and cancel jobs, import nothing
heavier than redis. Every state change goes through one Lua script that only moves live jobs, so a cancel wins
over any later step; progress is a Redis set per phase, so a redelivered task counts once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import redis

from farm import defaults
from farm.errors import ExitStatus
from farm.store import StoreUnreachableError, redact_url


class JobState(str, Enum):
    QUEUED = "queued"
    PLANNING = "planning"
    TUNING = "tuning"
    COMPILING = "compiling"
    LINKING = "linking"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.DONE.value, JobState.FAILED.value, JobState.CANCELLED.value})

_SET_IF_LIVE = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'done' or state == 'failed' or state == 'cancelled' then return 0 end
for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""


class JobBoard:
    """Job records: a Redis hash per job (farm:job:<id>) plus sets counting finished units per phase."""

    def __init__(self, url: str, retries: int = 1) -> None:
        """`retries`: reconnections before a call fails (a client fails fast, a worker waits out a restart)."""
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        self.url = url
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.1), retries,
                      supported_errors=(redis.exceptions.ConnectionError,))
        self.redis = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10, decode_responses=True,
                                          retry=retry)
        self._set_if_live = self.redis.register_script(_SET_IF_LIVE)

    @staticmethod
    def key(job_id: str, suffix: str = "") -> str:
        return f"farm:job:{job_id}{suffix}"

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one Redis call; a lost connection becomes StoreUnreachableError (exit status 4)."""
        try:
            return fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as error:
            raise StoreUnreachableError(f"farm unreachable at {redact_url(self.url)}: {error}") from None

    def create(self, job_id: str, fields: dict[str, Any]) -> None:
        record = {**fields, "state": JobState.QUEUED.value, "created": time.time(), "updated": time.time()}
        self.call(self.redis.hset, self.key(job_id), mapping=_flat(record))
        self.call(self.redis.expire, self.key(job_id), defaults.JOB_TTL_SECONDS)

    def get(self, job_id: str) -> dict[str, str] | None:
        record = self.call(self.redis.hgetall, self.key(job_id))
        return record or None

    def update(self, job_id: str, **fields: Any) -> None:
        self.call(self.redis.hset, self.key(job_id), mapping=_flat({**fields, "updated": time.time()}))

    def advance(self, job_id: str, state: JobState, **fields: Any) -> bool:
        """Move a live job to `state`; False when it had already ended (a cancel wins over any later step)."""
        args = [item for pair in _flat({**fields, "state": state.value, "updated": time.time()}).items() for item in pair]
        return bool(self.call(self._set_if_live, [self.key(job_id)], args))

    def fail(self, job_id: str, error: str, status: ExitStatus = ExitStatus.BUILD_FAILED, unit: str = "") -> bool:
        return self.advance(job_id, JobState.FAILED, error=error, exit_status=int(status), failed_unit=unit)

    def is_over(self, job_id: str) -> bool:
        record = self.get(job_id)
        return record is None or record.get("state") in TERMINAL

    def complete(self, job_id: str, phase: str, name: str) -> int:
        """Record `name` finished in `phase`; returns how many distinct units of the phase are finished now."""
        key = self.key(job_id, f":{phase}")
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(key, name)
        pipe.scard(key)
        pipe.expire(key, defaults.JOB_TTL_SECONDS)
        added, count, _ = self.call(pipe.execute)
        return count if added else -1

    def is_complete(self, job_id: str, phase: str, name: str) -> bool:
        """Whether `name` already finished in `phase` (a duplicate delivery must not run or count again)."""
        return bool(self.call(self.redis.sismember, self.key(job_id, f":{phase}"), name))

    def count_delivery(self, job_id: str, name: str) -> int:
        """How many times this unit's task has started (its first run included)."""
        key = self.key(job_id, f":deliveries:{name}")
        count = self.call(self.redis.incr, key)
        self.call(self.redis.expire, key, defaults.JOB_TTL_SECONDS)
        return int(count)


def _flat(record: dict[str, Any]) -> dict[str, str]:
    """Hash fields as strings: lists and dicts as JSON."""
    return {name: json.dumps(value) if isinstance(value, (list, dict)) else str(value) for name, value in record.items()}
