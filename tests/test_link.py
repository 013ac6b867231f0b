"""link_library: kernel + entry objects in, one shared library of code alone exporting only the entry points out;
the entry reads each weight's address from the weight table after the arena."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from native_helpers import (
    EM_AARCH64,
    aarch64,
    aligned_arena,
    call_farm_run,
    compile_kernels,
    elf_header,
    elf_type,
    host,
    load_library,
)

from farm.backends.llvm.compiler_runtime import runtime_object
from farm.backends.llvm.elf import imported_symbols
from farm.backends.llvm.entry import (
    ENTRY_SYMBOL,
    LAUNCH_SYMBOL,
    POST_SYMBOL,
    SERVE_SYMBOL,
    STEPS_SYMBOL,
    WORK_SYMBOL,
    compile_entry,
)
from farm.backends.llvm.link import find_linker, link_library, linker_identity
from farm.backends.llvm.target import CpuTarget, parse_target
from farm.backends.llvm.toolchain import Pipeline, compile_ir
from farm.errors import BuildError
from farm.ir import loopir as L

N = 40
WEIGHTS = np.linspace(-2, 2, N, dtype=np.float32)
X_AT, Y_AT, Z_AT = 0, 256, 512  # arena byte offsets: x (input), y = x + w, z = exp(y) * 2
TABLE_AT = 768  # the weight table: one 64-bit pointer per weight, after the arena


def add_blob_kernel() -> L.LoopKernel:
    i = L.Var("i")
    return L.LoopKernel(
        [L.Param("out", output=True), L.Param("in"), L.Param("w")],
        [L.Loop(i, N, [L.Store("out", i, L.Load("in", i) + L.Load("w", i))])],
    )


def exp_kernel() -> L.LoopKernel:
    i = L.Var("i")
    return L.LoopKernel(
        [L.Param("out", output=True), L.Param("in")],
        [L.Loop(i, N, [L.Store("out", i, L.call("exp", L.Load("in", i)) * 2.0)])],
    )


SCHEDULE = [
    {"kernel": "farm_k_add", "args": [["arena", Y_AT], ["arena", X_AT], ["weight", 0]]},
    {"kernel": "farm_k_exp", "args": [["arena", Z_AT], ["arena", Y_AT]]},
]


def model_objects(target: CpuTarget) -> list[bytes]:
    """Two kernel objects and the entry: what a build links."""
    return [
        compile_kernels([("farm_k_add", add_blob_kernel())], target),
        compile_kernels([("farm_k_exp", exp_kernel())], target),
        compile_entry(SCHEDULE, target, TABLE_AT),
    ]


@pytest.fixture(scope="module")
def host_library() -> bytes:
    return link_library(model_objects(host()), host())


def dynamic_symbols(library: bytes, tmp_path) -> list[list[str]]:
    """readelf --dyn-syms -W rows: [Num, Value, Size, Type, Bind, Vis, Ndx, Name?]."""
    path = tmp_path / "dyn.so"
    path.write_bytes(library)
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[0].rstrip(":").isdigit()]


def test_library_is_a_shared_object_for_the_host(host_library):
    assert elf_type(host_library) == 3  # ET_DYN
    assert elf_header(host_library)[:2] == (2, 1)


def test_library_exports_only_the_entry_points(host_library, tmp_path):
    defined = sorted(row[7] for row in dynamic_symbols(host_library, tmp_path) if len(row) >= 8 and row[6] != "UND")
    assert defined == sorted([ENTRY_SYMBOL, LAUNCH_SYMBOL, STEPS_SYMBOL, WORK_SYMBOL, SERVE_SYMBOL, POST_SYMBOL])


def test_library_needs_nothing_but_sched_yield_and_syscall(host_library, tmp_path):
    """Self-contained code: the entry's outside symbols are libc's sched_yield, which farm_work's threads call
    while they wait for a thread the OS has descheduled, and syscall, through which farm_serve and farm_post sleep
    and wake in the futex (every process that can load a library on Linux has both). (Kernels whose copy loops LLVM
    turns into memcpy/memset also need those; this library's kernels have none.)"""
    undefined = [row[7] for row in dynamic_symbols(host_library, tmp_path) if len(row) >= 8 and row[6] == "UND"]
    assert undefined == ["sched_yield", "syscall"]


def test_linking_is_byte_identical(host_library):
    assert link_library(model_objects(host()), host()) == host_library


def test_the_library_holds_no_weights_and_the_entry_reads_their_addresses_from_the_table(host_library, tmp_path):
    """Weights are artifact members that the runtime maps: the library is code, and the entry loads each weight's
    address from its 64-bit slot at arena + weights_offset (no relocation names a weight)."""
    assert WEIGHTS.tobytes() not in host_library
    entry = tmp_path / "entry.o"
    entry.write_bytes(compile_entry(SCHEDULE, host(), TABLE_AT))
    relocations = subprocess.run(["readelf", "-rW", str(entry)], capture_output=True, text=True, check=True).stdout
    assert "farm_w_" not in relocations


def test_no_build_id_and_no_executable_stack(host_library, tmp_path):
    path = tmp_path / "lib.so"
    path.write_bytes(host_library)
    notes = subprocess.run(["readelf", "-nW", str(path)], capture_output=True, text=True, check=True).stdout
    assert "NT_GNU_BUILD_ID" not in notes
    segments = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True, check=True).stdout
    stack = next(line for line in segments.splitlines() if "GNU_STACK" in line)
    assert "RWE" not in stack


def test_library_runs_the_schedule(host_library, tmp_path):
    library = load_library(host_library, tmp_path)
    arena = aligned_arena(TABLE_AT + 8)
    x = np.linspace(-3, 3, N, dtype=np.float32)
    arena[X_AT : X_AT + 4 * N].view(np.float32)[:] = x
    arena[TABLE_AT : TABLE_AT + 8].view(np.uint64)[0] = WEIGHTS.ctypes.data
    call_farm_run(library, arena)
    y = arena[Y_AT : Y_AT + 4 * N].view(np.float32)
    z = arena[Z_AT : Z_AT + 4 * N].view(np.float32)
    np.testing.assert_array_equal(y, x + WEIGHTS)
    np.testing.assert_allclose(z, np.exp(y.astype(np.float64)) * 2, rtol=3e-7)


def test_link_with_gnu_ld_when_lld_is_absent(host_library, tmp_path, monkeypatch):
    """find_linker falls back to GNU ld for the host's own architecture."""
    gnu_ld = shutil.which("ld")
    if gnu_ld is None:
        pytest.fail("GNU ld is not installed (apt-get install binutils)")
    folder = tmp_path / "bin"
    folder.mkdir()
    os.symlink(gnu_ld, folder / "ld")
    monkeypatch.setenv("PATH", str(folder))
    assert find_linker(host()) == str(folder / "ld")
    library = link_library(model_objects(host()), host())
    assert link_library(model_objects(host()), host()) == library
    assert elf_type(library) == 3
    loaded = load_library(library, tmp_path)
    arena = aligned_arena(TABLE_AT + 8)
    arena[TABLE_AT : TABLE_AT + 8].view(np.uint64)[0] = WEIGHTS.ctypes.data
    call_farm_run(loaded, arena)
    np.testing.assert_array_equal(arena[Y_AT : Y_AT + 4 * N].view(np.float32), WEIGHTS)


def test_no_linker_is_a_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match="no linker for .*ld.lld"):
        find_linker(host())
    with pytest.raises(BuildError, match=r"no linker for aarch64-unknown-linux-gnu: install one of ld\.lld \("):
        link_library([b""], aarch64())


def test_aarch64_link_gives_an_aarch64_shared_object(tmp_path):
    target = aarch64()
    library = link_library(model_objects(target), target)
    assert elf_type(library) == 3
    assert elf_header(library) == (2, 1, EM_AARCH64)
    assert any(
        len(row) >= 8 and row[7] == ENTRY_SYMBOL and row[6] != "UND" for row in dynamic_symbols(library, tmp_path)
    )
    assert link_library(model_objects(target), target) == library


def test_missing_kernel_is_a_build_error_with_the_linker_log():
    """The entry calls a kernel that no object defines: the link must fail, naming the symbol.

    With the kernels declared at default visibility (see test_entry), `ld -shared` accepts the undefined
    reference and the failure only shows when the library is loaded ("undefined symbol").
    """
    objects = model_objects(host())
    without_exp = [objects[0], objects[2]]
    with pytest.raises(BuildError) as info:
        link_library(without_exp, host())
    message = str(info.value)
    assert message.startswith(f"linking 2 objects for {host().triple} failed:")
    assert "farm_k_exp" in message and "undefined" in message


def test_an_invalid_object_is_a_build_error_naming_it():
    objects = model_objects(host())
    with pytest.raises(BuildError, match=f"object 1 of 3 for {host().triple}: not an ELF object"):
        link_library([objects[0], b"\x7fELF this is not an object", objects[2]], host())


def test_a_link_error_carries_the_linker_stderr():
    objects = model_objects(host())
    with pytest.raises(BuildError) as info:
        link_library([objects[0], objects[0]], host())  # every symbol of the kernel defined twice
    message = str(info.value)
    assert message.startswith(f"linking 2 objects for {host().triple} failed:\n")
    assert "000001.o" in message and ("duplicate symbol" in message or "multiple definition" in message)


def test_duplicate_kernel_is_a_build_error():
    objects = model_objects(host())
    with pytest.raises(BuildError, match="duplicate symbol.*farm_k_add"):
        link_library([objects[0], *objects], host())


@pytest.fixture
def fresh_linker_identity():
    """linker_identity is asked once per process: forget it around a test that changes PATH."""
    linker_identity.cache_clear()
    yield
    linker_identity.cache_clear()


def test_linker_identity_names_the_linker_and_its_version(fresh_linker_identity, tmp_path, monkeypatch):
    version = subprocess.run(["ld.lld", "--version"], capture_output=True, text=True, check=True).stdout
    assert linker_identity() == f"ld.lld: {version.splitlines()[0].strip()}"

    folder = tmp_path / "bin"  # without lld, GNU ld links for the host: that is the linker then
    folder.mkdir()
    os.symlink(shutil.which("ld"), folder / "ld")
    monkeypatch.setenv("PATH", str(folder))
    linker_identity.cache_clear()
    gnu = subprocess.run(["ld", "--version"], capture_output=True, text=True, check=True).stdout
    assert linker_identity() == f"ld: {gnu.splitlines()[0].strip()}" and "GNU ld" in gnu

    monkeypatch.setenv("PATH", str(tmp_path))
    linker_identity.cache_clear()
    assert linker_identity() == "no linker"


# --- objects that would run code at load are refused ----------------------------------------------------------

STARTUP_ASSEMBLY = {
    "an .init_array section": ".section .init_array,\\22aw\\22",
    "a .ctors section": ".section .ctors.65535,\\22aw\\22",
    "an init_array by type under another name": ".section .data.innocent,\\22aw\\22,@init_array",
}


@pytest.mark.parametrize("how", STARTUP_ASSEMBLY)
def test_an_object_with_load_time_code_is_never_linked(how: str) -> None:
    """A library farm links runs only when it is called: a poisoned cache entry with a constructor is refused."""
    ir = (
        f'module asm "{STARTUP_ASSEMBLY[how]}"\nmodule asm ".quad farm_evil"\ndefine void @farm_evil() {{ ret void }}\n'
    )
    evil = compile_ir(ir, host(), "evil", Pipeline.NONE)
    with pytest.raises(BuildError, match="holds load-time code"):
        link_library([evil], host())


@pytest.mark.parametrize("data", [b"", b"\x7fELF" + b"\0" * 60, b"\x7fELF\x02\x01" + b"\xff" * 200, os.urandom(4096)])
def test_garbage_in_place_of_an_object_is_a_build_error_not_a_crash(data: bytes) -> None:
    with pytest.raises(BuildError, match="ELF"):
        link_library([data], host())


# ------------------------------------------------------------------------- what a library may import, and who calls


def to_half_kernel() -> L.LoopKernel:
    """Doubles and floats stored as float16: on x86-64 without AVX512-FP16 (and without F16C, for the floats) LLVM
    calls a compiler runtime's __truncdfhf2 and __truncsfhf2 for them."""
    i = L.Var("i")
    return L.LoopKernel(
        [
            L.Param("half_of_double", L.F16, output=True),
            L.Param("half_of_float", L.F16, output=True),
            L.Param("doubles", L.F64),
            L.Param("floats"),
        ],
        [
            L.Loop(
                i,
                N,
                [
                    L.Store("half_of_double", i, L.Load("doubles", i, L.F64)),
                    L.Store("half_of_float", i, L.Load("floats", i)),
                ],
            )
        ],
    )


def test_a_call_into_a_compiler_runtime_is_a_build_error_naming_it_and_its_caller() -> None:
    """Without farm's compiler-runtime object, the library would load only in a process that happened to load
    libgcc_s first (issue 28): the link refuses it on every host instead, naming each import and its caller."""
    baseline = parse_target("cpu:x86_64-linux-gnu")
    kernels = compile_kernels([("farm_k_to_half", to_half_kernel())], baseline)
    with pytest.raises(BuildError) as failure:
        link_library([kernels], baseline)
    message = str(failure.value)
    assert message.startswith(f"the library for {baseline.id} imports what farm's libraries may not (only ")
    assert "__truncdfhf2, called by object 0 of 1 (farm_k_to_half); __truncsfhf2, called by object 0 of 1" in message


def test_the_compiler_runtime_object_defines_llvms_half_conversions_inside_the_library(tmp_path) -> None:
    """The same kernel linked with an entry and farm's compiler-runtime object (as every library is) imports only
    what every process has, exports nothing new, and rounds as numpy does (x86-64 baseline runs natively on any
    x86-64 host)."""
    baseline = parse_target("cpu:x86_64-linux-gnu")
    schedule = [{"kernel": "farm_k_to_half", "args": [["arena", offset] for offset in (0, 128, 256, 640)]}]
    library = link_library(
        [
            compile_kernels([("farm_k_to_half", to_half_kernel())], baseline),
            compile_entry(schedule, baseline),
            runtime_object(baseline),
        ],
        baseline,
    )
    assert imported_symbols(library) == {"sched_yield", "syscall"}
    assert not {"__truncdfhf2", "__truncsfhf2", "__extendhfsf2"} & {
        row[7] for row in dynamic_symbols(library, tmp_path) if len(row) >= 8
    }
    arena = aligned_arena(1024)
    doubles = np.linspace(-70000, 70000, N) + 1 / 3
    arena[256 : 256 + 8 * N].view(np.float64)[:] = doubles
    arena[640 : 640 + 4 * N].view(np.float32)[:] = doubles
    call_farm_run(load_library(library, tmp_path), arena)
    with np.errstate(over="ignore"):
        halves, halves_of_floats = doubles.astype(np.float16), doubles.astype(np.float32).astype(np.float16)
    np.testing.assert_array_equal(arena[: 2 * N].view(np.float16), halves)
    np.testing.assert_array_equal(arena[128 : 128 + 2 * N].view(np.float16), halves_of_floats)
