"""compile_entry: the schedule in, an object with `farm_run(uint8_t *arena)` and
`farm_launch(int64_t index, int64_t begin, int64_t end, uint8_t *arena)` out.

farm_run calls every kernel in schedule order with pointers into the arena (activations, inputs, outputs,
scratch) or to the weights, so a whole inference is one native call. The library holds code alone: the weights
are members of the artifact that the runtime maps, and it writes their addresses into a table of 64-bit pointers
after the arena (farm.build.parts.weights_offset), which the entry reads. A library is thus the same file for every
model of the same architecture and shapes, and two models loaded from it never share a weight.
farm_launch runs one launch of the schedule (the launches of every step's kernel, numbered in order; see
loopir.launch_groups) over iterations [begin, end): a multithreaded runtime calls it from several threads.
`farm_run_steps(arena, begin, end)` runs steps [begin, end) of the same schedule, so that `farm bench` can time
each step on its own.
`farm_work(arena, table, counters)` is the native thread pool's body: every thread of a multithreaded run calls
it once, and the threads claim the ranges of each launch in turn from shared atomic counters (see _work_function).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir

from farm.backends.llvm.render import PTR_T, declare_kernel, declare_launch, launch_symbol
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import compile_ir

ENTRY_SYMBOL = "farm_run"
STEPS_SYMBOL = "farm_run_steps"
LAUNCH_SYMBOL = "farm_launch"
WORK_SYMBOL = "farm_work"
I8_T, I32_T, I64_T = ir.IntType(8), ir.IntType(32), ir.IntType(64)
# Spins on a busy-wait before each further check yields the CPU (sched_yield): long enough that a wait for a range
# finishing on another core never sleeps, short enough that a thread waiting for a descheduled one gives way.
SPINS_BEFORE_YIELD = 1024


def entry_ir(schedule: list[dict[str, Any]], target: CpuTarget, weights_offset: int = 0) -> str:
    """IR of farm_run, farm_run_steps and farm_launch for `schedule`: [{"kernel": symbol, "args": [["arena",
    offset] | ["weight", slot]], "launches": [[extent, grain, work], ...]}] (a call without "launches" has none);
    weight slots are read from the table at arena + `weights_offset`."""
    module = ir.Module(name=ENTRY_SYMBOL)
    module.triple = target.triple
    schedule = [{**call, "args": [_table_slot(arg, weights_offset) for arg in call["args"]]} for call in schedule]
    entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T]), ENTRY_SYMBOL)
    _dispatch_only(entry)
    builder = ir.IRBuilder(entry.append_basic_block("entry"))
    for call in schedule:
        _call_step(module, builder, entry.args[0], call)
    builder.ret_void()
    _steps_function(module, schedule)
    _work_function(module, _launch_entry(module, schedule), target)
    return str(module)


def _dispatch_only(function: ir.Function) -> None:
    """Mark a function that only dispatches (a call per step or launch: nothing to optimise) optnone, which needs
    noinline: LLVM's O3 passes skip it and select its code fast. BERT-base's entry (415 steps) compiles in 0.07 s
    instead of 0.25 s, which the link, serial after every unit, spends; farm_work, the thread pool's loop, is still
    optimised."""
    for attribute in ("nounwind", "noinline", "optnone"):
        function.attributes.add(attribute)


def _call_step(module: ir.Module, builder: ir.IRBuilder, arena: ir.Value, call: dict[str, Any]) -> None:
    kernel = module.globals.get(call["kernel"]) or declare_kernel(module, call["kernel"], len(call["args"]))
    builder.call(kernel, [_pointer(module, builder, arena, arg) for arg in call["args"]])


def _steps_function(module: ir.Module, schedule: list[dict[str, Any]]) -> None:
    """farm_run_steps(arena, begin, end): for i in [begin, end): switch (i) { case k: step k }."""
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T, I64_T, I64_T]), STEPS_SYMBOL)
    _dispatch_only(function)
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


def _launch_entry(module: ir.Module, schedule: list[dict[str, Any]]) -> ir.Function:
    """farm_launch: a switch over every launch of the schedule, each case calling one launch function."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64_T, I64_T, I64_T, PTR_T]), LAUNCH_SYMBOL)
    _dispatch_only(fn)
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
    return fn


def _pause_x86(module: ir.Module, builder: ir.IRBuilder) -> None:
    builder.call(_intrinsic(module, "llvm.x86.sse2.pause", []), [])


def _pause_aarch64(module: ir.Module, builder: ir.IRBuilder) -> None:
    builder.call(_intrinsic(module, "llvm.aarch64.hint", [I32_T]), [ir.Constant(I32_T, 1)])  # 1: YIELD


# The spin-wait hint of each architecture (tells the core a busy-wait is running); none elsewhere.
PAUSES = {"x86_64": _pause_x86, "aarch64": _pause_aarch64}


def _intrinsic(module: ir.Module, name: str, params: list[ir.Type]) -> ir.Function:
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)


def _work_function(module: ir.Module, launch: ir.Function, target: CpuTarget) -> None:
    """farm_work(arena, table, counters): one thread's share of a multithreaded run.

    table (int64): [groups, first_0 .. first_groups, (launch, begin, end) ...]: group g is ranges
    [first_g, first_g+1) of one launch, in the order of the iterations they cover. counters (int64, zeroed before
    the run, then `threads` at [2 * groups + 1]): [claimed_g, done_g] per group (claimed_g only for libraries built
    before slices, which claim with it), the thread count pair
    [arrivals, threads], then one flag per range. Each thread takes an index as it arrives (an atomic add on
    `arrivals`) and, in every group, first runs the ranges of its own slice (its index's share of the group's
    ranges, in order), then takes any range still free, last first; a range runs once, for whichever thread swaps
    its flag from 0. It then waits for done_g to reach the group's count before group g+1, whose ranges may read
    what g wrote. So in a run where every thread keeps up, a thread runs the same share of every launch, and what
    it wrote stays in its core's cache for the next launch that reads it (ResNet-50 on two Xeon threads 34.3 ->
    33.0 ms against ranges going to whichever thread claimed first); a thread the OS runs late holds nobody up: the
    others take its free ranges, so only a range being run is waited for.
    """
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T, PTR_T, PTR_T]), WORK_SYMBOL)
    fn.attributes.add("nounwind")
    arena, table, counters = fn.args
    arena.name, table.name, counters.name = "arena", "table", "counters"
    names = ("entry", "group", "body", "own", "own_try", "steal_from", "steal", "steal_try", "wait", "spin", "pause",
             "yield", "next", "done")
    blocks = {name: fn.append_basic_block(name) for name in names}
    b = ir.IRBuilder(blocks["entry"])
    at = lambda base, index: b.gep(base, [index], inbounds=True, source_etype=I64_T)  # noqa: E731
    one, zero = ir.Constant(I64_T, 1), ir.Constant(I64_T, 0)
    groups = b.load(at(table, zero), typ=I64_T)
    pair = b.mul(groups, ir.Constant(I64_T, 2))
    me = b.atomic_rmw("add", at(counters, pair), one, "monotonic")
    given = b.load(at(counters, b.add(pair, one)), typ=I64_T)
    threads = b.select(b.icmp_signed("<", given, one), one, given)
    flags = at(counters, b.add(pair, ir.Constant(I64_T, 2)))
    ranges = at(table, b.add(groups, ir.Constant(I64_T, 2)))
    group_slot, spin_slot, index_slot = b.alloca(I64_T), b.alloca(I64_T), b.alloca(I64_T)
    b.store(zero, group_slot)
    b.store(zero, spin_slot)
    b.branch(blocks["group"])

    b.position_at_end(blocks["group"])
    group = b.load(group_slot)
    b.cbranch(b.icmp_signed("<", group, groups), blocks["body"], blocks["done"])

    b.position_at_end(blocks["body"])
    first = b.load(at(table, b.add(group, one)), typ=I64_T)
    count = b.sub(b.load(at(table, b.add(group, ir.Constant(I64_T, 2))), typ=I64_T), first)
    finished = at(counters, b.add(b.mul(group, ir.Constant(I64_T, 2)), one))
    own_end = _slice_start(b, b.add(me, one), count, threads)
    b.store(_slice_start(b, me, count, threads), index_slot)
    b.branch(blocks["own"])

    def try_range(index: ir.Value, after: ir.Block) -> None:
        """Run range `index` of the group if this thread is the one that takes it, then go to `after`."""
        taken = b.atomic_rmw("xchg", at(flags, b.add(first, index)), one, "monotonic")
        with b.if_then(b.icmp_signed("==", taken, zero)):
            row = at(ranges, b.mul(b.add(first, index), ir.Constant(I64_T, 3)))
            fields = [b.load(b.gep(row, [ir.Constant(I64_T, i)], inbounds=True, source_etype=I64_T), typ=I64_T)
                      for i in range(3)]
            b.call(launch, [*fields, arena])
            b.atomic_rmw("add", finished, one, "release")
        b.branch(after)

    b.position_at_end(blocks["own"])
    index = b.load(index_slot)
    b.cbranch(b.icmp_signed("<", index, own_end), blocks["own_try"], blocks["steal_from"])
    b.position_at_end(blocks["own_try"])
    b.store(b.add(index, one), index_slot)
    try_range(index, blocks["own"])

    b.position_at_end(blocks["steal_from"])
    b.store(count, index_slot)
    b.store(zero, spin_slot)
    b.branch(blocks["steal"])
    b.position_at_end(blocks["steal"])
    index = b.sub(b.load(index_slot), one)
    b.cbranch(b.icmp_signed(">=", index, zero), blocks["steal_try"], blocks["wait"])
    b.position_at_end(blocks["steal_try"])
    b.store(index, index_slot)
    try_range(index, blocks["steal"])

    b.position_at_end(blocks["wait"])
    done = b.load_atomic(finished, "acquire", 8, typ=I64_T)
    b.cbranch(b.icmp_signed(">=", done, count), blocks["next"], blocks["spin"])

    b.position_at_end(blocks["spin"])
    spins = b.add(b.load(spin_slot), one)
    b.store(spins, spin_slot)
    b.cbranch(b.icmp_signed("<", spins, ir.Constant(I64_T, SPINS_BEFORE_YIELD)), blocks["pause"], blocks["yield"])

    b.position_at_end(blocks["pause"])
    PAUSES.get(target.arch, lambda module, builder: None)(module, b)
    b.branch(blocks["wait"])

    b.position_at_end(blocks["yield"])
    sched_yield = module.globals.get("sched_yield") or ir.Function(module, ir.FunctionType(I32_T, []), "sched_yield")
    b.call(sched_yield, [])
    b.branch(blocks["wait"])

    b.position_at_end(blocks["next"])
    b.store(b.add(group, one), group_slot)
    b.branch(blocks["group"])

    b.position_at_end(blocks["done"])
    b.ret_void()


def _slice_start(b: ir.IRBuilder, thread: ir.Value, count: ir.Value, threads: ir.Value) -> ir.Value:
    """The first range of `thread`'s slice of a group's `count` ranges (ceil(thread * count / threads)), at most
    count: a thread past the run's count (none should be) has an empty slice."""
    start = b.sdiv(b.add(b.mul(thread, count), b.sub(threads, ir.Constant(I64_T, 1))), threads)
    return b.select(b.icmp_signed("<", start, count), start, count)


def _table_slot(arg: list, weights_offset: int) -> list:
    """["weight", slot] as ["table", the arena offset of its pointer]; other arguments as they are."""
    kind, where = arg
    return ["table", weights_offset + 8 * where] if kind == "weight" else arg


def _pointer(module: ir.Module, builder: ir.IRBuilder, arena: ir.Value, arg: list) -> ir.Value:
    """An argument's address: into the arena, or a weight's, loaded from its pointer in the weight table that the
    runtime writes after the arena (["table", offset of the pointer])."""
    kind, where = arg
    address = builder.gep(arena, [ir.Constant(I64_T, where)], inbounds=True, source_etype=I8_T)
    return address if kind == "arena" else builder.load(address, typ=PTR_T, align=8)


def compile_entry(schedule: list[dict[str, Any]], target: CpuTarget, weights_offset: int = 0) -> bytes:
    """The entry's object code for `target` (`weights_offset`: where the weight table starts in the arena)."""
    return compile_ir(entry_ir(schedule, target, weights_offset), target, ENTRY_SYMBOL)
