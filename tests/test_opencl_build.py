"""The OpenCL part of an artifact: sources, a binary per kernel per device, weights and the schedule."""

from __future__ import annotations

import onnx
import pytest

from farm.artifact import open_artifact
from farm.backends.opencl.devices import opencl_devices
from farm.backends.opencl.part import OPENCL_TARGET_ID, binary_jobs, opencl_kernels
from farm.build.assembly import build_model, plan_model
from farm.build.executor import LocalExecutor
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


def test_one_binary_job_per_kernel_per_device(model):
    plan = plan_model(model)
    jobs = binary_jobs(plan, ["aaaa", "bbbb"])
    assert len(jobs) == 2 * len(plan.kernels())
    assert all(spec.target_id == OPENCL_TARGET_ID for spec in opencl_kernels(plan))


def test_the_artifact_lists_sources_binaries_weights_and_schedule(model, fingerprint, tmp_path):
    result = build_model(model, tmp_path, executor=LocalExecutor(1), opencl=[fingerprint])
    artifact = open_artifact(result.artifact)
    part = artifact.manifest["opencl"]
    assert part["devices"] == [fingerprint] and artifact.manifest["targets"] == []
    members = artifact.manifest["members"]
    for kernel in part["kernels"]:
        assert kernel["source"] in members and kernel["binaries"][fingerprint] in members
        assert f"__kernel void {kernel['symbol']}_0(" in artifact.read_member(kernel["source"]).decode()
    assert set(part["blobs"].values()) <= set(members)
    assert [step["kernel"] for step in part["schedule"]] and all(k["launches"] and k["arguments"] for k in part["kernels"])
    assert f"opencl:{fingerprint}" in result.targets


def test_cpu_and_opencl_in_one_artifact_build_byte_identically_twice(model, fingerprint, tmp_path):
    first = build_model(model, tmp_path / "a", executor=LocalExecutor(1), opencl=[fingerprint])
    second = build_model(model, tmp_path / "b", executor=LocalExecutor(2), opencl=[fingerprint])
    assert open(first.artifact, "rb").read() == open(second.artifact, "rb").read()
