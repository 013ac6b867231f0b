"""Atomic file writes: a temporary file in the target's folder, then os.replace, so no reader sees a partial file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes | memoryview, *, fsync: bool = False) -> None:
    """Write `data` to `path` (mode 0644); a failure leaves neither `path` changed nor a temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            if fsync:
                file.flush()
                os.fsync(file.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
