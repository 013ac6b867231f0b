"""The emulation driver (farm.backends.llvm.driver): fixed IR that LLVM accepts, an executable of each emulated
architecture linked against its C library, and the exit status of each way its arena file can be wrong, run under
qemu as the runtime runs it."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import llvmlite.binding as llvm
import pytest

from farm.backends.llvm import elf
from farm.backends.llvm.driver import (
    EXIT_ARENA,
    EXIT_ARTIFACT,
    EXIT_LIBRARY,
    HEADER_FIELDS,
    MAGIC,
    PAGE_BYTES,
    build_driver,
    driver_ir,
)
from farm.backends.llvm.target import init_llvm, parse_target
from farm.runtime.emulation import EMULATORS

MACHINES = {"aarch64": 183, "riscv64": 243}
"""e_machine of each emulated architecture."""
EF_RISCV_FLOAT_ABI_DOUBLE, EF_RISCV_FLOAT_ABI = 0x4, 0x6


@pytest.fixture(scope="module", params=sorted(EMULATORS))
def driver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(architecture, the driver executable built for it)."""
    emulator = EMULATORS[request.param]
    path = tmp_path_factory.mktemp("driver") / "driver"
    path.write_bytes(build_driver(parse_target(f"cpu:{emulator.triple}"), emulator.libc))
    path.chmod(0o755)
    return request.param, path


def test_the_ir_is_fixed_and_valid():
    init_llvm()
    text = driver_ir()
    assert text == driver_ir()
    llvm.parse_assembly(text).verify()
    assert "farm_run" not in text  # the entry is named by the arena file, as the library and the artifact are


def test_the_driver_is_a_pie_of_its_architecture_that_needs_only_its_libc(driver):
    arch, path = driver
    data = path.read_bytes()
    kind, machine = struct.unpack_from("<HH", data, 16)
    assert (kind, machine) == (3, MACHINES[arch])  # ET_DYN: position-independent
    interp = next(section for section in elf.sections(data) if section.name == ".interp")
    assert data[interp.offset : interp.offset + interp.size].rstrip(b"\0").decode() == EMULATORS[arch].libc.loader
    dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    assert sorted(line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line) == [
        "libc.so.6",
        "libm.so.6",
    ]


def test_the_riscv64_driver_has_the_double_float_abi_of_debians_libc():
    emulator = EMULATORS["riscv64"]
    data = build_driver(parse_target(f"cpu:{emulator.triple}"), emulator.libc)
    libc = (emulator.libc.folder / "libc.so.6").read_bytes()
    flags = struct.unpack_from("<I", data, 0x30)[0]
    assert flags & EF_RISCV_FLOAT_ABI == EF_RISCV_FLOAT_ABI_DOUBLE == struct.unpack_from("<I", libc, 0x30)[0] & 0x6


def _arena_file(folder: Path, strings: list[str], *, magic: int = MAGIC, weights: int = 0) -> Path:
    """An arena file as the driver reads it: the header's fields, the strings, NULs to the page, a page of arena."""
    fields = {"magic": magic, "arena_at": PAGE_BYTES, "table_offset": 0, "weights": weights}
    head = struct.pack(f"<{len(HEADER_FIELDS)}Q", *(fields[name] for name in HEADER_FIELDS))
    head += b"".join(text.encode() + b"\0" for text in strings)
    path = folder / "arena"
    path.write_bytes(head + bytes(2 * PAGE_BYTES - len(head)))
    return path


def _run(driver: tuple[str, Path], arena: Path) -> subprocess.CompletedProcess:
    arch, path = driver
    emulator = EMULATORS[arch]
    with open(arena, "r+b") as stdin:
        return subprocess.run(
            [emulator.qemu, "-L", str(emulator.libc.folder.parent), str(path)],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env={},
        )


def test_each_wrong_arena_file_ends_with_its_own_status(driver, tmp_path):
    real = str(driver[1])
    assert _run(driver, _arena_file(tmp_path, [real, "farm_run", real], magic=MAGIC + 1)).returncode == EXIT_ARENA
    table_past_the_arena = _arena_file(tmp_path, [real, "farm_run", real], weights=PAGE_BYTES)
    assert _run(driver, table_past_the_arena).returncode == EXIT_ARENA
    missing_artifact = _arena_file(tmp_path, [real, "farm_run", str(tmp_path / "missing.farm")])
    assert _run(driver, missing_artifact).returncode == EXIT_ARTIFACT
    missing_library = _run(driver, _arena_file(tmp_path, [str(tmp_path / "missing.so"), "farm_run", real]))
    assert missing_library.returncode == EXIT_LIBRARY and "missing.so" in missing_library.stderr


def test_an_empty_arena_file_is_refused(driver, tmp_path):
    (tmp_path / "arena").write_bytes(b"")
    assert _run(driver, tmp_path / "arena").returncode == EXIT_ARENA
