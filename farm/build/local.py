"""A whole build on this machine: plan, tune (when asked), compile every unit the compile cache lacks in the local
executor, link and write the artifact, all through the one assembly (farm.build.assembly) that the farm's steps use
too. The compile cache is the local store, with the farm's refs (farm.build.units.cached_unit, cache_unit)."""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.artifact import LazyMember, write_artifact
from farm.backends.registry import Target
from farm.build import assembly
from farm.build.executor import LocalExecutor, StepCall
from farm.build.parts import BuiltUnits
from farm.build.units import CompileUnit, cache_unit, cached_unit, compile_unit, traits_of
from farm.ir.shapes import PinnedShapes
from farm.ir.specs import BlobSpec
from farm.ir.unit_kinds import UnitKind
from farm.store import FileStore, Store, default_store_root
from farm.tuning.variants import TuningReport, choose_variants

ProgressCallback = Callable[[int, int], None]
PhaseCallback = Callable[[str], None]


@dataclass
class BuildResult:
    job_id: str
    artifact: str
    kernels: int
    blobs: int
    seconds: float
    targets: list[str] = field(default_factory=list)
    tuning: TuningReport | None = None
    """What `--tune` did (None when it wasn't asked for)."""
    compiled: int = 0
    """Units this build made: kernel objects and OpenCL binaries it compiled, and every packed weight (always packed
    as the artifact is written, never cached locally)."""
    cached: int = 0
    """Code units taken from the compile cache; compiled + cached = kernels + blobs."""

    def to_json(self) -> dict[str, Any]:
        data = {
            "job_id": self.job_id,
            "state": "done",
            "artifact": self.artifact,
            "kernels": self.kernels,
            "blobs": self.blobs,
            "seconds": round(self.seconds, 3),
            "targets": self.targets,
            "compiled": self.compiled,
            "cached": self.cached,
        }
        return {**data, "tuning": self.tuning.to_json()} if self.tuning else data


def build_model(
    model_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    targets: Sequence[Target] = (),
    executor: LocalExecutor | None = None,
    progress: ProgressCallback | None = None,
    tune: bool = False,
    retune: bool = False,
    store: Store | None = None,
    tune_progress: ProgressCallback | None = None,
    sizes: Sequence[PinnedShapes] = (),
    phase: PhaseCallback | None = None,
    no_cache: bool = False,
) -> BuildResult:
    """Build `<out_dir>/<model-stem>.farm`; the artifact appears only when every step succeeded.

    `targets`: CPU and OpenCL targets (farm.backends.registry.parse_targets); none means this host's CPU. Every
    tunable kernel uses the variant the tuning database in `store` (default: the local store,
    farm.store.default_store_root) holds for its target; `tune` first times, on this host, the kernels it lacks for
    targets this host can run (`retune`: all of them), reporting each one to `tune_progress`. `sizes` fix the
    sizes of dynamic input dimensions (`--shape`, farm.ir.shapes.parse_sizes): one artifact holds a schedule
    per size (farm.build.assembly). `phase(name)` is called as each phase starts, in order: "planning" (import and
    plan), "tuning" (with `tune` or `retune`), "compiling" (counted by `progress`: 0 of the total first, then after
    each unit), "linking", "writing", then "done", so that a user sees what the build is doing between the counts.

    `store` is also the compile cache: a kernel object or OpenCL binary found there under its unit's cache ref is
    used instead of compiled (`no_cache`: compile every one), what is compiled is kept there, and the store is then
    evicted down to its cap (FARM_STORE_MAX_BYTES). `progress(done, total)` counts code units, the cached ones
    done at once.
    """
    from farm.backends.llvm.blobs import sweep_stale_scratch
    from farm.backends.llvm.target import host_target

    started = time.perf_counter()
    report_phase = phase or _no_phase
    report_phase("planning")
    sweep_stale_scratch()  # what older versions' crashed packers left in /dev/shm
    targets = list(targets) or [host_target()]
    assembly.start_parts(targets)
    name, model_sha256 = Path(model_path).stem, _file_sha256(model_path)
    store = store or FileStore(default_store_root())
    sized_plans = assembly.plan_sizes(model_path, sizes)
    if tune or retune:
        report_phase("tuning")
    plans, tuning = choose_variants(
        sized_plans, [t for t in targets if t.kind == "cpu"], store, tune, retune, tune_progress
    )
    blobs = assembly.sized_blobs(plans)
    units = assembly.sized_units(plans, targets)
    code = [unit for unit in units if unit.kind != UnitKind.BLOB]
    report_phase("compiling")
    compiled: dict[str, bytes] = {} if no_cache else _cached(store, code)
    todo = [unit for unit in code if unit.name not in compiled]
    compiled.update(_compiled(store, executor, todo, blobs, _counting_from(len(compiled), len(code), progress)))
    objects: dict[str, bytes | LazyMember] = {**compiled}
    objects.update({unit.name: _packed_when_written(unit, blobs) for unit in units if unit.kind == UnitKind.BLOB})
    report_phase("linking")
    plan_json = assembly.link_plan(plans, targets, name, model_sha256, units, sizes)
    libraries: dict[str, bytes] = {}
    built = BuiltUnits(
        objects.__getitem__,
        lambda unit: hashlib.sha256(compiled[unit]).hexdigest(),
        libraries.__getitem__,
        lambda sha: memoryview(blobs[sha]).cast("B"),
    )
    for library in assembly.libraries(plan_json):
        libraries[library["id"]] = assembly.link_library(plan_json, library["id"], built)
    manifest, members = assembly.artifact_contents(plan_json, built)
    report_phase("writing")
    os.makedirs(out_dir, exist_ok=True)
    artifact = write_artifact(os.path.abspath(os.path.join(out_dir, f"{name}.farm")), manifest, members)
    if todo:
        store.evict()
    report_phase("done")
    counts = assembly.unit_counts(units)
    return BuildResult(
        assembly.build_identity(model_sha256, name, targets, sizes)[:16],
        artifact,
        counts["kernels"],
        counts["blobs"],
        time.perf_counter() - started,
        [t.id for t in targets],
        tuning if tune or retune else None,
        len(todo) + counts["blobs"],
        len(code) - len(todo),
    )


def _file_sha256(path: str | os.PathLike) -> str:
    """The model file's sha256, read a MiB at a time: the import maps the file rather than copy it, and hashing it
    should not hold all of it in memory either (BERT-base: 430 MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cached(store: Store, code: list[CompileUnit]) -> dict[str, bytes]:
    """The units' bytes that the compile cache holds, by unit name (a miss, corrupt entries included, is left out
    and so compiled)."""
    found = {unit.name: cached_unit(store, unit) for unit in code}
    return {name: data for name, data in found.items() if data is not None}


def _compiled(
    store: Store,
    executor: LocalExecutor | None,
    todo: list[CompileUnit],
    blobs: Mapping[str, Any],
    progress: ProgressCallback | None,
) -> dict[str, bytes]:
    """Compile the units in the executor and keep their bytes in the compile cache, by unit name."""
    built = _run(executor, [_step_call(unit, blobs) for unit in todo], progress)
    for unit, data in zip(todo, built):
        cache_unit(store, unit, data)
    return {unit.name: data for unit, data in zip(todo, built)}


def _counting_from(cached: int, total: int, progress: ProgressCallback | None) -> ProgressCallback | None:
    """`progress` over every code unit: the cached ones reported done at once, then each compile step."""
    if progress is None:
        return None
    if cached:
        progress(cached, total)
    return lambda done, _: progress(cached + done, total)


def _no_phase(name: str) -> None:
    """The phase callback of a caller that shows none."""


def _packed_when_written(unit: CompileUnit, blobs: Mapping[str, Any]) -> LazyMember:
    """A weight packed for a target's kernels, made by its pure step as the artifact is written: the packed copies
    of a model's weights are never all held at once (the source weights are, in the plans)."""
    assert isinstance(unit.spec, BlobSpec), f"{unit.name} is a blob unit, whose spec is a BlobSpec"
    return LazyMember(unit.spec.nbytes, functools.partial(compile_unit, unit, _weights_of(unit, blobs)))


def _weights_of(unit: CompileUnit, blobs: Mapping[str, Any]) -> memoryview | None:
    return memoryview(blobs[unit.data_key]).cast("B") if unit.data_key else None


def _step_call(unit: CompileUnit, blobs: Mapping[str, Any]) -> StepCall:
    """The unit's pure step as an executor call; a blob's weights are passed as a view, not copied."""
    return StepCall(unit.name, compile_unit, (unit, _weights_of(unit, blobs)), big_bytes=traits_of(unit.kind).big_bytes)


def _run(executor: LocalExecutor | None, calls: list[StepCall], progress: ProgressCallback | None) -> list[bytes]:
    done = [0]
    if progress and calls:
        progress(0, len(calls))  # the total shows before the first unit ends (seconds, when PoCL starts first)

    def on_done(call: StepCall) -> None:
        done[0] += 1
        if progress:
            progress(done[0], len(calls))

    if executor is not None:
        return executor.run(calls, on_done)
    with LocalExecutor() as local:
        return local.run(calls, on_done)
