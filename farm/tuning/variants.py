"""Tuning: time the GEMM variants of a kernel on the CPU that will run it, keep the fastest, remember it.

A variant is a GemmBlocking (rows x vectors x lanes of the register-blocked micro-kernel). A kernel is tunable when
its lowering holds a Gemm (Conv other than depthwise, Gemm, MatMul, ConvTranspose, matmul-shaped Einsum). The
chosen variant travels in the KernelSpec (`variant_json`), so compiling stays a pure function of (spec, target).

The tuning database lives in the store: the ref `tune:<cpu id>:<kernel key>` points at a JSON record of the
timings (the result of `time_variants`, plus farm's version), where the cpu id is the CpuTarget id (triple, cpu
name and features: the CPU class) and the kernel key is the spec's key without target or variant. Every build
looks its tunable kernels up there; a kernel with no record uses the documented default, cpu.default_blocking.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from farm import __version__, defaults
from farm.backends.llvm.entry import STEPS_SYMBOL, compile_entry
from farm.backends.llvm.gemm import GemmBlocking, pack_panels
from farm.backends.llvm.kernel import blocking_for, compile_cpu_kernel, default_blocking, gemms, packed_params
from farm.backends.llvm.link import link_library
from farm.backends.llvm.target import CpuTarget, host_target
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import argument_bytes, lower_kernel
from farm.plan.planner import BuildPlan
from farm.store import CorruptEntryError, MissingEntryError, Store

TILE_SHAPES = ((4, 3), (6, 4), (8, 3), (4, 4), (8, 2), (6, 2), (2, 4), (4, 2))
"""(rows, vectors) of the tiles tried, in this order; the first is the default's. Those that don't fit the
register file are left out."""
CACHE_TILINGS = ((4, 3, 256, "columns"), (8, 3, 256, "columns"), (8, 3, 0, "rows"))
"""(rows, vectors, k_block, order) of the cache-tiled and row-ordered variants also tried at full width, where
they fit: on a 2-core Zen 4 (1 MB L2) they were within 3% of the plain tiles on ResNet-50's convolutions, but
cores with smaller caches or other bandwidths may choose them."""
HALF_LANE_SHAPES = 3
"""How many of the fitting tiles are also tried at half the vector width (narrow outputs waste fewer lanes)."""
MIN_GAIN = 0.03
"""A variant replaces the default only when it is at least this much faster (timing noise must not pick one)."""
MIN_SAMPLE_SECONDS = 1e-3
"""Each timing sample runs the kernel this long at least, so call overhead and timer resolution don't count."""
MIN_ROUNDS, MAX_ROUNDS = 3, 100
ARENA_ALIGNMENT = 64
LOCK_FILE = "farm-tune.lock"


def queue_name(target_id: str) -> str:
    """The Celery queue of tuning tasks for one CPU class: only a worker on such a CPU consumes it."""
    return f"tune.{target_id}"


# --- variants --------------------------------------------------------------------------------------------------


def vector_registers(target: CpuTarget) -> int:
    """Vector registers of the target: 32 with AVX-512 and on AArch64 (NEON), 16 otherwise."""
    return 32 if target.arch == "aarch64" or "+avx512f" in target.features.split(",") else 16


def fits(blocking: GemmBlocking, registers: int) -> bool:
    """Whether a tile's rows x vectors accumulators, its `vectors` loaded B vectors and the broadcast A value are
    all held in registers at once (a tile that spills is slower than a smaller one)."""
    return blocking.rows * blocking.vectors + blocking.vectors + 1 <= registers


def lane_widths(target: CpuTarget) -> list[int]:
    """The target's widest float vector, and half of it while that still holds 4 floats."""
    full = target.simd_floats
    return [full] + ([full // 2] if full // 2 >= 4 else [])


def candidate_variants(target: CpuTarget) -> list[GemmBlocking]:
    """The variants tuning times on `target`, the default first: every tile of TILE_SHAPES that fits the register
    file at full width, the first HALF_LANE_SHAPES of them at half width, then the CACHE_TILINGS that fit (at
    most 14)."""
    registers = vector_registers(target)
    variants = [default_blocking(target)]
    for index, lanes in enumerate(lane_widths(target)):
        fitting = [b for b in (GemmBlocking(r, v, lanes) for r, v in TILE_SHAPES) if fits(b, registers)]
        variants += [b for b in fitting[: HALF_LANE_SHAPES if index else None] if b not in variants]
    tiled = (GemmBlocking(r, v, target.simd_floats, k, order) for r, v, k, order in CACHE_TILINGS)
    return variants + [b for b in tiled if fits(b, registers) and b not in variants]


def tunable(spec: KernelSpec) -> bool:
    """Whether the kernel's lowering holds a Gemm: only then does the variant change its code."""
    return bool(gemms(lower_kernel(spec).body))


def variant_json(blocking: GemmBlocking, target: CpuTarget) -> str:
    """What a spec carries for `blocking` on `target`: "" for the default, so that a kernel whose tuning kept the
    default shares the untuned kernel's key, symbol and cache entry."""
    return "" if blocking == default_blocking(target) else canonical_json(blocking.to_json())


def variant_spec(spec: KernelSpec, target: CpuTarget, blocking: GemmBlocking) -> KernelSpec:
    """`spec` for `target` with `blocking` as its variant."""
    return dataclasses.replace(spec, target_id=target.id, variant_json=variant_json(blocking, target))


# --- timing ------------------------------------------------------------------------------------------------------


def time_variants(spec_json: dict[str, Any], target_json: dict[str, Any],
                  variants: Sequence[GemmBlocking] | None = None,
                  seconds_per_variant: float | None = None) -> dict[str, Any]:
    """Time each variant of one kernel on this host and choose one.

    Every variant is compiled by the build's own compile_cpu_kernel, linked into one library with an entry whose
    step i calls variant i on one arena (inputs filled with random numbers), and run once; a variant whose outputs
    differ from the default's by more than 1e-4 (relative to max(1, max |default|)) is rejected. The others are
    timed in interleaved rounds (best of each; about `seconds_per_variant` each, default
    FARM_TUNE_SECONDS_PER_VARIANT), one timing per host at a time (host_lock). The default is always timed, and
    another variant wins only when it is MIN_GAIN faster, so the choice is never slower than the default as
    measured. Returns {"variant", "default", "seconds": {name: best seconds}, "default_seconds", "rejected"}.
    """
    spec, target = KernelSpec.from_json(spec_json), CpuTarget.from_json(target_json)
    default = default_blocking(target)
    blockings = list(dict.fromkeys([default, *(candidate_variants(target) if variants is None else variants)]))
    seconds_per_variant = defaults.tune_seconds_per_variant() if seconds_per_variant is None else seconds_per_variant
    specs = [variant_spec(spec, target, b) for b in blockings]
    with tempfile.TemporaryDirectory(prefix="farm-tune-") as folder:
        harness = _Harness(specs, target, Path(folder))
        try:
            with host_lock():
                outputs = [harness.run_once(index) for index in range(len(specs))]
                agreeing = [i for i, output in enumerate(outputs) if _agrees(output, outputs[0])]
                best = _best_seconds(harness, agreeing, seconds_per_variant)
        finally:
            harness.close()
    seconds = {blockings[i].name: best[i] for i in agreeing}
    return {"variant": blockings[_choose(best, default_index=0)].to_json(), "default": default.to_json(),
            "seconds": seconds, "default_seconds": seconds[default.name],
            "rejected": [blockings[i].name for i in range(len(specs)) if i not in agreeing]}


def _choose(best: dict[int, float], default_index: int) -> int:
    """The fastest variant, unless it beats the default by less than MIN_GAIN: then the default."""
    fastest = min(best, key=best.__getitem__)
    return fastest if best[fastest] < best[default_index] * (1 - MIN_GAIN) else default_index


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """Hold this host's tuning lock (a file lock in the temporary folder): one measurement at a time per host, so
    two tuning processes (a worker's pool processes, two local builds) don't disturb each other's timings."""
    descriptor = os.open(Path(tempfile.gettempdir()) / LOCK_FILE, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


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
        variant_offsets = [[copies.get((index, param), (offset, None))[0] for param, offset in enumerate(self.offsets)]
                           for index in range(len(specs))]
        self.library = _link_variants(specs, target, variant_offsets, folder / "harness.so")
        self._steps = getattr(self.library, STEPS_SYMBOL)
        self._steps.argtypes, self._steps.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], None
        raw = np.zeros(size + ARENA_ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % ARENA_ALIGNMENT
        self.arena = raw[start : start + size]
        rng = np.random.default_rng(0)
        for info, offset in zip(spec.inputs, self.offsets[len(self.outputs):]):
            view = self._view(info, offset)
            view[...] = rng.standard_normal(view.shape) if view.dtype.kind == "f" else 0
        for (_, param), (offset, (rows, m, k)) in copies.items():
            source = self.arena[self.offsets[param] : self.offsets[param] + sizes[param]]
            packed = pack_panels(source.view(np.float32).reshape(-1, m, k), rows).view(np.uint8).ravel()
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


def _link_variants(specs: Sequence[KernelSpec], target: CpuTarget, offsets: Sequence[Sequence[int]],
                   path: Path) -> ctypes.CDLL:
    """Compile every variant as a build would, link them with an entry whose step i calls variant i with the
    arena buffers at offsets[i], and load the library from `path`."""
    schedule = [{"kernel": variant.symbol, "args": [["arena", offset] for offset in variant_offsets]}
                for variant, variant_offsets in zip(specs, offsets)]
    objects = [compile_cpu_kernel(variant, target) for variant in specs]
    path.write_bytes(link_library([*objects, compile_entry(schedule, target)], target))
    return ctypes.CDLL(str(path))


def _packed_copies(specs: Sequence[KernelSpec], target: CpuTarget,
                   size: int) -> tuple[dict[tuple[int, int], tuple[int, tuple[int, int, int]]], int]:
    """Where each variant's pre-packed inputs go (codegen.cpu.packed_params: a conv's weights in panels of the
    variant's tile rows, as a build links them): {(variant, parameter): (arena offset, panels)}, placed after
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


# --- the tuning database -----------------------------------------------------------------------------------------


def tuning_key(spec: KernelSpec) -> str:
    """The kernel's key without target or variant: with the CPU class, what the database is keyed by."""
    return dataclasses.replace(spec, target_id="", variant_json="").key


def db_ref(spec: KernelSpec, target_id: str) -> str:
    """The store ref of a kernel's tuning record for one CPU class."""
    return f"tune:{target_id}:{tuning_key(spec)}"


def record(store: Store, spec: KernelSpec, target: CpuTarget, result: dict[str, Any]) -> str:
    """Keep a `time_variants` result as the kernel's record for the target's CPU class; returns its store key."""
    entry = {**result, "farm_version": __version__, "kernel": tuning_key(spec), "op": spec.op,
             "target": target.to_json()}
    key = store.put(json.dumps(entry, sort_keys=True).encode())
    store.set_ref(db_ref(spec, target.id), key)
    return key


def lookup(store: Store, spec: KernelSpec, target_id: str) -> GemmBlocking | None:
    """The variant recorded for the kernel on this CPU class; None when there is no usable record (none, gone,
    corrupt or unreadable: the build then uses the default, and tuning again rewrites it)."""
    key = store.get_ref(db_ref(spec, target_id))
    if key is None:
        return None
    try:
        return GemmBlocking.from_json(json.loads(store.get(key))["variant"])
    except (CorruptEntryError, MissingEntryError, ValueError, KeyError, TypeError):
        return None


# --- choosing the variants of a build ----------------------------------------------------------------------------


@dataclass
class TuningReport:
    """What tuning did in one build: kernels timed (`<target id>/<kernel key[:20]>`) and notes for the user."""

    timed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"timed": self.timed, "notes": self.notes}


def tune_name(spec: KernelSpec, target_id: str) -> str:
    """How a tuning unit is named in reports, job records and task arguments."""
    return f"{target_id}/{spec.key[:20]}"


def missing(store: Store, plan: BuildPlan, targets: Sequence[CpuTarget], retune: bool = False,
            ) -> list[tuple[KernelSpec, CpuTarget]]:
    """(kernel, target) of every tunable kernel of the plan without a record for the target (every one with
    `retune`)."""
    return [(spec, target) for target in targets for spec in plan.kernels().values()
            if tunable(spec) and (retune or lookup(store, spec, target.id) is None)]


def apply(store: Store, plan: BuildPlan, targets: Sequence[CpuTarget]) -> None:
    """Give every tunable kernel of the plan its recorded variant on each target (plan.tuned)."""
    for target in targets:
        for key, spec in plan.kernels().items():
            blocking = lookup(store, spec, target.id) if tunable(spec) else None
            if blocking is not None:
                plan.tuned[(key, target.id)] = variant_json(blocking, target)


def with_variants(store: Store, plan: BuildPlan, targets: Sequence[CpuTarget]) -> BuildPlan:
    apply(store, plan, targets)
    return plan


def can_time_here(target: CpuTarget) -> bool:
    """Whether this host runs `target`'s code as that CPU would: same triple and CPU, and every feature the target
    enables is one this host has."""
    host = host_target()
    wanted = {f for f in target.features.split(",") if f.startswith("+")}
    return (target.triple, target.cpu) == (host.triple, host.cpu) and wanted <= set(host.features.split(","))


def choose_variants(plan: BuildPlan, targets: Sequence[CpuTarget], store: Store, tune: bool = False,
                    retune: bool = False, progress: Callable[[int, int], None] | None = None) -> TuningReport:
    """A local build's variants: with `tune`, first time (in this process, one kernel at a time, before any
    compile job starts) every tunable kernel the database lacks (all with `retune`) for the targets this host can
    run, and record them; then give every kernel its recorded variant."""
    report = TuningReport()
    if tune or retune:
        todo = missing(store, plan, targets, retune)
        here = [(spec, target) for spec, target in todo if can_time_here(target)]
        for target_id in sorted({target.id for _, target in todo if not can_time_here(target)}):
            report.notes.append(f"target {target_id} can't be timed on this host: its kernels use the default "
                                "variant (tune them on a farm worker of that CPU class)")
        for done, (spec, target) in enumerate(here, start=1):
            record(store, spec, target, time_variants(spec.to_json(), target.to_json()))
            report.timed.append(tune_name(spec, target.id))
            if progress:
                progress(done, len(here))
    apply(store, plan, targets)
    return plan, report


# --- the manifest ------------------------------------------------------------------------------------------------


def manifest_variant(plan: BuildPlan, spec: KernelSpec, target: CpuTarget) -> dict[str, Any]:
    """What the manifest says of a kernel's variant on `target`: the blocking and "tuned" or "default"; both null
    for a kernel without a Gemm (nothing to tune)."""
    if not tunable(spec):
        return {"variant": None, "variant_source": None}
    source = "tuned" if (spec.key, target.id) in plan.tuned else "default"
    return {"variant": blocking_for(plan.kernel_for(spec, target.id), target).to_json(), "variant_source": source}


def manifest_current(store: Store, manifest: dict[str, Any]) -> bool:
    """Whether an artifact used exactly the variants the database holds now (a cached artifact is reusable only
    then). An artifact whose manifest doesn't say which variants it used is not."""
    for entry in manifest["kernels"]:
        if "variant_source" not in entry:
            return False
        recorded = GemmBlocking.from_json(entry["variant"]) if entry["variant_source"] == "tuned" else None
        if lookup(store, KernelSpec.from_json(entry["spec"]), entry["target"]) != recorded:
            return False
    return True


def untuned_targets(manifest: dict[str, Any]) -> set[str]:
    """Target ids on which some tunable kernel of the artifact used the default for want of a record."""
    return {entry["target"] for entry in manifest["kernels"] if entry.get("variant_source") == "default"}
