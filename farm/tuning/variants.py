"""Choosing a build's variants: which tunable kernels lack a record, timing them where this host can, giving the
plan the recorded ones, and what the manifest says of them.

The pieces live beside this module: the variants tried (farm/tuning/space.py), timing them
(farm/tuning/harness.py) and the database of winners in the store (farm/tuning/database.py). A plan is a value:
`with_variants` and `choose_variants` return a new BuildPlan and leave the one they were given as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.kernel import blocking_for
from farm.backends.llvm.target import CpuTarget, host_target
from farm.errors import BuildError
from farm.ir.specs import KernelSpec
from farm.plan.planner import BuildPlan
from farm.store import Store
from farm.tuning.database import lookup, record
from farm.tuning.harness import TuningLockBusy, time_variants
from farm.tuning.space import tunable, variant_json

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


def missing(
    store: Store,
    plan: BuildPlan,
    targets: Sequence[CpuTarget],
    retune: bool = False,
) -> list[tuple[KernelSpec, CpuTarget]]:
    """(kernel, target) of every tunable kernel of the plan without a record for the target (every one with
    `retune`)."""
    return [
        (spec, target)
        for target in targets
        for spec in plan.kernels().values()
        if tunable(spec) and (retune or lookup(store, spec, target.id) is None)
    ]


def with_variants(store: Store, plan: BuildPlan, targets: Sequence[CpuTarget]) -> BuildPlan:
    """The plan with every tunable kernel's recorded variant on each target in `tuned`. A new plan: `plan` is left
    as it was, so whoever else holds it never sees variants change under it."""
    tuned = dict(plan.tuned)
    for target in targets:
        for key, spec in plan.kernels().items():
            blocking = lookup(store, spec, target.id) if tunable(spec) else None
            if blocking is not None:
                tuned[(key, target.id)] = variant_json(blocking, spec, target)
    return dataclasses.replace(plan, tuned=tuned)


def can_time_here(target: CpuTarget) -> bool:
    """Whether this host runs `target`'s code as that CPU would: same triple and CPU, and every feature the target
    enables is one this host has."""
    host = host_target()
    wanted = {f for f in target.features.split(",") if f.startswith("+")}
    return (target.triple, target.cpu) == (host.triple, host.cpu) and wanted <= set(host.features.split(","))


def choose_variants(
    plans: Sequence[BuildPlan],
    targets: Sequence[CpuTarget],
    store: Store,
    tune: bool = False,
    retune: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[BuildPlan], TuningReport]:
    """A local build's variants, for the plan of each of its sizes: with `tune`, first time (in this process, one
    kernel at a time, before any compile job starts) every tunable kernel the database lacks (all with `retune`) for
    the targets this host can run, each once however many sizes have it, and record them (a kernel whose timing
    fails keeps the default variant, with a note: tuning never fails a build); then each plan with every kernel's
    recorded variant (with_variants), and what was done. A build waits for a busy host tuning lock once
    (FARM_TUNE_LOCK_TIMEOUT): after that wait ran out, each later kernel is timed only if the lock is free when its
    turn comes, so that a stuck lock costs one timeout, not one per kernel."""
    report = TuningReport()
    if tune or retune:
        todo = list(
            {
                tune_name(spec, target.id): (spec, target)
                for plan in plans
                for spec, target in missing(store, plan, targets, retune)
            }.values()
        )
        here = [(spec, target) for spec, target in todo if can_time_here(target)]
        for target_id in sorted({target.id for _, target in todo if not can_time_here(target)}):
            report.notes.append(
                f"target {target_id} can't be timed on this host: its kernels use the default "
                "variant (tune them on a farm worker of that CPU class)"
            )
        lock_timeout: float | None = None  # FARM_TUNE_LOCK_TIMEOUT until one wait has run out
        for done, (spec, target) in enumerate(here, start=1):
            try:
                record(store, spec, target, time_variants(spec.to_json(), target.to_json(), lock_timeout=lock_timeout))
                report.timed.append(tune_name(spec, target.id))
            except TuningLockBusy as error:
                report.notes.append(f"{tune_name(spec, target.id)}: {_busy_lock_note(error, lock_timeout)}")
                lock_timeout = 0.0
            except BuildError as error:  # tuning never fails a build
                report.notes.append(f"{tune_name(spec, target.id)}: {error} (the default variant is used)")
            if progress:
                progress(done, len(here))
    return [with_variants(store, plan, targets) for plan in plans], report


def _busy_lock_note(error: TuningLockBusy, lock_timeout: float | None) -> str:
    """What a build says of a kernel left untimed by a busy tuning lock: the wait that ran out, or that it was not
    waited for again."""
    if lock_timeout is None:
        return f"{error} (the default variant is used)"
    return (
        "tuning lock still held by another tuning process, not waited for again in this build "
        "(the default variant is used)"
    )


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
    for entry in _kernel_entries(manifest):
        if "variant_source" not in entry:
            return False
        recorded = GemmBlocking.from_json(entry["variant"]) if entry["variant_source"] == "tuned" else None
        if lookup(store, KernelSpec.from_json(entry["spec"]), entry["target"]) != recorded:
            return False
    return True


def untuned_targets(manifest: dict[str, Any]) -> set[str]:
    """Target ids on which some tunable kernel of the artifact used the default for want of a record."""
    return {entry["target"] for entry in _kernel_entries(manifest) if entry.get("variant_source") == "default"}


def _kernel_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The CPU kernels of every size of an artifact."""
    from farm.artifact import size_manifests

    return [entry for size in size_manifests(manifest) for entry in size["kernels"]]
