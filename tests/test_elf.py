"""Tests of farm.backends.llvm.elf: the symbols of a real farm library, and refusals of files that are not ELF or lie."""

from __future__ import annotations

import struct
import tarfile

import onnx
import pytest

from farm.backends.llvm.elf import DYNSYM, defined_symbols, imported_symbols, sections, symbols
from farm.build.local import build_model
from farm.errors import ArtifactError
from farm.tools.examples import EXAMPLES


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    folder = tmp_path_factory.mktemp("tiny")
    onnx.save(EXAMPLES["tiny_cnn"](), str(folder / "tiny_cnn.onnx"))
    with tarfile.open(build_model(folder / "tiny_cnn.onnx", folder).artifact) as tar:
        member = next(info for info in tar.getmembers() if info.name.endswith(".so"))
        return tar.extractfile(member).read()  # type: ignore[union-attr]


def test_defined_symbols_of_a_farm_library(library: bytes) -> None:
    names = defined_symbols(library)
    assert {"farm_run", "farm_launch", "farm_work", "farm_run_steps"} <= names
    assert any(name.startswith("farm_k_") for name in names)
    assert "memcpy" not in names and "sched_yield" not in names, "undefined symbols are not defined ones"


@pytest.mark.parametrize("data", [b"", b"MZ" + bytes(100), b"\x7fELF\x01\x01" + bytes(100)])
def test_not_a_64_bit_elf_is_refused(data: bytes) -> None:
    with pytest.raises(ArtifactError, match="not a 64-bit ELF file"):
        defined_symbols(data)


def test_section_table_past_the_end_is_refused(library: bytes) -> None:
    lying = bytearray(library)
    struct.pack_into("<Q", lying, 0x28, len(library) + 4096)
    with pytest.raises(ArtifactError, match="outside the file"):
        defined_symbols(bytes(lying))


def test_sections_of_32_and_64_bit_objects_of_either_byte_order() -> None:
    """The link step reads the sections of every target's objects: ELF64 (x86-64, AArch64) and ELF32 (ARMv7)."""
    from farm.backends.llvm.target import CpuTarget
    from farm.backends.llvm.toolchain import compile_ir

    for triple in ("x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu", "armv7-unknown-linux-gnueabihf"):
        names = [s.name for s in sections(compile_ir("define void @k() { ret void }\n", CpuTarget(triple), "k"))]
        assert ".text" in names and ".symtab" in names and ".strtab" in names, (triple, names)


def test_imported_symbols_are_the_librarys_undefined_dynamic_ones(library: bytes) -> None:
    """What the dynamic loader must find elsewhere: farm_work's sched_yield (the link step allows nothing else that
    every process lacks: farm.backends.llvm.link.ALLOWED_IMPORTS), never what the library defines."""
    imported = imported_symbols(library)
    assert "sched_yield" in imported and "" not in imported
    assert not imported & defined_symbols(library)
    assert imported == {symbol.name for symbol in symbols(library, DYNSYM) if not symbol.defined} - {""}


def test_symbols_of_32_and_64_bit_objects_of_either_byte_order() -> None:
    """The link step names the object that calls an import it refuses, by the symbols each object defines."""
    from farm.backends.llvm.target import CpuTarget
    from farm.backends.llvm.toolchain import Pipeline, compile_ir

    ir = (
        "declare void @elsewhere()\ndefine void @k() { call void @elsewhere()\n ret void }\n"
        "define internal void @mine() { ret void }\n"
    )
    for triple in ("x86_64-unknown-linux-gnu", "aarch64_be-unknown-linux-gnu", "armv7-unknown-linux-gnueabihf"):
        found = {s.name: s for s in symbols(compile_ir(ir, CpuTarget(triple), "k", Pipeline.NONE))}
        assert found["k"].defined and not found["k"].local, triple
        assert not found["elsewhere"].defined and not found["elsewhere"].local, triple
        assert found["mine"].defined and found["mine"].local, triple


def test_a_symbol_table_past_the_end_or_without_strings_is_refused(library: bytes) -> None:
    table = next(index for index, section in enumerate(sections(library)) if section.kind == DYNSYM)
    header_at = struct.unpack_from("<Q", library, 0x28)[0] + 64 * table
    past_the_end = bytearray(library)
    struct.pack_into("<Q", past_the_end, header_at + 0x20, len(library) - 8)  # sh_size: from sh_offset to past the end
    struct.pack_into("<Q", past_the_end, header_at + 0x18, len(library) - 8)  # sh_offset
    with pytest.raises(ArtifactError, match="the symbol table lies outside the file"):
        imported_symbols(bytes(past_the_end))
    no_strings = bytearray(library)
    struct.pack_into("<I", no_strings, header_at + 0x28, 0xFFFF)  # sh_link
    with pytest.raises(ArtifactError, match="a symbol table names no string table"):
        imported_symbols(bytes(no_strings))
