"""Helpers for the codegen tests: render loop-IR kernels with real LLVM, link them with the real linker and call
`farm_run` through ctypes.

Every kernel symbol is hidden inside the library, so a test reaches a kernel through an entry (farm_run) whose
schedule passes pointers into one arena; `run_kernels` lays the buffers out in that arena and copies them back.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llvmlite import ir

from farm.backends.llvm.dot_products import DotProduct
from farm.backends.llvm.entry import compile_entry
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.gemm_outlining import Outlining
from farm.backends.llvm.link import link_library
from farm.backends.llvm.render import render_kernel
from farm.backends.llvm.target import CpuTarget, host_target, parse_target
from farm.backends.llvm.toolchain import compile_ir
from farm.ir import loopir as L

ARENA_ALIGN = 64
DEFAULT_BLOCKING = GemmBlocking()
_counter = itertools.count()


@functools.cache
def host() -> CpuTarget:
    return host_target()


@functools.cache
def aarch64() -> CpuTarget:
    return parse_target("cpu:aarch64-linux-gnu")


def kernel_module_ir(
    kernels: Sequence[tuple[str, L.LoopKernel]],
    target: CpuTarget,
    blocking: GemmBlocking = DEFAULT_BLOCKING,
    parts: int = 1,
    part: int | None = None,
    dot: DotProduct | None = None,
) -> str:
    """LLVM IR text of one module defining every (symbol, kernel): whole, or split into `parts`
    (gemm_outlining.Outlining), all of them or only `part`; IntGemms with `dot` (render_kernel's default: widening
    multiplies)."""
    module = ir.Module(name="test_kernels")
    module.triple = target.triple
    for symbol, kernel in kernels:
        render_kernel(module, symbol, kernel, blocking, Outlining(parts, part) if parts > 1 else None, dot)
    return str(module)


def compile_kernels(
    kernels: Sequence[tuple[str, L.LoopKernel]],
    target: CpuTarget | None = None,
    blocking: GemmBlocking = DEFAULT_BLOCKING,
    parts: int = 1,
    part: int | None = None,
    dot: DotProduct | None = None,
) -> bytes:
    target = target or host()
    return compile_ir(kernel_module_ir(kernels, target, blocking, parts, part, dot), target, "test kernels")


def layout(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """64-byte aligned arena offsets for `arrays`, and the arena's size."""
    offsets, size = [], 0
    for array in arrays:
        offsets.append(size)
        size += (array.nbytes + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN
    return offsets, max(size, ARENA_ALIGN)


def load_library(data: bytes, folder: Path) -> ctypes.CDLL:
    """Write a shared library under `folder` with a fresh name and dlopen it."""
    path = folder / f"lib{next(_counter)}.so"
    path.write_bytes(data)
    return ctypes.CDLL(str(path))


def call_farm_run(library: ctypes.CDLL, arena: np.ndarray) -> None:
    farm_run = library.farm_run
    farm_run.restype, farm_run.argtypes = None, [ctypes.c_void_p]
    farm_run(arena.ctypes.data)


def aligned_arena(size: int) -> np.ndarray:
    raw = np.zeros(size + ARENA_ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ARENA_ALIGN
    return raw[start : start + size]


def run_kernels(
    kernels: Sequence[tuple[L.LoopKernel, Sequence[np.ndarray]]],
    folder: Path,
    blocking: GemmBlocking = DEFAULT_BLOCKING,
    parts: int = 1,
    dot: DotProduct | None = None,
) -> list[list[np.ndarray]]:
    """Compile, link and run each kernel once (in order, in one farm_run) on its own copies of its arrays; with
    `parts`, the kernels split into that many objects (gemm_outlining.Outlining), each compiled on its own; IntGemms
    with `dot`.

    Returns, per kernel, its arrays as they are after the run (outputs written, inputs as given).
    """
    target = host()
    named = [(f"test_kernel_{index}", kernel) for index, (kernel, _) in enumerate(kernels)]
    all_arrays = [np.ascontiguousarray(a) for _, arrays in kernels for a in arrays]
    offsets, size = layout(all_arrays)
    schedule, position = [], 0
    for (symbol, kernel), (_, arrays) in zip(named, kernels):
        assert len(arrays) == len(kernel.params), "one array per kernel parameter"
        schedule.append({"kernel": symbol, "args": [["arena", offsets[position + i]] for i in range(len(arrays))]})
        position += len(arrays)
    objects = [
        compile_kernels(named, target, blocking, parts, part if parts > 1 else None, dot) for part in range(parts)
    ]
    library = load_library(link_library([*objects, compile_entry(schedule, target)], target), folder)
    arena = aligned_arena(size)
    for array, offset in zip(all_arrays, offsets):
        arena[offset : offset + array.nbytes] = array.view(np.uint8).reshape(-1)
    call_farm_run(library, arena)
    results, position = [], 0
    for _, arrays in kernels:
        results.append(
            [
                arena[offsets[position + i] : offsets[position + i] + a.nbytes].view(a.dtype).reshape(a.shape).copy()
                for i, a in enumerate(arrays)
            ]
        )
        position += len(arrays)
    return results


def run_kernel(
    kernel: L.LoopKernel,
    arrays: Sequence[np.ndarray],
    folder: Path,
    blocking: GemmBlocking = DEFAULT_BLOCKING,
    parts: int = 1,
    dot: DotProduct | None = None,
) -> list[np.ndarray]:
    """Compile, link and run one kernel on copies of `arrays` (one per parameter); the arrays after the run."""
    return run_kernels([(kernel, arrays)], folder, blocking, parts, dot)[0]


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", *args], capture_output=True, text=True, check=True).stdout


def elf_header(data: bytes) -> tuple[int, int, int]:
    """(EI_CLASS, EI_DATA, e_machine) of an ELF file's bytes."""
    assert data[:4] == b"\x7fELF", "not an ELF file"
    byteorder = "little" if data[5] == 1 else "big"
    return data[4], data[5], int.from_bytes(data[18:20], byteorder)


def elf_type(data: bytes) -> int:
    """e_type: 1 relocatable, 3 shared object."""
    return int.from_bytes(data[16:18], "little" if data[5] == 1 else "big")


EM_X86_64, EM_AARCH64 = 62, 183


# -- a minimal ELF64 little-endian reader (enough for section headers and symbol tables, for any e_machine) --------


@dataclass(frozen=True)
class ElfSection:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    addralign: int
    entsize: int


@dataclass(frozen=True)
class ElfSymbol:
    name: str
    value: int
    size: int
    type: str
    bind: str
    visibility: str
    section: str  # the defining section's name, "UND", "ABS" or "COMMON"


SHT_NOBITS = 8
_SYM_TYPES = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 3: "SECTION", 4: "FILE", 6: "TLS"}
_SYM_BINDS = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK"}
_VISIBILITIES = {0: "DEFAULT", 1: "INTERNAL", 2: "HIDDEN", 3: "PROTECTED"}


def _cstring(data: bytes, offset: int) -> str:
    return data[offset : data.index(b"\0", offset)].decode()


def elf_sections(data: bytes) -> list[ElfSection]:
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "expected a 64-bit little-endian ELF"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]
    return [
        ElfSection(i, _cstring(data, names_at + r[0]), r[1], r[2], r[4], r[5], r[6], r[8], r[9])
        for i, r in enumerate(raw)
    ]


def elf_section(data: bytes, name: str) -> ElfSection:
    matches = [s for s in elf_sections(data) if s.name == name]
    assert len(matches) == 1, f"{len(matches)} sections named {name!r}"
    return matches[0]


def elf_section_bytes(data: bytes, name: str) -> bytes:
    section = elf_section(data, name)
    assert section.type != SHT_NOBITS
    return data[section.offset : section.offset + section.size]


def elf_symbols(data: bytes, table: str = ".symtab") -> list[ElfSymbol]:
    sections = elf_sections(data)
    symtab = next(s for s in sections if s.name == table)
    strtab = sections[symtab.link]
    symbols = []
    for start in range(symtab.offset, symtab.offset + symtab.size, symtab.entsize):
        st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, start)
        where = {0: "UND", 0xFFF1: "ABS", 0xFFF2: "COMMON"}.get(st_shndx) or sections[st_shndx].name
        symbols.append(
            ElfSymbol(
                _cstring(data, strtab.offset + st_name),
                st_value,
                st_size,
                _SYM_TYPES.get(st_info & 0xF, str(st_info & 0xF)),
                _SYM_BINDS.get(st_info >> 4, str(st_info >> 4)),
                _VISIBILITIES[st_other & 3],
                where,
            )
        )
    return symbols


def elf_symbol(data: bytes, name: str, table: str = ".symtab") -> ElfSymbol:
    matches = [s for s in elf_symbols(data, table) if s.name == name]
    assert len(matches) == 1, f"{len(matches)} symbols named {name!r} in {table}"
    return matches[0]
