"""The CPU backend's loader: the artifact's shared library for this host, from the runtime cache, under ctypes."""

from __future__ import annotations

import ctypes
import os

from farm import defaults
from farm.artifact import verify
from farm.errors import ArtifactError
from farm.runtime.cache import cached_library
from farm.runtime.host import choose_target, this_host
from farm.runtime.manifest import check_library, check_manifest
from farm.runtime.model import Model


def load_library_model(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None,
                       threads: int) -> Model:
    """Verify every member, choose this host's target and load its library (see farm.runtime.load)."""
    artifact = verify(path)
    check_manifest(artifact.path, artifact.manifest)
    target = choose_target(artifact.manifest["targets"], this_host(), artifact.path)
    library_bytes = artifact.read_member(target["library"])
    check_library(artifact.path, artifact.manifest, target, library_bytes)
    library_file = cached_library(library_bytes, cache_dir)
    try:
        library = ctypes.CDLL(str(library_file))
    except OSError as error:
        raise ArtifactError(f"{artifact.path}: can't load target {target.get('id')!r} library: {error}") from None
    return Model(artifact.path, artifact.manifest, target, library,
                 defaults.cpu_count() if threads == 0 else threads)
