"""CPU targets: parsing `--target`, ids, SIMD widths and LLVM target machines."""

from __future__ import annotations

import re
import subprocess
import sys

import llvmlite.binding as llvm
import pytest

from farm.backends.llvm.dot_products import dot_product_for
from farm.backends.llvm.target import CPU_FEATURES, CpuTarget, host_target, parse_target
from farm.errors import BadInputError, ExitStatus


def test_plain_cpu_is_the_host():
    host = host_target()
    assert parse_target("cpu") == host
    assert parse_target("cpu:") == host
    assert host.triple == llvm.get_process_triple()
    assert host.cpu == llvm.get_host_cpu_name()
    assert host.features == llvm.get_host_cpu_features().flatten()


def test_triple_aliases_expand():
    assert parse_target("cpu:aarch64-linux-gnu") == CpuTarget("aarch64-unknown-linux-gnu", "generic", "")
    assert parse_target("cpu:x86_64-linux-gnu") == CpuTarget("x86_64-unknown-linux-gnu", "generic", "")


def test_riscv64_means_debians_rv64gc_whose_objects_have_the_double_float_abi():
    from farm.backends.llvm.entry import compile_entry

    target = parse_target("cpu:riscv64-linux-gnu")
    assert target == CpuTarget("riscv64-unknown-linux-gnu", "generic-rv64", "+m,+a,+f,+d,+c")
    assert parse_target("cpu:riscv64-unknown-linux-gnu") == target
    assert parse_target("cpu:riscv64-linux-gnu:sifive-u74") == CpuTarget("riscv64-unknown-linux-gnu", "sifive-u74", "")
    assert target.simd_floats == 1  # scalar: no vector extension in rv64gc
    flags = int.from_bytes(compile_entry([], target)[0x30:0x34], "little")
    assert flags & 0x6 == 0x4  # EF_RISCV_FLOAT_ABI_DOUBLE: lp64d, what Debian's riscv64 libc is built for


def test_full_triple_cpu_and_features():
    target = parse_target("cpu:x86_64-unknown-linux-gnu:skylake:+avx2")
    assert target == CpuTarget("x86_64-unknown-linux-gnu", "skylake", "+avx2")
    assert target.arch == "x86_64"


def test_triple_and_cpu_without_features():
    assert parse_target("cpu:aarch64-unknown-linux-gnu:cortex-a72") == CpuTarget(
        "aarch64-unknown-linux-gnu", "cortex-a72", ""
    )


@pytest.mark.parametrize(
    ("cpu", "lanes", "registers", "dot"),
    [
        ("znver3", 8, 16, "avx2"),
        ("haswell", 8, 16, "avx2"),
        ("skylake-avx512", 16, 32, "avx2"),
        ("cascadelake", 16, 32, "avx512vnni"),
        ("alderlake", 8, 16, "avxvnni"),
        ("sapphirerapids", 16, 32, "avx512vnni"),
    ],
)
def test_a_named_x86_cpu_gets_the_features_farm_reads(cpu: str, lanes: int, registers: int, dot: str) -> None:
    """A build for a named CPU (a Zen 3 fleet built elsewhere) gets its vector width, registers and int8 dot product,
    not the generic SSE-width fallback; the features are in its id, and the machine accepts them."""
    target = parse_target(f"cpu:x86_64-linux-gnu:{cpu}")
    assert target.features == CPU_FEATURES[cpu]
    assert (target.simd_floats, target.vector_registers, dot_product_for(target).name) == (lanes, registers, dot)
    target.machine()


def test_features_given_or_a_cpu_outside_the_table_stay_as_given() -> None:
    assert parse_target("cpu:x86_64-linux-gnu:znver3:+avx2").features == "+avx2"
    assert parse_target("cpu:x86_64-linux-gnu:generic").features == ""
    assert parse_target("cpu:x86_64-linux-gnu:nehalem").features == ""


def test_features_may_hold_several_comma_separated_flags():
    target = parse_target("cpu:x86_64-unknown-linux-gnu:generic:+avx,+avx2,+fma")
    assert target.features == "+avx,+avx2,+fma"
    assert target.simd_floats == 8


def test_empty_cpu_means_generic():
    assert parse_target("cpu:x86_64-unknown-linux-gnu::+sse2").cpu == "generic"


@pytest.mark.parametrize("spec", ["gpu", "opencl:0", "CPU", "", "x86_64-unknown-linux-gnu"])
def test_unknown_kind_is_bad_input(spec):
    with pytest.raises(BadInputError, match="unknown target") as info:
        parse_target(spec)
    assert repr(spec) in str(info.value)
    assert info.value.exit_status == ExitStatus.BAD_INPUT


@pytest.mark.parametrize(
    "spec, triple", [("cpu:foo-bar-baz", "foo-bar-baz"), ("cpu:nonsense", "nonsense"), ("cpu::", "")]
)
def test_unknown_triple_is_bad_input_naming_it(spec, triple):
    with pytest.raises(BadInputError) as info:
        parse_target(spec)
    message = str(info.value)
    assert repr(spec) in message and f"does not know triple {triple!r}" in message


@pytest.mark.parametrize(
    "features, lanes",
    [
        ("+avx512f", 16),
        ("+sse2,+avx,+avx512f", 16),
        ("+avx", 8),
        ("+sse2,+avx", 8),
        ("+sse2", 4),
        ("+avx512f,-avx512f", 16),  # set membership: a later "-" does not remove an earlier "+"
        ("-avx512f,+avx", 8),
        ("-avx512f,-avx", 4),
        ("", 4),
    ],
)
def test_simd_floats_for_x86_feature_strings(features, lanes):
    assert CpuTarget("x86_64-unknown-linux-gnu", "generic", features).simd_floats == lanes


def test_simd_floats_for_other_architectures():
    assert CpuTarget("aarch64-unknown-linux-gnu").simd_floats == 4
    assert CpuTarget("aarch64-unknown-linux-gnu", "generic", "+neon").simd_floats == 4
    assert CpuTarget("riscv64-unknown-linux-gnu").simd_floats == 1


def test_host_simd_floats_follow_its_features():
    host = host_target()
    enabled = set(host.features.split(","))
    expected = 16 if "+avx512f" in enabled else 8 if "+avx" in enabled else 4
    if host.arch in ("x86_64", "aarch64"):
        assert host.simd_floats == expected


def test_id_is_a_stable_function_of_triple_cpu_and_features():
    # literal values: ids name cache keys and artifact paths, so they must not change between versions or hosts
    assert CpuTarget("x86_64-unknown-linux-gnu").id == "cpu-x86_64-unknown-linux-gnu-generic-647924c3"
    assert (
        CpuTarget("x86_64-unknown-linux-gnu", "skylake", "+avx2").id == "cpu-x86_64-unknown-linux-gnu-skylake-f9728ae0"
    )
    assert parse_target("cpu:aarch64-linux-gnu").id == "cpu-aarch64-unknown-linux-gnu-generic-3dc5ba3d"


def test_id_is_the_same_in_a_fresh_process():
    code = (
        "from farm.backends.llvm.target import parse_target; "
        "print(parse_target('cpu:x86_64-unknown-linux-gnu:skylake:+avx2').id)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == parse_target("cpu:x86_64-unknown-linux-gnu:skylake:+avx2").id


def test_id_differs_by_triple_cpu_and_features():
    ids = {
        CpuTarget("x86_64-unknown-linux-gnu").id,
        CpuTarget("x86_64-unknown-linux-gnu", "skylake").id,
        CpuTarget("x86_64-unknown-linux-gnu", "generic", "+avx2").id,
        CpuTarget("x86_64-unknown-linux-gnu", "generic", "+avx2,+fma").id,
        CpuTarget("x86_64-unknown-linux-gnu", "skylake", "+avx2").id,
        CpuTarget("aarch64-unknown-linux-gnu").id,
    }
    assert len(ids) == 6


def test_to_json():
    target = CpuTarget("aarch64-unknown-linux-gnu", "cortex-a72", "+neon")
    assert target.to_json() == {
        "id": target.id,
        "kind": "cpu",
        "triple": "aarch64-unknown-linux-gnu",
        "cpu": "cortex-a72",
        "features": "+neon",
    }


@pytest.mark.parametrize("spec", ["cpu", "cpu:aarch64-linux-gnu", "cpu:x86_64-unknown-linux-gnu:skylake:+avx2"])
def test_machines_are_created_for_the_target(spec):
    target = parse_target(spec)
    machine = target.machine()
    assert machine.triple == target.triple
    assert str(machine.target_data)  # a data layout string


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("cpu:x86_64-linux-gnu:bogus", "'bogus' is not a recognized processor"),
        ("cpu:x86_64-linux-gnu:skylake:+nofeat", "'+nofeat' is not a recognized feature"),
    ],
)
def test_a_cpu_or_feature_llvm_does_not_know_is_refused_before_any_compile(spec: str, named: str) -> None:
    """LLVM only warns and goes on, then aborts the compiling process ('64-bit code requested on a subtarget that
    doesn't support it'): farm reads the warning and refuses the target with exit status 2."""
    with pytest.raises(BadInputError, match=re.escape(named)):
        parse_target(spec)


def test_a_forged_target_with_an_unknown_cpu_fails_its_compile_cleanly() -> None:
    """A target from a job record or message never went through parse_target: machine() checks it too."""
    forged = CpuTarget("x86_64-unknown-linux-gnu", "bogus2", "")
    with pytest.raises(BadInputError, match="'bogus2' is not a recognized processor"):
        forged.machine()
