"""LLVM as farm's toolchain: parse, verify, optimise and emit an object for a CPU target. Kernels, weight blobs and
the entry all become objects here.

The toolchain's identity (`toolchain()`: llvmlite's and LLVM's versions, the linker and its version) is part of
every cache ref of what it builds, since another LLVM or linker may write other bytes for the same spec: kernel and
blob objects are cached under `Toolchain.compiler_key`, artifacts under a build identity that holds `Toolchain.key`
(docs/architecture.md, "Cache keys"). Each process uses its own, so a worker never reads what another toolchain
built; farm's own code generation is versioned apart (farm.ir.specs.CODEGEN_VERSION, in every spec key).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import llvmlite
import llvmlite.binding as llvm

from farm import defaults
from farm.backends.llvm.link import linker_identity
from farm.backends.llvm.target import CpuTarget
from farm.errors import BuildError


@dataclass(frozen=True)
class Toolchain:
    """What turns farm's LLVM IR into bytes. `label` (FARM_TOOLCHAIN_LABEL) is an operator's mark that keeps this
    process's cache entries apart from those of every other label; it can split caches, never merge them."""

    llvmlite: str
    llvm: str
    linker: str
    label: str = ""

    @property
    def compiler_key(self) -> str:
        """16 hex digits naming what writes objects (llvmlite, LLVM, the label): kernel and blob cache refs hold it.
        The linker is left out, since it never touches an object."""
        return _digest([self.llvmlite, self.llvm, self.label])

    @property
    def key(self) -> str:
        """16 hex digits naming the whole toolchain (the compiler and the linker): build identities hold it."""
        return _digest([self.llvmlite, self.llvm, self.linker, self.label])

    def to_json(self) -> dict[str, str]:
        """As workers advertise it (`farm workers --json`), keys included."""
        return {
            "llvmlite": self.llvmlite,
            "llvm": self.llvm,
            "linker": self.linker,
            "label": self.label,
            "compiler_key": self.compiler_key,
            "key": self.key,
        }


def _digest(parts: list[str]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


@functools.cache
def _measured() -> Toolchain:
    return Toolchain(llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)), linker_identity())


def toolchain() -> Toolchain:
    """This process's toolchain: measured once per process (the linker's version is one subprocess), labelled with
    FARM_TOOLCHAIN_LABEL as it is set now."""
    return replace(_measured(), label=defaults.toolchain_label())


class Pipeline(enum.Enum):
    """How LLVM optimises a module before emitting its object (compile_ir). Part of what a cache ref names through
    CODEGEN_VERSION: a kernel's pipeline is a function of its spec and target (kernel.kernel_pipeline)."""

    O3 = "o3"
    """O3 with loop and SLP vectorisation and loop unrolling: loop IR, whose vectors LLVM finds."""
    O3_WIDE_LOOPS = "o3-wide-loops"
    """O3 on a target machine that vectorises loops over the widest vectors (target.WIDE_LOOPS: 512 bits with AVX-512,
    where LLVM prefers 256): loops that call math functions, whose time is their arithmetic."""
    O3_NO_UNROLL = "o3-no-unroll"
    """O3 without loop unrolling: tiny kernels, which run for microseconds whatever the unroller does."""
    EMITTED = "emitted"
    """O1's function simplification only (_emitted): code whose loops, vectors and register tiles farm's emitter
    laid out (the outlined GEMM parts), where O3's vectorisers and loop passes find nothing to do and took a third
    of LLVM's time (light ResNet-50's outlined parts, serially: 3.3 s -> 2.1 s, the same speed)."""
    NONE = "none"
    """No optimisation: the entry, a list of calls."""


def compile_ir(text: str, target: CpuTarget, name: str, pipeline: Pipeline = Pipeline.O3) -> bytes:
    """Parse, verify, optimise with `pipeline` and emit an object for `target`."""
    steps = _PIPELINES[pipeline]
    machine = target.machine(wide_loops=steps.wide_loops)
    try:
        module = llvm.parse_assembly(text)
        module.triple = target.triple
        module.data_layout = str(machine.target_data)
        module.verify()
    except RuntimeError as exc:
        raise BuildError(f"{name}: LLVM rejected the generated IR: {exc}") from None
    steps.run(module, machine)
    return machine.emit_object(module)


def _o3(unroll: bool) -> Callable[[llvm.ModuleRef, llvm.TargetMachine], None]:
    def run(module: llvm.ModuleRef, machine: llvm.TargetMachine) -> None:
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        tuning.loop_vectorization = True
        tuning.slp_vectorization = True
        tuning.loop_unrolling = unroll
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(module, builder)

    return run


def _emitted(module: llvm.ModuleRef, machine: llvm.TargetMachine) -> None:
    """O1's function simplification on each function: SROA takes the accumulators out of their allocas, EarlyCSE,
    InstCombine, LICM and IndVarSimplify fold and hoist the emitter's index arithmetic, and loops are rotated. No
    vectorisers, unroller or LoopLoadElimination: the module optimisation pipeline is not run."""
    tuning = llvm.create_pipeline_tuning_options(speed_level=1)
    tuning.loop_unrolling = False
    builder = llvm.create_pass_builder(machine, tuning)
    passes = builder.getFunctionPassManager()
    for function in module.functions:
        if not function.is_declaration:
            passes.run(function, builder)


@dataclass(frozen=True)
class _Steps:
    """What a Pipeline does: the passes it runs on a module, and whether on a target machine that vectorises loops
    over the widest vectors (CpuTarget.machine's `wide_loops`)."""

    run: Callable[[llvm.ModuleRef, llvm.TargetMachine], None]
    wide_loops: bool = False


_PIPELINES: dict[Pipeline, _Steps] = {
    Pipeline.O3: _Steps(_o3(unroll=True)),
    Pipeline.O3_WIDE_LOOPS: _Steps(_o3(unroll=True), wide_loops=True),
    Pipeline.O3_NO_UNROLL: _Steps(_o3(unroll=False)),
    Pipeline.EMITTED: _Steps(_emitted),
    Pipeline.NONE: _Steps(lambda module, machine: None),
}
