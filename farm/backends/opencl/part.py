"""The OpenCL backend's part of a build: every kernel's source, a program binary per kernel per device, the weights
and the schedule, so the runtime goes cache -> shipped binary -> parallel source build and never builds serially;
the manifest's `opencl` section.

It sits above the build's core (farm.build.units, farm.build.parts), which finds it by name: `PART`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from farm.artifact import Member
from farm.backends.opencl.target import OpenClTarget
from farm.build.parts import BuiltUnits, Part, weights_member
from farm.build.units import CompileUnit, UnitKindTraits, compile_kernel
from farm.ir.specs import KernelSpec
from farm.ir.unit_kinds import UnitKind
from farm.plan.planner import BuildPlan, for_target
from farm.store import refs

UNIT_KINDS: dict[UnitKind, UnitKindTraits] = {
    UnitKind.CL_KERNEL: UnitKindTraits(
        "OpenCL kernel",
        KernelSpec,
        compile_kernel,
        lambda spec, target: refs.opencl_binary(target.fingerprint, spec.key),
    ),
}


def opencl_kernels(plan: BuildPlan) -> list[KernelSpec]:
    """The plan's distinct kernels, specialised for OpenCL (one source, and one symbol, serves every device)."""
    from farm.backends.opencl.target import SPEC_TARGET_ID

    return [for_target(spec, SPEC_TARGET_ID) for spec in plan.kernels().values()]


def binary_member(fingerprint: str, symbol: str) -> str:
    return f"opencl/{fingerprint}/{symbol}.bin"


class OpenClPart(Part[OpenClTarget]):
    kind = "opencl"
    unit_kinds = UNIT_KINDS

    def units(self, plan: BuildPlan, targets: Sequence[OpenClTarget]) -> list[CompileUnit]:
        return [CompileUnit(UnitKind.CL_KERNEL, spec, t) for t in targets for spec in opencl_kernels(plan)]

    def layout(self, plan: BuildPlan, targets: Sequence[OpenClTarget], units: Sequence[CompileUnit]) -> dict[str, Any]:
        from farm.backends.opencl.kernel import kernel_source

        return {
            "sources": {f"opencl/source/{spec.symbol}.cl": kernel_source(spec) for spec in opencl_kernels(plan)},
            "binaries": {binary_member(_fingerprint(unit), unit.spec.symbol): unit.name for unit in units},
            "weights": {weights_member(sha): sha for sha in sorted(plan.blobs)},
        }

    def manifest_fields(self, plan: BuildPlan, targets: Sequence[OpenClTarget]) -> dict[str, Any]:
        from farm.backends.opencl.kernel import kernel_launches
        from farm.ops import argument_bytes

        fingerprints = [t.fingerprint for t in targets]
        kernels = [
            {
                "symbol": spec.symbol,
                "spec": spec.to_json(),
                "source": f"opencl/source/{spec.symbol}.cl",
                "launches": [[name, list(size)] for name, size in kernel_launches(spec)],
                "arguments": argument_bytes(spec),
                "binaries": {fp: binary_member(fp, spec.symbol) for fp in fingerprints},
            }
            for spec in opencl_kernels(plan)
        ]
        return {
            "opencl": {
                "devices": fingerprints,
                "kernels": kernels,
                "schedule": _opencl_schedule(plan),
                "buffers": dict(sorted(plan.memory.sizes.items())),
                "blobs": {sha: weights_member(sha) for sha in sorted(plan.blobs)},
            }
        }

    def assemble(
        self, layout: dict[str, Any], manifest: dict[str, Any], built: BuiltUnits
    ) -> tuple[dict[str, Any], dict[str, Member]]:
        members = {member: source.encode() for member, source in layout["sources"].items()}
        members.update({member: built.object_of(name) for member, name in layout["binaries"].items()})
        members.update({member: built.blob_of(sha) for member, sha in layout["weights"].items()})
        return {}, members

    def nodes_of(self, manifest: dict[str, Any], unit: CompileUnit) -> list[str]:
        return [step["node"] for step in manifest["opencl"]["schedule"] if step["kernel"] == unit.spec.symbol]

    def names_targets(self, manifest: dict[str, Any], targets: Sequence[OpenClTarget]) -> bool:
        part = manifest.get("opencl")
        devices = part.get("devices") if isinstance(part, dict) else []
        return devices == [t.fingerprint for t in targets]


def _fingerprint(unit: CompileUnit) -> str:
    """The device fingerprint of an OpenCL unit (assembly gives a part only the units of its kind)."""
    assert isinstance(unit.target, OpenClTarget), f"unit {unit.name} is not an OpenCL one"
    return unit.target.fingerprint


def _opencl_schedule(plan: BuildPlan) -> list[dict[str, Any]]:
    """Each node's kernel and arguments, in order (the kernel's entry lists its launches and argument sizes)."""
    from farm.backends.opencl.target import SPEC_TARGET_ID

    return [
        {
            "node": step.node,
            "kernel": for_target(step.spec, SPEC_TARGET_ID).symbol,
            "args": [f"{arg.kind}:{arg.name}" for arg in step.args],
        }
        for step in plan.steps
    ]


PART = OpenClPart()
