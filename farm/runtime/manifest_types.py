"""A checked manifest as frozen values, so that the runtime and `farm inspect` read attributes, not string keys.

`farm.runtime.manifest.check_manifest` checks a manifest's JSON and then builds its `Manifest` here (`from_json`
assumes the checks passed: it reads every field they bound, with the same defaults). Lists become tuples and
objects read-only mappings. Each target's and schedule step's whole JSON object is kept too (`json_object`): a
loaded model hands those to its caller as they were (`Model.target`, `Model.schedule`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Union

DEFAULT_ENTRY = "farm_run"
"""The entry point of a CPU target whose manifest entry names none."""
DEFAULT_ALIGNMENT = 64
POINTER_BYTES = 8
"""Bytes of an address in the arena: a weight's in the table after it, an input's pointer slot
(farm.plan.memory.INPUT_POINTERS)."""
"""The memory plan's alignment when the manifest gives none."""


@dataclass(frozen=True, slots=True)
class TensorSlot:
    """A model input or output: its name, static shape, dtype name (a key of manifest.DTYPE_BYTES) and offset in
    the arena; an input's pointer slot (farm.plan.memory.INPUT_POINTERS), None in artifacts built before inputs were
    read in place."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    pointer: int | None = None


@dataclass(frozen=True, slots=True)
class PlannedBuffer:
    """One buffer of the memory plan: its offset in the arena and its size."""

    offset: int
    bytes: int


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """The arena: its size, the alignment its buffers keep, its buffers."""

    arena_bytes: int
    alignment: int = DEFAULT_ALIGNMENT
    buffers: tuple[PlannedBuffer, ...] = ()


@dataclass(frozen=True, slots=True)
class Launch:
    """One launch of a CPU target's schedule, in farm_launch's numbering: its extent, the grain its ranges are cut
    at, and its work (launching.work)."""

    extent: int
    grain: int
    work: int


@dataclass(frozen=True, slots=True)
class CpuTargetEntry:
    """A CPU target as its manifest entry gives it: its id, LLVM triple, CPU and features, every feature its code
    may use (`requires`), its library member and entry points, its launches (None in libraries without
    farm_launch), its weight members and where their table starts. `json_object` is the JSON object as written."""

    id: str
    triple: str
    cpu: str
    features: str = ""
    requires: tuple[str, ...] = ()
    library: str = ""
    entry: str = DEFAULT_ENTRY
    launch_entry: str | None = None
    work_entry: str | None = None
    serve_entry: str | None = None
    post_entry: str | None = None
    launches: tuple[Launch, ...] | None = None
    weights: tuple[str, ...] = ()
    weights_offset: int = 0
    json_object: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    kind: ClassVar[str] = "cpu"

    @classmethod
    def from_json(cls, target: Mapping[str, Any], arena_bytes: int = 0) -> CpuTargetEntry:
        """The checked entry `target` of a manifest whose arena has `arena_bytes` (where the weight table starts
        unless the entry says)."""
        launches = target.get("launches")
        return cls(
            id=target["id"],
            triple=target["triple"],
            cpu=target["cpu"],
            features=target["features"],
            requires=tuple(target["requires"]),
            library=target["library"],
            entry=target.get("entry", DEFAULT_ENTRY),
            launch_entry=target.get("launch_entry"),
            work_entry=target.get("work_entry"),
            serve_entry=target.get("serve_entry"),
            post_entry=target.get("post_entry"),
            launches=None if launches is None else tuple(Launch(*launch) for launch in launches),
            weights=tuple(target.get("weights", [])),
            weights_offset=target.get("weights_offset", arena_bytes),
            json_object=target,
        )


@dataclass(frozen=True, slots=True)
class OtherTargetEntry:
    """A target of another kind than cpu in the manifest's `targets`: only its id and kind are read."""

    id: str
    kind: str


TargetEntry = Union[CpuTargetEntry, OtherTargetEntry]


def target_from_json(target: Mapping[str, Any], arena_bytes: int = 0) -> TargetEntry:
    """A checked entry of the manifest's `targets`, typed by its kind."""
    if target["kind"] == CpuTargetEntry.kind:
        return CpuTargetEntry.from_json(target, arena_bytes)
    return OtherTargetEntry(target["id"], target["kind"])


@dataclass(frozen=True, slots=True)
class KernelEntry:
    """A kernel of a CPU target: the schedule's name for it, the target's id and its symbol in the library."""

    kernel: str
    target: str
    symbol: str


@dataclass(frozen=True, slots=True)
class BlobEntry:
    """A weight of the model: the sha256 of its bytes, how many bytes it has and its symbol."""

    sha256: str
    bytes: int
    symbol: str


@dataclass(frozen=True, slots=True)
class ScheduleStep:
    """A step of the CPU schedule: the kernel it runs. `json_object` is the JSON object as written (node, op,
    args)."""

    kernel: str
    json_object: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class OpenClLaunch:
    """One launch of an OpenCL kernel: the program's kernel function and its global size (1-3 dimensions)."""

    name: str
    size: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpenClKernel:
    """An OpenCL kernel: its symbol, its source member, a binary member per device fingerprint, its launches and
    the byte size of each of its arguments (`arguments`: the buffers a source build runs its launches on)."""

    symbol: str
    source: str
    binaries: Mapping[str, str]
    launches: tuple[OpenClLaunch, ...]
    arguments: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpenClStep:
    """A step of the OpenCL schedule: its kernel's symbol and arguments ("blob:<sha256>" or a buffer's name).
    `json_object` is the JSON object as written."""

    kernel: str
    args: tuple[str, ...]
    json_object: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class OpenClPart:
    """The manifest's OpenCL part: each buffer's size, each weight's member by its sha256, the kernels, the schedule
    and the fingerprints of the device classes it was built for (`devices`)."""

    buffers: Mapping[str, int]
    blobs: Mapping[str, str]
    kernels: tuple[OpenClKernel, ...]
    schedule: tuple[OpenClStep, ...]
    devices: tuple[str, ...]

    @classmethod
    def from_json(cls, part: Mapping[str, Any]) -> OpenClPart:
        """The checked OpenCL part `part`."""
        return cls(
            buffers=MappingProxyType(dict(part["buffers"])),
            blobs=MappingProxyType(dict(part.get("blobs", {}))),
            kernels=tuple(
                OpenClKernel(
                    symbol=kernel["symbol"],
                    source=kernel["source"],
                    binaries=MappingProxyType(dict(kernel.get("binaries", {}))),
                    launches=tuple(OpenClLaunch(name, tuple(size)) for name, size in kernel["launches"]),
                    arguments=tuple(kernel["arguments"]),
                )
                for kernel in part["kernels"]
            ),
            schedule=tuple(OpenClStep(step["kernel"], tuple(step["args"]), step) for step in part["schedule"]),
            devices=tuple(part["devices"]),
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """One size's checked manifest, as the runtime reads it: the model's sha256, the memory plan, the inputs and
    outputs, the CPU targets, their kernels and schedule, the weight blobs and the OpenCL part (None without
    one)."""

    model_sha256: str
    memory_plan: MemoryPlan
    inputs: tuple[TensorSlot, ...]
    outputs: tuple[TensorSlot, ...]
    targets: tuple[TargetEntry, ...]
    kernels: tuple[KernelEntry, ...] = ()
    schedule: tuple[ScheduleStep, ...] = ()
    blobs: tuple[BlobEntry, ...] = ()
    opencl: OpenClPart | None = None

    @classmethod
    def from_json(cls, manifest: Mapping[str, Any]) -> Manifest:
        """The checked manifest `manifest` (farm.runtime.manifest.check_manifest) as frozen values."""
        plan = manifest["memory_plan"]
        memory_plan = MemoryPlan(
            arena_bytes=plan["arena_bytes"],
            alignment=plan.get("alignment", DEFAULT_ALIGNMENT),
            buffers=tuple(PlannedBuffer(buffer["offset"], buffer["bytes"]) for buffer in plan.get("buffers", [])),
        )
        return cls(
            model_sha256=manifest["model"]["sha256"],
            memory_plan=memory_plan,
            inputs=_slots(manifest["inputs"]),
            outputs=_slots(manifest["outputs"]),
            targets=tuple(target_from_json(target, memory_plan.arena_bytes) for target in manifest["targets"]),
            kernels=tuple(
                KernelEntry(entry["kernel"], entry["target"], entry["symbol"]) for entry in manifest.get("kernels", [])
            ),
            schedule=tuple(ScheduleStep(step["kernel"], step) for step in manifest.get("schedule", [])),
            blobs=tuple(BlobEntry(blob["sha256"], blob["bytes"], blob["symbol"]) for blob in manifest.get("blobs", [])),
            opencl=OpenClPart.from_json(manifest["opencl"]) if "opencl" in manifest else None,
        )

    @property
    def cpu_targets(self) -> tuple[CpuTargetEntry, ...]:
        """The targets of kind cpu, in the manifest's order."""
        return tuple(target for target in self.targets if isinstance(target, CpuTargetEntry))


def _slots(entries: list[Mapping[str, Any]]) -> tuple[TensorSlot, ...]:
    return tuple(
        TensorSlot(entry["name"], tuple(entry["shape"]), entry["dtype"], entry["offset"], entry.get("pointer"))
        for entry in entries
    )
