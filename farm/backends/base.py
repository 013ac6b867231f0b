"""What a backend is: the interface each kind of device implements in its own folder (farm/backends/<kind>/), and
what `--target` resolves against.

A backend brings everything particular to its kind of device: how its targets are written on the command line and
in JSON, its renderer (loop IR -> source text) and pure compile step (spec + target -> bytes), its farm queues and
what a worker advertises of it, and, in two modules of its folder that sit above the build and the runtime, its
part of a build (`<package>.part`: `PART`, its compile units and its part of the artifact) and its loader
(`<package>.loader`: `LOADER`). The build and the runtime find those two by the module name its `package` gives
(farm.build.parts.part_of, farm.runtime.loader_of), as tinygrad finds a device's `ops_<name>` module: so neither
names a backend, and the registry (farm.backends.registry) is the one list of them.

Imports of the compilers and drivers stay inside the methods, so that parsing a target or loading an artifact
never loads what another backend needs (pyopencl on a CPU-only host), and a submitting client needs neither them
nor the IR (numpy) to name targets.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from farm.ir.specs import KernelSpec


ANY_WORKER = "start one with 'farm worker'"
"""What serves a queue that every worker consumes, said when no live worker does."""

TargetT = TypeVar("TargetT")
"""The one kind of target a backend takes (each a frozen value with its `kind`, an `id` and a JSON form)."""


@dataclass(frozen=True)
class Devices:
    """What `--target KIND` resolves against: the ids of the devices of a kind there are (this host's, or the farm's
    live workers'), asked for only when a target needs them, and where they are, for messages."""

    where: str
    of_kind: Callable[[str], list[str]]


class Backend(ABC, Generic[TargetT]):
    """One kind of device. `kind` is the prefix of its targets (`--target KIND[:...]`), its runtime device
    (`farm run --device KIND`) and its key in a worker's capabilities; `package` is its folder's package;
    `queue_prefixes`: the names (or name prefixes) of its farm queues, which the farm's Redis users are granted."""

    kind: ClassVar[str]
    package: ClassVar[str]
    target_type: ClassVar[Any]
    usage: ClassVar[str]
    queue_prefixes: ClassVar[tuple[str, ...]]

    @abstractmethod
    def resolve(self, rest: str, devices: Devices) -> list[Any]:
        """The targets `KIND:rest` names (`rest` may be empty)."""

    def target_from_json(self, data: dict[str, Any]) -> Any:
        return self.target_type.from_json(data)

    @abstractmethod
    def render(self, spec: KernelSpec, target: TargetT) -> str:
        """The kernel's source text for the target (LLVM IR, OpenCL C)."""

    @abstractmethod
    def compile_kernel(self, spec: KernelSpec, target: TargetT) -> bytes:
        """The kernel's compiled bytes for the target: the pure compile step that local and farm builds call."""

    @abstractmethod
    def compile_queue(self, target: TargetT) -> str:
        """The farm queue the target's compile units go to."""

    @abstractmethod
    def served_by(self, target: TargetT) -> str:
        """What to start when no live worker consumes the target's compile queue (said by `farm submit`)."""

    @abstractmethod
    def host_capabilities(self) -> Any:
        """What a worker on this host advertises of this kind (JSON, under `kind` in its capabilities)."""

    @abstractmethod
    def queues_served(self, capabilities: Any) -> list[str]:
        """The queues of this kind a worker with these capabilities (its entry under `kind`) consumes."""

    @abstractmethod
    def device_ids(self, capabilities: Any) -> list[str]:
        """The ids that `--target KIND:ID` names the devices of these capabilities by."""

    def module(self, name: str) -> ModuleType:
        """The module `name` of this backend's folder (`part`, `loader`), imported on first use."""
        return importlib.import_module(f"{self.package}.{name}")

    def host_devices(self) -> list[str]:
        """The ids of this host's devices of the kind, as `--target KIND:ID` names them."""
        return self.device_ids(self.host_capabilities())
