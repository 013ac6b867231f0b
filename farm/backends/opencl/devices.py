"""OpenCL devices of this host and their fingerprints; pyopencl is imported lazily (CPU-only hosts don't need it).

A program binary is only valid for the exact platform, device, driver and build options it was built with, so the
fingerprint hashes all of them; it names the device's queue (`opencl.<fingerprint>`) and keys its binaries.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from typing import Any

from farm.backends.opencl.child_python import module_command
from farm.errors import MissingPackageError
from farm.ir.keys import canonical_json

BUILD_OPTIONS = "-cl-std=CL1.2"


def fingerprint(info: dict[str, str]) -> str:
    return hashlib.sha256(canonical_json(info).encode()).hexdigest()[:16]


def device_info(platform: Any, device: Any) -> dict[str, str]:
    import pyopencl as cl

    return {
        "platform": platform.name,
        "platform_version": platform.version,
        "device": device.name,
        "vendor": device.vendor,
        "driver_version": device.driver_version,
        "opencl_c_version": device.get_info(cl.device_info.OPENCL_C_VERSION),
        "build_options": BUILD_OPTIONS,
    }


def opencl_platforms() -> list[Any]:
    """This host's OpenCL platforms; none where the ICD loader finds none (pyopencl raises LogicError
    PLATFORM_NOT_FOUND_KHR, a 35-line traceback for a user who only asked for --device opencl). MissingPackageError
    when pyopencl itself is missing (a client install)."""
    try:
        import pyopencl as cl
    except ImportError:
        raise MissingPackageError("pyopencl") from None
    try:
        return cl.get_platforms()
    except cl.Error:
        return []


def opencl_devices() -> list[dict[str, str]]:
    """Every OpenCL device pyopencl finds, with its fingerprint; empty without pyopencl or a platform."""
    try:
        platforms = opencl_platforms()
    except Exception:  # noqa: BLE001 - no ICD loader, no platform or no pyopencl all mean: no OpenCL here
        return []
    devices = []
    for platform in platforms:
        for device in platform.get_devices():
            info = device_info(platform, device)
            devices.append({**info, "fingerprint": fingerprint(info)})
    return devices


def opencl_devices_of_a_fresh_process() -> list[dict[str, str]]:
    """`opencl_devices()`, asked of a child process so that this one never starts an OpenCL driver.

    A process that will fork workers (Celery's prefork pool) must not: PoCL starts its device threads with the
    platform, a forked child has none of them, and its first kernel launch waits forever.
    """
    listing = subprocess.run(module_command("farm.backends.opencl.devices"), capture_output=True, text=True)
    return json.loads(listing.stdout) if listing.returncode == 0 else []


if __name__ == "__main__":
    print(json.dumps(opencl_devices()))
