"""farm.ir.launching: how both renderers and the CPU runtime's launch table split a kernel into launches, their
ranges and their work (pure Python, no LLVM)."""

from __future__ import annotations

from farm.ir import launching
from farm.ir import loopir as L


def _gemm(m: int, n: int, k: int) -> L.Gemm:
    return L.Gemm("a", L.const(0), k, "b", L.const(0), n, "c", L.const(0), n, m, n, k)


def _launch_kernel() -> L.LoopKernel:
    """A batch-of-one loop around: a serial store, a parallel loop, two serial stores, a Gemm, a serial loop."""
    b, i, j, s = L.Var("b"), L.Var("i"), L.Var("j"), L.Var("s")
    store = lambda index: L.Store("c", L.const(index), L.const(0.0))  # noqa: E731
    body = [
        store(0),
        L.Loop(i, 7, [L.Store("c", i, L.const(1.0))], parallel=True),
        store(1),
        store(2),
        _gemm(13, 5, 3),
        L.Loop(s, 4, [L.Store("c", s, L.const(2.0))]),
        L.Loop(j, 6, [L.Store("c", j, L.const(3.0))], parallel=True),
    ]
    return L.LoopKernel([L.Param("a"), L.Param("b"), L.Param("c", output=True)], [L.Loop(b, 1, body)])


def test_launch_groups_peel_batch_of_one_and_keep_parallel_loops_and_gemms_alone():
    fixed, groups = launching.launch_groups(_launch_kernel())
    assert fixed == ["b"]
    statements = [[type(stmt).__name__ for stmt in group.stmts] for group in groups]
    assert statements == [["Store"], ["Loop"], ["Store", "Store"], ["Gemm"], ["Loop"], ["Loop"]]
    serial, parallel, gemm = launching.LaunchKind.SERIAL, launching.LaunchKind.PARALLEL, launching.LaunchKind.GEMM
    assert [group.kind for group in groups] == [serial, parallel, serial, gemm, serial, parallel]
    assert all(group.head is group.stmts[0] for group in groups)


def test_statements_that_run_nothing_make_no_launch():
    """Loops over an empty tensor (an extent 0 anywhere in the nest) or a Gemm with no element of C: OpenCL refuses
    a launch of 0 work-items, and there is nothing to run. A loop that runs something beside them stays."""
    i, j = L.Var("i"), L.Var("j")
    store = L.Store("c", i, L.const(1.0))
    assert launching.runs_nothing(L.Loop(i, 0, [store], parallel=True)) and launching.runs_nothing(_gemm(0, 4, 4))
    assert launching.runs_nothing(_gemm(4, 0, 4)) and not launching.runs_nothing(_gemm(4, 4, 0))
    assert launching.runs_nothing(L.Loop(i, 3, [L.Loop(j, 0, [store])], parallel=True))
    assert not launching.runs_nothing(L.Loop(i, 2, [store])) and not launching.runs_nothing(store)
    kept = L.Loop(i, 3, [L.Loop(j, 0, [store]), store], parallel=True)
    body = [L.Loop(L.Var("b"), 1, [L.Loop(j, 0, [store], parallel=True)]), _gemm(0, 5, 3), kept, store]
    kernel = L.LoopKernel([L.Param("a"), L.Param("b"), L.Param("c", output=True)], body)
    fixed, groups = launching.launch_groups(kernel)
    assert [group.stmts for group in groups] == [[kept], [store]]
    assert [(info.extent, info.work) for info in launching.launch_info(kernel, gemm_rows=4)] == [(3, 3), (1, 1)]


def test_launch_kind_recognises_gemms_parallel_loops_and_everything_else_as_serial():
    i, x = L.Var("i"), L.Var("x", L.F32)
    store = L.Store("c", i, L.const(1.0))
    assert launching.launch_kind(_gemm(4, 4, 4)) is launching.LaunchKind.GEMM
    assert launching.launch_kind(L.Loop(i, 8, [store], parallel=True)) is launching.LaunchKind.PARALLEL
    serial = [L.Loop(i, 8, [store]), store, L.Assign(x, L.const(0.0)), L.If(L.compare("lt", i, 2), [store])]
    assert [launching.launch_kind(stmt) for stmt in serial] == [launching.LaunchKind.SERIAL] * 4


def test_a_kernel_of_one_kind_is_one_launch_of_that_kind_and_serial_statements_between_others_merge():
    i, j = L.Var("i"), L.Var("j")
    parallel = L.Loop(i, 8, [L.Store("c", i, L.const(1.0))], parallel=True)
    stores = [L.Store("c", L.const(index), L.const(0.0)) for index in range(3)]
    for body, kinds in (
        ([_gemm(2, 3, 4)], ["gemm"]),
        ([parallel], ["parallel"]),
        (stores, ["serial"]),
        ([stores[0], L.Loop(j, 1, stores[1:])], ["serial"]),
        ([_gemm(2, 3, 4), _gemm(2, 3, 4), *stores, parallel], ["gemm", "gemm", "serial", "parallel"]),
    ):
        groups = launching.launch_groups(L.LoopKernel([L.Param("c", output=True)], body))[1]
        assert [group.kind.value for group in groups] == kinds


def test_launch_ranges_handle_every_kind_and_split_wide_gemms_by_columns():
    assert set(launching.LAUNCH_RANGES) == set(launching.LaunchKind)
    wide = L.LoopKernel([L.Param("a"), L.Param("b"), L.Param("c", output=True)], [_gemm(3, 40, 2)])
    assert [(i.extent, i.grain) for i in launching.launch_info(wide, gemm_rows=4, gemm_columns=8)] == [(5, 1)]
    assert [(i.extent, i.grain) for i in launching.launch_info(wide, gemm_rows=4)] == [(3, 4)]


def test_column_split_gemm_ranges_are_cut_at_whole_blocks():
    """A column-split Gemm's units are vectors, its grain a whole block's vectors, so threads' ranges run whole
    blocks (runtime.model.shares_range cuts at multiples of the grain): 256 columns in blocks of 3 vectors of 16
    are 16 units in grains of 3."""
    wide = L.LoopKernel([L.Param("a"), L.Param("b"), L.Param("c", output=True)], [_gemm(196, 256, 2304)])
    [info] = launching.launch_info(wide, gemm_rows=8, gemm_columns=48, gemm_vectors=3)
    assert (info.extent, info.grain) == (16, 3)


def test_launch_info_gives_extent_grain_and_work():
    infos = launching.launch_info(_launch_kernel(), gemm_rows=4)
    assert [(i.extent, i.grain) for i in infos] == [(1, 1), (7, 1), (1, 1), (13, 4), (1, 1), (6, 1)]
    assert [i.work for i in infos] == [1, 7, 2, 4 * (13 * 3 + 3 * 5 + 13 * 5) // launching.GEMM_WORK_DIVISOR, 4, 6]
    assert infos[1].to_json() == [7, 1, 7]


def test_work_counts_nested_loops_and_ifs():
    i, j = L.Var("i"), L.Var("j")
    inner = L.Loop(j, 5, [L.If(L.compare("lt", j, 2), [L.Store("c", j, L.const(0.0))])])
    assert launching.work([L.Loop(i, 3, [inner, L.Store("c", i, L.const(1.0))])]) == 3 * (5 * 2 + 1)


def test_work_counts_an_int_gemms_products_by_the_divisor_it_is_given():
    """By default one 16-lane VNNI instruction's products (INT_GEMM_WORK_DIVISOR) make a unit of work; a target's
    dot product gives its own divisor (kernel._cpu_launches)."""
    gemm = L.IntGemm("a", L.const(0), 256, "b", L.const(0), 64, "c", L.const(0), 64, 32, 64, 256)
    assert launching.work([gemm]) == 32 * 64 * 256 // launching.INT_GEMM_WORK_DIVISOR
    assert launching.work([gemm], int_gemm_divisor=16) == 32 * 64 * 256 // 16
    kernel = L.LoopKernel([L.Param("a"), L.Param("b"), L.Param("c", output=True)], [gemm])
    assert [info.work for info in launching.launch_info(kernel, 4, int_gemm_divisor=16)] == [32 * 64 * 256 // 16]


def test_gemm_work_counts_products_or_the_operands_bytes_where_more():
    # the classifier of one image: 2 MB of weights for 512,000 products, so its bytes count
    assert launching.gemm_work(_gemm(1, 1000, 512)) == 4 * (512 + 512 * 1000 + 1000) // launching.GEMM_WORK_DIVISOR
    # a 256-pixel, 576-deep conv by 64 channels: its products count
    assert launching.gemm_work(_gemm(256, 64, 576)) == 256 * 64 * 576 // launching.GEMM_WORK_DIVISOR
