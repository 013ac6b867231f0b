"""The on-disk cache of native libraries: dlopen needs a file, and one per content hash lets later loads reuse it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from farm import defaults
from farm.atomic import write_atomically


def _has_content(path: Path, sha256: str) -> bool:
    """Whether `path` exists with exactly the expected bytes; a damaged cached file must be replaced, not loaded."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    except FileNotFoundError:
        return False


def cached_library(data: bytes, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of a file under <cache root>/runtime/, named after the sha256 of `data`, holding `data`.

    The write goes to a temporary file then os.replace, so that a concurrent loader never dlopens a partial library;
    it is skipped when a file with that name and content is already there.
    """
    sha256 = hashlib.sha256(data).hexdigest()
    folder = Path(cache_dir if cache_dir is not None else defaults.cache_dir()) / "runtime"
    target = folder / f"{sha256}.so"
    if _has_content(target, sha256):
        return target
    write_atomically(target, data)
    return target
