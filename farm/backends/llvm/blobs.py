"""pack_weights: a weight's bytes in, the bytes a target's kernels read out: the float32 tensor pre-packed in the
panels of the Gemm that reads it (BlobSpec.panels), a pure function of (spec, target, bytes).

Weights never go through a compiler or the linker: they are members of the artifact, which the runtime maps into
memory and hands to the entry through its weight table (farm.build.parts.weights_offset). Until codegen 12 each
weight was an object file that LLVM assembled (`.incbin`) and ld.lld linked into the library: a 2.5 GiB model then
peaked at 5.06 GiB in ld.lld alone (it maps its inputs and writes its output), and linking BERT-base's 430 MB took
3.2 s on the job's critical path (docs/architecture.md, "Weights are artifact members").
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from farm.backends.llvm.packing import pack_operand
from farm.backends.llvm.target import CpuTarget
from farm.errors import BuildError
from farm.ir.specs import BlobSpec


def pack_weights(spec: BlobSpec, target: CpuTarget, data: bytes | memoryview) -> bytes:
    """The weight's bytes as `target`'s kernels read it: packed in panels when the spec says so, else as given.

    The bytes are not hashed again here: the planner derived the spec from them, and the store checks every read.
    """
    if len(data) != spec.nbytes:
        raise BuildError(f"weight {spec.symbol}: {len(data)} bytes given, the spec says {spec.nbytes}")
    if spec.panels is None:
        return bytes(data)
    return _packed(spec, spec.panels, data).tobytes()


STALE_SCRATCH_PREFIX = "farm-blob-"
STALE_SCRATCH_SECONDS = 300
"""An older version's `farm-blob-*` folder untouched this long is a crash's leftover: that version held one only
while it assembled one blob (seconds), so a younger one may still be in use by an older process on this host."""


def scratch_folders() -> list[Path]:
    """Where older versions put their blob scratch: /dev/shm and the temp folder."""
    return [Path("/dev/shm"), Path(tempfile.gettempdir())]


def sweep_stale_scratch(folders: Iterable[Path] | None = None, now: float | None = None) -> list[Path]:
    """Remove the `farm-blob-*` folders (default: in scratch_folders) that this user owns and that are
    STALE_SCRATCH_SECONDS old; returns what was removed. Symbolic links and other users' entries are left alone
    (never followed). Called when a worker or a local build starts, so leaked gigabytes don't outlive a restart."""
    now = time.time() if now is None else now
    removed = []
    for folder in scratch_folders() if folders is None else folders:
        for entry in _stale_entries(Path(folder), now):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _stale_entries(folder: Path, now: float) -> list[Path]:
    try:
        names = [name for name in os.listdir(folder) if name.startswith(STALE_SCRATCH_PREFIX)]
    except OSError:  # no such folder, or not ours to read
        return []
    return [folder / name for name in names if _is_stale_scratch(folder / name, now)]


def _is_stale_scratch(path: Path, now: float) -> bool:
    """A real folder of this user whose newest mtime (its own, or its blob.bin's) is STALE_SCRATCH_SECONDS old."""
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        newest = max([info.st_mtime, *(os.lstat(child).st_mtime for child in path.iterdir())])
    except OSError:  # gone meanwhile (its owner finished), or unreadable
        return False
    return now - newest >= STALE_SCRATCH_SECONDS


def _packed(spec: BlobSpec, panels: tuple[int, ...], data: bytes | memoryview) -> memoryview:
    """The float32 tensor in the Gemm's panel layout (spec.panels: farm.backends.llvm.packing.PANEL_LAYOUTS)."""
    if spec.nbytes % 4:
        raise BuildError(f"weight {spec.symbol}: {spec.nbytes} bytes are not float32 values")
    try:
        return pack_operand(np.frombuffer(data, dtype=np.float32), panels).data.cast("B")
    except ValueError as error:
        raise BuildError(f"weight {spec.symbol}: {error}") from None
