"""compile_entry: the schedule in, an object with `farm_run(uint8_t *arena)` and
`farm_launch(int64_t index, int64_t begin, int64_t end, uint8_t *arena)` out.

farm_run calls every kernel in schedule order with pointers into the arena (activations, inputs, outputs,
scratch) or to the weights, so a whole inference is one native call. The library holds code alone: the weights
are members of the artifact that the runtime maps, and it writes their addresses into a table of 64-bit pointers
after the arena (farm.build.parts.weights_offset), which the entry reads. A library is thus the same file for every
model of the same architecture and shapes, and two models loaded from it never share a weight.
farm_launch runs one launch of the schedule (the launches of every step's kernel, numbered in order; see
launching.launch_groups) over iterations [begin, end): a multithreaded runtime calls it from several threads.
`farm_run_steps(arena, begin, end)` runs steps [begin, end) of the same schedule, so that `farm bench` can time
each step on its own.
`farm_work(arena, table, counters)` is the native thread pool's body: every thread of a multithreaded run calls
it once, and the threads claim the ranges of each launch in turn from shared atomic counters (see _work_function).
On Linux, `farm_serve(state, table, helper)` is a helper thread's whole life, which waits for runs in native code,
and `farm_post(state, arena, counters)` hands it each run (see _serve_function).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from llvmlite import ir

from farm.backends.llvm.render import PTR_T, launch_symbol
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import Pipeline, compile_ir
from farm.errors import BuildError

ENTRY_SYMBOL = "farm_run"
STEPS_SYMBOL = "farm_run_steps"
LAUNCH_SYMBOL = "farm_launch"
WORK_SYMBOL = "farm_work"
SERVE_SYMBOL = "farm_serve"
POST_SYMBOL = "farm_post"
I8_T, I32_T, I64_T = ir.IntType(8), ir.IntType(32), ir.IntType(64)
# Spins on a busy-wait before each further check yields the CPU (sched_yield): long enough that a wait for a range
# finishing on another core never sleeps, short enough that a thread waiting for a descheduled one gives way.
SPINS_BEFORE_YIELD = 1024
SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def entry_ir(schedule: list[dict[str, Any]], target: CpuTarget, weights_offset: int = 0) -> str:
    """IR of farm_run, farm_run_steps, farm_launch and farm_work for `schedule`: [{"kernel": symbol, "args":
    [["arena", offset] | ["weight", slot] | ["input", offset, pointer slot, offset inside]], "launches": [[extent,
    grain, work], ...]}] (a call without "launches" has none); weight slots are read from the table at arena +
    `weights_offset`, a model input from its feed where its pointer slot holds one (_input_lines).

    The three dispatch functions are written as text, a few lines per call: built through llvmlite's IR builder
    they took light DenseNet-121's finish 0.3-0.5 s of Python (an object and a unique name per instruction), on
    the build's critical path after every unit. farm_run runs every step through farm_run_steps, so each step's
    call is compiled once, not twice. farm_work, the thread pool's loop, is the same for every schedule and comes
    from llvmlite's builder (_work_text)."""
    calls = [
        (
            _checked_symbol(call["kernel"]),
            [_table_slot(arg, weights_offset) for arg in call["args"]],
            len(call.get("launches", [])),
        )
        for call in schedule
    ]
    kernels = {symbol: len(args) for symbol, args, _ in calls}
    launches = [(launch_symbol(symbol, launch), args) for symbol, args, count in calls for launch in range(count)]
    lines = [f'; ModuleID = "{ENTRY_SYMBOL}"', f'target triple = "{target.triple}"', ""]
    lines += [_declaration(symbol, count, launch=False) for symbol, count in kernels.items()]
    lines += [_declaration(symbol, len(args), launch=True) for symbol, args in dict(launches).items()]
    lines += [
        "",
        f'define void @"{ENTRY_SYMBOL}"(ptr %arena) {DISPATCH_ATTRIBUTES}',
        "{",
        "entry:",
        f'  call void @"{STEPS_SYMBOL}"(ptr %arena, i64 0, i64 {len(calls)})',
        "  ret void",
        "}",
        "",
    ]
    lines += _steps_text(calls)
    lines += _launch_text(launches)
    lines.append(_work_text(target))
    return "\n".join(lines)


DISPATCH_ATTRIBUTES = "noinline nounwind optnone"
"""The attributes of a function that only dispatches (a call per step or launch: nothing to optimise): LLVM's O3
passes skip an optnone function (which needs noinline) and select its code fast. BERT-base's entry (415 steps)
compiles in 0.07 s instead of 0.25 s, which the link, serial after every unit, spends; farm_work, the thread
pool's loop, is still optimised."""


def _checked_symbol(symbol: object) -> str:
    """A kernel symbol of the schedule, which goes into IR text unquoted by any builder: farm's symbols are plain
    names (farm_k_<hex>); anything else in a link plan is refused."""
    if not isinstance(symbol, str) or not SYMBOL.fullmatch(symbol):
        raise BuildError(f"the schedule names a kernel {str(symbol)[:100]!r} that is not a plain symbol")
    return symbol


def _declaration(symbol: str, count: int, launch: bool) -> str:
    """A kernel (void symbol(ptr, ...)) or a launch (..., i64 begin, i64 end), hidden inside the library."""
    params = ["ptr"] * count + (["i64", "i64"] if launch else [])
    return f'declare hidden void @"{symbol}"({", ".join(params)})'


def _call_lines(symbol: str, args: list[list], name: str, extra: str = "") -> list[str]:
    """Lines that compute each argument's address (named `name`.<index>) and call `symbol` with them (and
    `extra`, already typed)."""
    lines, values = [], []
    for index, (kind, *where) in enumerate(args):
        value = f"%{name}.{index}"
        if kind not in ARGUMENT_LINES:
            raise BuildError(f"the schedule passes {symbol} an argument of unknown kind {str(kind)[:40]!r}")
        lines += ARGUMENT_LINES[kind](value, [int(number) for number in where])
        values.append(f"ptr {value}")
    lines.append(f'  call void @"{symbol}"({", ".join(values + ([extra] if extra else []))})')
    return lines


def _arena_lines(value: str, where: list[int]) -> list[str]:
    """A buffer of the arena: the arena's address plus its offset."""
    return [f"  {value} = getelementptr inbounds i8, ptr %arena, i64 {where[0]}"]


def _table_lines(value: str, where: list[int]) -> list[str]:
    """A weight: its pointer, in its slot of the table after the arena (_table_slot)."""
    return [
        f"  {value}.slot = getelementptr inbounds i8, ptr %arena, i64 {where[0]}",
        f"  {value} = load ptr, ptr {value}.slot, align 8",
    ]


def _input_lines(value: str, where: list[int]) -> list[str]:
    """A model input's bytes ([offset, pointer slot, offset inside the input]): the feed the runtime put in the
    slot, read in place, or the input's own buffer in the arena where the slot holds 0 (the runtime copied the
    feed there: an old runtime, a feed not laid out as the input, a run under emulation)."""
    offset, slot, inner = where
    return [
        f"  {value}.slot = getelementptr inbounds i8, ptr %arena, i64 {slot}",
        f"  {value}.fed = load ptr, ptr {value}.slot, align 8",
        f"  {value}.copied = icmp eq ptr {value}.fed, null",
        f"  {value}.in = getelementptr i8, ptr {value}.fed, i64 {inner}",
        f"  {value}.own = getelementptr inbounds i8, ptr %arena, i64 {offset}",
        f"  {value} = select i1 {value}.copied, ptr {value}.own, ptr {value}.in",
    ]


ARGUMENT_LINES: dict[str, Callable[[str, list[int]], list[str]]] = {
    "arena": _arena_lines,
    "table": _table_lines,
    "input": _input_lines,
}
"""The lines that compute a call's argument, by its kind in the link plan (after _table_slot)."""


def _steps_text(calls: list[tuple[str, list[list], int]]) -> list[str]:
    """farm_run_steps(arena, begin, end): for i in [begin, end): switch (i) { case k: step k }."""
    cases = " ".join(f"i64 {number}, label %step{number}" for number in range(len(calls)))
    lines = [
        f'define void @"{STEPS_SYMBOL}"(ptr %arena, i64 %begin, i64 %end) {DISPATCH_ATTRIBUTES}',
        "{",
        "entry:",
        "  %counter = alloca i64",
        "  store i64 %begin, ptr %counter",
        "  br label %head",
        "head:",
        "  %index = load i64, ptr %counter",
        "  %more = icmp slt i64 %index, %end",
        "  br i1 %more, label %body, label %done",
        "body:",
        f"  switch i64 %index, label %latch [{cases}]",
    ]
    for number, (symbol, args, _) in enumerate(calls):
        lines += [f"step{number}:", *_call_lines(symbol, args, f"s{number}"), "  br label %latch"]
    lines += [
        "latch:",
        "  %current = load i64, ptr %counter",
        "  %next = add i64 %current, 1",
        "  store i64 %next, ptr %counter",
        "  br label %head",
        "done:",
        "  ret void",
        "}",
        "",
    ]
    return lines


def _launch_text(launches: list[tuple[str, list[list]]]) -> list[str]:
    """farm_launch(index, begin, end, arena): a switch over every launch of the schedule, each case calling one
    launch function over [begin, end)."""
    cases = " ".join(f"i64 {number}, label %launch{number}" for number in range(len(launches)))
    lines = [
        f'define void @"{LAUNCH_SYMBOL}"(i64 %index, i64 %begin, i64 %end, ptr %arena) {DISPATCH_ATTRIBUTES}',
        "{",
        "entry:",
        f"  switch i64 %index, label %done [{cases}]",
    ]
    for number, (symbol, args) in enumerate(launches):
        lines += [
            f"launch{number}:",
            *_call_lines(symbol, args, f"l{number}", "i64 %begin, i64 %end"),
            "  br label %done",
        ]
    lines += ["done:", "  ret void", "}", ""]
    return lines


@functools.cache
def _work_text(target: CpuTarget) -> str:
    """farm_work's definition and the declarations it needs (not farm_launch's, which entry_ir defines), the same
    for every schedule of a target: built once per process and target."""
    module = ir.Module(name=ENTRY_SYMBOL)
    launch = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64_T, I64_T, I64_T, PTR_T]), LAUNCH_SYMBOL)
    work = _work_function(module, launch, target)
    if serves_natively(target):
        _serve_function(module, work, target)
        _post_function(module, target)
    entities = str(module).split("\n\n")
    return "\n\n".join(entity for entity in entities[1:] if not entity.startswith(f'declare void @"{LAUNCH_SYMBOL}"'))


def _pause_x86(module: ir.Module, builder: ir.IRBuilder) -> None:
    builder.call(_intrinsic(module, "llvm.x86.sse2.pause", []), [])


def _pause_aarch64(module: ir.Module, builder: ir.IRBuilder) -> None:
    builder.call(_intrinsic(module, "llvm.aarch64.hint", [I32_T]), [ir.Constant(I32_T, 1)])  # 1: YIELD


# The spin-wait hint of each architecture (tells the core a busy-wait is running); none elsewhere.
PAUSES = {"x86_64": _pause_x86, "aarch64": _pause_aarch64}


def _intrinsic(module: ir.Module, name: str, params: list[ir.Type]) -> ir.Function:
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)


def _work_function(module: ir.Module, launch: ir.Function, target: CpuTarget) -> ir.Function:
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
    it wrote stays in its core's cache for the next launch that reads it (faster than ranges going to whichever
    thread claimed first); a thread the OS runs late holds nobody up: the
    others take its free ranges, so only a range being run is waited for.
    """
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T, PTR_T, PTR_T]), WORK_SYMBOL)
    fn.attributes.add("nounwind")
    arena, table, counters = fn.args
    arena.name, table.name, counters.name = "arena", "table", "counters"
    names = (
        "entry",
        "group",
        "body",
        "own",
        "own_try",
        "steal_from",
        "steal",
        "steal_try",
        "wait",
        "spin",
        "pause",
        "yield",
        "next",
        "done",
    )
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
            fields = [
                b.load(b.gep(row, [ir.Constant(I64_T, i)], inbounds=True, source_etype=I64_T), typ=I64_T)
                for i in range(3)
            ]
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
    return fn


FUTEX_SYSCALLS = {"x86_64": 202, "aarch64": 98}
"""Linux's futex system call number on each architecture: farm_serve sleeps in it once idle, farm_post wakes it."""
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
IDLE_SPINS = 4096
"""Spin-waits a helper makes for the next run before it sleeps: about 50 us on the Xeon of docs/benchmarks.md (12 ns
a pause), 0.2 ms where a pause takes 140 cycles (Skylake). Runs back to back (a benchmark, a busy server) find it
awake; an idle model costs that much of a core after its last run, then nothing. Waking a sleeping helper took
12-90 us there, now and then over a millisecond."""
STATE_SEQUENCE, STATE_ARENA, STATE_COUNTERS, STATE_STOP = 0, 1, 2, 3
STATE_SLEEPERS = 8
"""Where the words of a native pool's state are (farm.runtime.model._NativePool): the run sequence, the run's arena
and counters and the stop flag, written by the calling thread; on a line of their own, the helpers asleep in the
futex; then each helper's last finished run, a line each (STATE_HELPERS + 8 * helper)."""
STATE_HELPERS = 16


def serves_natively(target: CpuTarget) -> bool:
    """Whether `target`'s library has farm_serve and farm_post: Linux on an architecture of FUTEX_SYSCALLS."""
    return "-linux" in target.triple and target.arch in FUTEX_SYSCALLS


def serving_entries(target: CpuTarget) -> dict[str, str]:
    """The manifest's serve_entry and post_entry for `target`, where its library has them (serves_natively)."""
    return {"serve_entry": SERVE_SYMBOL, "post_entry": POST_SYMBOL} if serves_natively(target) else {}


def _futex(
    module: ir.Module, b: ir.IRBuilder, target: CpuTarget, word: ir.Value, operation: int, value: ir.Value
) -> None:
    """syscall(SYS_futex, word, operation, value, NULL, NULL, 0) through libc."""
    syscall = module.globals.get("syscall") or ir.Function(
        module, ir.FunctionType(I64_T, [I64_T], var_arg=True), "syscall"
    )
    null = ir.Constant(PTR_T, None)
    arguments = [ir.Constant(I64_T, FUTEX_SYSCALLS[target.arch]), word, ir.Constant(I64_T, operation), value]
    b.call(syscall, [*arguments, null, null, ir.Constant(I64_T, 0)])


def _serve_function(module: ir.Module, work: ir.Function, target: CpuTarget) -> None:
    """farm_serve(state, table, helper): a helper thread's life in a multithreaded run's pool. It waits for the run
    sequence (even once a run is posted; odd while farm_post writes) to move past the last run it saw: it spins
    IDLE_SPINS times, then counts itself among the sleepers, checks once more and sleeps in the futex on the
    sequence's low word until farm_post wakes it. It reads the run's arena and counters between two reads of the
    sequence (a seqlock: a torn read is retried), runs farm_work over them (none when counters is 0: a wake only),
    and records the run as its last finished one, so the caller may free counters up to there. It returns once the
    stop flag is set.

    A helper that blocked in the OS between runs (a Python queue) started each run some 30 us late: waking a
    thread takes that long on a 2-vCPU VM, and the GIL passes twice before the helper is back in native code;
    resnet18_style's int8 artifact ran 0.73-0.75 ms on two threads that way, 0.67-0.70 with farm_serve."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T, PTR_T, I64_T]), SERVE_SYMBOL)
    fn.attributes.add("nounwind")
    state, table, helper = fn.args
    state.name, table.name, helper.name = "state", "table", "helper"
    names = ("entry", "check", "idle", "pause", "sleep", "read", "run", "done")
    blocks = {name: fn.append_basic_block(name) for name in names}
    b = ir.IRBuilder(blocks["entry"])
    word = lambda index: b.gep(state, [index], inbounds=True, source_etype=I64_T)  # noqa: E731
    constant = lambda value: ir.Constant(I64_T, value)  # noqa: E731
    seen_slot, spins_slot = b.alloca(I64_T), b.alloca(I64_T)
    b.store(constant(0), seen_slot)
    b.store(constant(0), spins_slot)
    sequence_word = word(constant(STATE_SEQUENCE))
    b.branch(blocks["check"])

    b.position_at_end(blocks["check"])
    stopped = b.icmp_signed("!=", b.load_atomic(word(constant(STATE_STOP)), "acquire", 8, typ=I64_T), constant(0))
    sequence = b.load_atomic(sequence_word, "acquire", 8, typ=I64_T)
    posted = b.and_(
        b.icmp_signed("!=", sequence, b.load(seen_slot)),
        b.icmp_signed("==", b.and_(sequence, constant(1)), constant(0)),
    )
    b.cbranch(stopped, blocks["done"], blocks["idle"])

    b.position_at_end(blocks["idle"])
    spins = b.load(spins_slot)
    b.cbranch(posted, blocks["read"], blocks["pause"])

    b.position_at_end(blocks["pause"])
    b.store(b.add(spins, constant(1)), spins_slot)
    with b.if_then(b.icmp_signed("<", spins, constant(IDLE_SPINS))):
        PAUSES.get(target.arch, lambda module, builder: None)(module, b)
        b.branch(blocks["check"])
    b.branch(blocks["sleep"])

    b.position_at_end(blocks["sleep"])
    sleepers = word(constant(STATE_SLEEPERS))
    b.atomic_rmw("add", sleepers, constant(1), "seq_cst")
    latest = b.load_atomic(sequence_word, "seq_cst", 8, typ=I64_T)
    quiet = b.icmp_signed("==", b.load_atomic(word(constant(STATE_STOP)), "seq_cst", 8, typ=I64_T), constant(0))
    with b.if_then(b.and_(quiet, b.icmp_signed("==", latest, b.load(seen_slot)))):
        low = b.and_(b.load(seen_slot), constant(0xFFFFFFFF))
        _futex(module, b, target, sequence_word, FUTEX_WAIT_PRIVATE, low)
    b.atomic_rmw("sub", sleepers, constant(1), "seq_cst")
    b.store(constant(0), spins_slot)
    b.branch(blocks["check"])

    b.position_at_end(blocks["read"])
    arena = b.load_atomic(word(constant(STATE_ARENA)), "monotonic", 8, typ=I64_T)
    counters = b.load_atomic(word(constant(STATE_COUNTERS)), "monotonic", 8, typ=I64_T)
    b.fence("acquire")
    unchanged = b.icmp_signed("==", b.load_atomic(sequence_word, "monotonic", 8, typ=I64_T), sequence)
    b.cbranch(unchanged, blocks["run"], blocks["check"])

    b.position_at_end(blocks["run"])
    b.store(sequence, seen_slot)
    b.store(constant(0), spins_slot)
    with b.if_then(b.icmp_signed("!=", counters, constant(0))):
        b.call(work, [b.inttoptr(arena, PTR_T), table, b.inttoptr(counters, PTR_T)])
    finished = word(b.add(constant(STATE_HELPERS), b.mul(helper, constant(8))))
    b.atomic_rmw("xchg", finished, sequence, "release")
    b.branch(blocks["check"])

    b.position_at_end(blocks["done"])
    b.ret_void()


def _post_function(module: ir.Module, target: CpuTarget) -> None:
    """farm_post(state, arena, counters): hand the helpers a run (counters 0: only wake them, to see the stop
    flag). The sequence goes odd, the run's words are written, the sequence goes even (farm_serve's seqlock);
    then, if any helper counts itself asleep, the futex wakes them all. The sequence's store and the sleepers' read
    are ordered by a full fence, as the helper's count and its last read of the sequence are, so a helper either
    sees the run before it sleeps or is counted and woken. (Its atomic stores are exchanges: llvmlite's
    store_atomic wants a typed pointer.)"""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR_T, I64_T, I64_T]), POST_SYMBOL)
    fn.attributes.add("nounwind")
    state, arena, counters = fn.args
    state.name, arena.name, counters.name = "state", "arena", "counters"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    word = lambda index: b.gep(state, [ir.Constant(I64_T, index)], inbounds=True, source_etype=I64_T)  # noqa: E731
    sequence_word = word(STATE_SEQUENCE)
    sequence = b.load_atomic(sequence_word, "monotonic", 8, typ=I64_T)
    b.atomic_rmw("xchg", sequence_word, b.add(sequence, ir.Constant(I64_T, 1)), "monotonic")
    b.fence("release")
    b.atomic_rmw("xchg", word(STATE_ARENA), arena, "monotonic")
    b.atomic_rmw("xchg", word(STATE_COUNTERS), counters, "monotonic")
    b.atomic_rmw("xchg", sequence_word, b.add(sequence, ir.Constant(I64_T, 2)), "release")
    b.fence("seq_cst")
    sleeping = b.load_atomic(word(STATE_SLEEPERS), "seq_cst", 8, typ=I64_T)
    with b.if_then(b.icmp_signed(">", sleeping, ir.Constant(I64_T, 0))):
        _futex(module, b, target, sequence_word, FUTEX_WAKE_PRIVATE, ir.Constant(I64_T, 0x7FFFFFFF))
    b.ret_void()


def _slice_start(b: ir.IRBuilder, thread: ir.Value, count: ir.Value, threads: ir.Value) -> ir.Value:
    """The first range of `thread`'s slice of a group's `count` ranges (ceil(thread * count / threads)), at most
    count: a thread past the run's count (none should be) has an empty slice."""
    start = b.sdiv(b.add(b.mul(thread, count), b.sub(threads, ir.Constant(I64_T, 1))), threads)
    return b.select(b.icmp_signed("<", start, count), start, count)


def _table_slot(arg: list, weights_offset: int) -> list:
    """["weight", slot] as ["table", the arena offset of its pointer]; other arguments as they are."""
    kind, *where = arg
    return ["table", weights_offset + 8 * where[0]] if kind == "weight" else arg


def compile_entry(schedule: list[dict[str, Any]], target: CpuTarget, weights_offset: int = 0) -> bytes:
    """The entry's object code for `target` (`weights_offset`: where the weight table starts in the arena). Its IR
    skips LLVM's O3 pipeline: it is calls, counters and waits, which O3 left within 96 bytes of the same object,
    and the pipeline was two thirds of its compile (39 -> 13 ms for a small model's, 47 -> 24 ms for ResNet-50's),
    paid by every build whose entry is new (every model, every pinned size)."""
    return compile_ir(entry_ir(schedule, target, weights_offset), target, ENTRY_SYMBOL, Pipeline.NONE)
