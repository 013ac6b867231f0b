"""What a backend adds to a build, as the build sees it: its compile units, what assembling its part needs (a JSON
layout, kept in the link plan), and its manifest fields and members once the units are built.

Each backend's part is `PART` in its folder's `part` module (farm/backends/<kind>/part.py: the CPU library and
weights, the OpenCL sources and binaries), found by name through the registry (`part_of`, `parts`), so the build
names no backend. `parts()` is in the registry's order, the order parts are assembled.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic

from farm.artifact import Member
from farm.backends.base import TargetT
from farm.backends.registry import BACKENDS
from farm.build.units import CompileUnit, UnitKindTraits
from farm.ir.unit_kinds import UnitKind
from farm.plan.planner import BuildPlan


def weights_member(sha256: str) -> str:
    """A weight as the model holds it (shared by every part: the OpenCL part and each CPU target that reads it unpacked)."""
    return f"weights/{sha256}.bin"


@dataclass(frozen=True)
class BuiltUnits:
    """How assembly reads what the units built: bytes and sha256 by unit name, libraries by target id, and
    weights by sha256 (in memory locally, from the store on the farm). A member may be a LazyMember, made as the
    artifact is written (a local build's packed weights). `entry_of`: a library's entry object, compiled here
    unless the farm's link plan step compiled it while the units did (None: compile it here). `sha256_of` is None where the farm's
    finishing worker has no cache ref of the object (the manifest's object_sha256 is null then)."""

    object_of: Callable[[str], Member]
    sha256_of: Callable[[str], str | None]
    library_of: Callable[[str], bytes]
    blob_of: Callable[[str], Member]
    entry_of: Callable[[dict[str, Any]], bytes] | None = None


class Part(ABC, Generic[TargetT]):
    """One backend's part. `always`: its manifest fields are written even when the build has none of its targets
    (a CPU-less build still lists `targets` and `kernels`, empty)."""

    kind: ClassVar[str]
    always: ClassVar[bool] = False
    unit_kinds: ClassVar[dict[UnitKind, UnitKindTraits]]
    """The kinds of compile unit this part builds, with what each is (farm.build.units.traits_of reads them)."""

    def start(self, targets: Sequence[TargetT]) -> None:
        """Start, in the background, what finishing this part will ask of `targets` (by default nothing)."""

    @abstractmethod
    def units(self, plan: BuildPlan, targets: Sequence[TargetT]) -> list[CompileUnit]:
        """The units this part needs built for `targets` (all of this part's kind)."""

    @abstractmethod
    def layout(self, plan: BuildPlan, targets: Sequence[TargetT], units: Sequence[CompileUnit]) -> dict[str, Any]:
        """JSON: everything assembling this part needs besides the built bytes."""

    @abstractmethod
    def manifest_fields(self, plan: BuildPlan, targets: Sequence[TargetT]) -> dict[str, Any]:
        """This part's manifest fields that are known before anything is built."""

    @abstractmethod
    def assemble(
        self, layout: dict[str, Any], manifest: dict[str, Any], built: BuiltUnits
    ) -> tuple[dict[str, Any], dict[str, Member]]:
        """This part's manifest fields completed with what was built (`manifest`: the template), and its members."""

    @abstractmethod
    def nodes_of(self, manifest: dict[str, Any], unit: CompileUnit) -> list[str]:
        """The ONNX nodes one of this part's units serves, as the manifest template names them."""

    @abstractmethod
    def names_targets(self, manifest: dict[str, Any], targets: Sequence[TargetT]) -> bool:
        """Whether an artifact's manifest was built for exactly these targets of this part's kind."""


def part_of(kind: str) -> Part:
    """The part of the backend of `kind`: `PART` in its folder's `part` module."""
    part = BACKENDS[kind].module("part").PART
    assert isinstance(part, Part) and part.kind == kind, f"{BACKENDS[kind].package}.part.PART is not {kind}'s part"
    return part


@functools.cache
def parts() -> dict[str, Part]:
    """Every backend's part, by kind, in the registry's order (the order parts are assembled)."""
    return {kind: part_of(kind) for kind in BACKENDS}
