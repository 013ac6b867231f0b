"""The local executor: runs a build's pure compile steps in a process pool sized to the machine.

Steps are plain functions of picklable arguments that return bytes, the same functions the Celery tasks call, so
a build gives the same artifact whichever way it ran.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from farm import defaults


@dataclass(frozen=True)
class StepCall:
    """One call of a pure compile step; `name` says what it builds (the unit's name) for progress and errors.

    (Not a farm job: a job is a whole build on the farm, farm.distributed.)

    `big_bytes` marks a call whose arguments or result are large (a weight blob): it runs in this process, on one
    background thread, instead of crossing a process pipe twice (LLVM releases the GIL while it assembles).
    """

    name: str
    fn: Callable[..., bytes]
    args: tuple[Any, ...]
    big_bytes: bool = False


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8


@functools.cache
def keep_large_buffers() -> None:
    """Serve large allocations from a heap that is kept, instead of fresh mmap'd pages each time.

    LLVM copies a blob several times while writing its object; with glibc's defaults every copy lands in new pages
    and the page faults cost more than the copying (a 256 MB blob: 330 MB/s, and 2 GB/s once the heap is warm).
    One arena, because a thread's own arena can't hold a large block and would fall back to mmap.
    A no-op where the C library has no mallopt.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_ARENA_MAX, 1)
        mallopt(M_MMAP_THRESHOLD, 1 << 30)
        mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)


GC_THRESHOLDS = (100_000, 10, 10)
"""CPython's cyclic collector's generation thresholds in a building process (its defaults: 700, 10, 10). Only the
youngest is raised: the older ones keep their cadence, so cyclic garbage (llvmlite's IR is full of parent links)
is still freed every few million allocations. Compiling light ResNet-50's kernels three times over in one
process: 385-398 MB peak against 333-361 MB with the defaults, steady from round to round; (100,000, 50, 100)
was no faster."""


@functools.cache
def collect_garbage_rarely() -> None:
    """Run the cyclic garbage collector rarely, and never over what the process has loaded so far (gc.freeze).

    Building allocates many small containers (link plans and manifests as JSON, recipes, IR), nearly all freed by
    their reference counts; with CPython's defaults the collector ran every 700 allocations and, every so often,
    over every object of every module loaded: 60-80 ms of light ResNet-50's 0.12 s finish (docs/benchmarks-history.md,
    "The serial path in seconds").
    mypy raises its thresholds the same way. Frozen before a worker forks its pool, the loaded objects' pages also
    stay shared with the children (the collector no longer writes to them)."""
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()


def prepare_building_process() -> None:
    """What every process that builds sets up once: large buffers kept, garbage collected rarely."""
    keep_large_buffers()
    collect_garbage_rarely()


class LocalExecutor:
    """Runs calls in `workers` processes (spawned, so no LLVM state is forked); one worker runs them in-process.

    Every process that compiles is prepared for it (prepare_building_process: large buffers kept, garbage
    collected rarely), this one included.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or defaults.cpu_count()
        self._pool: ProcessPoolExecutor | None = None
        self._thread: ThreadPoolExecutor | None = None
        prepare_building_process()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        for executor in (self._pool, self._thread):
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        self._pool = self._thread = None

    def run(self, calls: Sequence[StepCall], on_done: Callable[[StepCall], None] = lambda call: None) -> list[bytes]:
        """Results in call order; the first failure cancels what has not started and is raised."""
        if self.workers == 1 or len(calls) <= 1:
            return [self._run_inline(call, on_done) for call in calls]
        futures: dict[Future, StepCall] = {self._submit(call): call for call in calls}
        for future in futures:
            future.add_done_callback(
                lambda f: on_done(futures[f]) if not f.cancelled() and f.exception() is None else None
            )
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [error for error in (f.exception() for f in done) if error is not None]
        if failed:
            for future in pending:
                future.cancel()
            raise failed[0]
        return [future.result() for future in futures]

    @staticmethod
    def _run_inline(call: StepCall, on_done: Callable[[StepCall], None]) -> bytes:
        result = call.fn(*call.args)
        on_done(call)
        return result

    def _submit(self, call: StepCall) -> Future:
        if call.big_bytes:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="farm-big-bytes")
            return self._thread.submit(call.fn, *call.args)
        return self._ensure_pool().submit(call.fn, *call.args)

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=prepare_building_process
            )
        return self._pool
