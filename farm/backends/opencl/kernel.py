"""compile_cl_kernel: a KernelSpec and a device fingerprint in, the device's program binary out.

It must run on a host that owns a device with that fingerprint (a program binary is only valid for the exact
platform, device, driver and build options the fingerprint hashes). pyopencl is imported lazily.

Some drivers finish compiling only at a kernel's first launch, for the launch's work-group geometry (PoCL
generates its work-group functions then: 0.05 s per kernel, seconds per model). Shapes are static here, so
`build_binary` runs every launch once on zeroed scratch buffers before it reads the binary, and the binary
carries the code for exactly the launches the runtime will make.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Union

from farm.backends.opencl.devices import BUILD_OPTIONS, device_info, fingerprint, opencl_platforms
from farm.backends.opencl.render import launches, render_opencl
from farm.errors import BuildError
from farm.ir.specs import KernelSpec
from farm.ops import argument_bytes, lower_kernel


def kernel_source(spec: KernelSpec) -> str:
    """The kernel's OpenCL C source (shipped in artifacts beside the binaries, for the runtime's source build)."""
    return render_opencl(spec.symbol, lower_kernel(spec))


@functools.cache
def device_context(device_fingerprint: str) -> tuple[Any, Any]:
    """(context, device) of this host's device with the fingerprint; BuildError when there is none."""
    import pyopencl as cl

    for platform in opencl_platforms():
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


Launch = Union[tuple[str, Sequence[int]], list[Any]]
"""(OpenCL kernel name, global size): as the lowering gives it, or as a manifest's JSON holds it ([name, size])."""


def kernel_launches(spec: KernelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(OpenCL kernel name, global size) of every launch that runs the kernel, in order."""
    return launches(spec.symbol, lower_kernel(spec))


def run_launches(program: Any, launch_list: Sequence[Launch], sizes: Sequence[int]) -> None:
    """Run every launch once on zeroed buffers of the given byte sizes (zeros keep any index argument in bounds)."""
    import pyopencl as cl

    context = program.get_info(cl.program_info.CONTEXT)
    queue = cl.CommandQueue(context)
    padded = [-(-max(int(size), 4) // 4) * 4 for size in sizes]  # fills go in whole 4-byte patterns
    buffers = [cl.Buffer(context, cl.mem_flags.READ_WRITE, size) for size in padded]
    for buffer, size in zip(buffers, padded):
        cl.enqueue_fill_buffer(queue, buffer, b"\0\0\0\0", 0, size)
    for name, global_size in launch_list:
        cl.Kernel(program, name)(queue, tuple(int(n) for n in global_size), None, *buffers)
    queue.finish()


def build_binary(
    source: str, what: str, device_fingerprint: str, launch_list: Sequence[Launch], sizes: Sequence[int]
) -> bytes:
    """Build `source`, run its launches once (see the module docstring) and return the program binary."""
    import pyopencl as cl

    program = build_program(source, what, device_fingerprint)
    run_launches(program, launch_list, sizes)
    return bytes(program.get_info(cl.program_info.BINARIES)[0])


def compile_cl_kernel(spec: KernelSpec, device_fingerprint: str) -> bytes:
    """The program binary of one kernel for one device, compiled for the kernel's launches."""
    return build_binary(
        kernel_source(spec),
        f"kernel {spec.op} {spec.symbol}",
        device_fingerprint,
        kernel_launches(spec),
        argument_bytes(spec),
    )
