"""compile_entry: the schedule in, `farm_run(uint8_t *arena)` out, calling every kernel in order."""

from __future__ import annotations

import re

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

from farm.codegen import loopir as L
from farm.codegen.entry import ENTRY_SYMBOL, compile_entry, entry_ir
from farm.codegen.link import link_library
from farm.codegen.targets import CpuTarget

SCHEDULE = [
    {"kernel": "farm_k_first", "args": [["arena", 0], ["arena", 256], ["blob", "farm_w_aaaa"]]},
    {"kernel": "farm_k_second", "args": [["arena", 512], ["arena", 0]]},
    {"kernel": "farm_k_first", "args": [["arena", 1024], ["arena", 512], ["blob", "farm_w_bbbb"]]},
]


def parsed_entry(schedule, target: CpuTarget) -> llvm.ModuleRef:
    module = llvm.parse_assembly(entry_ir(schedule, target))
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
    assert re.search(r'define void @"?farm_run"?\(ptr %[^)]*\) nounwind', text)
    assert f'target triple = "{host().triple}"' in text


def _function_text(text: str, name: str) -> str:
    """The IR of one function definition in a module's text."""
    return re.search(rf'define [^\n]*@"?{name}"?\(.*?\n}}', text, flags=re.DOTALL).group(0)


def test_entry_calls_kernels_in_schedule_order_with_arena_offsets_and_blobs():
    text = _function_text(entry_ir(SCHEDULE, host()), "farm_run")
    calls = call_lines(text)
    assert [re.search(r'@"?(\w+)"?\(', c).group(1) for c in calls] == ["farm_k_first", "farm_k_second",
                                                                        "farm_k_first"]
    offsets = [int(x) for x in re.findall(r"getelementptr inbounds i8, ptr %\"?[.\w]+\"?, i64 (\d+)", text)]
    assert offsets == [0, 256, 512, 0, 1024, 512]
    assert "farm_w_aaaa" in calls[0] and "farm_w_bbbb" in calls[2] and "farm_w" not in calls[1]


def test_farm_run_steps_runs_any_range_of_steps():
    text = _function_text(entry_ir(SCHEDULE, host()), "farm_run_steps")
    assert text.count("switch i64") == 1
    assert [re.search(r'@"?(\w+)"?\(', c).group(1) for c in call_lines(text)] == ["farm_k_first", "farm_k_second",
                                                                                  "farm_k_first"]


def test_each_kernel_and_blob_is_declared_once():
    module = parsed_entry(SCHEDULE, host())
    declared = sorted(f.name for f in module.functions if f.is_declaration and not f.name.startswith("llvm."))
    assert declared == ["farm_k_first", "farm_k_second"]
    assert sorted(g.name for g in module.global_variables) == ["farm_w_aaaa", "farm_w_bbbb"]
    assert [len(list(module.get_function(k).arguments)) for k in declared] == [3, 2]


def test_kernels_and_blobs_are_declared_hidden():
    """Kernels and blobs live inside the library: the entry must reference them as hidden symbols, so that they
    bind locally (no PLT/GOT, nothing exported) and a missing one is a link error instead of a dlopen error.

    Today entry_ir sets `.visibility = "hidden"` on llvmlite.ir objects, which llvmlite ignores (it has no
    visibility support), so the IR says `declare void @k(...)` and `@w = external global i8`.
    """
    module = parsed_entry(SCHEDULE, host())
    for name in ("farm_k_first", "farm_k_second"):
        assert module.get_function(name).visibility == llvm.Visibility.hidden, name
    for name in ("farm_w_aaaa", "farm_w_bbbb"):
        assert module.get_global_variable(name).visibility == llvm.Visibility.hidden, name


def test_empty_schedule_is_a_function_that_returns():
    text = entry_ir([], host())
    assert call_lines(text) == []
    llvm.parse_assembly(text).verify()


@pytest.mark.parametrize("target", [host(), aarch64()], ids=["host", "aarch64"])
def test_entry_object_defines_farm_run_and_references_the_rest(target):
    obj = compile_entry(SCHEDULE, target)
    if target.arch == "aarch64":
        assert elf_header(obj) == (2, 1, EM_AARCH64)
    farm_run = elf_symbol(obj, ENTRY_SYMBOL)
    assert (farm_run.type, farm_run.bind, farm_run.visibility) == ("FUNC", "GLOBAL", "DEFAULT")
    assert farm_run.section != "UND"
    undefined = {s.name for s in elf_symbols(obj) if s.section == "UND" and s.name}
    assert undefined == {"farm_k_first", "farm_k_second", "farm_w_aaaa", "farm_w_bbbb"}
    assert compile_entry(SCHEDULE, target) == obj


# -- running it: order matters ----------------------------------------------------------------------------------


def _affine(scale: float, shift: float, n: int) -> L.LoopKernel:
    """out[i] = in[i] * scale + shift."""
    i = L.Var("i")
    return L.LoopKernel([L.Param("out", output=True), L.Param("in")],
                        [L.Loop(i, n, [L.Store("out", i, L.Load("in", i) * scale + shift)])])


@pytest.mark.parametrize("order", [("double", "inc"), ("inc", "double")])
def test_farm_run_calls_kernels_in_order_through_a_shared_arena(order, tmp_path):
    """Both kernels update the same 16 floats in place; (x*2)+1 differs from (x+1)*2, so the order shows."""
    n = 16
    target = host()
    kernels = [("double", _affine(2.0, 0.0, n)), ("inc", _affine(1.0, 1.0, n))]
    schedule = [{"kernel": name, "args": [["arena", 0], ["arena", 0]]} for name in order]
    library = load_library(link_library([compile_kernels(kernels, target), compile_entry(schedule, target)], target),
                           tmp_path)
    arena = aligned_arena(n * 4)
    x = np.arange(n, dtype=np.float32)
    arena.view(np.float32)[:] = x
    call_farm_run(library, arena)
    expected = x * 2 + 1 if order == ("double", "inc") else (x + 1) * 2
    np.testing.assert_array_equal(arena.view(np.float32), expected)
