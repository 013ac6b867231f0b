"""Tests of farm.runtime.elf: the symbols of a real farm library, and refusals of files that are not ELF or lie."""

from __future__ import annotations

import struct
import tarfile

import onnx
import pytest

from farm.build.local import build_model
from farm.errors import ArtifactError
from farm.runtime.elf import defined_symbols
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
    from farm.runtime.elf import sections

    for triple in ("x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu", "armv7-unknown-linux-gnueabihf"):
        names = [s.name for s in sections(compile_ir("define void @k() { ret void }\n", CpuTarget(triple), "k"))]
        assert ".text" in names and ".symtab" in names and ".strtab" in names, (triple, names)
