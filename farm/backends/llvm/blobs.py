"""pack_blob: weight bytes in, an object file that defines them as one 64-byte aligned hidden symbol out.

LLVM writes every blob object; no C compiler is involved. For the host's architecture, LLVM assembles a module
made only of module-level assembly that `.incbin`s the raw bytes, which runs near memory speed (a C char array
through cc managed about 1 MB/s here, an IR constant about 18-30 MB/s). llvmlite only initialises the host's
assembly parser, so other architectures get the bytes as an IR constant: slower, but still LLVM and still exact.

The bytes `.incbin` reads live in an anonymous memory file (memfd) of this process, named to the assembler as
/proc/self/fd/N: it has no name in any folder, so a packing process that aborts or is killed leaves nothing behind
(the kernel frees the memory with the process), and the path in the assembly is always farm's own. Older versions
wrote `farm-blob-*` folders in /dev/shm or the temp folder; sweep_stale_scratch removes what their crashes left.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

from farm.backends.llvm.gemm import pack_operand
from farm.backends.llvm.target import CpuTarget, init_llvm
from farm.backends.llvm.toolchain import compile_ir
from farm.errors import BuildError
from farm.ir.specs import BlobSpec

BLOB_ALIGNMENT = 64
_HEX_ESCAPES = np.array([f"\\{value:02X}".encode() for value in range(256)], dtype="S3")


def blob_assembly(symbol: str, path: str, nbytes: int) -> str:
    """ELF assembly for a hidden, 64-byte aligned, read-only symbol holding the file at `path`."""
    return "\n".join([
        f'.section .rodata.{symbol},"a",@progbits',
        f".p2align {BLOB_ALIGNMENT.bit_length() - 1}",
        f".globl {symbol}",
        f".hidden {symbol}",
        f".type {symbol},@object",
        f".size {symbol}, {nbytes}",
        f"{symbol}:",
        f'.incbin "{path}"',
        "",
    ])


def module_asm_ir(target: CpuTarget, assembly: str) -> str:
    """LLVM IR text of a module made of module-level assembly only (llvmlite.ir cannot express `module asm`)."""
    lines = [f'target triple = "{target.triple}"']
    for line in assembly.splitlines():
        escaped = line.replace("\\", "\\5C").replace('"', "\\22")
        lines.append(f'module asm "{escaped}"')
    return "\n".join(lines) + "\n"


def _pack_incbin(symbol: str, target: CpuTarget, data: bytes) -> bytes:
    """The blob assembled from an anonymous memory file: nothing to clean up, whatever happens to this process."""
    descriptor = os.memfd_create("farm-blob", os.MFD_CLOEXEC)
    try:
        with open(descriptor, "wb", closefd=False) as file:
            file.write(data)
        path = f"/proc/self/fd/{descriptor}"
        return compile_ir(module_asm_ir(target, blob_assembly(symbol, path, len(data))), target, f"blob {symbol}",
                          optimize=False)
    finally:
        os.close(descriptor)


def _incbin_possible() -> bool:
    """Anonymous memory files and /proc/self/fd to name them (Linux): the incbin packer's scratch."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


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


def _pack_ir_constant(symbol: str, target: CpuTarget, data: bytes) -> bytes:
    escaped = _HEX_ESCAPES[np.frombuffer(data, np.uint8)].tobytes().decode("ascii")
    text = (f'target triple = "{target.triple}"\n'
            f'@{symbol} = hidden constant [{len(data)} x i8] c"{escaped}", '
            f'section ".rodata.{symbol}", align {BLOB_ALIGNMENT}\n')
    return compile_ir(text, target, f"blob {symbol}", optimize=False)


BLOB_PACKERS: dict[str, Callable[[str, CpuTarget, bytes], bytes]] = {
    "incbin": _pack_incbin,
    "ir-constant": _pack_ir_constant,
}


def packer_for(target: CpuTarget) -> str:
    """`incbin` where llvmlite can assemble for the target (the host's architecture) and the bytes can live in an
    anonymous memory file (Linux), else `ir-constant`."""
    init_llvm()
    host_arch = target.arch == llvm.get_process_triple().split("-")[0]
    return "incbin" if host_arch and _incbin_possible() else "ir-constant"


def pack_blob(spec: BlobSpec, target: CpuTarget, data: bytes | memoryview) -> bytes:
    """The object file defining `spec.symbol` as `data`, for `target`.

    The bytes are not hashed again here: the planner derived the spec from them, and the store checks every read.
    """
    if len(data) != spec.nbytes:
        raise BuildError(f"blob {spec.symbol}: {len(data)} bytes given, the spec says {spec.nbytes}")
    if spec.panels is not None:
        data = _packed(spec, data)
    return BLOB_PACKERS[packer_for(target)](spec.symbol, target, data)


def _packed(spec: BlobSpec, data: bytes | memoryview) -> memoryview:
    """The float32 tensor in the Gemm's panel layout (spec.panels: llvm_gemm.PANEL_LAYOUTS)."""
    if spec.nbytes % 4:
        raise BuildError(f"blob {spec.symbol}: {spec.nbytes} bytes are not float32 values")
    try:
        return memoryview(pack_operand(np.frombuffer(data, dtype=np.float32), spec.panels)).cast("B")
    except ValueError as error:
        raise BuildError(f"blob {spec.symbol}: {error}") from None
