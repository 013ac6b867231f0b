"""The names a shared library defines, read from its ELF symbol table without loading it.

dlopen runs code and trusts the file, so the runtime reads the symbol table first to cross-check the library
against the manifest (farm.runtime.manifest.check_library): a library of another model or target defines other
kernels. Every offset and size is bounds-checked; anything malformed is an ArtifactError.
"""

from __future__ import annotations

import struct

from farm.errors import ArtifactError

_SYMTAB, _SYMBOL_BYTES, _SECTION_BYTES = 2, 24, 64


def _unpack(data: bytes, fmt: str, offset: int, what: str) -> tuple[int, ...]:
    if offset < 0 or offset + struct.calcsize(fmt) > len(data):
        raise ArtifactError(f"the library's {what} lies outside the file")
    return struct.unpack_from(fmt, data, offset)


def defined_symbols(data: bytes) -> set[str]:
    """The names of the symbols `data` (a 64-bit ELF file) defines in its .symtab (local ones included)."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] not in (1, 2):
        raise ArtifactError("the library is not a 64-bit ELF file")
    order = "<" if data[5] == 1 else ">"
    section_table, = _unpack(data, order + "Q", 0x28, "section table")
    entry_size, count = _unpack(data, order + "HH", 0x3A, "section table")
    if entry_size != _SECTION_BYTES:
        raise ArtifactError("the library's section headers have an unexpected size")
    sections = [_unpack(data, order + "IIQQQQIIQQ", section_table + i * _SECTION_BYTES, "section header")
                for i in range(count)]
    names: set[str] = set()
    for header in sections:
        if header[1] != _SYMTAB:
            continue
        offset, size, link = header[4], header[5], header[6]
        if link >= len(sections):
            raise ArtifactError("the library's symbol table names no string table")
        strings_at, strings_size = sections[link][4], sections[link][5]
        strings = data[strings_at:strings_at + strings_size]
        for at in range(offset, offset + size - _SYMBOL_BYTES + 1, _SYMBOL_BYTES):
            name_at, _, _, section = _unpack(data, order + "IBBH", at, "symbol table")
            if section != 0 and name_at < len(strings):
                names.add(strings[name_at:strings.find(b"\0", name_at)].decode("ascii", "replace"))
    return names
