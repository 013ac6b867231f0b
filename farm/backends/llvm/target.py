"""CPU targets: an LLVM triple, cpu name and feature string, parsed from `--target` and turned into machines.

LLVM cross-compiles, so any worker can build for any triple; only running the code needs the real CPU.

llvmlite is imported by `init_llvm`, not with this module: a target is a name, and a submitting client installed
without llvmlite (pip install farm) names targets too. It checks their names' form only; LLVM's check (does it
know this triple, CPU and features) is then its workers' (`CpuTarget.machine`, at the job's first compile, exit
status 2). This host's own CPU (`--target cpu`, the default) is what LLVM detects, so such a client refuses it
(NO_HOST_CPU): a CPU guessed without LLVM would name another target id than a worker on this host advertises.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Literal

from farm.errors import BadInputError
from farm.ir.keys import CPU_TARGET_PREFIX

if TYPE_CHECKING:
    import llvmlite.binding as llvm

TRIPLE_ALIASES = {
    "aarch64-linux-gnu": "aarch64-unknown-linux-gnu",
    "riscv64-linux-gnu": "riscv64-unknown-linux-gnu",
    "x86_64-linux-gnu": "x86_64-unknown-linux-gnu",
}
DEFAULT_CPUS = {"riscv64": ("generic-rv64", "+m,+a,+f,+d,+c")}
"""The CPU and features `cpu:TRIPLE` means where LLVM's generic CPU can't run the architecture's Linux: Debian's
riscv64 is rv64gc with the lp64d ABI (doubles in float registers), which LLVM derives from +d, and LLVM's
generic-rv64 has none of M, A, F, D or C (its lp64 objects don't link or load with that libc). Elsewhere: generic."""

_AVX2 = "+sse2,+avx,+avx2,+fma"
_AVX512 = f"{_AVX2},+avx512f,+avx512bw"
_ICELAKE = f"{_AVX512},+avx512vnni,+avx512vbmi"
CPU_FEATURES = {
    **dict.fromkeys(("x86-64-v3", "haswell", "broadwell", "skylake", "znver1", "znver2", "znver3"), _AVX2),
    **dict.fromkeys(("alderlake", "raptorlake", "meteorlake", "arrowlake"), f"{_AVX2},+avxvnni"),
    **dict.fromkeys(("x86-64-v4", "skylake-avx512"), _AVX512),
    **dict.fromkeys(("cascadelake", "cooperlake"), f"{_AVX512},+avx512vnni"),
    **dict.fromkeys(("icelake-client", "icelake-server", "tigerlake", "rocketlake", "znver4", "znver5"), _ICELAKE),
    **dict.fromkeys(("sapphirerapids", "emeraldrapids", "graniterapids"), f"{_ICELAKE},+avxvnni"),
}
"""The features farm's own choices read (vector width, registers, the int8 dot product, byte permutes) of the x86
CPUs a build names without features (`cpu:x86_64-linux-gnu:znver3`): LLVM enables a named CPU's features in its
code generation, but farm reads only the features string, so a build for a named Zen 3 got SSE-width GEMM tiles
and the int8 kernels' widening multiplies instead of vpmaddwd. Filled in by parse_target, so that the runtime's
check of the host's features (farm.runtime.host) also asks for them."""

NAME = re.compile(r"[A-Za-z0-9_.-]+")
FEATURES = re.compile(r"([+-][A-Za-z0-9_.-]+(,[+-][A-Za-z0-9_.-]+)*)?")
SIMD_WIDTHS = (("+avx512f", 16), ("+avx", 8), ("+sse2", 4), ("+neon", 4))
WIDE_LOOPS = "-prefer-256-bit"
"""The tuning feature an AVX-512 target machine for math-heavy loops drops (toolchain.Pipeline.O3_WIDE_LOOPS): LLVM
tunes Skylake and later x86 cores to vectorise loops over 256-bit vectors (older Xeons slowed their clocks for 512-bit
code), which halved the vectors of loops that call exp, log or sqrt (Gelu, Softmax, LayerNormalization), where farm's
GEMMs run 512-bit vectors anyway."""


NO_HOST_CPU = (
    "--target cpu (the default) is this host's CPU as LLVM detects it, and llvmlite is not installed "
    "(a client install: pip install farm): name the targets for the farm (--target cpu:x86_64-linux-gnu, "
    "--target cpu:aarch64-linux-gnu:neoverse-n1, ...), or pip install 'farm[worker]'"
)
"""What a client without llvmlite says to `--target cpu`."""


@functools.cache
def init_llvm() -> ModuleType:
    """llvmlite's binding with every LLVM target initialised, once per process (cross-compiling needs them all).
    ImportError where llvmlite isn't installed (a client install)."""
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()
    return llvm


@dataclass(frozen=True)
class CpuTarget:
    """Where CPU code runs: triple + cpu + features. `id` names it in keys, manifests and artifact paths."""

    triple: str
    cpu: str = "generic"
    features: str = ""
    kind: ClassVar[Literal["cpu"]] = "cpu"

    def __post_init__(self) -> None:
        """Triple, CPU and features go into IR text, file names and queue names: refuse anything but plain names."""
        for field, value, pattern in (
            ("triple", self.triple, NAME),
            ("cpu", self.cpu, NAME),
            ("features", self.features, FEATURES),
        ):
            if not isinstance(value, str) or not pattern.fullmatch(value):
                raise BadInputError(f"CPU target {field} {value!r} is not a plain LLVM name")

    @property
    def arch(self) -> str:
        return self.triple.split("-")[0]

    @property
    def id(self) -> str:
        digest = hashlib.sha256(f"{self.triple}|{self.cpu}|{self.features}".encode()).hexdigest()[:8]
        return f"{CPU_TARGET_PREFIX}{self.triple}-{self.cpu}-{digest}"

    @property
    def simd_floats(self) -> int:
        """float32 lanes in the widest vector register the features allow."""
        enabled = set(self.features.split(","))
        widths = [lanes for feature, lanes in SIMD_WIDTHS if feature in enabled]
        return max(widths, default=4 if self.arch in ("aarch64", "x86_64") else 1)

    @property
    def vector_registers(self) -> int:
        """Vector registers of the target: 32 with AVX-512 and on AArch64 (NEON), 16 otherwise."""
        return 32 if self.arch == "aarch64" or "+avx512f" in self.features.split(",") else 16

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "triple": self.triple, "cpu": self.cpu, "features": self.features}

    @classmethod
    def from_json(cls, data: dict) -> CpuTarget:
        return cls(data["triple"], data["cpu"], data["features"])

    def machine(self, wide_loops: bool = False) -> llvm.TargetMachine:
        """An LLVM target machine for position-independent code at O3 (one per target per process); `wide_loops`:
        one that vectorises loops over the widest vectors (machine_features)."""
        return _machine(self.triple, self.cpu, self.machine_features(wide_loops))

    def machine_features(self, wide_loops: bool) -> str:
        """The features a target machine gets: the target's, and for `wide_loops` with AVX-512 on x86
        "-prefer-256-bit" (WIDE_LOOPS), so that LLVM vectorises loops over 512-bit vectors."""
        wide = wide_loops and self.arch == "x86_64" and self.simd_floats == 16
        return f"{self.features},{WIDE_LOOPS}" if wide else self.features


@functools.cache
def _machine(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
    """The target machine, or BadInputError when LLVM doesn't know the triple, the CPU or a feature. LLVM only
    warns on stderr about an unknown CPU or feature and goes on without it, and then may abort the process later
    (an x86-64 'bogus' CPU loses 64-bit mode: "LLVM ERROR: 64-bit code requested..."), so its warnings are read."""
    llvm = init_llvm()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise BadInputError(f"CPU target {triple}: LLVM does not know triple {triple!r} ({exc})") from None
    with _stderr_captured() as warnings:
        machine = target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default")
        str(machine.target_data)  # the subtarget is made here too
    unknown = sorted({line.split(" (ignoring")[0] for line in warnings if "is not a recognized" in line})
    if unknown:
        raise BadInputError(f"CPU target {triple}:{cpu}:{features}: {'; '.join(unknown)} (LLVM)")
    return machine


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """Redirect this process's file descriptor 2 (where LLVM writes) to a temporary file for the block; the list it
    yields holds the lines written once the block has ended."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as capture:
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines.extend(capture.read().decode(errors="replace").splitlines())


def host_target() -> CpuTarget:
    """This machine's CPU, with every feature it has, as LLVM detects them (BadInputError NO_HOST_CPU without
    llvmlite)."""
    try:
        llvm = init_llvm()
    except ImportError:
        raise BadInputError(NO_HOST_CPU) from None
    return CpuTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())


def parse_target(spec: str) -> CpuTarget:
    """`cpu` (the host), `cpu:TRIPLE`, or `cpu:TRIPLE:CPU[:FEATURES]`, checked against LLVM where llvmlite is
    installed (without it, only the names' form: see the module's docstring)."""
    kind, _, rest = spec.partition(":")
    if kind != "cpu":
        raise BadInputError(f"unknown target {spec!r}: expected 'cpu', 'cpu:TRIPLE' or 'cpu:TRIPLE:CPU[:FEATURES]'")
    if not rest:
        return host_target()
    triple, _, cpu_features = rest.partition(":")
    cpu, _, features = cpu_features.partition(":")
    triple = TRIPLE_ALIASES.get(triple, triple)
    if not cpu_features:
        cpu, features = DEFAULT_CPUS.get(triple.split("-")[0], ("generic", ""))
    elif not features and triple.startswith("x86_64"):
        features = CPU_FEATURES.get(cpu, "")
    try:
        llvm = init_llvm()
    except ImportError:
        return CpuTarget(triple, cpu or "generic", features)  # LLVM's check is the farm's (the module's docstring)
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise BadInputError(f"target {spec!r}: LLVM does not know triple {triple!r} ({exc})") from None
    target = CpuTarget(triple, cpu or "generic", features)
    target.machine()  # an unknown CPU or feature is refused now, not when a compile process aborts on it
    return target
