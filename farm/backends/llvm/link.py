"""link_library: object files in, one shared library out, through the system linker.

`ld.lld` links for every ELF architecture; GNU `ld` links for the host's. Inputs are named by position so that
the same objects always give the same bytes (no build id, no timestamps).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import llvmlite.binding as llvm

from farm.backends.llvm.target import CpuTarget, host_target
from farm.errors import BuildError
from farm.runtime import elf


def _linkers(target: CpuTarget) -> list[str]:
    """Linkers that can link `target`, best first."""
    native = target.arch == llvm.get_process_triple().split("-")[0]
    return ["ld.lld"] + (["ld"] if native else [])


def find_linker(target: CpuTarget) -> str:
    for name in _linkers(target):
        path = shutil.which(name)
        if path:
            return path
    raise BuildError(f"no linker for {target.triple}: install one of {', '.join(_linkers(target))} "
                     "(Debian: apt-get install lld binutils)")


@functools.cache
def linker_identity() -> str:
    """The linker this host links with and the first line of its `--version` (e.g. "ld.lld: Debian LLD 14.0.6
    (compatible with GNU linkers)"), or "no linker": part of the toolchain identity (farm.backends.llvm.toolchain),
    since another linker may write other bytes. ld.lld, when installed, links every target; otherwise GNU ld links
    the host's, so the host's choice is the linker of every link that can succeed here. Asked once per process."""
    try:
        path = find_linker(host_target())
    except BuildError:
        return "no linker"
    try:
        result = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        first_line = (result.stdout.strip().splitlines() or [f"exit status {result.returncode}"])[0]
    except (OSError, subprocess.TimeoutExpired) as error:
        first_line = f"unknown version ({error})"
    return f"{os.path.basename(path)}: {first_line.strip()}"


STARTUP_SECTIONS = (".init_array", ".preinit_array", ".ctors", ".fini_array", ".dtors", ".init", ".fini")
"""Sections whose code runs when a library is loaded or unloaded. farm's kernels and entries never have
them, so an object that does was not made by farm's compile steps (a poisoned cache entry, say)."""


STARTUP_SECTION_TYPES = {14, 15, 16}
"""SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY."""


def startup_sections(data: bytes) -> list[str]:
    """The load-time code sections an object file holds: by name (`.init_array`, `.ctors`, ... and their numbered
    forms) or by type (SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY, whatever their name)."""
    return [section.name or f"section of type {section.kind}" for section in elf.sections(data, BuildError)
            if section.kind in STARTUP_SECTION_TYPES
            or any(section.name == name or section.name.startswith(name + ".") for name in STARTUP_SECTIONS)]


def check_no_startup_code(data: bytes, what: str) -> None:
    """BuildError unless the object runs nothing at load: a library farm links must run only when it is called."""
    try:
        found = startup_sections(data)
    except BuildError as error:
        raise BuildError(f"{what}: {error}") from None
    if found:
        raise BuildError(f"{what} holds load-time code ({', '.join(found)}): not an object farm's compile steps make")


def link_library(objects: Sequence[bytes], target: CpuTarget) -> bytes:
    """A shared library holding every object; only non-hidden symbols (farm_run, farm_launch, farm_run_steps)
    are exported. An object with load-time code is refused: an artifact's library runs only when it is called."""
    linker = find_linker(target)
    for index, data in enumerate(objects):
        check_no_startup_code(data, f"object {index} of {len(objects)} for {target.triple}")
    with tempfile.TemporaryDirectory(prefix="farm-link-") as folder:
        paths = []
        for index, data in enumerate(objects):
            paths.append(os.path.join(folder, f"{index:06d}.o"))
            with open(paths[-1], "wb") as file:
                file.write(data)
        output = os.path.join(folder, "model.so")
        command = [linker, "-shared", "--build-id=none", "-z", "noexecstack", "-o", output, *paths]
        result = subprocess.run(command, capture_output=True, text=True, cwd=folder)
        if result.returncode != 0:
            raise BuildError(f"linking {len(paths)} objects for {target.triple} failed:\n{result.stderr.strip()}")
        with open(output, "rb") as file:
            return file.read()
