"""compile_cl_kernel: a KernelSpec and a device fingerprint in, the device's program binary out.

It must run on a host that owns a device with that fingerprint (a program binary is only valid for the exact
platform, device, driver and build options the fingerprint hashes). pyopencl is imported lazily.
"""

from __future__ import annotations

import functools
from typing import Any

from farm.codegen.opencl_render import render_opencl
from farm.errors import BuildError
from farm.opencl_devices import BUILD_OPTIONS, device_info, fingerprint
from farm.ops import lower_kernel
from farm.specs import KernelSpec


def kernel_source(spec: KernelSpec) -> str:
    """The kernel's OpenCL C source (shipped in artifacts beside the binaries, for the runtime's source build)."""
    return render_opencl(spec.symbol, lower_kernel(spec))


@functools.cache
def device_context(device_fingerprint: str) -> tuple[Any, Any]:
    """(context, device) of this host's device with the fingerprint; BuildError when there is none."""
    import pyopencl as cl

    for platform in cl.get_platforms():
        for device in platform.get_devices():
            if fingerprint(device_info(platform, device)) == device_fingerprint:
                return cl.Context([device]), device
    raise BuildError(f"no OpenCL device with fingerprint {device_fingerprint} on this host")


def build_program(source: str, what: str, device_fingerprint: str) -> Any:
    """Build `source` for the device; a failure names `what` and the device and carries the build log."""
    import pyopencl as cl

    context, device = device_context(device_fingerprint)
    program = cl.Program(context, source)
    try:
        return program.build(options=BUILD_OPTIONS.split())
    except cl.RuntimeError:
        log = program.get_build_info(device, cl.program_build_info.LOG)
        raise BuildError(f"{what} failed to build on {device.name} ({device_fingerprint}):\n{log.strip()}") from None


def compile_cl_kernel(spec: KernelSpec, device_fingerprint: str) -> bytes:
    """The program binary of one kernel for one device."""
    import pyopencl as cl

    program = build_program(kernel_source(spec), f"kernel {spec.op} {spec.symbol}", device_fingerprint)
    return bytes(program.get_info(cl.program_info.BINARIES)[0])
