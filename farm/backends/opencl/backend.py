"""The OpenCL backend: OpenCL C, a program binary per kernel per device fingerprint, built where the device is.

A program binary is valid only for its exact device class, so each worker consumes `opencl.<fingerprint>` for each
OpenCL device it owns, and `--target opencl` means every device there is (this host's, or the farm's workers').
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from farm.backends.base import Backend, Devices
from farm.backends.opencl.target import OpenClTarget
from farm.errors import BadInputError

if TYPE_CHECKING:
    from farm.ir.specs import KernelSpec


def opencl_queue(fingerprint: str) -> str:
    """Program binaries for one OpenCL device class: only workers that own such a device."""
    return f"opencl.{fingerprint}"


class OpenClBackend(Backend[OpenClTarget]):
    kind = "opencl"
    package = "farm.backends.opencl"
    target_type = OpenClTarget
    usage = "opencl (every OpenCL device) or opencl:FINGERPRINT"
    queue_prefixes = (opencl_queue(""),)

    def resolve(self, rest: str, devices: Devices) -> list[Any]:
        available = devices.of_kind(self.kind)
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

    def compile_queue(self, target: OpenClTarget) -> str:
        return opencl_queue(target.fingerprint)

    def served_by(self, target: OpenClTarget) -> str:
        return f"start 'farm worker' on a host with OpenCL device {target.fingerprint}"

    def host_capabilities(self) -> list[dict[str, str]]:
        """This host's OpenCL devices, listed by a child process: a worker's pool forks, and a forked child of a
        process that started an OpenCL driver hangs at its first launch (farm.backends.opencl.devices)."""
        from farm.backends.opencl.devices import opencl_devices_of_a_fresh_process

        return opencl_devices_of_a_fresh_process()

    def queues_served(self, capabilities: list[dict[str, str]]) -> list[str]:
        """`opencl.<fingerprint>` for each device."""
        return [opencl_queue(fp) for fp in self.device_ids(capabilities)]

    def device_ids(self, capabilities: list[dict[str, str]]) -> list[str]:
        return [device["fingerprint"] for device in capabilities]

    def host_devices(self) -> list[str]:
        """This host's devices, listed in this process (a command that forks nothing may start the driver)."""
        from farm.backends.opencl.devices import opencl_devices

        return self.device_ids(opencl_devices())
