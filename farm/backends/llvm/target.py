"""CPU targets: an LLVM triple, cpu name and feature string, parsed from `--target` and turned into machines.

LLVM cross-compiles, so any worker can build for any triple; only running the code needs the real CPU.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import ClassVar

import llvmlite.binding as llvm

from farm.errors import BadInputError

TRIPLE_ALIASES = {"aarch64-linux-gnu": "aarch64-unknown-linux-gnu", "x86_64-linux-gnu": "x86_64-unknown-linux-gnu"}

NAME = re.compile(r"[A-Za-z0-9_.-]+")
FEATURES = re.compile(r"([+-][A-Za-z0-9_.-]+(,[+-][A-Za-z0-9_.-]+)*)?")
SIMD_WIDTHS = (("+avx512f", 16), ("+avx", 8), ("+sse2", 4), ("+neon", 4))


@functools.cache
def init_llvm() -> None:
    """Initialise every LLVM target once per process (cross-compiling needs them all)."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()


@dataclass(frozen=True)
class CpuTarget:
    """Where CPU code runs: triple + cpu + features. `id` names it in keys, manifests and artifact paths."""

    triple: str
    cpu: str = "generic"
    features: str = ""
    kind: ClassVar[str] = "cpu"

    def __post_init__(self) -> None:
        """Triple, CPU and features go into IR text, file names and queue names: refuse anything but plain names."""
        for field, value, pattern in (("triple", self.triple, NAME), ("cpu", self.cpu, NAME),
                                      ("features", self.features, FEATURES)):
            if not isinstance(value, str) or not pattern.fullmatch(value):
                raise BadInputError(f"CPU target {field} {value!r} is not a plain LLVM name")

    @property
    def arch(self) -> str:
        return self.triple.split("-")[0]

    @property
    def id(self) -> str:
        digest = hashlib.sha256(f"{self.triple}|{self.cpu}|{self.features}".encode()).hexdigest()[:8]
        return f"cpu-{self.triple}-{self.cpu}-{digest}"

    @property
    def simd_floats(self) -> int:
        """float32 lanes in the widest vector register the features allow."""
        enabled = set(self.features.split(","))
        widths = [lanes for feature, lanes in SIMD_WIDTHS if feature in enabled]
        return max(widths, default=4 if self.arch in ("aarch64", "x86_64") else 1)

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "triple": self.triple, "cpu": self.cpu, "features": self.features}

    @classmethod
    def from_json(cls, data: dict) -> CpuTarget:
        return cls(data["triple"], data["cpu"], data["features"])

    def machine(self) -> llvm.TargetMachine:
        """An LLVM target machine for position-independent code at O3 (one per target per process)."""
        return _machine(self.triple, self.cpu, self.features)


@functools.cache
def _machine(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
    init_llvm()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default")


def host_target() -> CpuTarget:
    """This machine's CPU, with every feature it has."""
    init_llvm()
    return CpuTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())


def parse_target(spec: str) -> CpuTarget:
    """`cpu` (the host), `cpu:TRIPLE`, or `cpu:TRIPLE:CPU[:FEATURES]`."""
    kind, _, rest = spec.partition(":")
    if kind != "cpu":
        raise BadInputError(f"unknown target {spec!r}: expected 'cpu', 'cpu:TRIPLE' or 'cpu:TRIPLE:CPU[:FEATURES]'")
    if not rest:
        return host_target()
    triple, _, cpu_features = rest.partition(":")
    cpu, _, features = cpu_features.partition(":")
    triple = TRIPLE_ALIASES.get(triple, triple)
    init_llvm()
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise BadInputError(f"target {spec!r}: LLVM does not know triple {triple!r} ({exc})") from None
    return CpuTarget(triple, cpu or "generic", features)
