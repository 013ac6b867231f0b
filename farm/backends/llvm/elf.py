"""ELF files read by hand, every offset and size bounds-checked: the bytes may come from an artifact or a cache
entry anyone could have written, and dlopen (or LLVM's object reader) trusts its input.

Two readers use it: the runtime checks which symbols a library defines before it loads it
(farm.runtime.manifest.check_library), and the link step checks which sections an object holds before it links
it (farm.backends.llvm.link: no load-time code) and which symbols the library it linked imports (only what every
process has: link.ALLOWED_IMPORTS).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from farm.errors import ArtifactError, FarmError

SYMTAB, DYNSYM = 2, 11
"""sh_type of the link-time symbol table and of the dynamic one."""

STB_LOCAL = 0
"""The binding (st_info's high nibble) of a symbol no other object sees."""


@dataclass(frozen=True)
class Layout:
    """Where an ELF class keeps the fields read here."""

    word: str  # the format of an address-sized field
    section_table_at: int  # e_shoff
    section_entry_at: int  # e_shentsize, then e_shnum and e_shstrndx
    section_bytes: int  # the size of one section header
    section_format: str  # a section header up to sh_entsize
    symbol_format: str  # (name, info, other, shndx) of a symbol, in the class's order
    symbol_bytes: int


LAYOUTS = {
    1: Layout("I", 0x20, 0x2E, 40, "IIIIIIIIII", "I8xBBH", 16),
    2: Layout("Q", 0x28, 0x3A, 64, "IIQQQQIIQQ", "IBBH16x", 24),
}
"""ELF32 and ELF64. A section header's fields: name, type, flags, addr, offset, size, link, info, align, entsize."""


@dataclass(frozen=True)
class Section:
    name: str
    kind: int
    offset: int
    size: int
    link: int


def _unpack(data: bytes | mmap.mmap, fmt: str, offset: int, what: str, error: type[FarmError]) -> tuple[int, ...]:
    if offset < 0 or offset + struct.calcsize(fmt) > len(data):
        raise error(f"the {what} lies outside the file")
    return struct.unpack_from(fmt, data, offset)


def _header(data: bytes | mmap.mmap, error: type[FarmError]) -> tuple[Layout, str]:
    if len(data) < 0x40 or data[:4] != b"\x7fELF" or data[4] not in LAYOUTS or data[5] not in (1, 2):
        raise error("not an ELF object")
    return LAYOUTS[data[4]], "<" if data[5] == 1 else ">"


def sections(data: bytes | mmap.mmap, error: type[FarmError] = ArtifactError) -> list[Section]:
    """Every section of an ELF file (32- or 64-bit, either byte order), named; `error` for anything malformed. A
    memory map is read in place (a copy of a 2.7 GB library took 2 s), other buffers are copied into bytes."""
    data = data if isinstance(data, (bytes, mmap.mmap)) else bytes(data)
    layout, order = _header(data, error)
    (table,) = _unpack(data, order + layout.word, layout.section_table_at, "section table", error)
    entry, count, names_index = _unpack(data, order + "HHH", layout.section_entry_at, "section table", error)
    if entry != layout.section_bytes or count == 0 or names_index >= count:
        raise error("malformed ELF object: bad section table")
    headers = [
        _unpack(data, order + layout.section_format, table + i * entry, "section header", error) for i in range(count)
    ]
    names_at, names_size = headers[names_index][4], headers[names_index][5]
    if names_at + names_size > len(data):
        raise error("malformed ELF object: the section names lie outside the file")
    names = data[names_at : names_at + names_size]
    return [Section(_string(names, header[0]), header[1], header[4], header[5], header[6]) for header in headers]


def _string(table: bytes, at: int) -> str:
    return table[at : table.find(b"\0", at)].decode("ascii", "replace") if 0 <= at < len(table) else ""


@dataclass(frozen=True)
class Symbol:
    name: str
    defined: bool  # st_shndx is not SHN_UNDEF: the file defines it rather than imports it
    local: bool  # binding STB_LOCAL: no other object sees it


def symbols(data: bytes | mmap.mmap, table: int = SYMTAB, error: type[FarmError] = ArtifactError) -> list[Symbol]:
    """Every symbol in the file's tables of type `table` (SYMTAB: the link-time table; DYNSYM: what the dynamic
    loader resolves and exports), the null symbol included; `error` for anything malformed."""
    layout, order = _header(data, error)
    found = sections(data, error)
    listed: list[Symbol] = []
    for section in (s for s in found if s.kind == table):
        if section.link >= len(found):
            raise error("malformed ELF object: a symbol table names no string table")
        strings = data[found[section.link].offset : found[section.link].offset + found[section.link].size]
        end = section.offset + section.size - layout.symbol_bytes + 1
        for at in range(section.offset, end, layout.symbol_bytes):
            name_at, info, _, index = _unpack(data, order + layout.symbol_format, at, "symbol table", error)
            listed.append(Symbol(_string(strings, name_at), index != 0, info >> 4 == STB_LOCAL))
    return listed


def defined_symbols(data: bytes | mmap.mmap) -> set[str]:
    """The names of the symbols `data` (a 64-bit ELF file, or a memory map of one) defines in its .symtab (local
    ones included)."""
    if data[4:5] != b"\x02":
        raise ArtifactError("the library is not a 64-bit ELF file")
    return {symbol.name for symbol in symbols(data) if symbol.defined}


def imported_symbols(data: bytes | mmap.mmap, error: type[FarmError] = ArtifactError) -> set[str]:
    """The names a shared library leaves for the dynamic loader to find elsewhere: its undefined dynamic symbols."""
    return {symbol.name for symbol in symbols(data, DYNSYM, error) if not symbol.defined and symbol.name}
