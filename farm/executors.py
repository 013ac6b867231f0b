"""The local executor: runs a build's pure compile steps in a process pool sized to the machine.

Steps are plain functions of picklable arguments that return bytes, the same functions the Celery tasks call, so
a build gives the same artifact whichever way it ran.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Job:
    """One call of a step function; `name` says what it builds (kernel, blob or library) for progress and errors."""

    name: str
    fn: Callable[..., bytes]
    args: tuple[Any, ...]


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


class LocalExecutor:
    """Runs jobs in `workers` processes (spawned, so no LLVM state is forked); one worker runs them in-process."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self, jobs: Sequence[Job], on_done: Callable[[Job], None] = lambda job: None) -> list[bytes]:
        """Results in job order; the first failure cancels what has not started and is raised."""
        if self.workers == 1 or len(jobs) <= 1:
            return [self._run_inline(job, on_done) for job in jobs]
        pool = self._ensure_pool()
        futures: dict[Future, Job] = {pool.submit(job.fn, *job.args): job for job in jobs}
        for future in futures:
            future.add_done_callback(lambda f: on_done(futures[f]) if f.exception() is None else None)
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for future in pending:
                future.cancel()
            raise failed[0].exception()
        return [future.result() for future in futures]

    @staticmethod
    def _run_inline(job: Job, on_done: Callable[[Job], None]) -> bytes:
        result = job.fn(*job.args)
        on_done(job)
        return result

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool
