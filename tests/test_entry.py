"""compile_entry: the schedule in, `farm_run(uint8_t *arena)` out, calling every kernel in order."""

from __future__ import annotations

import ctypes
import re
import threading

import llvmlite.binding as llvm
import numpy as np
import pytest
from native_helpers import (
    EM_AARCH64,
    aarch64,
    aligned_arena,
    call_farm_run,
    compile_kernels,
    elf_header,
    elf_symbol,
    elf_symbols,
    host,
    load_library,
)

from farm.backends.llvm.entry import (
    ENTRY_SYMBOL,
    FUTEX_SYSCALLS,
    LAUNCH_SYMBOL,
    POST_SYMBOL,
    SERVE_SYMBOL,
    STEPS_SYMBOL,
    WORK_SYMBOL,
    compile_entry,
    entry_ir,
    serves_natively,
    serving_entries,
)
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.link import link_library
from farm.backends.llvm.packing import pack_columns, pack_panels
from farm.backends.llvm.target import CpuTarget
from farm.errors import BuildError
from farm.ir import launching
from farm.ir import loopir as L

SCHEDULE = [
    {"kernel": "farm_k_first", "args": [["arena", 0], ["arena", 256], ["weight", 0]]},
    {"kernel": "farm_k_second", "args": [["arena", 512], ["arena", 0]]},
    {"kernel": "farm_k_first", "args": [["arena", 1024], ["arena", 512], ["weight", 1]]},
]
TABLE_AT = 2048


def parsed_entry(schedule, target: CpuTarget) -> llvm.ModuleRef:
    module = llvm.parse_assembly(entry_ir(schedule, target, TABLE_AT))
    module.verify()
    return module


def call_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if re.match(r"\s*call ", line)]


def test_entry_ir_verifies_and_defines_farm_run():
    module = parsed_entry(SCHEDULE, host())
    farm_run = module.get_function(ENTRY_SYMBOL)
    assert not farm_run.is_declaration
    assert farm_run.visibility == llvm.Visibility.default  # the one exported symbol
    assert [str(a.type) for a in farm_run.arguments] == ["ptr"]
    text = entry_ir(SCHEDULE, host())
    assert re.search(r'define void @"?farm_run"?\(ptr %[^)]*\) [^\n]*nounwind', text)
    dispatch = [
        re.search(rf'define [^\n]*@"?{name}"?\(.*', text).group(0)
        for name in (ENTRY_SYMBOL, STEPS_SYMBOL, LAUNCH_SYMBOL, WORK_SYMBOL)
    ]
    assert ["optnone" in line for line in dispatch] == [True, True, True, False]  # only the pool's loop optimised
    assert f'target triple = "{host().triple}"' in text


def _function_text(text: str, name: str) -> str:
    """The IR of one function definition in a module's text."""
    return re.search(rf'define [^\n]*@"?{name}"?\(.*?\n}}', text, flags=re.DOTALL).group(0)


def test_farm_run_runs_every_step_through_farm_run_steps():
    """Each step's call is compiled once: farm_run is farm_run_steps over the whole schedule."""
    text = _function_text(entry_ir(SCHEDULE, host(), TABLE_AT), "farm_run")
    assert call_lines(text) == [f'call void @"{STEPS_SYMBOL}"(ptr %arena, i64 0, i64 {len(SCHEDULE)})']


def test_entry_calls_kernels_in_schedule_order_with_arena_offsets_and_weights():
    """A weight argument is the pointer in its slot of the table after the arena: slot i at TABLE_AT + 8 i."""
    text = _function_text(entry_ir(SCHEDULE, host(), TABLE_AT), "farm_run_steps")
    calls = call_lines(text)
    assert [re.search(r'@"?(\w+)"?\(', c).group(1) for c in calls] == ["farm_k_first", "farm_k_second", "farm_k_first"]
    offsets = [int(x) for x in re.findall(r"getelementptr inbounds i8, ptr %\"?[.\w]+\"?, i64 (\d+)", text)]
    assert offsets == [0, 256, TABLE_AT, 512, 0, 1024, 512, TABLE_AT + 8]
    loads = re.findall(r'(%"?[.\w]+"?) = load ptr, ptr (%"?[.\w]+"?)', text)
    assert len(loads) == 2 and loads[0][0] in calls[0] and loads[1][0] in calls[2]


def test_farm_run_steps_runs_any_range_of_steps():
    text = _function_text(entry_ir(SCHEDULE, host()), "farm_run_steps")
    assert text.count("switch i64") == 1
    assert [re.search(r'@"?(\w+)"?\(', c).group(1) for c in call_lines(text)] == [
        "farm_k_first",
        "farm_k_second",
        "farm_k_first",
    ]


def test_each_kernel_is_declared_once_and_the_entry_has_no_globals():
    """No global state: two models loaded from one library (the same code, other weights) share nothing."""
    module = parsed_entry(SCHEDULE, host())
    declared = sorted(f.name for f in module.functions if f.is_declaration and f.name.startswith("farm_"))
    assert declared == ["farm_k_first", "farm_k_second"]
    assert list(module.global_variables) == []
    assert [len(list(module.get_function(k).arguments)) for k in declared] == [3, 2]


def test_kernels_are_declared_hidden():
    """Kernels live inside the library: the entry must reference them as hidden symbols, so that they bind locally
    (no PLT/GOT, nothing exported) and a missing one is a link error instead of a dlopen error."""
    module = parsed_entry(SCHEDULE, host())
    for name in ("farm_k_first", "farm_k_second"):
        assert module.get_function(name).visibility == llvm.Visibility.hidden, name


def test_empty_schedule_is_a_function_that_returns():
    text = entry_ir([], host())
    assert call_lines(_function_text(text, "farm_run_steps")) == []
    llvm.parse_assembly(text).verify()


@pytest.mark.parametrize("symbol", ['farm_k_a"(ptr %arena)\ndefine void @"evil', "", 7, "farm k"])
def test_a_schedule_naming_no_plain_symbol_is_refused(symbol):
    """The dispatch functions are IR text: a kernel name from a link plan is checked, never pasted as it is."""
    with pytest.raises(BuildError, match="not a plain symbol"):
        entry_ir([{"kernel": symbol, "args": [["arena", 0]]}], host())


@pytest.mark.parametrize("target", [host(), aarch64()], ids=["host", "aarch64"])
def test_entry_object_defines_farm_run_and_references_the_rest(target):
    obj = compile_entry(SCHEDULE, target)
    if target.arch == "aarch64":
        assert elf_header(obj) == (2, 1, EM_AARCH64)
    farm_run = elf_symbol(obj, ENTRY_SYMBOL)
    assert (farm_run.type, farm_run.bind, farm_run.visibility) == ("FUNC", "GLOBAL", "DEFAULT")
    assert farm_run.section != "UND"
    undefined = {s.name for s in elf_symbols(obj) if s.section == "UND" and s.name}
    assert undefined == {"farm_k_first", "farm_k_second", "sched_yield", "syscall"}
    assert {elf_symbol(obj, name).section != "UND" for name in (SERVE_SYMBOL, POST_SYMBOL)} == {True}
    assert compile_entry(SCHEDULE, target) == obj


# -- running it: order matters ----------------------------------------------------------------------------------


def _affine(scale: float, shift: float, n: int) -> L.LoopKernel:
    """out[i] = in[i] * scale + shift."""
    i = L.Var("i")
    return L.LoopKernel(
        [L.Param("out", output=True), L.Param("in")],
        [L.Loop(i, n, [L.Store("out", i, L.Load("in", i) * scale + shift)])],
    )


@pytest.mark.parametrize("order", [("double", "inc"), ("inc", "double")])
def test_farm_run_calls_kernels_in_order_through_a_shared_arena(order, tmp_path):
    """Both kernels update the same 16 floats in place; (x*2)+1 differs from (x+1)*2, so the order shows."""
    n = 16
    target = host()
    kernels = [("double", _affine(2.0, 0.0, n)), ("inc", _affine(1.0, 1.0, n))]
    schedule = [{"kernel": name, "args": [["arena", 0], ["arena", 0]]} for name in order]
    library = load_library(
        link_library([compile_kernels(kernels, target), compile_entry(schedule, target)], target), tmp_path
    )
    arena = aligned_arena(n * 4)
    x = np.arange(n, dtype=np.float32)
    arena.view(np.float32)[:] = x
    call_farm_run(library, arena)
    expected = x * 2 + 1 if order == ("double", "inc") else (x + 1) * 2
    np.testing.assert_array_equal(arena.view(np.float32), expected)


def test_an_input_argument_reads_the_feed_in_its_pointer_slot_or_else_its_own_buffer(tmp_path):
    """["input", offset, slot, inside]: where the slot holds an address, the kernel reads the feed there (plus the
    offset inside it); where it holds 0, the input's buffer in the arena (a copy the runtime made)."""
    n, slot, output = 16, 64, 128
    target = host()
    schedule = [{"kernel": "double", "args": [["arena", output], ["input", 0, slot, 4 * 2]]}]
    library = load_library(
        link_library(
            [compile_kernels([("double", _affine(2.0, 0.0, n))], target), compile_entry(schedule, target)], target
        ),
        tmp_path,
    )
    arena = aligned_arena(output + n * 4)
    arena[: n * 4].view(np.float32)[:] = np.arange(n, dtype=np.float32)  # the copy, 2 floats in: 2.0 onwards
    call_farm_run(library, arena)
    np.testing.assert_array_equal(arena[output:].view(np.float32), 2 * np.arange(n, dtype=np.float32))
    feed = np.arange(100, 100 + n + 2, dtype=np.float32)
    arena[slot : slot + 8].view(np.uint64)[0] = feed.ctypes.data
    call_farm_run(library, arena)
    np.testing.assert_array_equal(arena[output:].view(np.float32), 2 * feed[2:])


def test_an_argument_of_an_unknown_kind_is_refused():
    with pytest.raises(BuildError, match="unknown kind 'file'"):
        entry_ir([{"kernel": "farm_k_first", "args": [["file", 0]]}], host())


# -- farm_launch: one launch over a range, as a threaded runtime calls it -------------------------------------------


def _call_launch(library, index: int, begin: int, end: int, arena: np.ndarray) -> None:
    launch = library.farm_launch
    launch.restype = None
    launch.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    launch(index, begin, end, arena.ctypes.data)


SMALL_BLOCKING = GemmBlocking(rows=4, vectors=2, lanes=4)


def _launch_library(kernels, schedule, tmp_path, blocking=SMALL_BLOCKING):
    target = host()
    return load_library(
        link_library([compile_kernels(kernels, target, blocking), compile_entry(schedule, target)], target), tmp_path
    )


def test_farm_launch_runs_a_parallel_loop_split_at_odd_boundaries(tmp_path):
    """A launch of extent 7 run as 3 ranges writes every element once, each range only its own."""
    n = 7
    i = L.Var("i")
    kernel = L.LoopKernel(
        [L.Param("out", output=True), L.Param("in")],
        [L.Loop(i, n, [L.Store("out", i, L.Load("in", i) * 3.0 + 1.0)], parallel=True)],
    )
    launches = [info.to_json() for info in launching.launch_info(kernel, 4)]
    assert launches == [[7, 1, 7]]
    schedule = [{"kernel": "scale", "args": [["arena", 0], ["arena", 64]], "launches": launches}]
    library = _launch_library([("scale", kernel)], schedule, tmp_path)
    arena = aligned_arena(128)
    out, x = arena[:28].view(np.float32), arena[64:92].view(np.float32)
    x[:] = np.arange(n, dtype=np.float32)
    out[:] = -1.0
    _call_launch(library, 0, 2, 5, arena)
    np.testing.assert_array_equal(out, [-1, -1, 7, 10, 13, -1, -1])
    for begin, end in ((0, 2), (5, 7)):
        _call_launch(library, 0, begin, end, arena)
    np.testing.assert_array_equal(out, x * 3 + 1)
    _call_launch(library, 1, 0, 7, arena)  # past the last launch: does nothing
    np.testing.assert_array_equal(out, x * 3 + 1)


def _gemm_launch_setup(kernel, launches, shape, blocking, tmp_path):
    """The library of one Gemm kernel "mm" (A, B, C in one arena: A and B random, C all NaN; A pre-packed in
    the blocking's panels, B in its column panels, when the Gemm reads them so): (library, arena, a view of C, A @ B in float64)."""
    m, n, k = shape
    a_at, b_at, c_at = 0, _aligned(m * k * 4), _aligned(m * k * 4) + _aligned(k * n * 4)
    schedule = [{"kernel": "mm", "args": [["arena", a_at], ["arena", b_at], ["arena", c_at]], "launches": launches}]
    library = _launch_library([("mm", kernel)], schedule, tmp_path, blocking)
    arena = aligned_arena(c_at + _aligned(m * n * 4))
    rng = np.random.default_rng(0)
    a = arena[a_at : a_at + m * k * 4].view(np.float32).reshape(m, k)
    b = arena[b_at : b_at + k * n * 4].view(np.float32).reshape(k, n)
    c = arena[c_at : c_at + m * n * 4].view(np.float32).reshape(m, n)
    a[:], b[:], c[:] = rng.standard_normal((m, k)), rng.standard_normal((k, n)), np.nan
    whole = a.astype(np.float64) @ b.astype(np.float64)
    if kernel.body[0].a_panels:
        a[:] = pack_panels(a[None].copy(), blocking.rows)[0].reshape(m, k)
    if kernel.body[0].b_panels:
        b[:] = pack_columns(b[None].copy(), blocking.tile_columns)[0].reshape(k, n)
    return library, arena, c, whole


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


@pytest.mark.parametrize(
    ("cuts", "packed"),
    [
        ((0, 13), False),
        ((0, 4, 8, 12, 13), False),
        ((0, 5, 6, 13), False),
        ((0, 1, 2, 3, 11, 13), False),
        ((0, 13), True),
        ((0, 4, 8, 12, 13), True),
        ((0, 8, 13), True),
    ],
)
def test_farm_launch_runs_gemm_rows_split_anywhere(cuts, packed, tmp_path):
    """C = A @ B with m = 13 (not a multiple of the 4-row tile) and n = 15 (full, vector and scalar column tiles),
    its rows run as the given ranges: every row once, rows outside a range untouched. Row-major A may be cut
    anywhere; pre-packed A (panels of the tile's rows, with B in column panels) at multiples of the grain, as
    launch_info promises and the runtime cuts."""
    m, n, k = 13, 15, 6
    gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k, a_panels=packed, b_panels=packed)
    kernel = L.LoopKernel([L.Param("a"), L.Param("b"), L.Param("c", output=True)], [gemm])
    launches = [info.to_json() for info in launching.launch_info(kernel, 4)]
    assert [launch[:2] for launch in launches] == [[13, 4]]
    library, arena, c, whole = _gemm_launch_setup(kernel, launches, (m, n, k), SMALL_BLOCKING, tmp_path)
    for begin, end in zip(cuts, cuts[1:]):
        _call_launch(library, 0, begin, end, arena)
        assert np.isnan(c[end:]).all()
        np.testing.assert_allclose(c[:end], whole[:end], rtol=1e-5, atol=1e-5)
    reference = c.copy()
    call_farm_run(library, arena)  # the whole kernel, in one call: the same bits
    np.testing.assert_array_equal(c, reference)


@pytest.mark.parametrize(
    "blocking",
    [
        SMALL_BLOCKING,
        GemmBlocking(rows=4, vectors=2, lanes=4, k_block=2, order="rows"),
        GemmBlocking(rows=4, vectors=3, lanes=4),
    ],
    ids=lambda b: b.name,
)
@pytest.mark.parametrize("packed", [False, True], ids=["row-major", "packed"])
@pytest.mark.parametrize(
    "m, n, k", [(7, 45, 5), (7, 45, 600), (259, 269, 1000)], ids=["sweep", "few-rows-deep-k", "blocks"]
)
def test_farm_launch_runs_gemm_column_units_split_anywhere(m, n, k, blocking, packed, tmp_path):
    """A Gemm wider than tall splits by column units (launching.column_units): each vector of columns (the full
    column blocks' and those past them), then one unit for the columns short of a vector. Every column once, each
    range only its own, whatever the cut (whole, at every unit, in half, between blocks, also in the middle of a
    block: pieces of 1 or 2 of its vectors), in each of gemm._emit_column_blocks' ways: a small B swept by each row
    tile, few rows and a deep k in k blocks, and block by block (B past gemm.SWEEP_MAX_B_BYTES); the rows include
    4-row tiles and 3 edge rows; also with the k loop cache-tiled, and with A and B pre-packed (a piece reads part
    of its block's panel). One library serves every cut, though the runtime cuts only at whole blocks (the grain)."""
    gemm = L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k, a_panels=packed, b_panels=packed)
    kernel = L.LoopKernel([L.Param("a"), L.Param("b"), L.Param("c", output=True)], [gemm])
    launches = [
        info.to_json() for info in launching.launch_info(kernel, blocking.rows, blocking.tile_columns, blocking.vectors)
    ]
    units = -(-n // blocking.lanes)
    assert launches == [[units, blocking.vectors, launching.gemm_work(gemm)]]  # the runtime cuts at whole blocks
    library, arena, c, whole = _gemm_launch_setup(kernel, launches, (m, n, k), blocking, tmp_path)
    cuts = {
        "whole": [],
        "every-unit": range(1, units),
        "half": [units // 2],
        "mid-blocks": [1, 4, units - 4],
        "within-a-block": [2, 3, units - 2],
    }
    for name, inner in cuts.items():
        c[:] = np.nan
        bounds = (0, *inner, units)
        for begin, end in zip(bounds, bounds[1:]):
            _call_launch(library, 0, begin, end, arena)
            done = n if end == units else end * blocking.lanes
            assert np.isnan(c[:, done:]).all(), f"cut {name}: range [{begin}, {end}) wrote past its columns"
            np.testing.assert_allclose(
                c[:, :done],
                whole[:, :done],
                rtol=1e-5,
                atol=1e-6 * k,  # float32 sums of k
                err_msg=f"cut {name}, range [{begin}, {end})",
            )
        reference = c.copy()
        call_farm_run(library, arena)
        np.testing.assert_array_equal(c, reference, err_msg=f"cut {name}: farm_run's bits differ")


def test_farm_launch_numbers_launches_across_the_schedule(tmp_path):
    """Two steps of a two-launch kernel: launches 0-1 are the first step's, 2-3 the second's, each with its own
    arguments; farm_run runs them all."""
    i, j = L.Var("i"), L.Var("j")
    kernel = L.LoopKernel(
        [L.Param("out", output=True)],
        [
            L.Loop(i, 4, [L.Store("out", i, L.const(1.0))], parallel=True),
            L.Loop(j, 4, [L.Store("out", j + 4, L.const(2.0))], parallel=True),
        ],
    )
    launches = [info.to_json() for info in launching.launch_info(kernel, 4)]
    schedule = [{"kernel": "two", "args": [["arena", offset]], "launches": launches} for offset in (0, 64)]
    library = _launch_library([("two", kernel)], schedule, tmp_path)
    arena = aligned_arena(128)
    values = arena.view(np.float32)
    _call_launch(library, 3, 1, 3, arena)
    assert values[16 + 4 : 16 + 8].tolist() == [0, 2, 2, 0] and not values[:16].any()
    _call_launch(library, 0, 0, 4, arena)
    assert values[:8].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    arena[:] = 0
    call_farm_run(library, arena)
    assert values[:8].tolist() == values[16:24].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]


def test_farm_work_defines_the_thread_pool_body_for_each_architecture():
    """farm_work(arena, table, counters) exists on every target; the spin-wait hint is the architecture's own."""
    for target, hint in ((host(), "llvm.x86.sse2.pause"), (aarch64(), "llvm.aarch64.hint")):
        text = entry_ir(SCHEDULE, target)
        work = _function_text(text, "farm_work")
        assert re.search(r'define void @"?farm_work"?\(ptr %"?arena"?, ptr %"?table"?, ptr %"?counters"?\)', work)
        assert "atomicrmw add" in work and "load atomic" in work and hint in work and "sched_yield" in work


def test_farm_serve_and_farm_post_exist_on_linux_with_its_futex_call_number():
    """A helper's life (farm_serve) and the hand-over of a run (farm_post) wait and wake in Linux's futex, whose
    call number is the architecture's own; elsewhere the library has neither, nor does the manifest name them."""
    for target in (host(), aarch64()):
        text = entry_ir(SCHEDULE, target)
        serve, post = _function_text(text, SERVE_SYMBOL), _function_text(text, POST_SYMBOL)
        assert f"i64 {FUTEX_SYSCALLS[target.arch]}" in serve and f"i64 {FUTEX_SYSCALLS[target.arch]}" in post
        assert "farm_work" in serve and "fence seq_cst" in post and "fence acquire" in serve
        assert serves_natively(target)
        assert serving_entries(target) == {"serve_entry": SERVE_SYMBOL, "post_entry": POST_SYMBOL}
    for elsewhere in (CpuTarget("x86_64-unknown-freebsd"), CpuTarget("riscv64-unknown-linux-gnu")):
        assert not serves_natively(elsewhere) and serving_entries(elsewhere) == {}
        assert SERVE_SYMBOL not in entry_ir(SCHEDULE, elsewhere)


# -- farm_work: the native pool's body, called by every thread of a run ----------------------------------------------


def _parallel_affine(scale: float, shift: float, n: int) -> L.LoopKernel:
    i = L.Var("i")
    return L.LoopKernel(
        [L.Param("out", output=True), L.Param("in")],
        [L.Loop(i, n, [L.Store("out", i, L.Load("in", i) * scale + shift)], parallel=True)],
    )


@pytest.mark.parametrize("threads", [1, 3, 6])
def test_farm_work_threads_run_every_range_once_and_launches_in_order(threads, tmp_path):
    """Three in-place launches over 1000 floats, cut into 7 ranges each: x -> x*2 -> x*2+1 -> (x*2+1)*3. Any range
    run twice or a launch started before the previous one finished changes the result. More threads than CPUs
    (6) exercise the wait of a thread for a descheduled one."""
    from farm.runtime.model import split_range, work_table

    n = 1000
    kernels = [
        ("double", _parallel_affine(2.0, 0.0, n)),
        ("inc", _parallel_affine(1.0, 1.0, n)),
        ("triple", _parallel_affine(3.0, 0.0, n)),
    ]
    schedule = [{"kernel": name, "args": [["arena", 0], ["arena", 0]], "launches": [[n, 1, n]]} for name, _ in kernels]
    library = _launch_library(kernels, schedule, tmp_path)
    work = library.farm_work
    work.argtypes, work.restype = [ctypes.c_void_p] * 3, None
    table = work_table([(index, split_range(n, 1, 7)) for index in range(3)])
    arena = aligned_arena(n * 4)
    x = np.linspace(-5, 5, n, dtype=np.float32)
    for _ in range(5):
        arena.view(np.float32)[:] = x
        counters = _work_counters(3, threads, 21)
        helpers = [
            threading.Thread(target=work, args=(arena.ctypes.data, table.ctypes.data, counters.ctypes.data))
            for _ in range(threads - 1)
        ]
        for helper in helpers:
            helper.start()
        work(arena.ctypes.data, table.ctypes.data, counters.ctypes.data)
        for helper in helpers:
            helper.join()
        np.testing.assert_array_equal(arena.view(np.float32), (x * 2 + 1) * 3)
        # each launch's 7 ranges done, every thread arrived once, every range's flag taken
        assert counters.tolist() == [0, 7] * 3 + [threads, threads] + [1] * 21


def _work_counters(groups: int, threads: int, ranges: int) -> np.ndarray:
    """Zeroed counters for farm_work (entry._work_function's layout) with the run's thread count set."""
    counters = np.zeros(2 * groups + 2 + ranges, dtype=np.int64)
    counters[2 * groups + 1] = threads
    return counters


def test_farm_work_runs_only_the_ranges_still_free(tmp_path):
    """A range runs once, for the thread that takes its flag: a thread arriving second of two (its own slice the
    last ranges) whose first ranges another thread has taken runs the rest and waits for those; one arriving when
    every range is taken and done passes through without touching the arena (a helper the OS woke late), even
    past the run's thread count (its slice empty, nothing past the group's ranges read or taken)."""
    from farm.runtime.model import split_range, work_table

    n = 1000
    kernels = [("double", _parallel_affine(2.0, 0.0, n))]
    library = _launch_library(
        kernels, [{"kernel": "double", "args": [["arena", 0], ["arena", 0]], "launches": [[n, 1, n]]}], tmp_path
    )
    work = library.farm_work
    work.argtypes, work.restype = [ctypes.c_void_p] * 3, None
    ranges = split_range(n, 1, 4)
    table = work_table([(0, ranges)])
    arena = aligned_arena(n * 4)
    x = np.linspace(-5, 5, n, dtype=np.float32)
    arena.view(np.float32)[:] = x
    counters = _work_counters(1, 2, 4)
    counters[2] = 1  # the first thread has arrived
    counters[[4, 5]] = 1  # ... and taken the first two ranges, and finished them
    counters[1] = 2
    work(arena.ctypes.data, table.ctypes.data, counters.ctypes.data)
    expected = x.copy()
    expected[ranges[2][0] :] *= 2
    np.testing.assert_array_equal(arena.view(np.float32), expected)
    assert counters.tolist() == [0, 4, 2, 2, 1, 1, 1, 1]
    guarded = np.concatenate([counters, np.zeros(8, np.int64)])
    work(arena.ctypes.data, table.ctypes.data, guarded.ctypes.data)
    np.testing.assert_array_equal(arena.view(np.float32), expected)
    assert guarded.tolist() == [0, 4, 3, 2, 1, 1, 1, 1] + [0] * 8
