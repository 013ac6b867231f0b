"""The steps a worker's intake runs (farm.distributed.intake) on what submitters push: accepting a submitted job
from its request (or refusing it, saying why), admitting a blob of a streamed upload, reading a store entry a download
found damaged, and the housekeeping between pops. Kept apart from the build's steps (farm.distributed.steps), whose
Farm inherits them: these read and check what untrusted submitters wrote, those build what was accepted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from farm import defaults
from farm.distributed import pins, redis_keys, uploads
from farm.distributed.board import JobBoard
from farm.distributed.job_record import JobRecord, JobState
from farm.distributed.task_messages import Message, PlanJob
from farm.errors import BadInputError, ExitStatus
from farm.frontend.split import stored_blobs
from farm.frontend.wire import WireError
from farm.store import CorruptEntryError, MissingEntryError, Store

log = logging.getLogger(__name__)


class IntakeSteps:
    """The intake's steps, on the job board, the store and a way to enqueue the next tasks (farm.distributed.steps.Farm
    sets them)."""

    board: JobBoard
    store: Store
    dispatch: Callable[[Message], None]

    def accept(self, job_id: str) -> str:
        """Make a new job's record from its submitter's request and dispatch its planning (what a worker's intake
        does with each submitted id). Only the fields a submitter may choose are taken, each validated
        (job_record.decode_request), and the model is admitted into the store from staging once its bytes match the
        sha256 the request names. An id with a record already, or with no request, does nothing; a malformed request
        is dropped (the job becomes unknown); a model not staged whole fails the job. Returns what it did."""
        if self.board.get(job_id) is not None:
            return f"job {job_id} was accepted already"
        try:
            request = self.board.request(job_id)
        except BadInputError as error:
            self.board.drop_request(job_id)
            return f"job {job_id} refused: {error}"
        if request is None:
            return f"job {job_id} has no request (never submitted, or expired)"
        pins.pin_for_job(self.store, job_id, [request.model_key])
        now = time.time()
        graph = self._staging(job_id).take_staged(request.model_key)
        blobs = listed_blobs(graph) if graph is not None else {}
        refusal = self._refusal(job_id, request, graph, blobs)
        if refusal:
            request = replace(
                request, state=JobState.FAILED, exit_status=int(ExitStatus.BAD_INPUT), finished=now, error=refusal
            )
        else:
            pins.pin_for_job(self.store, job_id, list(blobs))
        if not self.board.create(job_id, replace(request, updated=now)):
            return f"job {job_id} was accepted already"
        if request.state == JobState.FAILED:
            return f"job {job_id} failed: {request.error}"
        self.board.count_live(job_id)
        self.dispatch(PlanJob(job_id).message())
        return f"job {job_id} accepted"

    def _refusal(self, job_id: str, request: JobRecord, graph: bytes | None, blobs: dict[str, int]) -> str:
        """Why a well-formed request can't become a job (its upload gone, its weights over the store's cap, a
        --retune the operator didn't grant: redis_keys.retune_grant_key), or "" when it can."""
        if graph is None:
            trimmed = self.board.call(self.board.redis.get, redis_keys.staging_trimmed_key(redis_keys.team_of(job_id)))
            return (
                f"the model's upload ({request.model_key}) is not on the farm: it expired before a worker took "
                f"the job, or was damaged{f', or dropped ({trimmed})' if trimmed else ''}; submit the model again"
            )
        if request.retune and not self.board.flag_raised(job_id, redis_keys.retune_grant_key):
            return (
                "--retune replaces tuning records every job on the farm uses, and this one was not granted by "
                "the operator's credentials (farm.distributed.board.JobBoard.grant_retune); --tune adds records "
                "for kernels that have none"
            )
        return uploads.over_the_cap(
            f"{request.model_name}.onnx", sum(blobs.values()) + len(graph), self.store.max_bytes
        ) or self._over_quota(redis_keys.team_of(job_id))

    def _over_quota(self, team: str) -> str:
        """Why a team (its submitters' Redis user) may not have another job now, or "" when it may."""
        live, quota = self.board.live_jobs(team), defaults.max_live_jobs()
        if live < quota:
            return ""
        who = f"team {team!r}" if team else "the default submitters"
        return (
            f"{who} already have {live} jobs queued or running on this farm, their quota (FARM_MAX_LIVE_JOBS="
            f"{quota} on the workers): wait for one to end or cancel one (`farm jobs` lists them), then submit "
            "again"
        )

    def admit(self, token: str, key: str) -> str:
        """Admit one blob of an upload in progress (farm.distributed.redis_keys.ADMIT_KEY), pinned for the upload
        until its job is accepted, so that a big model streams through Redis instead of piling up in staging."""
        pins.pin_upload(self.store, token, key)
        if self.store.for_team(redis_keys.team_of(token)).take_staged(key) is None:
            return f"upload {token}: blob {key} is not staged whole (the plan will say which initializer lacks it)"
        return f"upload {token}: blob {key} admitted"

    def repair(self, key: str) -> str:
        """Read a store entry that a download found damaged (redis_keys.REPAIR_KEY): `get` drops it when it is, so
        the artifacts naming it are built again rather than reused. Each key is read at most once per
        REPAIR_SECONDS, so no submitter can keep the intakes reading."""
        if not self.board.claim(redis_keys.repair_claim_key(key), redis_keys.REPAIR_SECONDS):
            return f"store entry {key} was checked less than {redis_keys.REPAIR_SECONDS} s ago"
        try:
            self.store.get(key)
        except CorruptEntryError:
            return f"store entry {key} was damaged: dropped"
        except MissingEntryError:
            return f"store entry {key} is not in the store"
        return f"store entry {key} is intact"

    def housekeep(self) -> None:
        """What keeps the store under its cap between builds (every worker's intake runs it every SWEEP_SECONDS):
        release the pins of ended jobs (a download only raises a flag: a submitter can't unpin) and evict down to
        the cap, so a big job's weights don't hold the store over it until the next build; and delete a farm key
        that holds another type than the farm keeps there (redis_keys.FIXED_KEY_TYPES), which would fail every call
        on it; and, once per EXPIRY_SWEEP_SECONDS across the farm, give a time to live to what a submitter wrote
        without one (farm.store.expiry), and once per STAGING_SWEEP_SECONDS keep each team's staged uploads under
        its quota."""
        for name, kind in self.board.drop_mistyped(redis_keys.FIXED_KEY_TYPES).items():
            log.warning(
                "housekeeping: deleted %s, a %s where the farm keeps a %s", name, kind, redis_keys.FIXED_KEY_TYPES[name]
            )
        if self.board.claim(redis_keys.EXPIRY_SWEEP_KEY, redis_keys.EXPIRY_SWEEP_SECONDS):
            untimed = self.board.expire_untimed()
            if untimed:
                log.warning("housekeeping: gave %d submitter-written keys the time to live they lacked", untimed)
        if self.board.claim(redis_keys.STAGING_SWEEP_KEY, redis_keys.STAGING_SWEEP_SECONDS):
            self._trim_staging()
        pins.release_ended_jobs(self.board, self.store)
        self.store.evict()

    def _staging(self, job_id: str) -> Store:
        """The store as the job's submitters stage into it (their team's staging area)."""
        return self.store.for_team(redis_keys.team_of(job_id))

    def _trim_staging(self) -> None:
        """Drop each team's oldest staged uploads past FARM_MAX_STAGED_BYTES, and note it for the team's jobs that
        then find their upload missing (accept)."""
        quota = defaults.max_staged_bytes(self.store.max_bytes)
        for team, dropped in self.store.trim_staging(quota).items():
            who = f"team {team!r}" if team else "the default submitters"
            note = (
                f"{who} had more than {quota} bytes of uploads staged (FARM_MAX_STAGED_BYTES on the workers), "
                f"so the oldest {dropped} bytes were dropped at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
            )
            log.warning("housekeeping: %s", note)
            self.board.call(
                self.board.redis.set, redis_keys.staging_trimmed_key(team), note, ex=defaults.STAGED_TTL_SECONDS
            )


def listed_blobs(graph: bytes) -> dict[str, int]:
    """The weight blobs a submitted graph names and their lengths (none when its bytes don't parse: the plan's
    import says why)."""
    try:
        return {key: max(0, length) for key, length in stored_blobs(graph).items()}
    except WireError:
        return {}
