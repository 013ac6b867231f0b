"""The timing harness of tuning: every variant of one kernel compiled, linked into one library, loaded with ctypes,
checked against the default and timed on this host, one measurement per host at a time.

It runs where the target's CPU is (a local build with --tune, or a farm worker consuming `tune.<cpu id>`): the
numbers it returns are what the tuning database records (farm/tuning/database.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import math
import os
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from farm import defaults
from farm.backends.llvm.entry import STEPS_SYMBOL, compile_entry
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.kernel import compile_cpu_kernel, packed_params, untuned_blocking
from farm.backends.llvm.link import link_library
from farm.backends.llvm.packing import pack_operand
from farm.backends.llvm.target import CpuTarget
from farm.errors import BuildError
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec
from farm.ops import argument_bytes
from farm.tuning.space import candidate_variants, variant_spec

MIN_GAIN = 0.03
"""A variant replaces the default only when it is at least this much faster (timing noise must not pick one)."""
MIN_SAMPLE_SECONDS = 1e-3
"""Each timing sample runs the kernel this long at least, so call overhead and timer resolution don't count."""
MIN_ROUNDS, MAX_ROUNDS = 3, 100
ARENA_ALIGNMENT = 64
LOCK_FILE = "tune.lock"
LOCK_POLL_SECONDS = 0.02


class TuningLockBusy(BuildError):
    """The host's tuning lock was still held by another tuning process when the wait for it ended."""


def time_variants(
    spec_json: dict[str, Any],
    target_json: dict[str, Any],
    variants: Sequence[GemmBlocking] | None = None,
    seconds_per_variant: float | None = None,
    lock_timeout: float | None = None,
) -> dict[str, Any]:
    """Time each variant of one kernel on this host and choose one.

    Every variant is compiled by the build's own compile_cpu_kernel, linked into one library with an entry whose
    step i calls variant i on one arena (inputs filled with random numbers), and run once; a variant whose outputs
    differ from the default's by more than 1e-4 (relative to max(1, max |default|)) is rejected. The others are
    timed in interleaved rounds (best of each; about `seconds_per_variant` each, default
    FARM_TUNE_SECONDS_PER_VARIANT), one timing per host at a time (host_lock, waiting `lock_timeout` seconds for it,
    default FARM_TUNE_LOCK_TIMEOUT; TuningLockBusy after that). The default is always timed, and
    another variant wins only when it is MIN_GAIN faster, so the choice is never slower than the default as
    measured. Returns {"variant", "default", "seconds": {name: best seconds}, "default_seconds", "rejected"}.
    """
    spec, target = KernelSpec.from_json(spec_json), CpuTarget.from_json(target_json)
    default = untuned_blocking(spec, target)
    blockings = list(dict.fromkeys([default, *(candidate_variants(target) if variants is None else variants)]))
    seconds_per_variant = defaults.tune_seconds_per_variant() if seconds_per_variant is None else seconds_per_variant
    specs = [variant_spec(spec, target, b) for b in blockings]
    with tempfile.TemporaryDirectory(prefix="farm-tune-") as folder:
        harness = _Harness(specs, target, Path(folder))
        try:
            with host_lock(lock_timeout):
                outputs = [harness.run_once(index) for index in range(len(specs))]
                agreeing = [i for i, output in enumerate(outputs) if _agrees(output, outputs[0])]
                best = _best_seconds(harness, agreeing, seconds_per_variant)
        finally:
            harness.close()
    seconds = {blockings[i].name: best[i] for i in agreeing}
    return {
        "variant": blockings[_choose(best, default_index=0)].to_json(),
        "default": default.to_json(),
        "seconds": seconds,
        "default_seconds": seconds[default.name],
        "rejected": [blockings[i].name for i in range(len(specs)) if i not in agreeing],
    }


def _choose(best: dict[int, float], default_index: int) -> int:
    """The fastest variant, unless it beats the default by less than MIN_GAIN: then the default."""
    fastest = min(best, key=best.__getitem__)
    return fastest if best[fastest] < best[default_index] * (1 - MIN_GAIN) else default_index


@contextlib.contextmanager
def host_lock(timeout: float | None = None) -> Iterator[None]:
    """Hold this host's tuning lock: one measurement at a time per host, so two tuning processes of this user (a
    worker's pool processes, two local builds) don't disturb each other's timings.

    The lock file lives in this user's private folder (lock_folder) and is opened without following links, so
    nobody else can plant a symlink or hold the lock; a lock still held after `timeout` seconds (default
    FARM_TUNE_LOCK_TIMEOUT; 0 tries once) is a TuningLockBusy naming the lock: the kernel keeps its default variant.
    """
    timeout = defaults.tune_lock_timeout() if timeout is None else timeout
    folder = lock_folder()
    descriptor = _open_private(folder, LOCK_FILE)
    try:
        _wait_for_lock(descriptor, folder / LOCK_FILE, timeout)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def lock_folder() -> Path:
    """`farm-<uid>` in the temp folder: made 0700 by this user, refused when it is anything else (a link, another
    user's, open to others), since anyone may create names in the shared temp folder."""
    folder = Path(tempfile.gettempdir()) / f"farm-{os.getuid()}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise BuildError(f"tuning lock folder {folder}: {error.strerror}") from None
    return folder


def _open_private(folder: Path, name: str) -> int:
    """A descriptor of `folder`/`name` (made 0600), opened without following a link at either step, after checking
    that the folder opened is a real folder of this user that nobody else may write."""
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder_descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | nofollow)
    except OSError as error:
        raise BuildError(f"tuning lock folder {folder}: {error.strerror} (a link is never followed)") from None
    try:
        info = os.fstat(folder_descriptor)
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise BuildError(
                f"tuning lock folder {folder}: not private to this user (owner uid {info.st_uid}, "
                f"mode {stat.S_IMODE(info.st_mode):o}); remove it"
            )
        return os.open(name, os.O_RDWR | os.O_CREAT | nofollow, 0o600, dir_fd=folder_descriptor)
    except OSError as error:
        raise BuildError(f"tuning lock {folder / name}: {error.strerror} (a link is never followed)") from None
    finally:
        os.close(folder_descriptor)


def _wait_for_lock(descriptor: int, path: Path, timeout: float) -> None:
    """Take the exclusive lock on `descriptor`, or raise TuningLockBusy once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TuningLockBusy(
                    f"tuning lock {path}: still held by another tuning process after {timeout:g} s "
                    "(FARM_TUNE_LOCK_TIMEOUT)"
                ) from None
            time.sleep(LOCK_POLL_SECONDS)


def _best_seconds(harness: _Harness, indices: list[int], seconds_per_variant: float) -> dict[int, float]:
    """Best seconds per call of each variant, over rounds that each time every variant once (in turn, so that a
    busy moment of the machine costs all variants alike); samples of at least MIN_SAMPLE_SECONDS."""
    once = max(harness.seconds(indices[0], 1), 1e-9)
    calls = max(1, math.ceil(MIN_SAMPLE_SECONDS / once))
    rounds = min(MAX_ROUNDS, max(MIN_ROUNDS, round(seconds_per_variant / (calls * once))))
    best = dict.fromkeys(indices, math.inf)
    for _ in range(rounds):
        for index in indices:
            best[index] = min(best[index], harness.seconds(index, calls))
    return best


def _agrees(output: list[np.ndarray], reference: list[np.ndarray]) -> bool:
    """Same numbers within 1e-4 of max(1, max |reference|) (floats; NaN and infinities in the same places), or
    exactly equal (other dtypes)."""
    for actual, expected in zip(output, reference):
        if expected.dtype.kind != "f":
            if not np.array_equal(actual, expected):
                return False
            continue
        finite = np.isfinite(expected)
        if not np.array_equal(finite, np.isfinite(actual)):
            return False
        if finite.any():
            scale = max(1.0, float(np.abs(expected[finite]).max()))
            if float(np.abs(actual[finite].astype(np.float64) - expected[finite]).max()) > 1e-4 * scale:
                return False
    return True


class _Harness:
    """Every variant of one kernel in one loaded library: step i of farm_run_steps calls variant i on one arena
    laid out as the kernel's parameters (outputs, inputs, scratch), the inputs filled with random numbers."""

    def __init__(self, specs: Sequence[KernelSpec], target: CpuTarget, folder: Path) -> None:
        spec = specs[0]
        self.outputs = list(spec.outputs)
        sizes = argument_bytes(spec)
        self.offsets, size = _layout(sizes)
        copies, size = _packed_copies(specs, target, size)
        variant_offsets = [
            [copies.get((index, param), (offset, None))[0] for param, offset in enumerate(self.offsets)]
            for index in range(len(specs))
        ]
        self.library = _link_variants(specs, target, variant_offsets, folder / "harness.so")
        self._steps = getattr(self.library, STEPS_SYMBOL)
        self._steps.argtypes, self._steps.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], None
        raw = np.zeros(size + ARENA_ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % ARENA_ALIGNMENT
        self.arena = raw[start : start + size]
        rng = np.random.default_rng(0)
        for info, offset in zip(spec.inputs, self.offsets[len(self.outputs) :]):
            view = self._view(info, offset)
            view[...] = rng.standard_normal(view.shape) if view.dtype.kind == "f" else 0
        for (_, param), (offset, panels) in copies.items():
            source = self.arena[self.offsets[param] : self.offsets[param] + sizes[param]]
            packed = pack_operand(source.view(np.float32), panels).view(np.uint8)
            self.arena[offset : offset + packed.size] = packed

    def _view(self, info: TensorInfo, offset: int) -> np.ndarray:
        return self.arena[offset : offset + info.nbytes].view(info.dtype).reshape(info.shape)

    def run_once(self, index: int) -> list[np.ndarray]:
        """Run variant `index` on zeroed outputs; copies of its outputs."""
        for info, offset in zip(self.outputs, self.offsets):
            self._view(info, offset)[...] = 0
        self._steps(self.arena.ctypes.data, index, index + 1)
        return [self._view(info, offset).copy() for info, offset in zip(self.outputs, self.offsets)]

    def seconds(self, index: int, calls: int) -> float:
        """Seconds per call of variant `index`, over `calls` calls in a row."""
        arena = self.arena.ctypes.data
        started = time.perf_counter()
        for _ in range(calls):
            self._steps(arena, index, index + 1)
        return (time.perf_counter() - started) / calls

    def close(self) -> None:
        """Unload the library: a worker tunes thousands of kernels over its life, and ctypes never unloads."""
        import _ctypes

        _ctypes.dlclose(self.library._handle)


def _link_variants(
    specs: Sequence[KernelSpec], target: CpuTarget, offsets: Sequence[Sequence[int]], path: Path
) -> ctypes.CDLL:
    """Compile every variant as a build would, link them with an entry whose step i calls variant i with the
    arena buffers at offsets[i], and load the library from `path`."""
    schedule = [
        {"kernel": variant.symbol, "args": [["arena", offset] for offset in variant_offsets]}
        for variant, variant_offsets in zip(specs, offsets)
    ]
    objects = [compile_cpu_kernel(variant, target) for variant in specs]
    path.write_bytes(link_library([*objects, compile_entry(schedule, target)], target))
    return ctypes.CDLL(str(path))


def _packed_copies(
    specs: Sequence[KernelSpec], target: CpuTarget, size: int
) -> tuple[dict[tuple[int, int], tuple[int, tuple[int, ...]]], int]:
    """Where each variant's pre-packed inputs go (backends.llvm.kernel.packed_params: a conv's weights in panels
    of the variant's tile rows, a layer's constant B in column panels of its tile width, as a build links them): {(variant, parameter): (arena offset, panels)}, placed after
    `size` bytes, and the new size."""
    copies = {}
    for index, spec in enumerate(specs):
        sizes = argument_bytes(spec)
        for param, panels in packed_params(spec, target).items():
            copies[(index, param)] = (size, panels)
            size += _layout([sizes[param]])[1]
    return copies, size


def _layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Aligned offsets of buffers of `sizes` bytes laid end to end, and the total."""
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-max(size, 1) // ARENA_ALIGNMENT) * ARENA_ALIGNMENT
    return offsets, total
