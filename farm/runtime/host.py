"""Which of an artifact's targets this process can run: the host's LLVM triple, CPU name and enabled features,
against the features each target's code may use (its manifest `requires`: farm.backends.llvm.features)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import llvmlite.binding as llvm

from farm.errors import ArtifactError
from farm.runtime.manifest_types import CpuTargetEntry, TargetEntry


@dataclass(frozen=True)
class Host:
    """The machine as LLVM sees it. `features` holds the names of enabled features, without the '+'; `known`, every
    feature LLVM's detection reports on this host, on or off (empty when it can't read them)."""

    triple: str
    cpu: str
    features: frozenset[str]
    known: frozenset[str]

    @property
    def arch(self) -> str:
        return arch_of(self.triple)

    def describe(self) -> str:
        return f"{self.triple}, cpu {self.cpu}"


def arch_of(triple: str) -> str:
    """The architecture part of an LLVM triple ("x86_64" in "x86_64-unknown-linux-gnu")."""
    return triple.split("-", 1)[0]


def this_host() -> Host:
    """The running host. LLVM can't read the features on some hosts; then no target that requires any will match."""
    try:
        feature_map = llvm.get_host_cpu_features()
    except RuntimeError:
        return Host(llvm.get_process_triple(), llvm.get_host_cpu_name(), frozenset(), frozenset())
    enabled = frozenset(name for name, on in feature_map.items() if on)
    return Host(llvm.get_process_triple(), llvm.get_host_cpu_name(), enabled, frozenset(feature_map))


def missing_features(requires: Sequence[str], host: Host) -> list[str]:
    """ "+name" for each feature a target's code may use (its `requires`) that the host lacks. A feature LLVM's
    detection doesn't report on this host's architecture (a tuning feature such as `fuse-aes`, a system register
    set such as `el3`) is not an instruction set the host could lack, so it never stops a target; every required
    feature does on a host whose features LLVM can't read."""
    if not host.known:
        return [f"+{name}" for name in requires]
    return [f"+{name}" for name in requires if name in host.known and name not in host.features]


def runs_on(target: TargetEntry, host: Host) -> bool:
    """Whether `host` can run the target (a checked manifest's): a CPU target of its arch, every feature its code
    may use."""
    return (
        isinstance(target, CpuTargetEntry)
        and arch_of(target.triple) == host.arch
        and not missing_features(target.requires, host)
    )


def choose_target(targets: Sequence[TargetEntry], host: Host, artifact: str) -> CpuTargetEntry:
    """The CPU target to run on `host`: one built for its exact CPU if any, else the first compatible one.

    Raises ArtifactError naming every target and why it doesn't fit, so that the user knows what to rebuild for.
    """
    usable = [target for target in targets if isinstance(target, CpuTargetEntry) and runs_on(target, host)]
    for target in usable:
        if target.cpu == host.cpu:
            return target
    if usable:
        return usable[0]
    raise ArtifactError(unrunnable(artifact, targets, host))


def unrunnable(artifact: str, targets: Sequence[TargetEntry], host: Host) -> str:
    """Why no target of `artifact` runs on `host`: one line naming each target and what keeps it off this host."""
    return f"{artifact}: no target for this host ({host.describe()}); the artifact has: {_list(targets, host)}"


def _list(targets: Sequence[TargetEntry], host: Host) -> str:
    """One entry per target: its id, triple, cpu and what keeps it from this host."""
    if not targets:
        return "no targets"
    entries = []
    for target in targets:
        if not isinstance(target, CpuTargetEntry):
            entries.append(f"{target.id!r} (None, cpu None: kind {target.kind!r} is not cpu)")
            continue
        if arch_of(target.triple) != host.arch:
            why = f"arch {arch_of(target.triple)} is not {host.arch}"
        elif not host.known:
            why = "LLVM can't read this host's CPU features"
        else:
            why = "host lacks " + ",".join(missing_features(target.requires, host))
        entries.append(f"{target.id!r} ({target.triple}, cpu {target.cpu}: {why})")
    return "; ".join(entries)
