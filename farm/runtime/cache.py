"""The on-disk cache of native libraries, and the record of which artifact files have been verified.

dlopen needs a file: each library is kept once, named by its sha256, under <cache root>/runtime/. Hashing is what
made loads slow (a 434 MB BERT-base artifact: 2.7 s every time), so each piece of work is done once per cache
entry instead of once per load:

- an artifact file is verified (every member's sha256) once per identity: its manifest's sha256 with the
  file's path, device, inode, size and modification time. A file rewritten in place, replaced or moved gets
  another identity and is verified again; a marker under runtime/verified/ records each verified identity.
- a cached library is written once, atomically, from bytes checked against the manifest; beside it, a marker
  records the size, inode and modification time it had when written. A later load trusts a library whose stat
  still matches its marker and rewrites one that doesn't (a damaged or replaced file). The cache is the user's
  own folder: silent corruption of a file's bytes that leaves its stat as it was is not detected.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from farm import defaults
from farm.atomic import stream_atomically, write_atomically


def runtime_folder(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """<cache root>/runtime/: the cache root is `cache_dir`, or FARM_CACHE_DIR's default."""
    return Path(cache_dir if cache_dir is not None else defaults.cache_dir()) / "runtime"


def _stamp(path: Path) -> dict[str, int] | None:
    """What a file's stat says of its identity and contents; None when there is no such file."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return {"device": found.st_dev, "inode": found.st_ino, "size": found.st_size, "mtime_ns": found.st_mtime_ns}


def _marker_holds(marker: Path, expected: Mapping[str, object]) -> bool:
    try:
        return json.loads(marker.read_text()) == expected
    except (OSError, ValueError):
        return False


def _verified_marker(folder: Path, artifact: str, manifest_sha256: str) -> tuple[Path, dict[str, object]] | None:
    stamp = _stamp(Path(artifact))
    if stamp is None:
        return None
    identity = {"path": os.path.abspath(artifact), "manifest": manifest_sha256, **stamp}
    name = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return folder / "verified" / name, identity


def is_verified(artifact: str, manifest_sha256: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether this artifact file, as it is now, was verified by an earlier load (see the module docstring)."""
    found = _verified_marker(runtime_folder(cache_dir), artifact, manifest_sha256)
    return found is not None and _marker_holds(*found)


def mark_verified(artifact: str, manifest_sha256: str, cache_dir: str | os.PathLike[str] | None = None) -> None:
    """Record that every member of this artifact file, as it is now, matched its manifest."""
    found = _verified_marker(runtime_folder(cache_dir), artifact, manifest_sha256)
    if found is not None:
        marker, identity = found
        write_atomically(marker, json.dumps(identity, sort_keys=True).encode())


def cached_library(sha256: str, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """<cache root>/runtime/<sha256>.so when it is there and its stat still matches the marker written with it;
    None when it must be written (again: store_library)."""
    folder = runtime_folder(cache_dir)
    target = folder / f"{sha256}.so"
    stamp = _stamp(target)
    return target if stamp is not None and _marker_holds(folder / f"{sha256}.so.stat", stamp) else None


def check_mapped(path: str | os.PathLike[str], check: Callable[[mmap.mmap], object]) -> None:
    """`check(a read-only memory map of the file at path)`: only the pages it reads are read."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        check(mapped)


def store_library(
    sha256: str,
    write: Callable[[BinaryIO], object],
    check: Callable[[mmap.mmap], object],
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Make <cache root>/runtime/<sha256>.so: `write(file)` streams the library's bytes into a temporary file
    (raising when they don't match `sha256`), `check(memory map of it)` may refuse it, then os.replace puts it in
    place (a concurrent loader never dlopens a partial library) and the marker of its stat follows. Nothing is
    left behind on a failure, and the library is never held in memory whole."""
    folder = runtime_folder(cache_dir)
    target = folder / f"{sha256}.so"
    missing = [path for path in (folder.parent, folder) if not path.exists()]

    try:
        stream_atomically(target, write, check=lambda temp: check_mapped(temp, check))
    except BaseException:
        for path in reversed(missing):  # the folders this call made, so a refused library leaves no trace
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    write_atomically(folder / f"{sha256}.so.stat", json.dumps(_stamp(target), sort_keys=True).encode())
    return target
