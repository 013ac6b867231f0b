"""The kinds of compile unit (farm/ir/unit_kinds.py): an Enum whose values are the names JSON, refs and messages
have always used, so that naming them changed no byte a unit's JSON form holds."""

from __future__ import annotations

import json

import pytest

from farm.backends.llvm.target import CpuTarget
from farm.build.units import CompileUnit, traits_of, unit_kinds
from farm.distributed.task_messages import COMPILE_TASKS
from farm.ir.specs import BlobSpec
from farm.ir.unit_kinds import UnitKind


def test_the_kinds_keep_their_names() -> None:
    assert [kind.value for kind in UnitKind] == ["kernel", "blob", "clkernel"]
    assert set(unit_kinds()) == set(COMPILE_TASKS) == set(UnitKind)


@pytest.mark.parametrize("kind", list(UnitKind))
def test_a_kind_reads_back_from_its_name_and_equals_it(kind: UnitKind) -> None:
    assert UnitKind(kind.value) is kind and kind == kind.value
    assert traits_of(kind) is traits_of(UnitKind(kind.value))


def test_a_units_json_spells_its_kind_as_before() -> None:
    cpu = CpuTarget("x86_64-unknown-linux-gnu", "generic")
    unit = CompileUnit(UnitKind.BLOB, BlobSpec("ab" * 32, 16, cpu.id), cpu)
    data = unit.to_json()
    assert type(data["kind"]) is str and data["kind"] == "blob"
    assert json.loads(json.dumps(data))["kind"] == "blob"
    again = CompileUnit.from_json(json.loads(json.dumps(data)))
    assert again == unit and again.kind is UnitKind.BLOB
