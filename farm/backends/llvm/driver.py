"""The emulation driver: a small program of a CPU target's own architecture that calls a model library's entry
once, so that farm can run a cross-compiled library under qemu user-mode emulation (farm.runtime.emulation).

No C compiler and no foreign Python: the driver is LLVM IR built here, compiled by llvmlite for the target's triple
and linked by ld.lld against that target's C library (Debian's libc6-<arch>-cross: libc.so.6, libm.so.6 and the
dynamic loader's path). Its IR is fixed: nothing from an artifact is in it, so one driver per architecture serves
every artifact.

It takes no arguments. Its standard input is the arena file, open for reading and writing, which it maps shared:

- a header (HEADER_FIELDS, 64-bit little-endian: magic, where the arena starts in the file (a multiple of 4096, so
  the arena is page-aligned as in a native run), where the weight table starts in the arena, how many weights it
  holds), then three strings, each ended by a NUL: the library's path, its entry's name and the artifact's path;
- the arena, with the inputs in place and in each weight table slot the weight's offset in the artifact file.

The driver maps the artifact read-only (the weights stay in the artifact file, as in a native load), adds the
map's address to each slot, dlopens the library with RTLD_NOW (an import the target's libc and libm lack fails
here, dlerror's line on stderr), calls the entry once on the arena and exits 0; the host reads the outputs from the
arena file. Each failure exits with its own status (EXIT_STATUSES), so that the host can say what went wrong.

The program's entry is `_start` itself, not the C library's start file (Scrt1.o): Debian's riscv64 Scrt1.o holds
an R_RISCV_ALIGN relocation that ld.lld 14 can't link, and an entry that reads argc from the stack needs inline
assembly, which llvmlite can parse for the host's architecture only. A dynamically linked program's C library is
initialised by the dynamic loader before `_start` runs, which is all that dlopen needs; the driver reads nothing
from argv or the environment.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from llvmlite import ir

from farm.backends.llvm.link import find_linker
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import compile_ir
from farm.errors import BuildError

I8_T, I32_T, I64_T, PTR_T = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.PointerType()
MAGIC = int.from_bytes(b"FARMEMU1", "little")
PAGE_BYTES = 4096
HEADER_FIELDS = ("magic", "arena_at", "table_offset", "weights")
"""The header's 64-bit little-endian fields, in order; the strings follow them."""
EXIT_STATUSES = {
    65: "the emulated process can't map the artifact file",
    66: "the emulated process can't map the arena file, or its header is malformed",
    67: "the emulated process can't load the library",
    68: "the library has no such entry",
}
EXIT_ARTIFACT, EXIT_ARENA, EXIT_LIBRARY, EXIT_ENTRY = EXIT_STATUSES
# Linux's values on every 64-bit architecture farm emulates (asm-generic): open, mmap, lseek and dlopen flags.
O_RDONLY, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE, SEEK_END, RTLD_NOW = 0, 1, 2, 1, 2, 2, 2
STDIN, STDERR = 0, 2
ENTRY_T = ir.FunctionType(ir.VoidType(), [PTR_T])
"""A library's entry: farm_run(arena)."""
LIBC_FUNCTIONS = {
    "open": ir.FunctionType(I32_T, [PTR_T, I32_T], var_arg=True),
    "lseek": ir.FunctionType(I64_T, [I32_T, I64_T, I32_T]),
    "mmap": ir.FunctionType(PTR_T, [PTR_T, I64_T, I32_T, I32_T, I32_T, I64_T]),
    "close": ir.FunctionType(I32_T, [I32_T]),
    "dlopen": ir.FunctionType(PTR_T, [PTR_T, I32_T]),
    "dlsym": ir.FunctionType(ir.PointerType(ENTRY_T), [PTR_T, PTR_T]),
    "dlerror": ir.FunctionType(PTR_T, []),
    "strlen": ir.FunctionType(I64_T, [PTR_T]),
    "write": ir.FunctionType(I64_T, [I32_T, PTR_T, I64_T]),
    "exit": ir.FunctionType(ir.VoidType(), [I32_T]),
}
"""What the driver calls in the target's libc (glibc 2.34 and later hold dlopen and dlsym); dlsym's result is typed
as a pointer to the entry (still `ptr` in the IR), so that the builder can call it."""


@dataclass(frozen=True)
class CrossLibc:
    """A target's C library as Debian's libc6-<arch>-cross installs it: the folder of its shared libraries, and the
    dynamic loader's path inside the target's file system (where qemu's -L prefix finds it)."""

    folder: Path
    loader: str

    LIBRARIES: ClassVar[tuple[str, ...]] = ("libc.so.6", "libm.so.6")
    """What the driver links with: libc for itself and for the libraries' memcpy, memset and sched_yield; libm for
    any libm call a kernel makes (a native run finds both in the Python process)."""

    @property
    def files(self) -> list[Path]:
        """The libraries the driver is linked with and the loader that runs it, as this host holds them."""
        return [*(self.folder / name for name in self.LIBRARIES), self.folder / Path(self.loader).name]


def driver_ir() -> str:
    """The driver's IR (see the module's docstring): the same text for every architecture."""
    module = ir.Module(name="farm_driver")
    functions = {name: ir.Function(module, kind, name) for name, kind in LIBC_FUNCTIONS.items()}
    run = _run_function(module, functions)
    start = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "_start")
    for attribute in ("noreturn", "nounwind"):
        start.attributes.add(attribute)
    b = ir.IRBuilder(start.append_basic_block("entry"))
    b.call(functions["exit"], [b.call(run, [])])
    b.unreachable()
    return str(module)


def _run_function(module: ir.Module, functions: dict[str, ir.Function]) -> ir.Function:
    """run(): the driver's work on the arena file at its standard input; returns its exit status."""
    fn = ir.Function(module, ir.FunctionType(I32_T, []), "run")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    report = _report_function(module, functions)
    size = b.call(functions["lseek"], [_i32(STDIN), _i64(0), _i32(SEEK_END)])
    _fail_unless(b, b.icmp_signed(">=", size, _i64(PAGE_BYTES)), EXIT_ARENA)
    image = b.call(
        functions["mmap"],
        [ir.Constant(PTR_T, None), size, _i32(PROT_READ | PROT_WRITE), _i32(MAP_SHARED), _i32(STDIN), _i64(0)],
    )
    _fail_unless(b, b.icmp_signed("!=", b.ptrtoint(image, I64_T), _i64(-1)), EXIT_ARENA)
    arena_at, table, count = _checked_header(b, image, size)
    library, entry, artifact = _header_strings(b, functions, image, arena_at)
    weights = _map_read_only(b, functions, artifact)
    _fail_unless(b, b.icmp_signed("!=", b.ptrtoint(weights, I64_T), _i64(-1)), EXIT_ARTIFACT)
    arena = b.gep(image, [arena_at], source_etype=I8_T)
    _add_base_to_slots(b, b.gep(arena, [table], source_etype=I8_T), count, b.ptrtoint(weights, I64_T))
    handle = b.call(functions["dlopen"], [library, _i32(RTLD_NOW)])
    _fail_unless(b, b.icmp_unsigned("!=", handle, ir.Constant(PTR_T, None)), EXIT_LIBRARY, report)
    function = b.call(functions["dlsym"], [handle, entry])
    _fail_unless(b, b.icmp_unsigned("!=", function, ir.Constant(PTR_T, None)), EXIT_ENTRY, report)
    b.call(function, [arena])
    b.ret(_i32(0))
    return fn


def _i32(value: int) -> ir.Constant:
    return ir.Constant(I32_T, value)


def _i64(value: int) -> ir.Constant:
    return ir.Constant(I64_T, value)


def _fail_unless(b: ir.IRBuilder, holds: ir.Value, status: int, report: ir.Function | None = None) -> None:
    """Return `status` from the function (after `report()`, when given) unless `holds`; go on after it."""
    with b.if_then(b.not_(holds), likely=False):
        if report is not None:
            b.call(report, [])
        b.ret(_i32(status))


def _checked_header(b: ir.IRBuilder, image: ir.Value, size: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The arena's offset in the file, the weight table's offset in the arena and its slot count, after checking
    the magic, that the arena starts on a page after the header and that the table lies inside it (unsigned
    arithmetic, so that no field can wrap a bound), and that the header's last byte is a NUL, which ends its
    strings."""
    field = lambda index: b.load(b.gep(image, [_i64(index)], source_etype=I64_T), typ=I64_T)  # noqa: E731
    magic, arena_at, table, count = (field(HEADER_FIELDS.index(name)) for name in HEADER_FIELDS)
    _fail_unless(b, b.icmp_unsigned("==", magic, _i64(MAGIC)), EXIT_ARENA)
    _fail_unless(b, b.icmp_unsigned(">=", arena_at, _i64(PAGE_BYTES)), EXIT_ARENA)
    _fail_unless(b, b.icmp_unsigned("==", b.urem(arena_at, _i64(PAGE_BYTES)), _i64(0)), EXIT_ARENA)
    _fail_unless(b, b.icmp_unsigned("<=", arena_at, size), EXIT_ARENA)
    room = b.sub(size, arena_at)
    _fail_unless(b, b.icmp_unsigned("<=", table, room), EXIT_ARENA)
    _fail_unless(b, b.icmp_unsigned("<=", count, b.udiv(b.sub(room, table), _i64(8))), EXIT_ARENA)
    last = b.load(b.gep(image, [b.sub(arena_at, _i64(1))], source_etype=I8_T), typ=I8_T)
    _fail_unless(b, b.icmp_unsigned("==", last, ir.Constant(I8_T, 0)), EXIT_ARENA)
    return arena_at, table, count


def _header_strings(
    b: ir.IRBuilder, functions: dict[str, ir.Function], image: ir.Value, arena_at: ir.Value
) -> list[ir.Value]:
    """The library's path, the entry's name and the artifact's path: NUL-ended strings one after the other after
    the header's fields, each starting inside the header (whose last byte is a NUL, so none runs past it)."""
    strings, at = [], _i64(8 * len(HEADER_FIELDS))
    for _ in range(3):
        _fail_unless(b, b.icmp_unsigned("<", at, arena_at), EXIT_ARENA)
        strings.append(b.gep(image, [at], source_etype=I8_T))
        at = b.add(at, b.add(b.call(functions["strlen"], [strings[-1]]), _i64(1)))
    return strings


def _map_read_only(b: ir.IRBuilder, functions: dict[str, ir.Function], path: ir.Value) -> ir.Value:
    """The whole file at `path` mapped read-only and private; MAP_FAILED (-1) when it can't be opened or mapped."""
    fd = b.call(functions["open"], [path, _i32(O_RDONLY)])
    size = b.call(functions["lseek"], [fd, _i64(0), _i32(SEEK_END)])
    mapped = b.call(
        functions["mmap"], [ir.Constant(PTR_T, None), size, _i32(PROT_READ), _i32(MAP_PRIVATE), fd, _i64(0)]
    )
    b.call(functions["close"], [fd])
    return mapped


def _report_function(module: ir.Module, functions: dict[str, ir.Function]) -> ir.Function:
    """report(): dlerror's message and a newline on stderr, when there is one."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "report")
    fn.linkage = "internal"
    newline = ir.GlobalVariable(module, ir.ArrayType(I8_T, 1), "newline")
    newline.initializer = ir.Constant(ir.ArrayType(I8_T, 1), [10])
    newline.global_constant, newline.linkage = True, "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    message = b.call(functions["dlerror"], [])
    with b.if_then(b.icmp_unsigned("!=", message, ir.Constant(PTR_T, None))):
        b.call(functions["write"], [_i32(STDERR), message, b.call(functions["strlen"], [message])])
        b.call(functions["write"], [_i32(STDERR), newline, _i64(1)])
    b.ret_void()
    return fn


def _add_base_to_slots(b: ir.IRBuilder, slots: ir.Value, count: ir.Value, base: ir.Value) -> None:
    """slots[i] += base for i in [0, count): each weight's offset in the artifact becomes its address in the map."""
    index = b.alloca(I64_T)
    b.store(_i64(0), index)
    head, body, done = (b.append_basic_block(name) for name in ("slots", "slot", "slots_done"))
    b.branch(head)
    b.position_at_end(head)
    at = b.load(index, typ=I64_T)
    b.cbranch(b.icmp_unsigned("<", at, count), body, done)
    b.position_at_end(body)
    slot = b.gep(slots, [at], source_etype=I64_T)
    b.store(b.add(b.load(slot, typ=I64_T), base), slot)
    b.store(b.add(at, _i64(1)), index)
    b.branch(head)
    b.position_at_end(done)


def build_driver(target: CpuTarget, libc: CrossLibc) -> bytes:
    """The driver executable for `target`'s architecture: driver_ir compiled for it and linked by ld.lld as a
    position-independent executable that needs `libc`'s libraries (BuildError when the link fails)."""
    code = compile_ir(driver_ir(), target, "farm_driver")
    linker = find_linker(target)
    with tempfile.TemporaryDirectory(prefix="farm-driver-") as folder:
        objects, output = os.path.join(folder, "driver.o"), os.path.join(folder, "driver")
        Path(objects).write_bytes(code)
        command = [
            linker,
            "-pie",
            "--build-id=none",
            "-z",
            "noexecstack",
            "-z",
            "now",
            "-z",
            "relro",
            f"--dynamic-linker={libc.loader}",
            "-o",
            output,
            objects,
            *(str(libc.folder / name) for name in libc.LIBRARIES),
        ]
        result = subprocess.run(command, capture_output=True, text=True, cwd=folder)
        if result.returncode != 0:
            raise BuildError(f"linking the emulation driver for {target.triple} failed:\n{result.stderr.strip()}")
        return Path(output).read_bytes()
