"""The names of store refs: the compile cache, the tuning database and the artifact cache, in one place.

A ref is a small named pointer to a content key. Each name holds everything its value depends on (the spec key
holds farm's codegen version, the op, attributes, shapes and target), so a ref never points at a stale entry.
"""

from __future__ import annotations


def kernel(spec_key: str) -> str:
    """A CPU kernel's object (the spec key names the target)."""
    return f"kernel:{spec_key}"


def blob(spec_key: str) -> str:
    """A weight blob's object (the spec key names the target and the packing)."""
    return f"blob:{spec_key}"


def opencl_binary(fingerprint: str, spec_key: str) -> str:
    """A kernel's program binary for one OpenCL device class (one source serves every device)."""
    return f"clkernel:{fingerprint}:{spec_key}"


def tuning_record(cpu_id: str, kernel_key: str) -> str:
    """A kernel's tuning record for one CPU class."""
    return f"tune:{cpu_id}:{kernel_key}"


def artifact(build_identity: str) -> str:
    """A whole build's artifact (farm.build.assembly.build_identity)."""
    return f"artifact:{build_identity}"
