"""A loaded model: its native entry point, one arena, its inputs read in place or copied in, its outputs copied out.

With `threads` > 1 a run is one native call per thread: the calling thread and `threads - 1` persistent helper
threads each call the library's farm_work, which runs its own slice of each launch's ranges, then takes any range
still free (atomic flags in shared counters), and waits natively for a launch's ranges to finish before the next
(see farm.backends.llvm.entry). On Linux the helpers wait for runs natively too (farm_serve, handed each run by
farm_post: _NativePool); elsewhere, and in libraries built before farm_serve, Python wakes them once per run through
queues (_Pool). ctypes releases the GIL for the native calls.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.errors import ArtifactError, RunInputError
from farm.runtime.manifest_types import POINTER_BYTES, CpuTargetEntry, Launch, Manifest, TensorSlot

# The arena starts on a page: its buffers' addresses modulo 4096 are then the same in every process. With 64 bytes,
# some processes drew a base whose copies hit 4K aliasing and ran at half speed (docs/architecture.md, the arena).
_MIN_ALIGNMENT = 4096
# The least work (launching.work, about 2-8 per ns of one core) of one range of a split launch: a claim costs tens of
# nanoseconds, a range's own loop set-up a little more, so ranges of a few microseconds keep the threads busy. With
# the helpers waiting natively (farm_serve), 5,000 instead of 20,000 ran bert_style on two Xeon threads at 0.50-0.52
# ms instead of 0.60-0.62 (one thread: 0.53), mobilenetv2_style at 0.37-0.39 instead of 0.40, resnet18_style's int8
# at 0.65 instead of 0.68, and no model slower.
MIN_WORK_PER_RANGE = 5_000
# The least work of the split launches of at least POOL_LAUNCH_MIN_WORK each, together, for a run to use threads at
# all: every launch of a threaded run ends at a barrier, and a run pays for the hand-over, more than small models
# gain (measured on 2 cores, helpers on Python queues: tiny_cnn 0.41x, small_cnn 0.83x, vit_style 0.96x with
# 0.06-0.44M such work; bert_style 1.08x at 1.4M, mobilenetv2_style 1.37x at 5.4M; with native helpers vit_style
# still ran 0.31 -> 0.39 ms with a pool).
MIN_SPLIT_WORK_FOR_THREADS = 1_000_000
POOL_LAUNCH_MIN_WORK = 40_000
# Ranges per thread of a split launch at most: threads claim ranges as they come free, so a thread the OS runs late
# (a busy machine) takes fewer instead of holding everyone up.
RANGES_PER_THREAD = 4
# The share of a split launch that the threads' first ranges take together, one range each (shares_range): 4 equal
# ranges per thread ran ResNet-18, ResNet-50 and MobileNetV2 slower than one range per thread (figures in
# docs/benchmarks-history.md, "Speed, step 2: memory in model order and the second thread"): every range of a
# row-split GEMM streams all of B, and
# ranges claimed in turn scatter a tensor's lines over both cores' caches for the next launch to fetch. Each thread's
# slice is its head range then its tail range (farm_work runs its own slice first, then takes others' free ranges,
# last first), so a thread that keeps up runs the same part of every launch.
HEAD_SHARE = 0.8


def split_range(extent: int, grain: int, parts: int) -> list[tuple[int, int]]:
    """[0, extent) cut into at most `parts` contiguous, near-equal ranges whose inner boundaries are multiples of
    `grain` (none empty)."""
    blocks = -(-extent // grain)
    parts = max(1, min(parts, blocks))
    cuts = [min(blocks * j // parts * grain, extent) for j in range(parts + 1)]
    return [(begin, end) for begin, end in zip(cuts, cuts[1:]) if end > begin]


def _whole_turns(parts: int, threads: int) -> int:
    """`parts` rounded down to a multiple of `threads` where it is at least that: 3 ranges on 2 threads left one
    thread twice the work of the other (a 512-channel 2x2 conv's 8 units cut 3, 3, 2)."""
    return parts - parts % threads if parts >= threads else parts


def shares_range(extent: int, grain: int, threads: int, worth: int) -> list[tuple[int, int]]:
    """[0, extent) cut for `threads` threads into contiguous ranges whose inner boundaries are multiples of `grain`,
    two per thread in its slice's order: a head range (together HEAD_SHARE of the blocks), which the thread runs
    first when it keeps up, then a tail range of the rest, which whichever thread is free first may take, so a
    thread the OS runs late holds the others up less. A launch whose `worth` (its work / MIN_WORK_PER_RANGE) is
    too small for a tail range gets near-equal ranges, up to RANGES_PER_THREAD per thread (split_range)."""
    blocks = -(-extent // grain)
    head = int(blocks * HEAD_SHARE / threads)
    tail = (blocks - head * threads) // threads
    if head < 1 or tail < 1 or tail * worth < blocks:
        return split_range(extent, grain, _whole_turns(min(threads * RANGES_PER_THREAD, worth, blocks), threads))
    tails = [tail] * (threads - 1) + [blocks - head * threads - tail * (threads - 1)]
    sizes = [size for last in tails for size in (head, last)]
    cuts = [0, *(min(grain * total, extent) for total in itertools.accumulate(sizes))]
    return list(zip(cuts, cuts[1:]))


def launch_plan(launches: Sequence[Launch], threads: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(launch index, its ranges) for every launch of the schedule: one range unless the launch is worth
    splitting across `threads`, else shares_range's, each with at least MIN_WORK_PER_RANGE work."""
    plan = []
    for index, launch in enumerate(launches):
        worth = launch.work // MIN_WORK_PER_RANGE
        if launch.extent <= 1 or threads <= 1 or worth < 2:
            plan.append((index, [(0, launch.extent)]))
        else:
            plan.append((index, shares_range(launch.extent, max(launch.grain, 1), threads, worth)))
    return plan


def work_table(plan: list[tuple[int, list[tuple[int, int]]]]) -> np.ndarray:
    """The int64 table farm_work reads: [groups, first range of each group and the end, (launch, begin, end)...],
    one group per launch."""
    firsts = np.cumsum([0] + [len(ranges) for _, ranges in plan])
    rows = [(index, begin, end) for index, ranges in plan for begin, end in ranges]
    return np.ascontiguousarray(
        np.concatenate([[len(plan)], firsts, np.asarray(rows, np.int64).ravel()]), dtype=np.int64
    )


@dataclass(frozen=True)
class _Counters:
    """The layout of a run's counters for a work table (entry._work_function's: two per launch, the thread count
    pair, a flag per range): `fresh` gives one run's, zeroed, with the thread count set."""

    size: int
    threads_at: int
    threads: int

    @classmethod
    def of(cls, table: np.ndarray, threads: int) -> _Counters:
        groups = int(table[0])
        ranges = int(table[groups + 1])  # first_groups: where the ranges end
        return cls(2 * groups + 2 + ranges, 2 * groups + 1, threads)

    def fresh(self) -> np.ndarray:
        counters = np.zeros(self.size, dtype=np.int64)
        counters[self.threads_at] = self.threads
        return counters


class _Pool:
    """`count` daemon threads, each calling farm_work once per run it is handed; the calling thread makes one
    more. Each run gets fresh counters (entry._work_function's layout: two per launch, the thread count pair, a flag
    per range), so a helper the OS wakes late runs its (by then finished) pass over the same counters without
    touching the next run's."""

    def __init__(self, work: Any, table: np.ndarray, count: int) -> None:
        self._table, self._table_address = table, table.ctypes.data
        self._counters = _Counters.of(table, count + 1)
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(count)]
        for runs in self._queues:
            threading.Thread(target=_helper, args=(work, table, runs), daemon=True, name="farm-runtime").start()
        self.stop = weakref.finalize(self, _stop, self._queues)

    def run(self, work: Any, arena: int) -> None:
        counters = self._counters.fresh()
        job = (arena, counters.ctypes.data, counters)  # the array rides along: helpers keep it alive
        for runs in self._queues:
            runs.put(job)
        work(arena, self._table_address, job[1])


class _NativePool:
    """`count` daemon threads, each living in the library's farm_serve (entry._serve_function), which waits for
    runs in native code, spinning a while before it sleeps in the futex; `run` hands each run over with farm_post
    and calls farm_work itself. Each run gets fresh counters, as in _Pool; a run's counters are kept until every
    helper has recorded a later or equal run as finished (its word in the state), since a helper the OS runs late
    may still pass over them."""

    # Words of the state, as farm.backends.llvm.entry lays them out (STATE_*): the run's and the stop flag, the
    # sleepers' on a line of their own, then a line per helper for its last finished run.
    _STOP_AT, _HELPERS_AT, _WORDS_PER_HELPER = 3, 16, 8

    def __init__(self, work: Any, serve: Any, post: Any, table: np.ndarray, count: int) -> None:
        self._table, self._table_address, self._post = table, table.ctypes.data, post
        self._counters = _Counters.of(table, count + 1)
        self._state = _aligned_zeros((self._HELPERS_AT + self._WORDS_PER_HELPER * count) * 8, 64).view(np.int64)
        self._state_address = self._state.ctypes.data
        self._finished = self._state[self._HELPERS_AT :: self._WORDS_PER_HELPER]
        self._sequence = 0
        self._kept: dict[int, np.ndarray] = {}
        self.helpers = [
            threading.Thread(
                target=_serve, args=(serve, self._state, table, self._kept, helper), daemon=True, name="farm-runtime"
            )
            for helper in range(count)
        ]
        for thread in self.helpers:
            thread.start()
        self.stop = weakref.finalize(self, _stop_native, self._state, post)

    def run(self, work: Any, arena: int) -> None:
        counters = self._counters.fresh()
        self._sequence += 2  # farm_post makes it odd, then even again
        self._kept[self._sequence] = counters
        oldest = int(self._finished.min())
        if len(self._kept) > KEPT_RUNS_MAX and not any(thread.is_alive() for thread in self.helpers):
            oldest = self._sequence - 2  # no helper left to finish them (a forked child's copy of the pool)
        for sequence in [sequence for sequence in self._kept if sequence <= oldest]:
            del self._kept[sequence]
        address = counters.ctypes.data
        self._post(self._state_address, arena, address)
        work(arena, self._table_address, address)


def _serve(serve: Any, state: np.ndarray, table: np.ndarray, kept: dict[int, np.ndarray], helper: int) -> None:
    """A native helper's thread: farm_serve until the stop flag. The frame holds what the native loop reads, the
    state, the table and the runs' counters kept for it, until it returns: a model dropped while a helper is still
    on its way out (waking from the futex, or passing over a finished run) must not free them under it."""
    serve(state.ctypes.data, table.ctypes.data, helper)


KEPT_RUNS_MAX = 256
"""Runs' counters a native pool keeps for helpers that haven't finished them before it checks that any helper is
still alive (a process forked from one with a pool has none: nothing would ever free them)."""


def _stop_native(state: np.ndarray, post: Any) -> None:
    """Set the stop flag and wake the helpers with a post of no run, so each returns from farm_serve."""
    state[_NativePool._STOP_AT] = 1
    post(state.ctypes.data, 0, 0)


def _helper(work: Any, table: np.ndarray, runs: queue.SimpleQueue) -> None:
    table_address = table.ctypes.data
    while (job := runs.get()) is not None:
        work(job[0], table_address, job[1])


def _stop(queues: list[queue.SimpleQueue]) -> None:
    for runs in queues:
        runs.put(None)


@dataclass(frozen=True)
class TensorSpec:
    """Name, static shape and numpy dtype name of one model input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _aligned_zeros(size: int, alignment: int) -> np.ndarray:
    """A zeroed uint8 buffer of `size` bytes whose address is a multiple of `alignment` (numpy only promises 16)."""
    raw = np.zeros(size + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + size]


DTYPE_PACKAGES = {"bfloat16": "ml_dtypes"}
"""The package that registers each dtype name numpy lacks (manifests give dtypes by name)."""


def registered_dtype(name: str) -> np.dtype:
    """numpy's dtype of a manifest's dtype name, importing the package that registers it where numpy lacks it
    (DTYPE_PACKAGES): only for a model that has such a tensor, since ml_dtypes 0.7's import takes 0.6 s under
    numpy 2.4 (PyUFunc_AddLoop scanning its loops once per loop it adds), and every `farm run`, `farm bench` and
    process that loaded an artifact paid it."""
    if name in DTYPE_PACKAGES:
        importlib.import_module(DTYPE_PACKAGES[name])
    return np.dtype(name)


def tensor_slots(slots: Sequence[TensorSlot]) -> list[tuple[TensorSpec, int]]:
    """A checked manifest's inputs or outputs as (spec, arena offset); check_manifest saw each fit the arena."""
    return [(TensorSpec(slot.name, slot.shape, registered_dtype(slot.dtype).name), slot.offset) for slot in slots]


def check_feeds(inputs: list[TensorSpec], feeds: Mapping[str, np.ndarray]) -> None:
    """Refuse feeds that don't match the inputs exactly: no casting, so that precision is never lost silently."""
    expected = [spec.name for spec in inputs]
    if not isinstance(feeds, Mapping):
        raise RunInputError(f"feeds must map input names to arrays, got {type(feeds).__name__}; inputs: {expected}")
    for name in feeds:
        if name not in expected:
            raise RunInputError(f"unknown input {name!r}; the model's inputs are {expected}")
    for spec in inputs:
        if spec.name not in feeds:
            raise RunInputError(f"missing input {spec.name!r}; the model's inputs are {expected}")
        array = feeds[spec.name]
        if not isinstance(array, np.ndarray):
            raise RunInputError(f"input {spec.name!r}: expected a numpy array, got {type(array).__name__}")
        if array.dtype != np.dtype(spec.dtype):
            raise RunInputError(
                f"input {spec.name!r}: expected dtype {spec.dtype}, got {array.dtype} (cast it explicitly)"
            )
        if array.shape != spec.shape:
            raise RunInputError(f"input {spec.name!r}: expected shape {spec.shape}, got {array.shape}")


class Model:
    """A model ready to run on this host. `run` is thread-safe: calls take turns on the one arena. `threads`: how
    many threads one run may use (1: the whole schedule in one native call, farm_run; more: one farm_work call
    per thread, when some launch has enough work to split)."""

    def __init__(
        self,
        path: str,
        manifest: Manifest,
        target: CpuTargetEntry,
        library: ctypes.CDLL,
        threads: int = 1,
        weights: Sequence[int] = (),
        keep: Any = None,
    ) -> None:
        """`weights`: the address of each weight the target's entry reads (its manifest `weights`, in slot order),
        written into the weight table after the arena; `keep`: what keeps those addresses valid (the artifact's
        memory map), held as long as the model."""
        arena_bytes = manifest.memory_plan.arena_bytes
        self._inputs = tensor_slots(manifest.inputs)
        self._outputs = tensor_slots(manifest.outputs)
        self.inputs = [spec for spec, _ in self._inputs]
        self.outputs = [spec for spec, _ in self._outputs]
        self.target = target.json_object
        self._library = library
        try:
            self._entry = getattr(library, target.entry)
        except AttributeError:
            raise ArtifactError(f"{path}: target {target.id!r} library has no entry point {target.entry!r}") from None
        self._entry.argtypes, self._entry.restype = [ctypes.c_void_p], None
        self.threads = max(1, int(threads))
        self._plan: list[tuple[int, list[tuple[int, int]]]] | None = None
        self._pool = self._thread_pool(path, target) if self.threads > 1 else None
        table = target.weights_offset
        self._arena = _aligned_zeros(
            max(arena_bytes, table + POINTER_BYTES * len(weights), 1),
            max(manifest.memory_plan.alignment, _MIN_ALIGNMENT),
        )
        self._arena[table : table + POINTER_BYTES * len(weights)].view(np.uint64)[:] = weights
        self._weights_map = keep
        # Fixed for the model's life: a run of a small model is tens of microseconds, and making these per run
        # cost some 5 us of it.
        self._arena_address = self._arena.ctypes.data
        self._input_views = [
            (spec.name, self._view(spec, offset), self._pointer_slot(slot.pointer))
            for (spec, offset), slot in zip(self._inputs, manifest.inputs)
        ]
        self._output_views = [(spec.name, self._view(spec, offset)) for spec, offset in self._outputs]
        self._lock = threading.Lock()
        self.path, self.schedule = path, [step.json_object for step in manifest.schedule]

    def _view(self, spec: TensorSpec, offset: int) -> np.ndarray:
        return self._arena[offset : offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)

    def _pointer_slot(self, offset: int | None) -> np.ndarray | None:
        """The arena's word at an input's pointer slot (None: the artifact has none, every feed is copied)."""
        return None if offset is None else self._arena[offset : offset + POINTER_BYTES].view(np.uint64)

    def _check(self, feeds: Mapping[str, np.ndarray]) -> None:
        check_feeds(self.inputs, feeds)

    def _bind_inputs(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Give the kernels each checked feed: its address in the input's pointer slot, read in place, where it is
        laid out as the input (C-contiguous, aligned; kernels never write a model input), else a copy in the
        input's buffer and 0 in the slot. Every run sets every slot, so none keeps a feed of an earlier run. In
        place, a run neither copies the feed nor takes its lines from the core that wrote the copy: light SqueezeNet
        on two Xeon threads took 0.98x the time (docs/architecture.md, "Inputs read in place")."""
        for name, view, slot in self._input_views:
            array = feeds[name]
            if slot is not None and array.size and array.flags.c_contiguous and array.flags.aligned:
                slot[0] = array.ctypes.data
                continue
            np.copyto(view, array, casting="no")
            if slot is not None:
                slot[0] = 0

    def time_steps(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        """Best (least) seconds of each schedule step over `repeat` runs (`sample_steps`). The best of several
        runs filters out interruptions, which a per-kernel comparison must not mistake for regressions."""
        return [min(samples) for samples in self.sample_steps(feeds, repeat)]

    def sample_steps(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[list[float]]:
        """Seconds of each schedule step in each of `repeat` runs, each step called on its own (farm_run_steps);
        the steps run in order on the real activations of `feeds`."""
        self._check(feeds)
        steps = self._steps_entry()
        timings: list[list[float]] = [[] for _ in self.schedule]
        with self._lock:
            for _ in range(repeat):
                self._bind_inputs(feeds)  # every pass: later steps may reuse a copied input's arena bytes
                for index, samples in enumerate(timings):
                    started = time.perf_counter()
                    steps(self._arena_address, index, index + 1)
                    samples.append(time.perf_counter() - started)
        return timings

    def _steps_entry(self) -> Any:
        try:
            steps = self._library.farm_run_steps
        except AttributeError:
            raise ArtifactError(
                f"{self.path}: the library has no farm_run_steps (built by an older farm: rebuild it)"
            ) from None
        steps.argtypes, steps.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], None
        return steps

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; returns fresh arrays, so results stay valid after later runs reuse the arena."""
        self._check(feeds)
        with self._lock:
            self._bind_inputs(feeds)
            if self._pool is None:
                self._entry(self._arena_address)
            else:
                self._pool.run(self._work, self._arena_address)
            return {name: view.copy() for name, view in self._output_views}

    def _thread_pool(self, path: str, target: CpuTargetEntry) -> _Pool | _NativePool | None:
        """The pool for a threaded run, or None when the launches worth splitting hold too little work in all
        (MIN_SPLIT_WORK_FOR_THREADS: one farm_run call is then fastest) or the library predates farm_work."""
        if target.launches is None or not target.work_entry:
            return None
        try:
            self._work = getattr(self._library, target.work_entry)
            plan = launch_plan(target.launches, self.threads)
        except (AttributeError, TypeError, ValueError) as error:
            raise ArtifactError(f"{path}: target {target.id!r} launches are unusable: {error}") from None
        works = [target.launches[index].work for index, ranges in plan if len(ranges) > 1]
        if sum(work for work in works if work >= POOL_LAUNCH_MIN_WORK) < MIN_SPLIT_WORK_FOR_THREADS:
            return None
        self._work.argtypes, self._work.restype = [ctypes.c_void_p] * 3, None
        self._plan = plan
        if not (target.serve_entry and target.post_entry):  # a library built before farm_serve
            return _Pool(self._work, work_table(plan), self.threads - 1)
        serve, post = self._native(path, target.serve_entry), self._native(path, target.post_entry)
        serve.argtypes, serve.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
        post.argtypes, post.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], None
        return _NativePool(self._work, serve, post, work_table(plan), self.threads - 1)

    def _native(self, path: str, symbol: str) -> Any:
        try:
            return getattr(self._library, symbol)
        except AttributeError:
            raise ArtifactError(f"{path}: the library has no {symbol!r}, which its manifest names") from None
