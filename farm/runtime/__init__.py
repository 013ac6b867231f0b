"""farm's runtime: load an artifact, pick the target built for this host and run it.

Nothing is loaded before every member's sha256 has been checked against the manifest. Each backend brings its
loader (farm.backends.registry): the CPU library (farm.runtime.cpu) or the OpenCL programs (farm.runtime.opencl).
"""

from __future__ import annotations

import os

from farm.backends.registry import backend_named
from farm.errors import ArtifactError
from farm.runtime.model import Model, TensorSpec

__all__ = ["Model", "TensorSpec", "load"]


def load(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
         device: str = "cpu", threads: int = 0) -> Model:
    """Verify the artifact, choose this host's target and load its library from the cache (<cache_dir>/runtime/).

    `threads`: how many threads a CPU run may use; 0 (the default) means every CPU this process may run on, 1 runs
    the whole schedule in one native call (farm_run) on the calling thread.

    `device="opencl"` runs the artifact's OpenCL part on this host's OpenCL device instead (farm.runtime.opencl);
    that load reads every member it uses, each checked against its sha256 as it is read, so the artifact is
    opened without hashing it all twice.
    """
    return backend_named(device, "device", ArtifactError).load(path, cache_dir, threads)
