"""Compile units (farm/build/units.py): every kind's JSON form, cache ref and pure step."""

from __future__ import annotations

import json

import pytest

from farm.backends.llvm.kernel import compile_cpu_kernel
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import toolchain
from farm.backends.opencl.target import OpenClTarget
from farm.build.units import CompileUnit, compile_unit, unit_kinds
from farm.errors import BadInputError
from farm.ir.graph import TensorInfo
from farm.ir.specs import BlobSpec, KernelSpec
from farm.ir.unit_kinds import UnitKind

CPU = CpuTarget("x86_64-unknown-linux-gnu")
DEVICE = OpenClTarget("0123456789abcdef")
RELU = KernelSpec("Relu", "{}", (TensorInfo((2, 8), "float32"),), (TensorInfo((2, 8), "float32"),), None, CPU.id)
UNITS = [
    CompileUnit(UnitKind.KERNEL, RELU, CPU),
    CompileUnit(UnitKind.BLOB, BlobSpec("ab" * 32, 16, CPU.id), CPU),
    CompileUnit(UnitKind.CL_KERNEL, KernelSpec(**{**RELU.__dict__, "target_id": "opencl"}), DEVICE),
]


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.kind.value)
def test_a_unit_round_trips_through_json(unit: CompileUnit) -> None:
    assert CompileUnit.from_json(json.loads(json.dumps(unit.to_json()))) == unit
    assert unit.name == f"{unit.target.id}/{unit.spec.symbol}"


def test_every_kind_has_its_own_cache_ref_and_only_blobs_have_input_bytes() -> None:
    assert set(unit_kinds()) == {unit.kind for unit in UNITS}
    assert [unit.cache_ref.split(":")[0] for unit in UNITS] == ["kernel", "blob", "clkernel"]
    assert UNITS[2].cache_ref == f"clkernel:{DEVICE.fingerprint}:{UNITS[2].spec.key}"
    assert [unit.data_key for unit in UNITS] == [None, "ab" * 32, None]


def test_cpu_cache_refs_hold_this_processs_compiler_and_opencl_refs_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another LLVM may write other bytes for the same spec, so CPU objects are cached per compiler; a program
    binary is already cached per device fingerprint (which holds the driver's version). Specs, symbols and the
    built bytes don't change: an artifact stays byte-identical for the same toolchain."""
    monkeypatch.delenv("FARM_TOOLCHAIN_LABEL", raising=False)
    compiler = toolchain().compiler_key
    assert UNITS[0].cache_ref == f"kernel:{compiler}:{RELU.key}"
    assert UNITS[1].cache_ref == f"blob:{compiler}:{UNITS[1].spec.key}"
    before = [(unit.cache_ref, unit.spec.key, unit.spec.symbol) for unit in UNITS]
    built = compile_unit(UNITS[0])

    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "other")  # as a process with another toolchain sees them
    after = [(unit.cache_ref, unit.spec.key, unit.spec.symbol) for unit in UNITS]
    assert [a[0] != b[0] for a, b in zip(after, before)] == [True, True, False]
    assert [a[1:] for a in after] == [b[1:] for b in before]
    assert compile_unit(UNITS[0]) == built


def test_a_units_step_is_its_backends_compile_step() -> None:
    assert compile_unit(UNITS[0]) == compile_cpu_kernel(RELU, CPU)
    assert compile_unit(UNITS[1], bytes(range(16))) == bytes(range(16))  # a weight without panels is its bytes


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "sh", "spec": {}, "target": CPU.to_json()}, "not a compile unit"),
        ({"kind": "blob", "spec": {"sha256": "x"}, "target": CPU.to_json()}, "malformed spec"),
        ({"kind": "kernel", "spec": RELU.to_json(), "target": {"kind": "gpu"}}, "unknown target kind"),
    ],
)
def test_a_malformed_unit_is_refused(data: dict, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        CompileUnit.from_json(data)
