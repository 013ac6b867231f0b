"""What each backend adds to a build, as the build sees it (farm/build/parts.py): every backend's part found in its
folder, and the parts of a build of several kinds of target together."""

from __future__ import annotations

from farm.artifact import open_artifact
from farm.backends.llvm.target import host_target
from farm.backends.opencl.target import OpenClTarget
from farm.backends.registry import BACKENDS
from farm.build.assembly import compile_units, plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.build.parts import Part, part_of, parts


def test_each_backends_part_is_found_in_its_folder_in_the_registrys_order() -> None:
    assert list(parts()) == list(BACKENDS)
    for kind, backend in BACKENDS.items():
        part = part_of(kind)
        assert isinstance(part, Part) and part.kind == kind
        assert type(part).__module__ == f"{backend.package}.part"


def test_compile_units_of_mixed_targets_are_each_parts_units(small_cnn_path):
    plan, cpu, device = plan_model(small_cnn_path), host_target(), OpenClTarget("c" * 16)
    units = compile_units(plan, [device, cpu])
    assert units == part_of("cpu").units(plan, [cpu]) + part_of("opencl").units(plan, [device])


def test_cpu_and_opencl_in_one_artifact_build_byte_identically_twice(small_cnn_path, fingerprint, tmp_path):
    targets = [host_target(), OpenClTarget(fingerprint)]
    first = build_model(small_cnn_path, tmp_path / "a", targets, executor=LocalExecutor(1), no_cache=True)
    second = build_model(small_cnn_path, tmp_path / "b", targets, executor=LocalExecutor(2), no_cache=True)
    assert open(first.artifact, "rb").read() == open(second.artifact, "rb").read()
    manifest = open_artifact(first.artifact).manifest
    assert manifest["targets"][0]["id"] == host_target().id and manifest["opencl"]["devices"] == [fingerprint]
