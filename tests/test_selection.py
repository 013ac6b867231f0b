"""Which CPU target a run uses (farm.runtime.selection): the one `--target` names, as `farm submit` named it or by
its id, else the best this host runs natively; one of another architecture runs under emulation."""

from __future__ import annotations

import pytest

from farm.backends.llvm.target import CpuTarget, parse_target
from farm.errors import ArtifactError, ExitStatus
from farm.runtime.host import Host
from farm.runtime.manifest_types import CpuTargetEntry
from farm.runtime.selection import needs_emulation, select_target

HOST = Host(
    "x86_64-unknown-linux-gnu",
    "znver4",
    frozenset({"sse2", "avx", "avx2"}),
    frozenset({"sse2", "avx", "avx2", "avx512f"}),
)
NATIVE = CpuTarget("x86_64-unknown-linux-gnu", "znver4", "+sse2,+avx,+avx2")
WIDER = CpuTarget("x86_64-unknown-linux-gnu", "sapphirerapids", "+avx512f")
ARM = parse_target("cpu:aarch64-linux-gnu")
NEOVERSE = CpuTarget("aarch64-unknown-linux-gnu", "neoverse-n1", "+neon")
RISCV = parse_target("cpu:riscv64-linux-gnu")


def targets(*chosen: CpuTarget) -> list[CpuTargetEntry]:
    """Manifest entries of the targets (what selection reads of them; `requires` here: the explicit +features)."""
    return [
        CpuTargetEntry(
            target.id,
            target.triple,
            target.cpu,
            target.features,
            requires=tuple(f[1:] for f in target.features.split(",") if f.startswith("+")),
        )
        for target in chosen
    ]


def test_no_target_or_cpu_is_the_best_this_host_runs():
    entries = targets(ARM, WIDER, NATIVE)
    assert select_target(entries, None, HOST, "a.farm").id == NATIVE.id
    assert select_target(entries, "cpu", HOST, "a.farm").id == NATIVE.id


@pytest.mark.parametrize(
    "wanted, chosen",
    [
        (ARM.id, ARM),
        ("cpu:aarch64-linux-gnu", ARM),
        ("cpu:aarch64-unknown-linux-gnu:generic", ARM),
        ("cpu:riscv64-linux-gnu", RISCV),
        (RISCV.id, RISCV),
        ("cpu:riscv64-linux-gnu:generic-rv64:+m,+a,+f,+d,+c", RISCV),
        ("cpu:x86_64-linux-gnu", NATIVE),
        (NATIVE.id, NATIVE),
    ],
)
def test_a_target_is_named_as_submit_named_it_or_by_its_id(wanted, chosen):
    assert select_target(targets(NATIVE, ARM, RISCV), wanted, HOST, "a.farm").id == chosen.id


def test_a_bare_triple_names_the_artifacts_only_target_of_that_triple_whatever_its_cpu():
    assert select_target(targets(NATIVE, NEOVERSE), "cpu:aarch64-linux-gnu", HOST, "a.farm").id == NEOVERSE.id


def test_a_bare_triple_that_fits_several_targets_asks_for_one():
    cortex = CpuTarget("aarch64-unknown-linux-gnu", "cortex-a72", "")
    with pytest.raises(ArtifactError, match=r"'cpu:aarch64-linux-gnu' fits 2 targets of the artifact") as refusal:
        select_target(targets(NEOVERSE, cortex), "cpu:aarch64-linux-gnu", HOST, "a.farm")
    assert NEOVERSE.id in str(refusal.value) and cortex.id in str(refusal.value)


@pytest.mark.parametrize("wanted", ["cpu:riscv64-linux-gnu", "cpu:aarch64-linux-gnu:cortex-a72", "nope"])
def test_a_target_the_artifact_lacks_is_one_line_listing_what_it_has(wanted):
    with pytest.raises(ArtifactError) as refusal:
        select_target(targets(NATIVE, ARM), wanted, HOST, "a.farm")
    message = str(refusal.value)
    assert message.startswith(f"a.farm: no target {wanted!r} in the artifact; it has {NATIVE.id} (")
    assert ARM.id in message and "\n" not in message
    assert refusal.value.exit_status == ExitStatus.BAD_INPUT


def test_a_named_target_of_this_architecture_needs_the_features_it_was_built_with():
    with pytest.raises(ArtifactError, match=rf"target '{WIDER.id}' needs \+avx512f, which this host .* lacks"):
        select_target(targets(NATIVE, WIDER), WIDER.id, HOST, "a.farm")


def test_only_another_architecture_needs_emulation():
    assert [needs_emulation(entry.triple, HOST) for entry in targets(NATIVE, WIDER, ARM, RISCV)] == [
        False,
        False,
        True,
        True,
    ]
