"""The CPU backend's loader: the artifact's shared library for this host, from the runtime cache, under ctypes."""

from __future__ import annotations

import ctypes
import os

from farm import defaults
from farm.artifact import verify
from farm.errors import ArtifactError
from farm.runtime.cache import cached_library
from farm.runtime.host import choose_target, this_host
from farm.runtime.model import Model


def load_library_model(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None,
                       threads: int) -> Model:
    """Verify every member, choose this host's target and load its library (see farm.runtime.load)."""
    artifact = verify(path)
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
                 defaults.cpu_count() if threads == 0 else threads)
