"""farm's runtime: load an artifact, pick the target built for this host and run it.

Nothing is loaded before every member's sha256 has been checked against the manifest.
"""

from __future__ import annotations

import ctypes
import os

from farm.artifact import open_artifact, verify
from farm.build.executor import default_workers as default_threads  # the CPUs this process may run on
from farm.errors import ArtifactError
from farm.runtime.cache import cached_library, default_cache_dir
from farm.runtime.host import choose_target, this_host
from farm.runtime.model import Model, TensorSpec

__all__ = ["Model", "TensorSpec", "default_cache_dir", "default_threads", "load"]


def load(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
         device: str = "cpu", threads: int = 0) -> Model:
    """Verify the artifact, choose this host's target and load its library from the cache (<cache_dir>/runtime/).

    `threads`: how many threads a CPU run may use; 0 (the default) means every CPU this process may run on, 1 runs
    the whole schedule in one native call (farm_run) on the calling thread.

    `device="opencl"` runs the artifact's OpenCL part on this host's OpenCL device instead (farm.runtime.opencl);
    that load reads every member it uses, each checked against its sha256 as it is read, so the artifact is
    opened without hashing it all twice.
    """
    if device == "opencl":
        from farm.runtime.opencl import OpenCLModel

        return OpenCLModel(open_artifact(path), cache_dir)
    artifact = verify(path)
    if device != "cpu":
        raise ArtifactError(f"unknown device {device!r}: expected 'cpu' or 'opencl'")
    targets = artifact.manifest.get("targets")
    if not isinstance(targets, list) or not all(isinstance(target, dict) for target in targets):
        raise ArtifactError(f"{artifact.path}: manifest 'targets' is not a list of objects")
    target = choose_target(targets, this_host(), artifact.path)
    member = target.get("library")
    if not isinstance(member, str):
        raise ArtifactError(f"{artifact.path}: target {target.get('id')!r} names no library member")
    library_file = cached_library(artifact.read_member(member), cache_dir)
    try:
        library = ctypes.CDLL(str(library_file))
    except OSError as error:
        raise ArtifactError(f"{artifact.path}: can't load target {target.get('id')!r} library: {error}") from None
    return Model(artifact.path, artifact.manifest, target, library,
                 default_threads() if threads == 0 else threads)
