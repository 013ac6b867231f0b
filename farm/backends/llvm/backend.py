"""The CPU backend: LLVM IR through llvmlite, object files linked into one shared library per target.

LLVM cross-compiles, so every worker consumes the `llvm` queue (CPU kernels, packed weights, links) whatever its
own CPU; timing kernel variants needs the very CPU class, so each worker also consumes `tune.<its cpu id>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from farm.backends.base import ANY_WORKER, Backend, Devices
from farm.backends.llvm.target import CpuTarget

if TYPE_CHECKING:
    from farm.ir.specs import KernelSpec

LLVM_QUEUE = "llvm"
"""CPU kernels, weight blobs and links: any worker (LLVM cross-compiles)."""


def tune_queue(cpu_id: str) -> str:
    """Timing kernel variants for one CPU class: only workers on such a CPU."""
    return f"tune.{cpu_id}"


class CpuBackend(Backend[CpuTarget]):
    kind = "cpu"
    package = "farm.backends.llvm"
    target_type = CpuTarget
    usage = "cpu (this host), cpu:TRIPLE or cpu:TRIPLE:CPU[:FEATURES]"
    queue_prefixes = (LLVM_QUEUE, tune_queue(""))

    def resolve(self, rest: str, devices: Devices) -> list[Any]:
        from farm.backends.llvm.target import parse_target

        return [parse_target(f"cpu:{rest}")]

    def render(self, spec: KernelSpec, target: CpuTarget) -> str:
        from farm.backends.llvm.kernel import kernel_ir

        return kernel_ir(spec, target)

    def compile_kernel(self, spec: KernelSpec, target: CpuTarget) -> bytes:
        from farm.backends.llvm.kernel import compile_cpu_kernel

        return compile_cpu_kernel(spec, target)

    def compile_queue(self, target: CpuTarget) -> str:
        return LLVM_QUEUE

    def served_by(self, target: CpuTarget) -> str:
        return ANY_WORKER

    def host_capabilities(self) -> dict[str, Any]:
        """This host's CPU: its triple, CPU name and features as LLVM detects them."""
        from farm.backends.llvm.target import host_target

        cpu = host_target()
        return {
            "id": cpu.id,
            "triple": cpu.triple,
            "cpu": cpu.cpu,
            "features": cpu.features,
            "simd_floats": cpu.simd_floats,
        }

    def queues_served(self, capabilities: dict[str, Any]) -> list[str]:
        """`llvm` (any host) and `tune.<cpu id>` (this CPU class)."""
        return [LLVM_QUEUE, tune_queue(self.device_ids(capabilities)[0])]

    def device_ids(self, capabilities: dict[str, Any]) -> list[str]:
        """The CPU's target id, made again from its fields (an advertised `id` is not trusted)."""
        return [CpuTarget(capabilities["triple"], capabilities["cpu"], capabilities["features"]).id]
