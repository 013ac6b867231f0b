"""A loaded model: its native entry point, one arena and the copies of inputs and outputs through it."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.errors import ArtifactError, RunInputError

_MIN_ALIGNMENT = 64


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


def _slots(path: str, entries: Any, arena_bytes: int, role: str) -> list[tuple[TensorSpec, int]]:
    """Parse the manifest's inputs or outputs into (spec, arena offset), refusing any that don't fit the arena."""
    if not isinstance(entries, list):
        raise ArtifactError(f"{path}: manifest {role} is not a list")
    slots = []
    for entry in entries:
        try:
            spec = TensorSpec(str(entry["name"]), tuple(int(n) for n in entry["shape"]), np.dtype(entry["dtype"]).name)
            offset = int(entry["offset"])
        except (KeyError, TypeError, ValueError) as error:
            raise ArtifactError(f"{path}: manifest {role} entry {entry!r} is malformed: {error}") from None
        if offset < 0 or min(spec.shape, default=1) < 0 or offset + spec.nbytes > arena_bytes:
            raise ArtifactError(f"{path}: {role[:-1]} {spec.name!r} does not fit the {arena_bytes}-byte arena")
        slots.append((spec, offset))
    return slots


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
    """A model ready to run on this host. `run` is thread-safe: calls take turns on the one arena."""

    def __init__(self, path: str, manifest: dict[str, Any], target: dict[str, Any], library: ctypes.CDLL) -> None:
        plan = manifest.get("memory_plan", {})
        arena_bytes = int(plan.get("arena_bytes", 0))
        self._inputs = _slots(path, manifest.get("inputs"), arena_bytes, "inputs")
        self._outputs = _slots(path, manifest.get("outputs"), arena_bytes, "outputs")
        self.inputs = [spec for spec, _ in self._inputs]
        self.outputs = [spec for spec, _ in self._outputs]
        self.target = target
        self._library = library
        entry = str(target.get("entry", "farm_run"))
        try:
            self._entry = getattr(library, entry)
        except AttributeError:
            raise ArtifactError(f"{path}: target {target.get('id')!r} library has no entry point {entry!r}") from None
        self._entry.argtypes, self._entry.restype = [ctypes.c_void_p], None
        self._arena = _aligned_zeros(max(arena_bytes, 1), max(int(plan.get("alignment", 0)), _MIN_ALIGNMENT))
        self._lock = threading.Lock()
        self.path, self.schedule = path, list(manifest.get("schedule", []))

    def _view(self, spec: TensorSpec, offset: int) -> np.ndarray:
        return self._arena[offset : offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)

    def _check(self, feeds: Mapping[str, np.ndarray]) -> None:
        check_feeds(self.inputs, feeds)

    def time_steps(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        """Best (least) seconds of each schedule step over `repeat` runs, each step called on its own
        (farm_run_steps); the steps run in order on the real activations of `feeds`. The best of several runs
        filters out interruptions, which a per-kernel comparison must not mistake for regressions."""
        self._check(feeds)
        steps = self._steps_entry()
        timings: list[list[float]] = [[] for _ in self.schedule]
        with self._lock:
            for _ in range(repeat):
                for spec, offset in self._inputs:  # every pass: later steps may reuse an input's arena slot
                    np.copyto(self._view(spec, offset), feeds[spec.name], casting="no")
                for index, samples in enumerate(timings):
                    started = time.perf_counter()
                    steps(self._arena.ctypes.data, index, index + 1)
                    samples.append(time.perf_counter() - started)
        return [min(samples) for samples in timings]

    def _steps_entry(self) -> Any:
        try:
            steps = self._library.farm_run_steps
        except AttributeError:
            raise ArtifactError(f"{self.path}: the library has no farm_run_steps (built by an older farm: rebuild "
                                "it)") from None
        steps.argtypes, steps.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], None
        return steps

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; returns fresh arrays, so results stay valid after later runs reuse the arena."""
        self._check(feeds)
        with self._lock:
            for spec, offset in self._inputs:
                np.copyto(self._view(spec, offset), feeds[spec.name], casting="no")
            self._entry(self._arena.ctypes.data)
            return {spec.name: self._view(spec, offset).copy() for spec, offset in self._outputs}
