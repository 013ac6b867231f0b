"""What each backend adds to a build (farm/build/parts.py): its units, its layout and its members; the OpenCL part's
sources, a binary per kernel per device, weights and the schedule."""

from __future__ import annotations

import onnx
import pytest

from farm.artifact import open_artifact
from farm.backends.llvm.target import host_target
from farm.backends.opencl.devices import opencl_devices
from farm.backends.opencl.target import SPEC_TARGET_ID, OpenClTarget
from farm.build.assembly import compile_units, libraries, link_plan, plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.build.parts import PARTS, entry_object, entry_ref, link_order, link_target, target_weights, weight_member
from farm.build.units import compile_unit
from farm.tools import examples


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "small_cnn.onnx"
    onnx.save(examples.small_cnn(), path)
    return path


@pytest.fixture(scope="module")
def fingerprint() -> str:
    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    return devices[0]["fingerprint"]


def test_one_binary_unit_per_kernel_per_device(model):
    plan = plan_model(model)
    devices = [OpenClTarget("a" * 16), OpenClTarget("b" * 16)]
    units = PARTS["opencl"].units(plan, devices)
    assert len(units) == 2 * len(plan.kernels()) and {u.kind for u in units} == {"clkernel"}
    assert all(u.spec.target_id == SPEC_TARGET_ID for u in units)  # one source and symbol serve every device
    assert len({u.cache_ref for u in units}) == len(units)  # but each device's binary is cached apart


def test_cpu_units_are_every_kernel_and_every_weight_the_target_reads_packed(model):
    """Plain weights are the model's bytes (artifact members as they are): only packed ones are built. A kernel is
    one unit, or one per part of its code (kernel_parts)."""
    plan, target = plan_model(model), host_target()
    units = PARTS["cpu"].units(plan, [target])
    assert {u.spec.whole for u in units if u.kind == "kernel"} == {
        plan.kernel_for(spec, target.id) for spec in plan.kernels().values()
    }
    assert sum(u.kind == "kernel" and not u.spec.part for u in units) <= len(plan.kernels())
    packed = [blob for blob in target_weights(plan, target) if blob.panels is not None]
    assert [u.spec for u in units if u.kind == "blob"] == packed and packed
    assert link_order(units, target) == sorted(u.name for u in units if u.kind == "kernel")


def test_each_weight_is_a_member_the_target_lists_in_slot_order(model, tmp_path):
    """The manifest's target lists its weights' members in the entry's slot order: plain ones shared with every
    other part by sha256, packed ones the target's own; each member holds what the kernels read."""
    from farm.backends.llvm.blobs import pack_weights

    result = build_model(model, tmp_path, executor=LocalExecutor(1))
    artifact = open_artifact(result.artifact)
    plan, target = plan_model(model), host_target()
    entry = artifact.manifest["targets"][0]
    weights = target_weights(plan, target)
    assert entry["weights"] == [weight_member(target.id, blob) for blob in weights]
    assert entry["weights_offset"] >= artifact.manifest["memory_plan"]["arena_bytes"]
    for blob, member in zip(weights, entry["weights"]):
        source = plan.blobs[blob.data_sha256].tobytes()
        assert artifact.read_member(member) == pack_weights(blob, target, source)


def test_compile_units_of_mixed_targets_are_each_parts_units(model):
    plan, cpu, device = plan_model(model), host_target(), OpenClTarget("c" * 16)
    units = compile_units(plan, [device, cpu])
    assert units == PARTS["cpu"].units(plan, [cpu]) + PARTS["opencl"].units(plan, [device])


def test_the_artifact_lists_sources_binaries_weights_and_schedule(model, fingerprint, tmp_path):
    result = build_model(model, tmp_path, executor=LocalExecutor(1), targets=[OpenClTarget(fingerprint)])
    artifact = open_artifact(result.artifact)
    part = artifact.manifest["opencl"]
    assert part["devices"] == [fingerprint] and artifact.manifest["targets"] == []
    members = artifact.manifest["members"]
    for kernel in part["kernels"]:
        assert kernel["source"] in members and kernel["binaries"][fingerprint] in members
        assert f"__kernel void {kernel['symbol']}_0(" in artifact.read_member(kernel["source"]).decode()
    assert set(part["blobs"].values()) <= set(members)
    assert [step["kernel"] for step in part["schedule"]] and all(
        k["launches"] and k["arguments"] for k in part["kernels"]
    )
    assert f"opencl:{fingerprint}" in result.targets


def test_cpu_and_opencl_in_one_artifact_build_byte_identically_twice(model, fingerprint, tmp_path):
    targets = [host_target(), OpenClTarget(fingerprint)]
    first = build_model(model, tmp_path / "a", targets, executor=LocalExecutor(1), no_cache=True)
    second = build_model(model, tmp_path / "b", targets, executor=LocalExecutor(2), no_cache=True)
    assert open(first.artifact, "rb").read() == open(second.artifact, "rb").read()
    manifest = open_artifact(first.artifact).manifest
    assert manifest["targets"][0]["id"] == host_target().id and manifest["opencl"]["devices"] == [fingerprint]


def test_a_kernel_whose_code_is_split_is_one_unit_per_part_linked_in_order(tmp_path) -> None:
    """Few-row convs (and implicit ones split by rows) compile as parts (kernel_parts), each a unit; the first part
    keeps the kernel's name, so the manifest's object_sha256 and error messages name the kernel as before."""
    from farm.backends.llvm.kernel import kernel_parts

    target = host_target()
    path = tmp_path / "resnet18_style.onnx"
    onnx.save(examples.resnet18_style(), path)
    units = compile_units(plan_model(path), [target])
    split = {unit.spec.whole for unit in units if unit.kind == "kernel" and unit.spec.part}
    assert split and all(kernel_parts(spec, target) > 1 for spec in split)
    for spec in split:
        names = [unit.name for unit in units if unit.kind == "kernel" and unit.spec.whole == spec]
        assert names[0] == f"{target.id}/{spec.symbol}" and len(names) == kernel_parts(spec, target)
        assert names[1:] == [f"{target.id}/{spec.symbol}.part{index}" for index in range(1, len(names))]
    assert set(link_order(units, target)) == {unit.name for unit in units if unit.kind == "kernel"}


def test_an_entry_ref_names_what_the_entry_is_made_of_and_the_compiler(model, monkeypatch) -> None:
    """A cached entry is found by its schedule, target and weight-table offset under the compiler key: any other
    schedule, offset or toolchain misses it (so a link never takes a stale entry or another toolchain's)."""
    target = host_target()
    plan = plan_model(model)
    library = libraries(link_plan([plan], [target], "m", "0" * 64, compile_units(plan, [target])))[0]
    ref = entry_ref(library)
    assert ref.startswith("entry:") and entry_ref(dict(library)) == ref
    assert entry_ref({**library, "weights_offset": library["weights_offset"] + 8}) != ref
    assert entry_ref({**library, "schedule": library["schedule"][:-1]}) != ref
    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "another-toolchain")
    assert entry_ref(library) != ref


def test_a_library_links_the_entry_it_is_given_and_compiles_it_otherwise(model) -> None:
    """link_target takes the entry from entry_of (the farm's cached one) and compiles it when given none: the
    same library either way, since compiling an entry is a pure step."""
    target = host_target()
    plan = plan_model(model)
    units = compile_units(plan, [target])
    library = libraries(link_plan([plan], [target], "m", "0" * 64, units))[0]
    objects = {unit.name: compile_unit(unit, plan.blobs.get(unit.data_key)) for unit in units if unit.kind == "kernel"}
    asked: list[str] = []

    def cached(entry_library: dict) -> bytes:
        asked.append(entry_library["id"])
        return entry_object(entry_library)

    assert link_target(library, objects.__getitem__, cached) == link_target(library, objects.__getitem__)
    assert asked == [library["id"]]
