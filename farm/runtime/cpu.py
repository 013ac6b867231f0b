"""The CPU backend's loader: the artifact's shared library for this host, from the runtime cache, under ctypes."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os

import numpy as np

from farm import defaults
from farm.artifact import Artifact, open_artifact
from farm.errors import ArtifactError
from farm.runtime.cache import cached_library, check_mapped, is_verified, mark_verified, store_library
from farm.runtime.host import choose_target, this_host
from farm.runtime.manifest import check_library, check_manifest
from farm.runtime.model import Model


def load_library_model(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None,
                       threads: int) -> Model:
    """Verify the artifact (every member's sha256, once per artifact file: farm.runtime.cache), choose this host's
    target and load its library from the cache, writing it there first when it is not (see farm.runtime.load).
    A second load of the same file hashes nothing: it reads the manifest, checks the library's symbols through a
    memory map, dlopens the cached file (code alone) and maps the artifact's weight members (map_weights)."""
    artifact = open_artifact(path)
    check_manifest(artifact.path, artifact.manifest)
    target = choose_target(artifact.manifest["targets"], this_host(), artifact.path)
    manifest_sha256 = hashlib.sha256(artifact.manifest_text).hexdigest()
    verified = is_verified(artifact.path, manifest_sha256, cache_dir)
    library_sha256 = artifact.manifest["members"][target["library"]]
    library_file = cached_library(library_sha256, cache_dir)
    if not verified:  # the library's bytes are checked as they are copied below, when the cache lacks them
        artifact.verify(skip=(target["library"],) if library_file is None else ())
    check = functools.partial(check_library, artifact.path, artifact.manifest, target)
    if library_file is None:
        library_file = store_library(library_sha256, functools.partial(artifact.copy_member, target["library"]),
                                     check, cache_dir)
    else:
        check_mapped(library_file, check)
    if not verified:
        mark_verified(artifact.path, manifest_sha256, cache_dir)
    try:
        library = ctypes.CDLL(str(library_file))
    except OSError as error:
        raise ArtifactError(f"{artifact.path}: can't load target {target.get('id')!r} library: {error}") from None
    addresses, mapped = map_weights(artifact, target.get("weights", []))
    return Model(artifact.path, artifact.manifest, target, library,
                 defaults.cpu_count() if threads == 0 else threads, addresses, mapped)


def map_weights(artifact: Artifact, members: list[str]) -> tuple[list[int], np.ndarray | None]:
    """The address of each weight member in a read-only memory map of the artifact file (checked: every member's
    sha256 was verified for this file, see load_library_model), and the map, which must outlive their use. Nothing
    is copied: the OS reads a weight's pages when a kernel first touches them, and shares them between processes.
    A tar member's data starts at a multiple of 512 bytes, so every weight is 64-byte aligned for the kernels."""
    if not members:
        return [], None
    with open(artifact.path, "rb") as file:
        view = np.frombuffer(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    base = view.ctypes.data
    return [base + artifact.member_place(name)[0] for name in members], view
