"""Atomic file writes: a temporary file in the target's folder, then os.replace, so no reader sees a partial file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(
    path: str | os.PathLike[str], data: bytes | memoryview, *, fsync: bool = False, mode: int = 0o644
) -> None:
    """Write `data` to `path` (with `mode`); a failure leaves neither `path` changed nor a temporary file behind."""
    stream_atomically(path, lambda file: file.write(data), fsync=fsync, mode=mode)


def stream_atomically(
    path: str | os.PathLike[str],
    write: Callable[[BinaryIO], object],
    *,
    fsync: bool = False,
    check: Callable[[str], object] | None = None,
    mode: int = 0o644,
) -> None:
    """Have `write(file)` fill a temporary file beside `path` (with `mode`), then `check(temporary path)` (which may
    raise) and os.replace it onto `path`, which thus never has another mode: bytes too big to hold in memory are
    written as they stream. Any failure leaves neither `path` changed nor a temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            if fsync:
                file.flush()
                os.fsync(file.fileno())
        if check is not None:
            check(temp)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
