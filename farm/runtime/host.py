"""Which of an artifact's targets this process can run: the host's LLVM triple, CPU name and enabled features."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm

from farm.errors import ArtifactError


@dataclass(frozen=True)
class Host:
    """The machine as LLVM sees it; `features` holds the names of enabled features, without the '+'."""

    triple: str
    cpu: str
    features: frozenset[str]

    @property
    def arch(self) -> str:
        return arch_of(self.triple)

    def describe(self) -> str:
        return f"{self.triple}, cpu {self.cpu}"


def arch_of(triple: str) -> str:
    """The architecture part of an LLVM triple ("x86_64" in "x86_64-unknown-linux-gnu")."""
    return triple.split("-", 1)[0]


def this_host() -> Host:
    """The running host. LLVM can't list features on some hosts; then only targets that require none will match."""
    try:
        feature_map = llvm.get_host_cpu_features()
    except RuntimeError:
        enabled: frozenset[str] = frozenset()
    else:
        enabled = frozenset(name for name, on in feature_map.items() if on)
    return Host(llvm.get_process_triple(), llvm.get_host_cpu_name(), enabled)


def missing_features(target: dict[str, Any], host: Host) -> list[str]:
    """The "+feature" entries of a target that the host lacks (its "-feature" entries never stop it running)."""
    wanted = [item.strip() for item in str(target.get("features", "")).split(",")]
    return [item for item in wanted if item.startswith("+") and item[1:] not in host.features]


def runs_on(target: dict[str, Any], host: Host) -> bool:
    """Whether `host` can run the CPU target (a manifest entry, or CpuTarget.to_json()): its arch, every feature it
    requires."""
    return (
        target.get("kind") == "cpu"
        and arch_of(str(target.get("triple", ""))) == host.arch
        and not missing_features(target, host)
    )


def choose_target(targets: Sequence[dict[str, Any]], host: Host, artifact: str) -> dict[str, Any]:
    """The CPU target to run on `host`: one built for its exact CPU if any, else the first compatible one.

    Raises ArtifactError naming every target and why it doesn't fit, so that the user knows what to rebuild for.
    """
    usable = [target for target in targets if runs_on(target, host)]
    for target in usable:
        if target.get("cpu") == host.cpu:
            return target
    if usable:
        return usable[0]
    raise ArtifactError(
        f"{artifact}: no target for this host ({host.describe()}); the artifact has: {_list(targets, host)}"
    )


def _list(targets: Sequence[dict[str, Any]], host: Host) -> str:
    """One entry per target: its id, triple, cpu and what keeps it from this host."""
    if not targets:
        return "no targets"
    entries = []
    for target in targets:
        if target.get("kind") != "cpu":
            why = f"kind {target.get('kind')!r} is not cpu"
        elif arch_of(str(target.get("triple", ""))) != host.arch:
            why = f"arch {arch_of(str(target.get('triple', '')))} is not {host.arch}"
        else:
            why = "host lacks " + ",".join(missing_features(target, host))
        entries.append(f"{target.get('id')!r} ({target.get('triple')}, cpu {target.get('cpu')}: {why})")
    return "; ".join(entries)
