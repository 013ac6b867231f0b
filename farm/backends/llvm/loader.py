"""The CPU backend's loader: the artifact's shared library for this host, from the runtime cache, under ctypes (or,
for a target of another architecture, under emulation: farm.runtime.emulation). It sits above the runtime's core,
which finds it by name (farm.runtime.loader_of): `LOADER`."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from farm import defaults
from farm.artifact import Artifact, open_artifact
from farm.errors import ArtifactError
from farm.ir.shapes import PinnedShapes
from farm.runtime.cache import cached_library, check_mapped, is_verified, mark_verified, store_library
from farm.runtime.emulation import EmulatedModel, Emulator, emulator_for
from farm.runtime.host import this_host
from farm.runtime.manifest import check_library, check_sizes
from farm.runtime.manifest_types import CpuTargetEntry, Manifest
from farm.runtime.model import Model
from farm.runtime.selection import needs_emulation, select_target
from farm.runtime.sized import SizedModel


def load_library_model(
    path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None, threads: int, target: str | None = None
) -> Model | SizedModel | EmulatedModel:
    """Verify the artifact (every member's sha256, once per artifact file: farm.runtime.cache), choose the target
    (the one `target` names, else this host's: farm.runtime.selection) and take its library from the cache, writing
    it there first when it is not (see farm.runtime.load). A second load of the same file hashes nothing: it reads
    the manifest, checks the library's symbols through a memory map, and loads it. A target of this host's
    architecture is dlopened here (code alone), with the artifact's weight members mapped (map_weights); one of
    another architecture runs under emulation (an EmulatedModel), after the same checks. An artifact of several
    sizes loads every size's library (a SizedModel; the sizes share the mapped weights)."""
    artifact = open_artifact(path)
    sizes = check_sizes(artifact.path, artifact.manifest)
    host = this_host()
    if not any(size.targets for _, size in sizes) and all(size.opencl for _, size in sizes):
        raise ArtifactError(
            f"{artifact.path}: the artifact has no CPU target, only OpenCL programs: run it with "
            f"--device opencl (runtime.load(..., device='opencl')), or build it with --target cpu too"
        )
    targets = [select_target(size.targets, target, host, artifact.path) for _, size in sizes]
    emulator = emulator_for(targets[0], host, artifact.path) if needs_emulation(targets[0].triple, host) else None
    files = _library_files(artifact, [size for _, size in sizes], targets, cache_dir)
    if emulator is None:
        models: Sequence[Model | EmulatedModel] = _native_models(
            artifact, sizes, targets, files, defaults.cpu_count() if threads == 0 else threads
        )
    else:
        models = _emulated_models(artifact, sizes, targets, files, emulator, cache_dir)
    if len(models) == 1:
        return models[0]
    return SizedModel(artifact.path, [(pins, model) for (pins, _), model in zip(sizes, models)])


LOADER = load_library_model
"""The CPU backend's loader (farm.runtime.Loader)."""


def _library_files(
    artifact: Artifact,
    manifests: list[Manifest],
    targets: list[CpuTargetEntry],
    cache_dir: str | os.PathLike[str] | None,
) -> list[Path]:
    """Each size's chosen library in the runtime cache, every member of the artifact verified first (once per
    artifact file) and each library's symbols checked against its manifest."""
    manifest_sha256 = hashlib.sha256(artifact.manifest_text).hexdigest()
    verified = is_verified(artifact.path, manifest_sha256, cache_dir)
    cached = [cached_library(artifact.member_sha256(target.library), cache_dir) for target in targets]
    if not verified:  # libraries' bytes are checked as they are copied below, when the cache lacks them
        artifact.verify(skip=tuple(target.library for target, file in zip(targets, cached) if file is None))
    files = [
        _library_file(artifact, manifest, target, file, cache_dir)
        for manifest, target, file in zip(manifests, targets, cached)
    ]
    if not verified:
        mark_verified(artifact.path, manifest_sha256, cache_dir)
    return files


def _native_models(
    artifact: Artifact,
    sizes: list[tuple[PinnedShapes, Manifest]],
    targets: list[CpuTargetEntry],
    files: list[Path],
    threads: int,
) -> list[Model]:
    """Each size's library loaded into this process, its weights mapped from the artifact file."""
    addresses, mapped = map_weights(artifact, sorted({m for target in targets for m in target.weights}))
    return [
        Model(
            artifact.path,
            size,
            target,
            _loaded(artifact, target, file),
            threads,
            [addresses[member] for member in target.weights],
            mapped,
        )
        for (_, size), target, file in zip(sizes, targets, files)
    ]


def _emulated_models(
    artifact: Artifact,
    sizes: list[tuple[PinnedShapes, Manifest]],
    targets: list[CpuTargetEntry],
    files: list[Path],
    emulator: Emulator,
    cache_dir: str | os.PathLike[str] | None,
) -> list[EmulatedModel]:
    """Each size's library run under `emulator`, its weights given by their offsets in the artifact file (the
    emulated process maps it)."""
    driver = emulator.driver(cache_dir)
    return [
        EmulatedModel(
            artifact.path,
            size,
            target,
            file,
            [artifact.member_place(member)[0] for member in target.weights],
            emulator,
            driver,
        )
        for (_, size), target, file in zip(sizes, targets, files)
    ]


def _library_file(
    artifact: Artifact,
    manifest: Manifest,
    target: CpuTargetEntry,
    library_file: Path | None,
    cache_dir: str | os.PathLike[str] | None,
) -> Path:
    """The target's library in the runtime cache (copied there first, its bytes checked as they are, when
    `library_file` is None), once its symbols are checked against the manifest."""
    check = functools.partial(check_library, artifact.path, manifest, target)
    if library_file is None:
        return store_library(
            artifact.member_sha256(target.library),
            functools.partial(artifact.copy_member, target.library),
            check,
            cache_dir,
        )
    check_mapped(library_file, check)
    return library_file


def _loaded(artifact: Artifact, target: CpuTargetEntry, library_file: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(library_file))
    except OSError as error:
        raise ArtifactError(f"{artifact.path}: can't load target {target.id!r} library: {error}") from None


def map_weights(artifact: Artifact, members: list[str]) -> tuple[dict[str, int], np.ndarray | None]:
    """The address of each weight member in a read-only memory map of the artifact file (checked: every member's
    sha256 was verified for this file, see load_library_model), and the map, which must outlive their use. Nothing
    is copied: the OS reads a weight's pages when a kernel first touches them, and shares them between processes.
    A tar member's data starts at a multiple of 512 bytes, so every weight is 64-byte aligned for the kernels."""
    if not members:
        return {}, None
    with open(artifact.path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    _ask_for_huge_pages(mapped)
    view = np.frombuffer(mapped, dtype=np.uint8)
    base = view.ctypes.data
    return {name: base + artifact.member_place(name)[0] for name in members}, view


def _ask_for_huge_pages(mapped: mmap.mmap) -> None:
    """Ask the OS to back the map with 2 MB pages where it can (madvise MADV_HUGEPAGE; a no-op where the platform
    has none, or refuses): the kernels stream big weights once a run, and on 4 KB pages each page costs a page
    walk. Pages already cached as 2 MB folios (artifact.COPY_BYTES) are mapped so either way; the advice makes the
    pages read from disk later come in 2 MB folios too (VGG-19 read cold: 460 MB of 501 huge, against 395)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):
            mapped.madvise(advice)
