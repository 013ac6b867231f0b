"""compile_entry: the schedule in, an object with `farm_run(uint8_t *arena)` out.

The entry calls every kernel in schedule order with pointers into the arena (activations, inputs, outputs,
scratch) or to the weight blobs linked into the same library, so a whole inference is one native call.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir

from farm.codegen.cpu import compile_ir
from farm.codegen.llvm_render import PTR_T, declare_kernel
from farm.codegen.targets import CpuTarget

ENTRY_SYMBOL = "farm_run"
I8_T, I64_T = ir.IntType(8), ir.IntType(64)


def entry_ir(schedule: list[dict[str, Any]], target: CpuTarget) -> str:
    """IR of farm_run for `schedule`: [{"kernel": symbol, "args": [["arena", offset] | ["blob", symbol]]}]."""
    module = ir.Module(name=ENTRY_SYMBOL)
    module.triple = target.triple
    entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T]), ENTRY_SYMBOL)
    entry.attributes.add("nounwind")
    builder = ir.IRBuilder(entry.append_basic_block("entry"))
    for call in schedule:
        kernel = module.globals.get(call["kernel"]) or declare_kernel(module, call["kernel"], len(call["args"]))
        builder.call(kernel, [_pointer(module, builder, entry.args[0], arg) for arg in call["args"]])
    builder.ret_void()
    return str(module)


def _pointer(module: ir.Module, builder: ir.IRBuilder, arena: ir.Value, arg: list) -> ir.Value:
    kind, where = arg
    if kind == "arena":
        return builder.gep(arena, [ir.Constant(I64_T, where)], inbounds=True, source_etype=I8_T)
    if where not in module.globals:
        blob = ir.GlobalVariable(module, I8_T, where)
        blob.linkage, blob.storage_class = "external", "hidden"
    return module.globals[where]


def compile_entry(schedule: list[dict[str, Any]], target: CpuTarget) -> bytes:
    """The entry's object code for `target`."""
    return compile_ir(entry_ir(schedule, target), target, ENTRY_SYMBOL)
