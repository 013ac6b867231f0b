"""The target registry: every backend farm can build for, found by the kind a target names (`cpu:...`,
`opencl:...`).

A backend brings what is particular to its kind of device: how its targets are written on the command line and in
JSON, its renderer (loop IR -> source text) and its compile step (spec + target -> bytes, a pure function); the
runtime keeps each kind's loader (farm.runtime.LOADERS). Its farm queue is named by the farm's task messages
(farm.distributed.task_messages), and its part of an artifact is assembled by farm.build.parts. A third backend
is one more class here and one more part there.

Imports of the compilers and drivers stay inside the methods, so that parsing a target or loading an artifact
never loads what another backend needs (pyopencl on a CPU-only host), and a submitting client needs neither them
nor the IR (numpy) to name targets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, Union

from farm.backends.llvm.target import CpuTarget
from farm.backends.opencl.target import OpenClTarget
from farm.defaults import MAX_TARGETS
from farm.errors import BadInputError

if TYPE_CHECKING:
    from farm.ir.specs import KernelSpec

Target = Union[CpuTarget, OpenClTarget]
TargetT = TypeVar("TargetT", CpuTarget, OpenClTarget)
"""The one kind of target a backend takes."""


@dataclass(frozen=True)
class Devices:
    """What `--target` resolves against: the OpenCL devices there are (this host's, or the farm's live workers'),
    asked for only when a target needs them, and where they are, for messages."""

    where: str
    opencl_fingerprints: Callable[[], list[str]]


class Backend(ABC, Generic[TargetT]):
    """One kind of device. `kind` is the prefix of its targets (`--target KIND[:...]`) and its runtime device."""

    kind: ClassVar[str]
    target_type: ClassVar[type[CpuTarget] | type[OpenClTarget]]
    usage: ClassVar[str]

    @abstractmethod
    def resolve(self, rest: str, devices: Devices) -> list[Target]:
        """The targets `KIND:rest` names (`rest` may be empty)."""

    def target_from_json(self, data: dict[str, Any]) -> Target:
        return self.target_type.from_json(data)

    @abstractmethod
    def render(self, spec: KernelSpec, target: TargetT) -> str:
        """The kernel's source text for the target (LLVM IR, OpenCL C)."""

    @abstractmethod
    def compile_kernel(self, spec: KernelSpec, target: TargetT) -> bytes:
        """The kernel's compiled bytes for the target: the pure compile step that local and farm builds call."""


class CpuBackend(Backend[CpuTarget]):
    """CPUs: LLVM IR through llvmlite, object files linked into one shared library per target."""

    kind = "cpu"
    target_type = CpuTarget
    usage = "cpu (this host), cpu:TRIPLE or cpu:TRIPLE:CPU[:FEATURES]"

    def resolve(self, rest: str, devices: Devices) -> list[Target]:
        from farm.backends.llvm.target import parse_target

        return [parse_target(f"cpu:{rest}")]

    def render(self, spec: KernelSpec, target: CpuTarget) -> str:
        from farm.backends.llvm.kernel import kernel_ir

        return kernel_ir(spec, target)

    def compile_kernel(self, spec: KernelSpec, target: CpuTarget) -> bytes:
        from farm.backends.llvm.kernel import compile_cpu_kernel

        return compile_cpu_kernel(spec, target)


class OpenClBackend(Backend[OpenClTarget]):
    """OpenCL devices: OpenCL C, a program binary per kernel per device fingerprint, built where the device is."""

    kind = "opencl"
    target_type = OpenClTarget
    usage = "opencl (every OpenCL device) or opencl:FINGERPRINT"

    def resolve(self, rest: str, devices: Devices) -> list[Target]:
        available = devices.opencl_fingerprints()
        chosen = [rest] if rest else available
        if not chosen or any(fp not in available for fp in chosen):
            raise BadInputError(
                f"--target opencl{':' + rest if rest else ''}: no such OpenCL device "
                f"{devices.where} (found: {available or 'none'})"
            )
        return [OpenClTarget(fp) for fp in chosen]

    def render(self, spec: KernelSpec, target: OpenClTarget) -> str:
        from farm.backends.opencl.kernel import kernel_source

        return kernel_source(spec)

    def compile_kernel(self, spec: KernelSpec, target: OpenClTarget) -> bytes:
        from farm.backends.opencl.kernel import compile_cl_kernel

        return compile_cl_kernel(spec, target.fingerprint)


BACKENDS: dict[str, Backend] = {backend.kind: backend for backend in (CpuBackend(), OpenClBackend())}


def backend_of(target: Target) -> Backend:
    return BACKENDS[target.kind]


def backend_named(kind: str, what: str = "backend", error: type[BadInputError] = BadInputError) -> Backend:
    """The backend of `kind`, or `error` naming the kinds there are."""
    if kind not in BACKENDS:
        raise error(f"unknown {what} {kind!r}: expected {' or '.join(repr(k) for k in BACKENDS)}")
    return BACKENDS[kind]


def check_target_count(targets: Sequence[Target]) -> list[Target]:
    """`targets`, or BadInputError when they are more than MAX_TARGETS (the artifact would be refused)."""
    if len(targets) > MAX_TARGETS:
        raise BadInputError(f"more than {MAX_TARGETS} targets named: an artifact holds at most {MAX_TARGETS}")
    return list(targets)


def parse_targets(texts: Sequence[str], devices: Devices) -> list[Target]:
    """The targets `--target` options name, each once, in order; none means this host's CPU."""
    from farm.backends.llvm.target import host_target

    targets: list[Target] = []
    for text in texts:
        kind, _, rest = text.partition(":")
        if kind not in BACKENDS:
            usages = "; ".join(backend.usage for backend in BACKENDS.values())
            raise BadInputError(f"unknown target {text!r}: expected {usages}")
        targets += [t for t in BACKENDS[kind].resolve(rest, devices) if t not in targets]
    return check_target_count(targets) or [host_target()]


def target_from_json(data: Any) -> Target:
    """A target from its JSON form, or BadInputError: job records and messages carry them across the farm."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise BadInputError(f"not a target: {data!r}")
    try:
        target = backend_named(data["kind"], "target kind").target_from_json(data)
    except (KeyError, TypeError) as error:
        raise BadInputError(f"{data['kind']} target lacks {error}: {str(data)[:200]}") from None
    if data.get("id", target.id) != target.id:
        raise BadInputError(f"target {data.get('id')!r} does not match its fields (id {target.id!r})")
    return target
