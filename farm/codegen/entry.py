"""compile_entry: the schedule in, an object with `farm_run(uint8_t *arena)` and
`farm_launch(int64_t index, int64_t begin, int64_t end, uint8_t *arena)` out.

farm_run calls every kernel in schedule order with pointers into the arena (activations, inputs, outputs,
scratch) or to the weight blobs linked into the same library, so a whole inference is one native call.
farm_launch runs one launch of the schedule (the launches of every step's kernel, numbered in order; see
loopir.launch_groups) over iterations [begin, end): a multithreaded runtime calls it from several threads.
`farm_run_steps(arena, begin, end)` runs steps [begin, end) of the same schedule, so that `farm bench` can time
each step on its own.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir

from farm.codegen.cpu import compile_ir
from farm.codegen.llvm_render import PTR_T, declare_kernel, declare_launch, launch_symbol
from farm.codegen.targets import CpuTarget

ENTRY_SYMBOL = "farm_run"
STEPS_SYMBOL = "farm_run_steps"
LAUNCH_SYMBOL = "farm_launch"
I8_T, I64_T = ir.IntType(8), ir.IntType(64)


def entry_ir(schedule: list[dict[str, Any]], target: CpuTarget) -> str:
    """IR of farm_run, farm_run_steps and farm_launch for `schedule`: [{"kernel": symbol, "args": [["arena",
    offset] | ["blob", symbol]], "launches": [[extent, grain, work], ...]}] (a call without "launches" has none)."""
    module = ir.Module(name=ENTRY_SYMBOL)
    module.triple = target.triple
    entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T]), ENTRY_SYMBOL)
    entry.attributes.add("nounwind")
    builder = ir.IRBuilder(entry.append_basic_block("entry"))
    for call in schedule:
        _call_step(module, builder, entry.args[0], call)
    builder.ret_void()
    _steps_function(module, schedule)
    _launch_entry(module, schedule)
    return str(module)


def _call_step(module: ir.Module, builder: ir.IRBuilder, arena: ir.Value, call: dict[str, Any]) -> None:
    kernel = module.globals.get(call["kernel"]) or declare_kernel(module, call["kernel"], len(call["args"]))
    builder.call(kernel, [_pointer(module, builder, arena, arg) for arg in call["args"]])


def _steps_function(module: ir.Module, schedule: list[dict[str, Any]]) -> None:
    """farm_run_steps(arena, begin, end): for i in [begin, end): switch (i) { case k: step k }."""
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T, I64_T, I64_T]), STEPS_SYMBOL)
    function.attributes.add("nounwind")
    arena, begin, end = function.args
    head, done = function.append_basic_block("head"), function.append_basic_block("done")
    entry = ir.IRBuilder(function.append_basic_block("entry"))
    function.basic_blocks.insert(0, function.basic_blocks.pop())
    counter = entry.alloca(I64_T)
    entry.store(begin, counter)
    entry.branch(head)
    builder = ir.IRBuilder(head)
    index = builder.load(counter)
    body, latch = function.append_basic_block("body"), function.append_basic_block("latch")
    builder.cbranch(builder.icmp_signed("<", index, end), body, done)
    switch = ir.IRBuilder(body).switch(index, latch)
    for number, call in enumerate(schedule):
        case = ir.IRBuilder(function.append_basic_block(f"step{number}"))
        _call_step(module, case, arena, call)
        case.branch(latch)
        switch.add_case(ir.Constant(I64_T, number), case.block)
    step = ir.IRBuilder(latch)
    step.store(step.add(step.load(counter), ir.Constant(I64_T, 1)), counter)
    step.branch(head)
    ir.IRBuilder(done).ret_void()


def _launch_entry(module: ir.Module, schedule: list[dict[str, Any]]) -> None:
    """farm_launch: a switch over every launch of the schedule, each case calling one launch function."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64_T, I64_T, I64_T, PTR_T]), LAUNCH_SYMBOL)
    fn.attributes.add("nounwind")
    index, begin, end, arena = fn.args
    index.name, begin.name, end.name, arena.name = "index", "begin", "end", "arena"
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    done = fn.append_basic_block("done")
    switch = builder.switch(index, done)
    number = 0
    for call in schedule:
        for launch in range(len(call.get("launches", []))):
            case = fn.append_basic_block(f"launch{number}")
            switch.add_case(ir.Constant(I64_T, number), case)
            builder.position_at_end(case)
            symbol = launch_symbol(call["kernel"], launch)
            callee = module.globals.get(symbol) or declare_launch(module, symbol, len(call["args"]))
            builder.call(callee, [*(_pointer(module, builder, arena, arg) for arg in call["args"]), begin, end])
            builder.branch(done)
            number += 1
    builder.position_at_end(done)
    builder.ret_void()


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
