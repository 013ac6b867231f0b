"""The target registry (farm/backends/registry.py): `--target` strings and JSON forms of every backend's targets,
each backend's renderer and compile step, and refusals that name what is wrong."""

from __future__ import annotations

import pytest

from farm.backends.llvm.target import CpuTarget, host_target
from farm.backends.opencl.target import OpenClTarget
from farm.backends.registry import BACKENDS, Devices, backend_named, backend_of, parse_targets, target_from_json
from farm.errors import ArtifactError, BadInputError
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec

FP1, FP2 = "0123456789abcdef", "fedcba9876543210"
HERE = Devices("on this host", lambda kind: [FP1, FP2] if kind == "opencl" else [])
NONE = Devices("on the farm's workers", lambda kind: [])
RELU = KernelSpec("Relu", "{}", (TensorInfo((1, 8), "float32"),), (TensorInfo((1, 8), "float32"),), None, "")


def test_no_target_means_this_hosts_cpu() -> None:
    assert parse_targets([], NONE) == [host_target()]


def test_cpu_and_opencl_targets_in_order_each_once() -> None:
    targets = parse_targets(["opencl", "cpu", "cpu:aarch64-linux-gnu", f"opencl:{FP1}", "cpu"], HERE)
    assert targets == [OpenClTarget(FP1), OpenClTarget(FP2), host_target(), CpuTarget("aarch64-unknown-linux-gnu")]


def test_an_opencl_only_build_has_no_cpu_target() -> None:
    assert parse_targets([f"opencl:{FP2}"], HERE) == [OpenClTarget(FP2)]


@pytest.mark.parametrize(
    ("texts", "devices", "message"),
    [
        (["tpu"], HERE, "unknown target 'tpu': expected cpu .* opencl"),
        (["opencl"], NONE, "no such OpenCL device on the farm's workers \\(found: none\\)"),
        ([f"opencl:{'1' * 16}"], HERE, f"no such OpenCL device on this host \\(found: \\['{FP1}', '{FP2}'\\]\\)"),
        (["cpu:not-a-triple"], HERE, "LLVM does not know triple"),
    ],
)
def test_a_bad_target_is_refused_by_name(texts: list[str], devices: Devices, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        parse_targets(texts, devices)


@pytest.mark.parametrize("target", [CpuTarget("aarch64-unknown-linux-gnu", "cortex-a76", "+neon"), OpenClTarget(FP1)])
def test_targets_round_trip_through_json(target: CpuTarget | OpenClTarget) -> None:
    assert target_from_json(target.to_json()) == target and backend_of(target).kind == target.kind


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"kind": "cpu", "id": "cpu-other", "triple": "x86_64-unknown-linux-gnu", "cpu": "generic", "features": ""},
            "does not match",
        ),
        ({"kind": "cpu", "triple": "x86_64", "cpu": "generic\n", "features": ""}, "cpu"),
        ({"kind": "opencl", "fingerprint": "ABC"}, "fingerprint"),
        ({"kind": "cpu"}, "lacks"),
        ("cpu", "not a target"),
    ],
)
def test_malformed_target_json_is_refused(data: object, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        target_from_json(data)


def test_each_backend_renders_its_source() -> None:
    assert "define" in BACKENDS["cpu"].render(RELU, host_target())
    assert "__kernel void" in BACKENDS["opencl"].render(RELU, OpenClTarget(FP1))


def test_the_cpu_backends_compile_step_gives_an_object() -> None:
    target = CpuTarget("x86_64-unknown-linux-gnu")
    assert BACKENDS["cpu"].compile_kernel(RELU, target)[:4] == b"\x7fELF"


def test_an_unknown_runtime_device_is_an_artifact_error() -> None:
    with pytest.raises(ArtifactError, match="unknown device 'tpu': expected 'cpu' or 'opencl'"):
        backend_named("tpu", "device", ArtifactError)
