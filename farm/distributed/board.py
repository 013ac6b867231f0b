"""The job board: one Redis hash per farm job, and the counters its tasks share.

Kept apart from the orchestration (farm/distributed/steps.py) so that clients, which only read and cancel jobs,
import nothing heavier than redis. Records are typed (farm.distributed.job_record.JobRecord) and encoded by
farm.distributed.job_record. Every state change goes through one Lua script that only moves live jobs, so a cancel
wins over any later step; progress is a Redis set per phase, so a redelivered task counts once. Both are published
on the job's events channel (redis_keys.job_events_channel), which waiting clients block on instead of polling.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import redis

from farm import defaults
from farm.distributed import job_record, redis_keys
from farm.distributed.job_record import JobRecord, JobState
from farm.errors import (
    CredentialsRefusedError,
    ExitStatus,
    FarmStateError,
    NotPermittedError,
    TlsRefusedError,
    UnreachableError,
    redact_url,
    tls_verification_failure,
)
from farm.store.expiry import expire_untimed
from farm.store.lua import LuaScript

CANCELLED_BY_USER = "cancelled by user"

_ENDED = " or ".join(f"state == '{state.value}'" for state in sorted(job_record.TERMINAL))
_SET_IF_LIVE = f"""
local state = redis.call('HGET', KEYS[1], 'state')
if not state or {_ENDED} then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[1], 'state', '{JobState.CANCELLED.value}', 'error', '{CANCELLED_BY_USER}')
  return 0
end
for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""
"""Move a live job (KEYS[1]) by setting the fields in ARGV; a job whose cancel flag (KEYS[2]) is raised is moved
to cancelled instead, so the record catches up with the flag at the first step that tries to move it."""
_ADD_IF_LIVE = f"""
local state = redis.call('HGET', KEYS[1], 'state')
if not state or {_ENDED} then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
"""Add ARGV[2] to the number in field ARGV[1] of a live job's record (KEYS[1]); an ended or expired job is left
alone (no record is made for one that expired)."""
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""
"""Create a record (KEYS[1], fields in ARGV[2:], time to live ARGV[1]) unless it exists."""


class JobBoard:
    """Job records: a Redis hash per job (farm:job:<id>) plus sets counting finished units per phase."""

    def __init__(self, url: str, retries: int = 1) -> None:
        """`retries`: reconnections before a call fails (a client fails fast, a worker waits out a restart)."""
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        self.url = url
        retry = Retry(
            ExponentialBackoff(cap=0.5, base=0.1), retries, supported_errors=(redis.exceptions.ConnectionError,)
        )
        self.redis = redis.Redis.from_url(
            url, socket_connect_timeout=3, socket_timeout=10, decode_responses=True, retry=retry
        )
        self._set_if_live = LuaScript(self.redis, _SET_IF_LIVE)
        self._create = LuaScript(self.redis, _CREATE)
        self._add_if_live = LuaScript(self.redis, _ADD_IF_LIVE)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one Redis call; refused credentials become CredentialsRefusedError, a server certificate that fails
        verification TlsRefusedError, a lost connection UnreachableError and any other error Redis answers (a key of
        another type, a full server) FarmStateError (all exit status 4): one line, never a traceback."""
        try:
            return fn(*args, **kwargs)
        except redis.exceptions.NoPermissionError as error:
            raise NotPermittedError(self.url, str(error)) from None
        except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError):
            raise CredentialsRefusedError(self.url) from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as error:
            failure = tls_verification_failure(error)
            if failure:
                raise TlsRefusedError(self.url, failure) from None
            raise UnreachableError(f"farm unreachable at {redact_url(self.url)}: {error}") from None
        except redis.exceptions.ResponseError as error:
            raise FarmStateError(self.url, str(error)) from None

    def create(self, job_id: str, record: JobRecord) -> bool:
        """Record a new job (its state, times and fields as given); False when the job already has a record (a
        record is written once, by the worker that accepts the job)."""
        fields = [item for pair in job_record.encode_record(record).items() for item in pair]
        return bool(self.call(self._create, [redis_keys.job_key(job_id)], [defaults.JOB_TTL_SECONDS, *fields]))

    def get(self, job_id: str) -> JobRecord | None:
        """The job's record, cancelled if its cancel flag is raised and it hadn't ended; None when there is none
        (never accepted, or expired)."""
        fields, cancelled = self._hash_and_cancel(redis_keys.job_key(job_id), job_id)
        return _with_cancel(JobRecord.decode(fields), cancelled) if fields else None

    def view(self, job_id: str) -> JobRecord | None:
        """The job as clients show it: its record, or until a worker accepts it, its request as a queued job;
        None when there is neither (never submitted, or expired)."""
        record = self.get(job_id)
        if record is not None:
            return record
        fields, cancelled = self._hash_and_cancel(redis_keys.request_key(job_id), job_id)
        return _with_cancel(job_record.decode_request(fields, job_id), cancelled) if fields else None

    def _hash_and_cancel(self, key: str, job_id: str) -> tuple[dict[str, str], int]:
        """The hash at `key` (a record or a request) and whether the job's cancel flag is raised, in one round
        trip."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(key)
        pipe.exists(redis_keys.cancel_key(job_id))
        fields, cancelled = self.call(pipe.execute)
        return fields, cancelled

    def request(self, job_id: str) -> JobRecord | None:
        """The queued record a submitter's request asks for (BadInputError when it is malformed); None if none."""
        fields = self.call(self.redis.hgetall, redis_keys.request_key(job_id))
        return job_record.decode_request(fields, job_id) if fields else None

    def submit(self, record: JobRecord) -> str:
        """Write a new job's request, index it for `farm jobs` and hand its id to the workers' intake
        (farm.distributed.intake): all a submitter may write, since the record is the accepting worker's. Returns
        the job id, which the request's contents determine (job_record.encode_request)."""
        job_id, request = job_record.encode_request(record)
        self.submit_request(job_id, request, record.created)
        return job_id

    def grant_retune(self, job_id: str) -> None:
        """Let the job's --retune replace tuning records (redis_keys.retune_grant_key); NotPermittedError, naming
        --retune, with a submitter's credentials."""
        try:
            self.call(self.redis.set, redis_keys.retune_grant_key(job_id), "1", ex=defaults.JOB_TTL_SECONDS)
        except NotPermittedError:
            raise NotPermittedError(
                self.url,
                "--retune times again kernels that have tuning records, which every "
                "job on the farm uses, so it is the operator's to ask for; --tune adds "
                "records for kernels that have none",
            ) from None

    def submit_request(self, job_id: str, request: dict[str, str], created: float) -> None:
        """Write an encoded request (job_record.encode_request) as `submit` does."""
        key = redis_keys.request_key(job_id)
        pipe = self.redis.pipeline(transaction=True)
        # redis-py types `mapping` as Mapping[FieldT, EncodableT], whose keys are invariant: the dict[str, str] it
        # takes doesn't match that type.
        pipe.hset(key, mapping=request)  # type: ignore[arg-type]
        pipe.expire(key, defaults.JOB_TTL_SECONDS)
        index = redis_keys.jobs_key(redis_keys.team_of(job_id))
        pipe.zadd(index, {job_id: created})
        pipe.zremrangebyscore(index, "-inf", created - defaults.JOB_TTL_SECONDS)
        pipe.expire(index, defaults.JOB_TTL_SECONDS)
        pipe.lpush(redis_keys.SUBMITTED_KEY, job_id)
        self.call(pipe.execute)

    def awaiting_acceptance(self, job_ids: list[str]) -> list[str]:
        """Those of `job_ids` that have a request and no record yet (one round trip for them all)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(redis_keys.request_key(job_id))
            pipe.exists(redis_keys.job_key(job_id))
        found = self.call(pipe.execute) if job_ids else []
        return [
            job_id
            for job_id, requested, recorded in zip(job_ids, found[::2], found[1::2])
            if requested and not recorded
        ]

    def live_jobs(self, team: str) -> int:
        """How many of the team's jobs are live (accepted, not ended, not cancelled): its live set
        (redis_keys.live_jobs_key), less the jobs that ended or expired, which leave it (one round trip for them)."""
        key = redis_keys.live_jobs_key(team)
        members = sorted(self.call(self.redis.smembers, key))
        pipe = self.redis.pipeline(transaction=False)
        for job_id in members:
            pipe.hget(redis_keys.job_key(job_id), "state")
            pipe.exists(redis_keys.cancel_key(job_id))
        found = self.call(pipe.execute) if members else []
        ended = [
            job_id
            for job_id, state, cancelled in zip(members, found[::2], found[1::2])
            if state is None or state in {s.value for s in job_record.TERMINAL} or cancelled
        ]
        if ended:
            self.call(self.redis.srem, key, *ended)
        return len(members) - len(ended)

    def count_live(self, job_id: str) -> None:
        """Add an accepted job to its team's live set (what `live_jobs` counts)."""
        key = redis_keys.live_jobs_key(redis_keys.team_of(job_id))
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(key, job_id)
        pipe.expire(key, defaults.JOB_TTL_SECONDS)
        self.call(pipe.execute)

    def drop_request(self, job_id: str) -> None:
        """Delete a request that was refused (the job becomes unknown to clients)."""
        self.call(self.redis.delete, redis_keys.request_key(job_id))

    def nudge(self, job_id: str) -> None:
        """Hand a submitted job's id to the intake again (its first pop may have died with its worker)."""
        self.call(self.redis.lpush, redis_keys.SUBMITTED_KEY, job_id)

    def claim(self, name: str, seconds: float) -> bool:
        """Whether this call is the first to claim `name` (a key of the farm's) in `seconds`."""
        return bool(self.call(self.redis.set, name, "1", nx=True, ex=max(1, int(seconds))))

    def raise_flag(self, job_id: str, flag: Callable[[str], str]) -> None:
        """Raise one of the flags a submitter may set on a job (redis_keys.cancel_key, redis_keys.downloaded_key) and
        wake the job's waiting clients."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(flag(job_id), "1", ex=defaults.JOB_TTL_SECONDS)
        pipe.publish(redis_keys.job_events_channel(job_id), "flag")
        self.call(pipe.execute)

    def flag_raised(self, job_id: str, flag: Callable[[str], str]) -> bool:
        return bool(self.call(self.redis.exists, flag(job_id)))

    def update(self, job_id: str, **fields: Any) -> None:
        self.call(
            self.redis.hset, redis_keys.job_key(job_id), mapping=job_record.encode_fields(**fields, updated=time.time())
        )

    def advance(self, job_id: str, state: JobState, **fields: Any) -> bool:
        """Move a live job to `state`; False when it had already ended (a cancel wins over any later step)."""
        encoded = job_record.encode_fields(**fields, state=state, updated=time.time())
        args = [item for pair in encoded.items() for item in pair]
        moved = bool(self.call(self._set_if_live, [redis_keys.job_key(job_id), redis_keys.cancel_key(job_id)], args))
        if moved:
            self.call(self.redis.publish, redis_keys.job_events_channel(job_id), state.value)
        return moved

    def fail(self, job_id: str, error: str, status: ExitStatus = ExitStatus.BUILD_FAILED, unit: str = "") -> bool:
        return self.advance(job_id, JobState.FAILED, error=error, exit_status=int(status), failed_unit=unit)

    def lost_worker(self, job_id: str, holder: str, tasks: int) -> bool:
        """Note on a live job that the worker `holder` (`<name>#<incarnation>`) was lost while it ran `tasks` of the
        job's tasks, which were dispatched again (farm.distributed.leases), and wake the job's waiting clients, which
        say so; reapers that share a holder's tasks add up. False when the job had ended (nothing to say), or when
        the record couldn't be read back with this entry (a worker name past job_record.MAX_HOLDER_CHARS): a note must
        never make the job unreadable."""
        try:
            job_record.MAP_ENTRIES["lost_workers"](holder, str(tasks))
        except ValueError:
            return False
        field = f"{job_record.MAP_FIELDS['lost_workers']}{holder}"
        if not self.call(self._add_if_live, [redis_keys.job_key(job_id)], [field, int(tasks)]):
            return False
        self.call(self.redis.publish, redis_keys.job_events_channel(job_id), "lost_worker")
        return True

    def is_over(self, job_id: str) -> bool:
        record = self.get(job_id)
        return record is None or record.is_over

    def complete(self, job_id: str, phase: str, name: str) -> int:
        """Record `name` finished in `phase`; returns how many distinct units of the phase are finished now."""
        key = redis_keys.phase_key(job_id, phase)
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(key, name)
        pipe.scard(key)
        pipe.expire(key, defaults.JOB_TTL_SECONDS)
        pipe.publish(redis_keys.job_events_channel(job_id), phase)
        added, count, _, _ = self.call(pipe.execute)
        return count if added else -1

    def finished(self, job_id: str, phase: str) -> int:
        """How many distinct units of `phase` are finished."""
        return int(self.call(self.redis.scard, redis_keys.phase_key(job_id, phase)))

    def is_complete(self, job_id: str, phase: str, name: str) -> bool:
        """Whether `name` already finished in `phase` (a duplicate delivery must not run or count again)."""
        return bool(self.call(self.redis.sismember, redis_keys.phase_key(job_id, phase), name))

    def expire_untimed(self) -> int:
        """Give each key a submitter wrote without a time to live (redis_keys.SUBMITTER_KEYS_TTL) JOB_TTL_SECONDS;
        returns how many got one."""
        return sum(
            self.call(expire_untimed, self.redis, pattern, defaults.JOB_TTL_SECONDS)
            for pattern in redis_keys.SUBMITTER_KEYS_TTL
        )

    def drop_mistyped(self, types: dict[str, str]) -> dict[str, str]:
        """Delete each key of `types` (key -> Redis type) that holds another type of value, in two round trips;
        returns what went: key -> the type it held."""
        pipe = self.redis.pipeline(transaction=False)
        for name in types:
            pipe.type(name)
        found = dict(zip(types, self.call(pipe.execute)))
        mistyped = [name for name, kind in found.items() if kind not in (types[name], "none")]
        if mistyped:
            self.call(self.redis.delete, *mistyped)
        return {name: found[name] for name in mistyped}

    def count_delivery(self, job_id: str, name: str) -> int:
        """How many times this unit's task has started (its first run included)."""
        key = redis_keys.deliveries_key(job_id, name)
        count = self.call(self.redis.incr, key)
        self.call(self.redis.expire, key, defaults.JOB_TTL_SECONDS)
        return int(count)


def _with_cancel(record: JobRecord, cancelled: int) -> JobRecord:
    """A record as its cancel flag makes it: a live job whose flag is raised is cancelled (an ended one stays)."""
    if not cancelled or record.is_over:
        return record
    return dataclasses.replace(record, state=JobState.CANCELLED, error=CANCELLED_BY_USER)
