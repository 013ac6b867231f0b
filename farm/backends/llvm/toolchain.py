"""LLVM as farm's toolchain: parse, verify, optimise and emit an object for a CPU target. Kernels, weight blobs and
the entry all become objects here."""

from __future__ import annotations

import llvmlite.binding as llvm

from farm.backends.llvm.target import CpuTarget
from farm.errors import BuildError


def compile_ir(text: str, target: CpuTarget, name: str, optimize: bool = True) -> bytes:
    """Parse, verify, optimise at O3 (with loop and SLP vectorisation) and emit an object for `target`."""
    machine = target.machine()
    try:
        module = llvm.parse_assembly(text)
        module.triple = target.triple
        module.data_layout = str(machine.target_data)
        module.verify()
    except RuntimeError as exc:
        raise BuildError(f"{name}: LLVM rejected the generated IR: {exc}") from None
    if optimize:
        _optimize(module, machine)
    return machine.emit_object(module)


def _optimize(module: llvm.ModuleRef, machine: llvm.TargetMachine) -> None:
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    tuning.loop_unrolling = True
    builder = llvm.create_pass_builder(machine, tuning)
    builder.getModulePassManager().run(module, builder)
