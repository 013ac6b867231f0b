"""compile_cpu_kernel / compile_ir: a KernelSpec in, ELF object bytes out, for the host and for a cross target."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from native_helpers import (
    EM_AARCH64,
    EM_X86_64,
    aarch64,
    aligned_arena,
    call_farm_run,
    elf_header,
    elf_type,
    host,
    layout,
    load_library,
)
from numerics import single_op_model

from farm.backends.llvm.entry import compile_entry
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.kernel import (
    TINY_KERNEL_WORK,
    blocking_for,
    calls_math,
    compile_cpu_kernel,
    cpu_launches,
    default_blocking,
    kernel_ir,
    kernel_parts,
    kernel_pipeline,
    untuned_blocking,
)
from farm.backends.llvm.link import link_library
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import Pipeline, compile_ir
from farm.build.assembly import plan_model
from farm.errors import BuildError
from farm.ir.graph import Activation, TensorInfo
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import lower_kernel
from farm.ops.registry import argument_bytes

RELU = Activation("relu")
CONV_ATTRS = {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1}
X_SHAPE, W_SHAPE, B_SHAPE, Y_SHAPE = (1, 8, 10, 10), (16, 8, 3, 3), (16,), (1, 16, 10, 10)


def conv_spec(target: CpuTarget, activation: Activation | None = RELU) -> KernelSpec:
    return KernelSpec(
        op="Conv",
        attrs_json=canonical_json(CONV_ATTRS),
        inputs=(TensorInfo(X_SHAPE), TensorInfo(W_SHAPE), TensorInfo(B_SHAPE)),
        outputs=(TensorInfo(Y_SHAPE),),
        activation=activation,
        target_id=target.id,
    )


def symbols(obj: bytes, tmp_path) -> dict[str, list[str]]:
    """name -> readelf -sW columns (Num Value Size Type Bind Vis Ndx) of an object's symbol table."""
    path = tmp_path / "sym.o"
    path.write_bytes(obj)
    text = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 8 and re.fullmatch(r"\d+:", fields[0]):
            table[fields[7]] = fields[:7]
    return table


def test_host_object_is_a_relocatable_elf_for_the_host_arch():
    target = host()
    obj = compile_cpu_kernel(conv_spec(target), target)
    ei_class, ei_data, machine = elf_header(obj)
    assert ei_class == 2 and ei_data == 1 and elf_type(obj) == 1
    if target.arch == "x86_64":
        assert machine == EM_X86_64
    elif target.arch == "aarch64":
        assert machine == EM_AARCH64


def test_aarch64_object_is_an_aarch64_elf():
    target = aarch64()
    obj = compile_cpu_kernel(conv_spec(target), target)
    assert obj[:4] == b"\x7fELF"
    assert obj[4] == 2  # EI_CLASS: 64-bit
    assert obj[5] == 1  # little-endian
    assert int.from_bytes(obj[18:20], "little") == 183  # e_machine: AArch64
    assert elf_type(obj) == 1


@pytest.mark.parametrize("target", [host(), aarch64()], ids=["host", "aarch64"])
def test_compiling_twice_gives_identical_bytes(target):
    spec = conv_spec(target)
    assert compile_cpu_kernel(spec, target) == compile_cpu_kernel(spec, target)


def test_a_tiny_kernel_is_compiled_without_unrolling_and_a_bigger_one_with_it():
    """A kernel whose launches run at most TINY_KERNEL_WORK innermost statements is compiled without LLVM's loop
    unrolling (kernel.kernel_pipeline): its object is compile_ir's with Pipeline.O3_NO_UNROLL, and another than O3's."""
    target = host()
    bigger = conv_spec(target)
    tiny = dataclasses.replace(
        bigger, inputs=(TensorInfo((1, 8, 4, 4)), *bigger.inputs[1:]), outputs=(TensorInfo((1, 16, 4, 4)),)
    )
    assert sum(work for _, _, work in cpu_launches(tiny, target)) <= TINY_KERNEL_WORK
    assert kernel_pipeline(tiny, target) == Pipeline.O3_NO_UNROLL
    text = kernel_ir(tiny, target)
    name = f"kernel Conv {tiny.symbol}"
    assert compile_cpu_kernel(tiny, target) == compile_ir(text, target, name, Pipeline.O3_NO_UNROLL)
    assert compile_cpu_kernel(tiny, target) != compile_ir(text, target, name)
    assert sum(work for _, _, work in cpu_launches(bigger, target)) > TINY_KERNEL_WORK
    assert kernel_pipeline(bigger, target) == Pipeline.O3


def test_a_kernel_that_calls_math_functions_vectorises_its_loops_wide(tmp_path: Path) -> None:
    """A kernel whose loops call exp, log or sqrt (kernel.calls_math: a Softmax) compiles with
    Pipeline.O3_WIDE_LOOPS; one that only moves and compares values (a MaxPool) with O3."""
    target = host()

    def spec(op: str, attrs: dict) -> KernelSpec:
        model = single_op_model(op, [("x", (1, 64, 56, 56))], attrs)
        onnx.save(model, tmp_path / f"{op}.onnx")
        return dataclasses.replace(plan_model(tmp_path / f"{op}.onnx").steps[0].spec, target_id=target.id)

    softmax, pool = spec("Softmax", {"axis": -1}), spec("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]})
    assert calls_math(lower_kernel(softmax).body) and not calls_math(lower_kernel(pool).body)
    assert kernel_pipeline(softmax, target) == Pipeline.O3_WIDE_LOOPS
    assert kernel_pipeline(pool, target) == Pipeline.O3


def test_the_outlined_parts_of_a_kernel_compile_with_the_emitted_pipeline_and_its_first_part_with_o3():
    """A kernel split into parts (kernel_parts): its outlined GEMM parts hold only tile loops whose rows, vectors and
    kernel columns farm lays out, so LLVM only promotes, folds and merges them (Pipeline.EMITTED); the first part,
    with the launches and the padded copy's loop IR, is compiled at O3 like a whole kernel."""
    target = host()
    spec = KernelSpec(
        op="Conv",
        attrs_json=canonical_json({**CONV_ATTRS, "constant_weight": True}),
        inputs=(TensorInfo((1, 256, 14, 14)), TensorInfo((256, 256, 3, 3)), TensorInfo((256,))),
        outputs=(TensorInfo((1, 256, 14, 14)),),
        activation=RELU,
        target_id=target.id,
    )
    parts = kernel_parts(spec, target)
    assert parts > 1
    assert kernel_pipeline(spec, target) == kernel_pipeline(dataclasses.replace(spec, part=(0, parts)), target)
    assert kernel_pipeline(spec, target) == Pipeline.O3
    outlined = [dataclasses.replace(spec, part=(part, parts)) for part in range(1, parts)]
    assert {kernel_pipeline(part, target) for part in outlined} == {Pipeline.EMITTED}
    text = kernel_ir(outlined[0], target)
    emitted = compile_cpu_kernel(outlined[0], target)
    assert emitted == compile_ir(text, target, f"kernel Conv {spec.symbol}", Pipeline.EMITTED)
    assert emitted != compile_ir(text, target, f"kernel Conv {spec.symbol}")


def test_object_defines_the_kernel_symbol_as_a_global_function(tmp_path):
    target = host()
    spec = conv_spec(target)
    table = symbols(compile_cpu_kernel(spec, target), tmp_path)
    assert spec.symbol in table
    _, _, size, kind, bind, _, ndx = table[spec.symbol]
    assert kind == "FUNC" and bind == "GLOBAL" and ndx != "UND" and int(size) > 0


def test_kernel_symbol_is_hidden_in_the_object(tmp_path):
    """Kernels are 'hidden inside the model library' (llvm_render.declare_kernel); the object must say so."""
    target = host()
    spec = conv_spec(target)
    table = symbols(compile_cpu_kernel(spec, target), tmp_path)
    assert table[spec.symbol][5] == "HIDDEN", table[spec.symbol]


def test_kernel_needs_no_external_symbols(tmp_path):
    target = host()
    table = symbols(compile_cpu_kernel(conv_spec(target), target), tmp_path)
    assert [name for name, fields in table.items() if fields[6] == "UND"] == []


def test_kernel_ir_names_the_triple_and_symbol():
    target = aarch64()
    spec = conv_spec(target)
    text = kernel_ir(spec, target)
    assert f'target triple = "{target.triple}"' in text
    assert f'@"{spec.symbol}"(' in text or f"@{spec.symbol}(" in text


def test_default_blocking_uses_the_target_vector_width_and_register_file():
    avx512 = CpuTarget("x86_64-unknown-linux-gnu", "generic", "+avx512f")
    avx = CpuTarget("x86_64-unknown-linux-gnu", "generic", "+avx")
    assert (avx512.vector_registers, avx.vector_registers, aarch64().vector_registers) == (32, 16, 32)
    shapes = [(b.rows, b.vectors, b.lanes) for b in map(default_blocking, (avx512, avx, aarch64()))]
    assert shapes == [(8, 3, 16), (4, 3, 8), (8, 3, 4)]
    blocking = default_blocking(host())
    assert blocking.lanes == host().simd_floats and blocking.rows == (8 if host().vector_registers == 32 else 4)


def test_an_untuned_14x14_conv_of_256_channels_takes_the_wide_tile_on_32_registers():
    """A 14x14 3x3 conv of 256 output channels is a few-row GEMM whose 8 x 3 blocks two threads can't share evenly
    (gemm_blocking.balanced_blocking): with 32 vector registers it takes 6 x 4 untuned, as the spec without a
    variant builds it; with 16 (AVX2) the default; a 3x3 conv of 192 channels keeps the default."""
    avx512 = CpuTarget("x86_64-unknown-linux-gnu", "skylake-avx512", "+avx512f")
    avx2 = CpuTarget("x86_64-unknown-linux-gnu", "haswell", "+avx,+avx2,+fma")

    def spec(channels: int, target: CpuTarget) -> KernelSpec:
        return KernelSpec(
            op="Conv",
            attrs_json=canonical_json({**CONV_ATTRS, "constant_weight": True}),  # a layer's weights, as models have
            inputs=(TensorInfo((1, 256, 14, 14)), TensorInfo((channels, 256, 3, 3)), TensorInfo((channels,))),
            outputs=(TensorInfo((1, channels, 14, 14)),),
            activation=None,
            target_id=target.id,
        )

    assert untuned_blocking(spec(256, avx512), avx512) == GemmBlocking(6, 4, 16)
    assert blocking_for(spec(256, avx512), avx512) == GemmBlocking(6, 4, 16)
    assert untuned_blocking(spec(256, avx2), avx2) == default_blocking(avx2)
    assert untuned_blocking(spec(192, avx512), avx512) == default_blocking(avx512)


def test_an_untuned_64_channel_3x3_conv_takes_one_wide_tile_on_32_registers():
    """A 56x56 3x3 conv of 64 to 64 channels (k = 576) is one 6 x 4 tile wide on AVX-512
    (gemm_blocking.single_tile_blocking); on AVX2 and for 128 output channels the default stays."""
    avx512 = CpuTarget("x86_64-unknown-linux-gnu", "skylake-avx512", "+avx512f")
    avx2 = CpuTarget("x86_64-unknown-linux-gnu", "haswell", "+avx,+avx2,+fma")

    def spec(channels: int, target: CpuTarget) -> KernelSpec:
        return KernelSpec(
            op="Conv",
            attrs_json=canonical_json({**CONV_ATTRS, "constant_weight": True}),
            inputs=(TensorInfo((1, 64, 56, 56)), TensorInfo((channels, 64, 3, 3)), TensorInfo((channels,))),
            outputs=(TensorInfo((1, channels, 56, 56)),),
            activation=None,
            target_id=target.id,
        )

    assert untuned_blocking(spec(64, avx512), avx512) == GemmBlocking(6, 4, 16)
    assert untuned_blocking(spec(64, avx2), avx2) == default_blocking(avx2)
    assert untuned_blocking(spec(128, avx512), avx512) == default_blocking(avx512)


def test_different_targets_give_different_code():
    x86 = CpuTarget("x86_64-unknown-linux-gnu", "generic", "+sse2")
    avx = CpuTarget("x86_64-unknown-linux-gnu", "haswell", "+avx,+avx2,+fma")
    assert compile_cpu_kernel(conv_spec(x86), x86) != compile_cpu_kernel(conv_spec(avx), avx)


def test_invalid_ir_is_a_build_error_naming_the_kernel():
    spec = conv_spec(host())
    name = f"kernel {spec.op} {spec.symbol}"
    with pytest.raises(BuildError) as info:
        compile_ir("this is not LLVM IR", host(), name)
    assert str(info.value).startswith(f"{name}: LLVM rejected the generated IR")
    assert "expected top-level entity" in str(info.value)


def test_ir_that_parses_but_fails_verification_is_a_build_error():
    text = "define void @f() {\nentry:\n  br label %b\nb:\n  %x = add i32 %y, 1\n  %y = add i32 %x, 1\n  ret void\n}\n"
    with pytest.raises(BuildError, match=r"kernel Conv farm_k_x: .*does not dominate"):
        compile_ir(text, host(), "kernel Conv farm_k_x")


# -- the compiled Conv computes a convolution ----------------------------------------------------------------------


def conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros(Y_SHAPE, np.float64)
    for r in range(3):
        for s in range(3):
            out += np.einsum("nchw,mc->nmhw", xp[:, :, r : r + 10, s : s + 10], w[:, :, r, s].astype(np.float64))
    return out + b.astype(np.float64)[None, :, None, None]


@pytest.mark.parametrize("activation", [Activation("relu"), None], ids=["relu", "none"])
def test_compiled_conv_matches_numpy(activation, tmp_path):
    target = host()
    spec = conv_spec(target, activation)
    kernel = lower_kernel(spec)
    assert [p.name for p in kernel.params] == ["out0", "in0", "in1", "in2", "scratch"]
    rng = np.random.default_rng(11)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    w = rng.standard_normal(W_SHAPE).astype(np.float32)
    b = rng.standard_normal(B_SHAPE).astype(np.float32)
    arrays = [np.zeros(Y_SHAPE, np.float32), x, w, b, np.zeros(argument_bytes(spec)[-1] // 4, np.float32)]
    offsets, size = layout(arrays)
    schedule = [{"kernel": spec.symbol, "args": [["arena", o] for o in offsets]}]
    library = load_library(
        link_library([compile_cpu_kernel(spec, target), compile_entry(schedule, target)], target), tmp_path
    )
    arena = aligned_arena(size)
    for array, offset in zip(arrays, offsets):
        arena[offset : offset + array.nbytes] = array.view(np.uint8).reshape(-1)
    call_farm_run(library, arena)
    y = arena[: arrays[0].nbytes].view(np.float32).reshape(Y_SHAPE)
    expected = conv_reference(x, w, b)
    if activation is not None:
        expected = np.maximum(expected, 0.0)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
