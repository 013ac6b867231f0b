"""Which of an artifact's CPU targets a run uses: the one `--target` names (`farm run --target`,
`farm.runtime.load(path, target=...)`), else the best this host runs natively (farm.runtime.host.choose_target).

A target is named as `farm submit` named it, so that what a build was told is what a run is told: its id
(`farm inspect` lists them), `cpu:TRIPLE:CPU[:FEATURES]` (the target of that id), or `cpu:TRIPLE` (the target
`cpu:TRIPLE` builds, else the artifact's only target of that triple, whatever its CPU). `cpu` is this host: the
default choice. A target of another architecture runs under emulation (farm.runtime.emulation).
"""

from __future__ import annotations

from collections.abc import Sequence

from farm.artifact import open_artifact
from farm.errors import ArtifactError
from farm.runtime.host import Host, arch_of, choose_target, missing_features, runs_on, this_host
from farm.runtime.manifest import check_sizes
from farm.runtime.manifest_types import CpuTargetEntry, TargetEntry


def select_target(targets: Sequence[TargetEntry], wanted: str | None, host: Host, artifact: str) -> CpuTargetEntry:
    """The CPU target of `targets` (a checked manifest's) that `wanted` names, or choose_target's when it names none
    or `cpu`; ArtifactError listing the artifact's targets when none fits, or when a target of this host's
    architecture needs features the host lacks."""
    if not wanted or wanted == "cpu":
        return choose_target(targets, host, artifact)
    target = _named(targets, wanted, artifact)
    if not needs_emulation(target.triple, host) and not runs_on(target, host):
        raise ArtifactError(
            f"{artifact}: target {target.id!r} needs {','.join(missing_features(target.requires, host))}, "
            f"which this host ({host.describe()}) lacks"
        )
    return target


def needs_emulation(triple: str, host: Host) -> bool:
    """Whether a target of LLVM triple `triple` is for another architecture than the host's, so that it runs only
    under emulation."""
    return arch_of(triple) != host.arch


def run_target(path: str, wanted: str | None = None) -> tuple[CpuTargetEntry, bool]:
    """The CPU target a run of the artifact at `path` would use, and whether it would run under emulation, read from
    its checked manifest without loading anything (farm bench refuses an emulated target before any work)."""
    artifact = open_artifact(path)
    _, first = check_sizes(artifact.path, artifact.manifest)[0]
    host = this_host()
    target = select_target(first.targets, wanted, host, artifact.path)
    return target, needs_emulation(target.triple, host)


def _named(targets: Sequence[TargetEntry], wanted: str, artifact: str) -> CpuTargetEntry:
    from farm.backends.llvm.target import parse_target

    cpu_targets = [target for target in targets if isinstance(target, CpuTargetEntry)]
    by_id = {target.id: target for target in cpu_targets}
    if wanted in by_id:
        return by_id[wanted]
    if not wanted.startswith("cpu:"):
        raise ArtifactError(f"{artifact}: no target {wanted!r} in the artifact; it has {_listed(cpu_targets)}")
    named = parse_target(wanted)
    if named.id in by_id:
        return by_id[named.id]
    same_triple = [target for target in cpu_targets if target.triple == named.triple]
    if wanted.count(":") > 1 or not same_triple:
        raise ArtifactError(f"{artifact}: no target {wanted!r} in the artifact; it has {_listed(cpu_targets)}")
    if len(same_triple) > 1:
        raise ArtifactError(
            f"{artifact}: {wanted!r} fits {len(same_triple)} targets of the artifact, "
            f"{_listed(same_triple)}: name one by its id or its cpu:TRIPLE:CPU[:FEATURES]"
        )
    return same_triple[0]


def _listed(targets: Sequence[CpuTargetEntry]) -> str:
    """Each target's id (what --target takes), triple and CPU."""
    if not targets:
        return "no CPU target"
    return ", ".join(f"{target.id} ({target.triple}, cpu {target.cpu})" for target in targets)
