"""The names of store refs: the compile cache, the tuning database and the artifact cache, in one place.

A ref is a small named pointer to a content key. Each name holds everything its value depends on (the spec key
holds farm's codegen version, the op, attributes, shapes and target; the compiler key names the LLVM that writes
objects, farm.backends.llvm.toolchain), so a ref never points at a stale entry or at another toolchain's bytes.
"""

from __future__ import annotations


def kernel(compiler_key: str, spec_key: str) -> str:
    """A CPU kernel's object as one compiler built it (the spec key names the target)."""
    return f"kernel:{compiler_key}:{spec_key}"


def blob(compiler_key: str, spec_key: str) -> str:
    """A weight blob's object as one compiler built it (the spec key names the target and the packing)."""
    return f"blob:{compiler_key}:{spec_key}"


def entry(compiler_key: str, schedule_digest: str) -> str:
    """A CPU library's entry object (farm_run and its peers) as one compiler built it, by the digest of its schedule,
    target and weight-table offset (farm.build.parts.entry_ref)."""
    return f"entry:{compiler_key}:{schedule_digest}"


def opencl_binary(fingerprint: str, spec_key: str) -> str:
    """A kernel's program binary for one OpenCL device class (one source serves every device)."""
    return f"clkernel:{fingerprint}:{spec_key}"


def tuning_record(cpu_id: str, kernel_key: str) -> str:
    """A kernel's tuning record for one CPU class."""
    return f"tune:{cpu_id}:{kernel_key}"


def artifact(build_identity: str) -> str:
    """A whole build's artifact (farm.build.assembly.build_identity, which holds the toolchain key)."""
    return f"artifact:{build_identity}"
