"""The farm seen from a client (a laptop, CI): submit a model, follow, download and cancel jobs by id.

Every call goes through Redis only (the job board and the store), so any process or host that reaches the broker
can wait on, download or cancel a job that another one submitted.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from farm import defaults
from farm.atomic import write_atomically
from farm.backends.registry import Target
from farm.distributed import pins
from farm.distributed.board import JobBoard
from farm.distributed.protocol import TERMINAL, JobRecord, JobState, PlanJob, check_model_name
from farm.errors import BadInputError, BuildError, ExitStatus, JobError
from farm.store import CorruptEntryError, MissingEntryError, Store, open_store


class FarmClient:
    """A connection to one farm: its job board and store, both reached through the broker's Redis."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.board = JobBoard(broker)
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(defaults.store_url(self.broker))
        return self._store

    def submit(self, model_path: str | os.PathLike, targets: Sequence[Target], no_cache: bool = False,
               tune: bool = False, retune: bool = False) -> str:
        """Store the model, record the job and enqueue its planning on the farm; returns the job id. `tune`: time
        the kernels the tuning database lacks first (`retune`: all of them), on workers of each target's CPU class."""
        path = Path(model_path)
        if not path.is_file():
            raise BadInputError(f"{path}: no such model file")
        data = path.read_bytes()
        job_id = uuid.uuid4().hex[:16]
        now = time.time()
        model_sha256 = hashlib.sha256(data).hexdigest()
        pins.pin_for_job(self.store, job_id, [model_sha256])
        self.board.create(job_id, JobRecord(JobState.QUEUED, self.store.put(data), check_model_name(path.stem),
                                            model_sha256, list(targets), no_cache=no_cache,
                                            tune=tune, retune=retune, submitted_from=os.uname().nodename,
                                            created=now, updated=now))
        from farm.distributed.celery_app import make_app

        message = PlanJob(job_id).message()
        make_app(self.broker).send_task(message.task, args=message.args, queue=message.queue,
                                        retry_policy={"max_retries": 2, "interval_start": 0.1})
        return job_id

    def record(self, job_id: str) -> JobRecord:
        record = self.board.get(job_id)
        if record is None:
            raise JobError(f"unknown job {job_id!r} (never submitted to this farm, or expired)")
        return record

    def status(self, job_id: str) -> dict[str, Any]:
        """The job's state, compile tasks done of total, and the failing unit and error if it failed."""
        record = self.record(job_id)
        status = {"job_id": job_id, "state": record.state.value, "model": record.model_name,
                  "done": self.board.finished(job_id, "compile"), "total": record.total or 0,
                  "kernels": record.kernels, "blobs": record.blobs}
        for field in ("error", "failed_unit", "exit_status", "artifact_key", "tuning_note"):
            if getattr(record, field):
                status[field] = getattr(record, field)
        if record.tune_units is not None:
            status["tuning"] = {"done": self.board.finished(job_id, "tune"), "total": len(record.tune_units),
                                "errors": record.tune_errors}
        status["seconds"] = round((record.finished or record.updated) - record.created, 3)
        return status

    def wait(self, job_id: str, timeout: float | None = None,
             on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until the job ends (or `timeout` seconds pass: then the last status, not ended)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(job_id)
            if on_progress:
                on_progress(status)
            if JobState(status["state"]) in TERMINAL or (deadline is not None and time.monotonic() > deadline):
                return status
            time.sleep(defaults.POLL_SECONDS)

    def download(self, job_id: str, out_dir: str | os.PathLike) -> str:
        """Write the job's artifact to out_dir/<model>.farm (atomically) and return its path."""
        status = self.status(job_id)
        raise_for_state(status)
        if status["state"] != JobState.DONE.value:
            raise JobError(f"job {job_id} is {status['state']}: no artifact yet (farm wait {job_id})")
        try:
            data = self.store.get(status["artifact_key"])
        except (MissingEntryError, CorruptEntryError):
            raise JobError(f"job {job_id}'s artifact is no longer in the farm's store (evicted after its first "
                           "download, or damaged); submit the model again to rebuild it") from None
        path = os.path.abspath(os.path.join(out_dir, f"{status['model']}.farm"))
        write_atomically(path, data)
        pins.release_job(self.store, job_id)
        return path

    def cancel(self, job_id: str) -> bool:
        """Cancel a live job: its queued tasks stop at their start; False when it had already ended."""
        self.record(job_id)
        cancelled = self.board.advance(job_id, JobState.CANCELLED, error="cancelled by user")
        if cancelled:
            pins.release_job(self.store, job_id)
        return cancelled


def raise_for_state(status: dict[str, Any]) -> None:
    """Turn a failed or cancelled job into the error (and exit status) the CLI reports."""
    if status["state"] == JobState.FAILED.value:
        error = BadInputError if status.get("exit_status") == ExitStatus.BAD_INPUT else BuildError
        raise error(f"job {status['job_id']} failed: {status.get('error', 'unknown error')}")
    if status["state"] == JobState.CANCELLED.value:
        raise JobError(f"job {status['job_id']} was cancelled")
