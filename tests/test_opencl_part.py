"""The OpenCL backend's part of a build (farm/backends/opencl/part.py): sources, a binary per kernel per device,
weights and the schedule."""

from __future__ import annotations

from farm.artifact import open_artifact
from farm.backends.opencl.target import SPEC_TARGET_ID, OpenClTarget
from farm.build.assembly import plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.build.parts import part_of


def test_one_binary_unit_per_kernel_per_device(small_cnn_path):
    plan = plan_model(small_cnn_path)
    devices = [OpenClTarget("a" * 16), OpenClTarget("b" * 16)]
    units = part_of("opencl").units(plan, devices)
    assert len(units) == 2 * len(plan.kernels()) and {u.kind for u in units} == {"clkernel"}
    assert all(u.spec.target_id == SPEC_TARGET_ID for u in units)  # one source and symbol serve every device
    assert len({u.cache_ref for u in units}) == len(units)  # but each device's binary is cached apart


def test_the_artifact_lists_sources_binaries_weights_and_schedule(small_cnn_path, fingerprint, tmp_path):
    result = build_model(small_cnn_path, tmp_path, executor=LocalExecutor(1), targets=[OpenClTarget(fingerprint)])
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
