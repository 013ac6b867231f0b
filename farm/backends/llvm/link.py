"""link_library: object files in, one shared library out, through the system linker.

`ld.lld` links for every ELF architecture; GNU `ld` links for the host's. Inputs are named by position so that
the same objects always give the same bytes (no build id, no timestamps). A linked library may import only what
every process that can load it already holds (ALLOWED_IMPORTS), so that it loads, or fails to build, on every host
alike.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import llvmlite.binding as llvm

from farm.backends.llvm import elf
from farm.backends.llvm.target import CpuTarget, host_target
from farm.errors import BuildError


def _linkers(target: CpuTarget) -> list[str]:
    """Linkers that can link `target`, best first."""
    native = target.arch == llvm.get_process_triple().split("-")[0]
    return ["ld.lld"] + (["ld"] if native else [])


def find_linker(target: CpuTarget) -> str:
    for name in _linkers(target):
        path = shutil.which(name)
        if path:
            return path
    raise BuildError(
        f"no linker for {target.triple}: install one of {', '.join(_linkers(target))} "
        "(Debian: apt-get install lld binutils)"
    )


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
    return [
        section.name or f"section of type {section.kind}"
        for section in elf.sections(data, BuildError)
        if section.kind in STARTUP_SECTION_TYPES
        or any(section.name == name or section.name.startswith(name + ".") for name in STARTUP_SECTIONS)
    ]


def check_no_startup_code(data: bytes, what: str) -> None:
    """BuildError unless the object runs nothing at load: a library farm links must run only when it is called."""
    try:
        found = startup_sections(data)
    except BuildError as error:
        raise BuildError(f"{what}: {error}") from None
    if found:
        raise BuildError(f"{what} holds load-time code ({', '.join(found)}): not an object farm's compile steps make")


ALLOWED_IMPORTS = frozenset({"memcpy", "memmove", "memset", "sched_yield", "syscall", "floor", "floorf"})
"""Everything a library farm links may import: C library functions that every process able to load it holds (Python's
own links libc and libm, and so does the emulation driver, farm.backends.llvm.driver). LLVM turns copy and fill loops
into memcpy, memmove and memset; farm_work yields with sched_yield; farm_serve and farm_post sleep and wake in
the futex through syscall (Linux's C library); llvm.floor is floor or floorf where the CPU has
no rounding instruction (x86-64 before SSE4.1). Anything else would load only where some earlier import brought it
along: LLVM's calls into a compiler runtime (`__truncdfhf2` and its kind: no C library has them) are defined by the
runtime object every library links (farm.backends.llvm.compiler_runtime), and check_imports refuses any other."""


def check_imports(library: bytes, objects: Sequence[bytes], target: CpuTarget) -> None:
    """BuildError unless `library`, linked from `objects` for `target`, imports ALLOWED_IMPORTS alone: an import
    no C library defines is then a build error on every host, not a load error on those where nothing happened to
    load it first. The error names each import and the object that calls it."""
    refused = sorted(elf.imported_symbols(library, BuildError) - ALLOWED_IMPORTS)
    if refused:
        calls = "; ".join(f"{name}, called by {_caller(objects, name)}" for name in refused)
        raise BuildError(
            f"the library for {target.id} imports what farm's libraries may not (only "
            f"{', '.join(sorted(ALLOWED_IMPORTS))}): {calls}"
        )


def _caller(objects: Sequence[bytes], name: str) -> str:
    """The first object that leaves `name` undefined, by its position and the first global symbol it defines (a
    kernel object's first is the kernel's own symbol, then come its launches)."""
    for index, data in enumerate(objects):
        symbols = elf.symbols(data, error=BuildError)
        if any(symbol.name == name and not symbol.defined for symbol in symbols):
            defined = sorted(s.name for s in symbols if s.defined and not s.local and s.name)
            return f"object {index} of {len(objects)} ({defined[0] if defined else 'which defines nothing'})"
    return "none of the objects (the linker added it)"


def link_library(objects: Sequence[bytes], target: CpuTarget) -> bytes:
    """A shared library holding every object; only non-hidden symbols (farm_run, farm_launch, farm_run_steps)
    are exported. An object with load-time code is refused: an artifact's library runs only when it is called; so
    is a library that imports anything outside ALLOWED_IMPORTS."""
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
            library = file.read()
    check_imports(library, objects, target)
    return library
