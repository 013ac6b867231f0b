"""The OpenCL part of a build: every kernel's source, a program binary per kernel per device, the weights and the
schedule, so that the runtime can go cache -> shipped binary -> parallel source build and never build serially."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from farm.backends.opencl.kernel import compile_cl_kernel, kernel_launches, kernel_source
from farm.build.executor import Job
from farm.ir.specs import KernelSpec
from farm.ops import argument_bytes
from farm.plan.planner import BuildPlan, for_target

OPENCL_TARGET_ID = "opencl"


def opencl_kernels(plan: BuildPlan) -> list[KernelSpec]:
    """The plan's distinct kernels, specialised for OpenCL (one source serves every device)."""
    return [for_target(spec, OPENCL_TARGET_ID) for spec in plan.kernels().values()]


def binary_jobs(plan: BuildPlan, fingerprints: Sequence[str]) -> list[Job]:
    """One job per kernel per device: its program binary, built where that device is."""
    return [Job(f"opencl/{fp}/{spec.symbol}", compile_cl_kernel, (spec, fp))
            for fp in fingerprints for spec in opencl_kernels(plan)]


def opencl_layout(plan: BuildPlan, fingerprints: Sequence[str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's `opencl` section and its source members (binaries and weights are added by the caller)."""
    kernels, members = [], {}
    for spec in opencl_kernels(plan):
        members[f"opencl/source/{spec.symbol}.cl"] = kernel_source(spec).encode()
        kernels.append({"symbol": spec.symbol, "source": f"opencl/source/{spec.symbol}.cl",
                        "launches": [[name, list(size)] for name, size in kernel_launches(spec)],
                        "arguments": argument_bytes(spec),
                        "binaries": {fp: binary_member(fp, spec.symbol) for fp in fingerprints}})
    section = {"devices": list(fingerprints), "kernels": kernels, "schedule": _schedule(plan),
               "buffers": dict(sorted(plan.memory.sizes.items())),
               "blobs": {sha: f"weights/{sha}.bin" for sha in sorted(plan.blobs)}}
    return section, members


def binary_member(fingerprint: str, symbol: str) -> str:
    return f"opencl/{fingerprint}/{symbol}.bin"


def opencl_part(plan: BuildPlan, fingerprints: Sequence[str],
                run: Callable[[list[Job]], list[bytes]]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's `opencl` section and the artifact members it names, binaries built by `run`."""
    section, members = opencl_layout(plan, fingerprints)
    members.update({f"weights/{sha}.bin": data.tobytes() for sha, data in plan.blobs.items()})
    jobs = binary_jobs(plan, fingerprints)
    members.update({f"{job.name}.bin": binary for job, binary in zip(jobs, run(jobs))})
    return section, members


def _schedule(plan: BuildPlan) -> list[dict[str, Any]]:
    """Each node's kernel and arguments, in order (the kernel's entry lists its launches and argument sizes)."""
    return [{"node": step.node, "kernel": for_target(step.spec, OPENCL_TARGET_ID).symbol,
             "args": [f"{arg.kind}:{arg.name}" for arg in step.args]} for step in plan.steps]
