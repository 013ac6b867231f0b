"""pack_blob: weight bytes in, an object file that defines them as one 64-byte aligned hidden symbol out.

LLVM writes every blob object; no C compiler is involved. For the host's architecture, LLVM assembles a module
made only of module-level assembly that `.incbin`s the raw bytes, which runs near disk speed (a C char array
through cc managed about 1 MB/s here, an IR constant about 18-30 MB/s). llvmlite only initialises the host's
assembly parser, so other architectures get the bytes as an IR constant: slower, but still LLVM and still exact.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import llvmlite.binding as llvm
import numpy as np

from farm.backends.llvm.gemm import pack_panels
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


def _scratch_dir() -> str | None:
    """Memory-backed /dev/shm when the machine has it (the bytes only pass through), else the default temp dir."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _pack_incbin(symbol: str, target: CpuTarget, data: bytes) -> bytes:
    with tempfile.TemporaryDirectory(prefix="farm-blob-", dir=_scratch_dir()) as folder:
        path = os.path.join(folder, "blob.bin")
        with open(path, "wb") as file:
            file.write(data)
        return compile_ir(module_asm_ir(target, blob_assembly(symbol, path, len(data))), target, f"blob {symbol}",
                          optimize=False)


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
    """`incbin` where llvmlite can assemble for the target (the host's architecture), else `ir-constant`."""
    init_llvm()
    return "incbin" if target.arch == llvm.get_process_triple().split("-")[0] else "ir-constant"


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
    """The float32 tensor in the Gemm's panel layout (spec.panels = rows, m, k per block)."""
    rows, m, k = spec.panels
    if m * k == 0 or spec.nbytes % (4 * m * k):
        raise BuildError(f"blob {spec.symbol}: {spec.nbytes} bytes are not float32 blocks of {m} x {k}")
    tensor = np.frombuffer(data, dtype=np.float32).reshape(-1, m, k)
    return memoryview(pack_panels(tensor, rows)).cast("B")
