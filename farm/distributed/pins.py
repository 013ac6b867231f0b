"""What a farm job keeps from the store's eviction: pins owned by the job (farm.store.base.Store.pin).

While a job runs it pins everything it will read again: its model, weights, link plan, the objects it compiled or
found cached, its libraries. Each is pinned before it is put (or, for a cached object, before its presence is
checked), so no eviction can fall between the two. When the job is done its pins shrink to the artifact (its
recipe and the entries it names: weights, packed weights, libraries), which stay until the artifact is first
downloaded; a failed or cancelled job releases them all. Submitters can't write
pins, so what a download or a cancel releases is released by the next sweep (`release_ended_jobs`, run by every
planning and by `farm store gc`). Every pin lives at
most as long as a job record (JOB_TTL_SECONDS, restarted by each pin), so a pin that no step released (a worker
lost with its job) can't hold entries forever, and `release_ended_jobs` drops such pins as soon as planning or
`farm store gc` looks.
"""

from __future__ import annotations

from collections.abc import Iterable

from farm import defaults
from farm.distributed import redis_keys
from farm.distributed.board import JobBoard
from farm.distributed.job_record import JobState
from farm.errors import BadInputError
from farm.store import Store


def pin_for_job(store: Store, job_id: str, keys: Iterable[str]) -> None:
    """Keep `keys` (present or about to be put) while the job needs them."""
    store.pin(redis_keys.store_pin_owner(job_id), keys, defaults.JOB_TTL_SECONDS)


def pin_upload(store: Store, token: str, key: str) -> None:
    """Keep a blob admitted while its upload goes on (a file blob store's streamed upload), for UPLOAD_PIN_SECONDS:
    the job's acceptance pins it for the job; an upload whose job never comes lets it go by itself."""
    store.pin(redis_keys.upload_pin_owner(token), [key], defaults.UPLOAD_PIN_SECONDS)


def keep_only_artifact(store: Store, job_id: str, artifact_keys: Iterable[str]) -> None:
    """A job is done: release everything but its artifact (its recipe and every member: farm.distributed.recipes),
    which stays until it is downloaded."""
    store.pin(redis_keys.store_pin_owner(job_id), artifact_keys, defaults.JOB_TTL_SECONDS, replace=True)


def release_job(store: Store, job_id: str) -> None:
    """The job needs nothing more (it failed, was cancelled, or was downloaded)."""
    store.unpin(redis_keys.store_pin_owner(job_id))


def release_ended_jobs(board: JobBoard, store: Store) -> list[str]:
    """Release the pins of jobs that failed, were cancelled, whose record expired, or that are done and were
    downloaded (redis_keys.downloaded_key: a submitter can't touch pins, so its download only raises the flag);
    returns their job ids."""
    released = []
    for owner in store.pin_owners():
        job_id = redis_keys.job_of_pin_owner(owner)
        if job_id is None:
            continue
        try:
            record = board.get(job_id)
        except BadInputError:  # a malformed record: leave its pins to their expiry
            continue
        if (
            record is None
            or record.state in (JobState.FAILED, JobState.CANCELLED)
            or (record.state == JobState.DONE and board.flag_raised(job_id, redis_keys.downloaded_key))
        ):
            release_job(store, job_id)
            released.append(job_id)
    return released
