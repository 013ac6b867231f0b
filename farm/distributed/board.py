"""The job board: one Redis hash per farm job, and the counters its tasks share.

Kept apart from the orchestration (farm/distributed/steps.py) so that clients, which only read and cancel jobs,
import nothing heavier than redis. Records are typed (farm.distributed.protocol.JobRecord) and encoded by the
protocol. Every state change goes through one Lua script that only moves live jobs, so a cancel wins over any later
step; progress is a Redis set per phase, so a redelivered task counts once. Both are published on the job's events
channel (protocol.job_events_channel), which waiting clients block on instead of polling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from farm import defaults
from farm.distributed import protocol
from farm.distributed.protocol import JobRecord, JobState
from farm.errors import (
    CredentialsRefusedError,
    ExitStatus,
    TlsRefusedError,
    UnreachableError,
    redact_url,
    tls_verification_failure,
)

_ENDED = " or ".join(f"state == '{state.value}'" for state in sorted(protocol.TERMINAL))
_SET_IF_LIVE = f"""
local state = redis.call('HGET', KEYS[1], 'state')
if not state or {_ENDED} then return 0 end
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

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one Redis call; refused credentials become CredentialsRefusedError, a server certificate that fails
        verification TlsRefusedError and a lost connection UnreachableError (all exit status 4)."""
        try:
            return fn(*args, **kwargs)
        except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError):
            raise CredentialsRefusedError(self.url) from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as error:
            failure = tls_verification_failure(error)
            if failure:
                raise TlsRefusedError(self.url, failure) from None
            raise UnreachableError(f"farm unreachable at {redact_url(self.url)}: {error}") from None

    def create(self, job_id: str, record: JobRecord) -> None:
        """Record a new job (its state, times and fields as given)."""
        key = protocol.job_key(job_id)
        self.call(self.redis.hset, key, mapping=protocol.encode_record(record))
        self.call(self.redis.expire, key, defaults.JOB_TTL_SECONDS)

    def get(self, job_id: str) -> JobRecord | None:
        """The job's record; None when there is none (never submitted, or expired)."""
        fields = self.call(self.redis.hgetall, protocol.job_key(job_id))
        return JobRecord.decode(fields) if fields else None

    def update(self, job_id: str, **fields: Any) -> None:
        self.call(self.redis.hset, protocol.job_key(job_id),
                  mapping=protocol.encode_fields(**fields, updated=time.time()))

    def advance(self, job_id: str, state: JobState, **fields: Any) -> bool:
        """Move a live job to `state`; False when it had already ended (a cancel wins over any later step)."""
        encoded = protocol.encode_fields(**fields, state=state, updated=time.time())
        args = [item for pair in encoded.items() for item in pair]
        moved = bool(self.call(self._set_if_live, [protocol.job_key(job_id)], args))
        if moved:
            self.call(self.redis.publish, protocol.job_events_channel(job_id), state.value)
        return moved

    def fail(self, job_id: str, error: str, status: ExitStatus = ExitStatus.BUILD_FAILED, unit: str = "") -> bool:
        return self.advance(job_id, JobState.FAILED, error=error, exit_status=int(status), failed_unit=unit)

    def is_over(self, job_id: str) -> bool:
        record = self.get(job_id)
        return record is None or record.is_over

    def complete(self, job_id: str, phase: str, name: str) -> int:
        """Record `name` finished in `phase`; returns how many distinct units of the phase are finished now."""
        key = protocol.phase_key(job_id, phase)
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(key, name)
        pipe.scard(key)
        pipe.expire(key, defaults.JOB_TTL_SECONDS)
        pipe.publish(protocol.job_events_channel(job_id), phase)
        added, count, _, _ = self.call(pipe.execute)
        return count if added else -1

    def finished(self, job_id: str, phase: str) -> int:
        """How many distinct units of `phase` are finished."""
        return int(self.call(self.redis.scard, protocol.phase_key(job_id, phase)))

    def is_complete(self, job_id: str, phase: str, name: str) -> bool:
        """Whether `name` already finished in `phase` (a duplicate delivery must not run or count again)."""
        return bool(self.call(self.redis.sismember, protocol.phase_key(job_id, phase), name))

    def count_delivery(self, job_id: str, name: str) -> int:
        """How many times this unit's task has started (its first run included)."""
        key = protocol.deliveries_key(job_id, name)
        count = self.call(self.redis.incr, key)
        self.call(self.redis.expire, key, defaults.JOB_TTL_SECONDS)
        return int(count)
