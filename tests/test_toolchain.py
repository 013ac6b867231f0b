"""The toolchain (farm/backends/llvm/toolchain.py): compile_ir is tested with the kernels (test_cpu.py); here, its
choice of unrolling, and the toolchain's identity, which every CPU cache ref and build identity holds."""

from __future__ import annotations

import re
from dataclasses import replace

import llvmlite
import llvmlite.binding as llvm
import pytest

from farm.backends.llvm.link import linker_identity
from farm.backends.llvm.target import CpuTarget, host_target
from farm.backends.llvm.toolchain import Pipeline, Toolchain, compile_ir, toolchain

HEX16 = re.compile(r"[0-9a-f]{16}")


@pytest.fixture(autouse=True)
def no_label(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FARM_TOOLCHAIN_LABEL", raising=False)


COUNTED_STORES = """
define void @k(ptr %p) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %at = getelementptr inbounds i32, ptr %p, i64 %i
  store volatile i32 7, ptr %at
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, 16
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""


def test_o3_no_unroll_keeps_a_counted_loop_that_o3_unrolls() -> None:
    """16 volatile stores in a loop: O3 unrolls them into 16 store instructions, O3_NO_UNROLL keeps one in a loop."""
    unrolled = compile_ir(COUNTED_STORES, host_target(), "k")
    kept = compile_ir(COUNTED_STORES, host_target(), "k", Pipeline.O3_NO_UNROLL)
    assert len(kept) < len(unrolled)
    assert compile_ir(COUNTED_STORES, host_target(), "k", Pipeline.O3_NO_UNROLL) == kept


def test_every_pipeline_gives_its_own_object_the_same_each_time() -> None:
    """Each pipeline is a pure function of the IR and target: the same bytes twice, and other bytes than O3's."""
    o3 = compile_ir(COUNTED_STORES, host_target(), "k")
    for pipeline in (Pipeline.EMITTED, Pipeline.NONE):
        built = compile_ir(COUNTED_STORES, host_target(), "k", pipeline)
        assert built != o3
        assert compile_ir(COUNTED_STORES, host_target(), "k", pipeline) == built


SQUARES = """
define void @k(ptr noalias %p) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %at = getelementptr inbounds float, ptr %p, i64 %i
  %v = load float, ptr %at
  %r = fmul fast float %v, %v
  store float %r, ptr %at
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, 1024
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""

AVX512 = CpuTarget("x86_64-unknown-linux-gnu", "skylake-avx512", "+avx2,+fma,+avx512f")
AVX2 = CpuTarget("x86_64-unknown-linux-gnu", "haswell", "+avx2,+fma")


def test_wide_loops_vectorise_over_512_bits_where_the_target_has_them() -> None:
    """Pipeline.O3_WIDE_LOOPS compiles on a target machine without LLVM's 256-bit preference (target.WIDE_LOOPS)
    where the target has AVX-512: other code than O3's there, the same code as O3's with AVX2."""
    assert AVX512.machine_features(True) == "+avx2,+fma,+avx512f,-prefer-256-bit"
    assert AVX512.machine_features(False) == AVX512.features
    assert AVX2.machine_features(True) == AVX2.features
    wide = compile_ir(SQUARES, AVX512, "k", Pipeline.O3_WIDE_LOOPS)
    assert wide != compile_ir(SQUARES, AVX512, "k") and wide == compile_ir(SQUARES, AVX512, "k", Pipeline.O3_WIDE_LOOPS)
    assert compile_ir(SQUARES, AVX2, "k", Pipeline.O3_WIDE_LOOPS) == compile_ir(SQUARES, AVX2, "k")


def test_the_identity_names_llvmlite_llvm_and_the_linker_this_process_uses() -> None:
    found = toolchain()
    assert found.llvmlite == llvmlite.__version__
    assert found.llvm == ".".join(map(str, llvm.llvm_version_info))
    assert found.linker == linker_identity() and found.linker.startswith("ld.lld: ")  # lld is installed here
    assert found.label == ""
    assert HEX16.fullmatch(found.compiler_key) and HEX16.fullmatch(found.key) and found.key != found.compiler_key
    assert toolchain() == found  # measured once per process: the same every time


def test_any_other_llvmlite_llvm_or_label_is_another_compiler_and_another_toolchain() -> None:
    base = toolchain()
    for other in (replace(base, llvmlite="0.0.1"), replace(base, llvm="1.0.0"), replace(base, label="canary")):
        assert other.compiler_key != base.compiler_key and other.key != base.key, other


def test_another_linker_is_another_toolchain_but_the_same_compiler() -> None:
    """Objects never pass through the linker, so kernels and blobs stay shared; artifacts (linked) do not."""
    base = toolchain()
    gnu = replace(base, linker="ld: GNU ld (GNU Binutils for Debian) 2.40")
    assert gnu.compiler_key == base.compiler_key and gnu.key != base.key


def test_the_label_is_read_from_the_environment_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    unlabelled = toolchain()
    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "canary")
    labelled = toolchain()
    assert labelled == replace(unlabelled, label="canary") and labelled.key != unlabelled.key
    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "")
    assert toolchain() == unlabelled


def test_the_json_form_carries_the_parts_and_both_keys() -> None:
    found = Toolchain("0.50.0", "22.1.0", "ld.lld: LLD 14", "x")
    assert found.to_json() == {
        "llvmlite": "0.50.0",
        "llvm": "22.1.0",
        "linker": "ld.lld: LLD 14",
        "label": "x",
        "compiler_key": found.compiler_key,
        "key": found.key,
    }
    assert Toolchain("0.50.0", "22.1.0", "ld.lld: LLD 14", "x").key == found.key  # a pure function of the parts
