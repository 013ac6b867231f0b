"""The CPU backend's part of a build (farm/backends/llvm/part.py): a unit per kernel (or part of one) and per
weight read packed, weights as members in slot order, the entry object and the library's link."""

from __future__ import annotations

import onnx

from farm.artifact import open_artifact
from farm.backends.llvm import features
from farm.backends.llvm.part import entry_object, entry_ref, link_order, link_target, target_weights, weight_member
from farm.backends.llvm.target import CpuTarget, host_target
from farm.build.assembly import compile_units, libraries, link_plan, plan_model, start_parts
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.build.parts import part_of
from farm.build.units import compile_unit
from farm.tools import examples


def test_cpu_units_are_every_kernel_and_every_weight_the_target_reads_packed(small_cnn_path):
    """Plain weights are the model's bytes (artifact members as they are): only packed ones are built. A kernel is
    one unit, or one per part of its code (kernel_parts)."""
    plan, target = plan_model(small_cnn_path), host_target()
    units = part_of("cpu").units(plan, [target])
    assert {u.spec.whole for u in units if u.kind == "kernel"} == {
        plan.kernel_for(spec, target.id) for spec in plan.kernels().values()
    }
    assert sum(u.kind == "kernel" and not u.spec.part for u in units) <= len(plan.kernels())
    packed = [blob for blob in target_weights(plan, target) if blob.panels is not None]
    assert [u.spec for u in units if u.kind == "blob"] == packed and packed
    assert link_order(units, target) == sorted(u.name for u in units if u.kind == "kernel")


def test_each_weight_is_a_member_the_target_lists_in_slot_order(small_cnn_path, tmp_path):
    """The manifest's target lists its weights' members in the entry's slot order: plain ones shared with every
    other part by sha256, packed ones the target's own; each member holds what the kernels read."""
    from farm.backends.llvm.blobs import pack_weights

    result = build_model(small_cnn_path, tmp_path, executor=LocalExecutor(1))
    artifact = open_artifact(result.artifact)
    plan, target = plan_model(small_cnn_path), host_target()
    entry = artifact.manifest["targets"][0]
    weights = target_weights(plan, target)
    assert entry["weights"] == [weight_member(target.id, blob) for blob in weights]
    assert entry["weights_offset"] >= artifact.manifest["memory_plan"]["arena_bytes"]
    for blob, member in zip(weights, entry["weights"]):
        source = plan.blobs[blob.data_sha256].tobytes()
        assert artifact.read_member(member) == pack_weights(blob, target, source)


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


def test_an_entry_ref_names_what_the_entry_is_made_of_and_the_compiler(small_cnn_path, monkeypatch) -> None:
    """A cached entry is found by its schedule, target and weight-table offset under the compiler key: any other
    schedule, offset or toolchain misses it (so a link never takes a stale entry or another toolchain's)."""
    target = host_target()
    plan = plan_model(small_cnn_path)
    library = libraries(link_plan([plan], [target], "m", "0" * 64, compile_units(plan, [target])))[0]
    ref = entry_ref(library)
    assert ref.startswith("entry:") and entry_ref(dict(library)) == ref
    assert entry_ref({**library, "weights_offset": library["weights_offset"] + 8}) != ref
    assert entry_ref({**library, "schedule": library["schedule"][:-1]}) != ref
    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "another-toolchain")
    assert entry_ref(library) != ref


def test_a_library_links_the_entry_it_is_given_and_compiles_it_otherwise(small_cnn_path) -> None:
    """link_target takes the entry from entry_of (the farm's cached one) and compiles it when given none: the
    same library either way, since compiling an entry is a pure step."""
    target = host_target()
    plan = plan_model(small_cnn_path)
    units = compile_units(plan, [target])
    library = libraries(link_plan([plan], [target], "m", "0" * 64, units))[0]
    objects = {unit.name: compile_unit(unit, plan.blobs.get(unit.data_key)) for unit in units if unit.kind == "kernel"}
    asked: list[str] = []

    def cached(entry_library: dict) -> bytes:
        asked.append(entry_library["id"])
        return entry_object(entry_library)

    assert link_target(library, objects.__getitem__, cached) == link_target(library, objects.__getitem__)
    assert asked == [library["id"]]


def test_starting_the_part_probes_each_targets_features_in_the_background(tmp_path, monkeypatch) -> None:
    """CpuPart.start (a local build calls it as it begins, through assembly.start_parts) leaves each target's
    feature probe running; the manifest's `requires` then takes its answer."""
    monkeypatch.setenv("FARM_CACHE_DIR", str(tmp_path))
    features._required.cache_clear()
    target = CpuTarget("x86_64-unknown-linux-gnu", "x86-64-v3")
    start_parts([target])
    key = (target.triple, target.cpu, target.features)
    assert key in features._BACKGROUND
    assert "avx2" in features.required_features(target) and key not in features._BACKGROUND
    features._required.cache_clear()
