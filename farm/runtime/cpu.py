"""The CPU backend's loader: the artifact's shared library for this host, from the runtime cache, under ctypes."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from farm import defaults
from farm.artifact import Artifact, open_artifact
from farm.errors import ArtifactError
from farm.runtime.cache import cached_library, check_mapped, is_verified, mark_verified, store_library
from farm.runtime.host import choose_target, this_host
from farm.runtime.manifest import check_library, check_sizes
from farm.runtime.model import Model
from farm.runtime.sized import SizedModel


def load_library_model(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None,
                       threads: int) -> Model | SizedModel:
    """Verify the artifact (every member's sha256, once per artifact file: farm.runtime.cache), choose this host's
    target and load its library from the cache, writing it there first when it is not (see farm.runtime.load).
    A second load of the same file hashes nothing: it reads the manifest, checks the library's symbols through a
    memory map, dlopens the cached file (code alone) and maps the artifact's weight members (map_weights). An
    artifact of several sizes loads every size's library (a SizedModel; the sizes share the mapped weights)."""
    artifact = open_artifact(path)
    sizes = check_sizes(artifact.path, artifact.manifest)
    host = this_host()
    if not any(size["targets"] for _, size in sizes) and all(size.get("opencl") for _, size in sizes):
        raise ArtifactError(f"{artifact.path}: the artifact has no CPU target, only OpenCL programs: run it with "
                            f"--device opencl (runtime.load(..., device='opencl')), or build it with --target cpu too")
    targets = [choose_target(size["targets"], host, artifact.path) for _, size in sizes]
    manifest_sha256 = hashlib.sha256(artifact.manifest_text).hexdigest()
    verified = is_verified(artifact.path, manifest_sha256, cache_dir)
    cached = [cached_library(artifact.manifest["members"][target["library"]], cache_dir) for target in targets]
    if not verified:  # libraries' bytes are checked as they are copied below, when the cache lacks them
        artifact.verify(skip=tuple(target["library"] for target, file in zip(targets, cached) if file is None))
    libraries = [_library(artifact, size, target, file, cache_dir)
                 for (_, size), target, file in zip(sizes, targets, cached)]
    if not verified:
        mark_verified(artifact.path, manifest_sha256, cache_dir)
    addresses, mapped = map_weights(artifact, sorted({m for target in targets for m in target.get("weights", [])}))
    count = defaults.cpu_count() if threads == 0 else threads
    models = [Model(artifact.path, size, target, library, count,
                    [addresses[member] for member in target.get("weights", [])], mapped)
              for (_, size), target, library in zip(sizes, targets, libraries)]
    if len(models) == 1:
        return models[0]
    return SizedModel(artifact.path, [(pins, model) for (pins, _), model in zip(sizes, models)])


def _library(artifact: Artifact, manifest: dict[str, Any], target: dict[str, Any], library_file: Path | None,
             cache_dir: str | os.PathLike[str] | None) -> ctypes.CDLL:
    """The target's library, loaded from the runtime cache (copied there first, its bytes checked as they are,
    when `library_file` is None), once its symbols are checked against the manifest."""
    check = functools.partial(check_library, artifact.path, manifest, target)
    if library_file is None:
        library_file = store_library(artifact.manifest["members"][target["library"]],
                                     functools.partial(artifact.copy_member, target["library"]), check, cache_dir)
    else:
        check_mapped(library_file, check)
    try:
        return ctypes.CDLL(str(library_file))
    except OSError as error:
        raise ArtifactError(f"{artifact.path}: can't load target {target.get('id')!r} library: {error}") from None


def map_weights(artifact: Artifact, members: list[str]) -> tuple[dict[str, int], np.ndarray | None]:
    """The address of each weight member in a read-only memory map of the artifact file (checked: every member's
    sha256 was verified for this file, see load_library_model), and the map, which must outlive their use. Nothing
    is copied: the OS reads a weight's pages when a kernel first touches them, and shares them between processes.
    A tar member's data starts at a multiple of 512 bytes, so every weight is 64-byte aligned for the kernels."""
    if not members:
        return {}, None
    with open(artifact.path, "rb") as file:
        view = np.frombuffer(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    base = view.ctypes.data
    return {name: base + artifact.member_place(name)[0] for name in members}, view
