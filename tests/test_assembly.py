"""The one assembly of a build (farm/build/assembly.py), driven by hand the way the farm's steps drive it: the
link plan survives JSON (the farm keeps it in the store), and the artifact it assembles is the local build's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx
import pytest

from farm.artifact import artifact_bytes
from farm.backends.llvm.target import CpuTarget, host_target
from farm.backends.opencl.target import OpenClTarget
from farm.build import assembly
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.build.parts import BuiltUnits
from farm.build.units import compile_unit
from farm.errors import BuildError
from farm.tools import examples
from tests.dynamic_models import dynamic_cnn


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("m") / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    return path


def test_the_assembly_driven_step_by_step_gives_the_local_builds_artifact(model: Path, tmp_path: Path) -> None:
    targets = [host_target(), CpuTarget("aarch64-unknown-linux-gnu")]
    plan = assembly.plan_model(model)
    units = assembly.compile_units(plan, targets)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    plan_json = json.loads(json.dumps(assembly.link_plan([plan], targets, model.stem, sha, units)))
    assert set(plan_json["units"]) == {unit.name for unit in units} and set(plan_json["layouts"]) == {"cpu"}

    objects = {
        unit.name: compile_unit(unit, memoryview(plan.blobs[unit.data_key]).cast("B") if unit.data_key else None)
        for unit in units
    }
    libraries: dict[str, bytes] = {}
    built = BuiltUnits(
        objects.__getitem__,
        lambda name: hashlib.sha256(objects[name]).hexdigest(),
        libraries.__getitem__,
        lambda key: plan.blobs[key].tobytes(),
    )
    for target in targets:
        libraries[target.id] = assembly.link_library(plan_json, target.id, built)
    manifest, members = assembly.artifact_contents(plan_json, built)

    local = build_model(model, tmp_path, targets, executor=LocalExecutor(1))
    assert artifact_bytes(manifest, members) == Path(local.artifact).read_bytes()
    assert local.job_id == assembly.build_identity(sha, model.stem, targets)[:16]


def test_an_opencl_only_plan_has_no_libraries_and_still_lists_cpu_fields(model: Path) -> None:
    plan, device = assembly.plan_model(model), OpenClTarget("0123456789abcdef")
    units = assembly.compile_units(plan, [device])
    plan_json = assembly.link_plan([plan], [device], "m", "0" * 64, units)
    assert assembly.libraries(plan_json) == [] and {unit.kind for unit in units} == {"clkernel"}
    assert plan_json["manifest"]["targets"] == [] and plan_json["manifest"]["kernels"] == []
    assert plan_json["manifest"]["opencl"]["devices"] == [device.fingerprint]
    assert set(plan_json["layouts"]["opencl"]["binaries"].values()) == {unit.name for unit in units}


def test_the_build_identity_names_everything_the_bytes_depend_on() -> None:
    host, arm = host_target(), CpuTarget("aarch64-unknown-linux-gnu")
    identities = {
        assembly.build_identity("a" * 64, "m", [host]),
        assembly.build_identity("b" * 64, "m", [host]),
        assembly.build_identity("a" * 64, "n", [host]),
        assembly.build_identity("a" * 64, "m", [host, arm]),
        assembly.build_identity("a" * 64, "m", [host, OpenClTarget("0123456789abcdef")]),
        assembly.build_identity("a" * 64, "m", [host], [{"batch": (1,)}]),
        assembly.build_identity("a" * 64, "m", [host], [{"batch": (2,)}]),
        assembly.build_identity("a" * 64, "m", [host], [{"batch": (1,)}, {"batch": (2,)}]),
        assembly.build_identity("a" * 64, "m", [host], [{"batch": (2,)}, {"batch": (1,)}]),
    }
    assert len(identities) == 9 and assembly.build_identity("a" * 64, "m", [host]) in identities
    assert assembly.build_identity("a" * 64, "m", [host], [{}]) == assembly.build_identity("a" * 64, "m", [host])


def test_sizes_driven_step_by_step_give_the_local_builds_artifact(tmp_path: Path) -> None:
    """Two sizes: every unit once (the sizes' shared ones too), a library per size and target under its own id,
    and the artifact the local build writes."""
    model = tmp_path / "dyn.onnx"
    dynamic_cnn(model)
    sizes, targets = [{"batch": (1,)}, {"batch": (2,)}], [host_target()]
    plans = assembly.plan_sizes(model, sizes)
    units = assembly.sized_units(plans, targets)
    assert len(units) < sum(len(assembly.compile_units(plan, targets)) for plan in plans)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    plan_json = json.loads(json.dumps(assembly.link_plan(plans, targets, model.stem, sha, units, sizes)))
    assert [library["id"] for library in assembly.libraries(plan_json)] == [
        f"{targets[0].id}.size0",
        f"{targets[0].id}.size1",
    ]
    blobs = assembly.sized_blobs(plans)
    objects = {
        unit.name: compile_unit(unit, memoryview(blobs[unit.data_key]).cast("B") if unit.data_key else None)
        for unit in units
    }
    libraries: dict[str, bytes] = {}
    built = BuiltUnits(
        objects.__getitem__,
        lambda name: hashlib.sha256(objects[name]).hexdigest(),
        libraries.__getitem__,
        lambda key: blobs[key].tobytes(),
    )
    for library in assembly.libraries(plan_json):
        libraries[library["id"]] = assembly.link_library(plan_json, library["id"], built)
    manifest, members = assembly.artifact_contents(plan_json, built)
    local = build_model(model, tmp_path, targets, executor=LocalExecutor(1), sizes=sizes)
    assert artifact_bytes(manifest, members) == Path(local.artifact).read_bytes()
    with pytest.raises(BuildError, match="no library 'nope'"):
        assembly.link_library(plan_json, "nope", built)


def test_the_build_identity_holds_the_toolchain_but_the_artifact_does_not(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another toolchain is another artifact cache entry (and local job id); the bytes stay a function of the model,
    the targets and the toolchain itself, so a label that only marks the toolchain changes no byte."""
    monkeypatch.delenv("FARM_TOOLCHAIN_LABEL", raising=False)
    sha, targets = hashlib.sha256(model.read_bytes()).hexdigest(), [host_target()]
    plain = build_model(model, tmp_path / "plain", targets, executor=LocalExecutor(1))
    assert plain.job_id == assembly.build_identity(sha, model.stem, targets)[:16]

    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "other")
    assert assembly.build_identity(sha, model.stem, targets)[:16] != plain.job_id
    labelled = build_model(model, tmp_path / "labelled", targets, executor=LocalExecutor(1))
    assert labelled.job_id == assembly.build_identity(sha, model.stem, targets)[:16]
    assert Path(labelled.artifact).read_bytes() == Path(plain.artifact).read_bytes()


def test_unit_counts_count_every_code_unit_and_every_packed_weight(model: Path) -> None:
    fingerprint = "0123456789abcdef"
    units = assembly.compile_units(assembly.plan_model(model), [host_target(), OpenClTarget(fingerprint)])
    counts = assembly.unit_counts(units)
    assert counts == {
        "kernels": sum(u.kind in ("kernel", "clkernel") for u in units),
        "blobs": sum(u.kind == "blob" for u in units),
    }
    assert counts["kernels"] + counts["blobs"] == len(units) and counts["blobs"] > 0


def test_a_link_plan_lowers_each_kernel_once_per_target(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The link plan is on the build's critical path: its manifest, layout and weight slots all ask for each kernel's
    launches, packed parameters and variant, and each answer lowered the kernel again (light DenseNet-121: 2,212
    lowerings of 316 kernels, 0.3-0.4 s). The units ask for each kernel's parts once too. Every cache is cleared
    first, so the test counts the same run alone as in the suite (it counted 28 of 21 alone: kernel_parts was not
    kept)."""
    from farm.backends.llvm import kernel
    from farm.tuning import space

    lowered: list[str] = []
    real = kernel.lower_kernel
    monkeypatch.setattr(kernel, "lower_kernel", lambda spec: lowered.append(spec.key) or real(spec))
    monkeypatch.setattr(space, "lower_kernel", lambda spec: lowered.append(spec.key) or real(spec))
    for cached in (kernel._packed_params, kernel._cpu_launches, kernel.kernel_parts, space.tunable):
        cached.cache_clear()
    plan, target = assembly.plan_model(model), host_target()
    units = assembly.compile_units(plan, [target])
    first = assembly.link_plan([plan], [target], "m", "0" * 64, units)
    kernels = len(plan.kernels())
    assert len(lowered) <= 4 * kernels  # parts, packed parameters, launches, tunable: once each
    assert assembly.compile_units(plan, [target]) == units
    assert assembly.link_plan([plan], [target], "m", "0" * 64, units) == first
    assert len(lowered) <= 4 * kernels
