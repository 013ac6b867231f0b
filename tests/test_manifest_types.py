"""A checked manifest comes back as frozen values (farm.runtime.manifest_types): what the runtime and `farm inspect`
read as attributes, with the manifest's defaults filled in, and nothing a reader can change."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from farm.errors import ArtifactError
from farm.runtime.manifest import check_manifest, check_sizes
from farm.runtime.manifest_types import (
    BlobEntry,
    CpuTargetEntry,
    KernelEntry,
    Launch,
    Manifest,
    MemoryPlan,
    OpenClLaunch,
    PlannedBuffer,
    TensorSlot,
)

SHA = "ab" * 32


def _manifest() -> dict[str, Any]:
    """A small manifest that passes check_manifest: one CPU target with launches and a weight, one OpenCL kernel."""
    return {
        "model": {"name": "m", "sha256": SHA, "opset": 17},
        "memory_plan": {"arena_bytes": 128, "buffers": [{"offset": 0, "bytes": 64}]},
        "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32", "offset": 0}],
        "outputs": [{"name": "y", "shape": [1, 4], "dtype": "float32", "offset": 64}],
        "targets": [
            {
                "id": "cpu-a",
                "kind": "cpu",
                "triple": "x86_64-unknown-linux-gnu",
                "cpu": "znver3",
                "features": "+avx2",
                "requires": ["avx2", "fma"],
                "library": "targets/cpu-a/model.so",
                "work_entry": "farm_work",
                "launches": [[64, 8, 1000]],
                "weights": ["weights/w.bin"],
            }
        ],
        "kernels": [{"kernel": "k0", "target": "cpu-a", "symbol": "farm_k0", "spec": {"op": "Relu"}}],
        "schedule": [{"node": "relu", "op": "Relu", "kernel": "k0", "args": []}],
        "blobs": [{"sha256": SHA, "bytes": 16, "symbol": "blob"}],
        "opencl": {
            "devices": ["0123456789abcdef"],
            "buffers": {"x": 16},
            "blobs": {SHA: "weights/w.bin"},
            "kernels": [
                {
                    "symbol": "farm_k0",
                    "source": "opencl/source/farm_k0.cl",
                    "binaries": {"0123456789abcdef": "opencl/bin/farm_k0.bin"},
                    "launches": [["farm_k0_0", [4, 2]]],
                    "arguments": [16],
                }
            ],
            "schedule": [{"node": "relu", "kernel": "farm_k0", "args": ["arena:x", f"blob:{SHA}"]}],
        },
        "members": {
            name: SHA
            for name in (
                "targets/cpu-a/model.so",
                "weights/w.bin",
                "opencl/source/farm_k0.cl",
                "opencl/bin/farm_k0.bin",
            )
        },
    }


def test_a_checked_manifest_comes_back_typed() -> None:
    manifest = check_manifest("a.farm", _manifest())
    assert isinstance(manifest, Manifest)
    assert manifest.model_sha256 == SHA
    assert manifest.memory_plan == MemoryPlan(128, 64, (PlannedBuffer(0, 64),))
    assert manifest.inputs == (TensorSlot("x", (1, 4), "float32", 0),)
    assert manifest.outputs == (TensorSlot("y", (1, 4), "float32", 64),)
    assert manifest.kernels == (KernelEntry("k0", "cpu-a", "farm_k0"),)
    assert [step.kernel for step in manifest.schedule] == ["k0"]
    assert manifest.blobs == (BlobEntry(SHA, 16, "blob"),)


def test_a_cpu_target_gets_the_manifests_defaults_and_keeps_its_json() -> None:
    written = _manifest()
    (target,) = check_manifest("a.farm", written).targets
    assert isinstance(target, CpuTargetEntry) and target.kind == "cpu"
    assert (target.id, target.triple, target.cpu, target.requires) == (
        "cpu-a",
        "x86_64-unknown-linux-gnu",
        "znver3",
        ("avx2", "fma"),
    )
    assert (target.entry, target.launch_entry, target.work_entry) == ("farm_run", None, "farm_work")
    assert (target.serve_entry, target.post_entry) == (None, None)  # a manifest from before farm_serve
    assert target.launches == (Launch(64, 8, 1000),)
    assert target.weights == ("weights/w.bin",) and target.weights_offset == 128  # the table starts at the arena's end
    assert target.json_object is written["targets"][0]


def test_the_opencl_part_is_typed_too() -> None:
    part = check_manifest("a.farm", _manifest()).opencl
    assert part is not None
    assert dict(part.buffers) == {"x": 16} and dict(part.blobs) == {SHA: "weights/w.bin"}
    (kernel,) = part.kernels
    assert kernel.launches == (OpenClLaunch("farm_k0_0", (4, 2)),) and kernel.arguments == (16,)
    assert kernel.binaries["0123456789abcdef"] == "opencl/bin/farm_k0.bin"
    assert [(step.kernel, step.args) for step in part.schedule] == [("farm_k0", ("arena:x", f"blob:{SHA}"))]
    assert part.devices == ("0123456789abcdef",)
    without = _manifest()
    del without["opencl"]
    assert check_manifest("a.farm", without).opencl is None


def test_a_checked_manifest_is_frozen() -> None:
    manifest = check_manifest("a.farm", _manifest())
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.inputs = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.memory_plan.arena_bytes = 1 << 40  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.targets[0].library = "elsewhere.so"  # type: ignore[misc]
    assert manifest.opencl is not None
    with pytest.raises(TypeError):
        manifest.opencl.buffers["x"] = 1 << 40  # type: ignore[index]


def test_check_sizes_gives_each_size_typed() -> None:
    one = _manifest()
    [(pins, manifest)] = check_sizes("a.farm", one)
    assert pins == {} and isinstance(manifest, Manifest)
    assert manifest == check_manifest("a.farm", one)


def _edited(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """_manifest() with the field at `path` (keys and list indexes) set to `value`, or deleted when it is None."""
    manifest = _manifest()
    node: Any = manifest
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return manifest


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("blobs",), {"sha256": SHA}, "blobs is not a list"),
        (("blobs", 0), "blob", r"blobs\[0\] is not an object"),
        (("blobs", 0, "sha256"), "ab", r"blobs\[0\].sha256 is not a string matching"),
        (("blobs", 0, "bytes"), -1, r"blobs\[0\].bytes is not an integer from 0 to"),
        (("blobs", 0, "bytes"), "16", r"blobs\[0\].bytes is not an integer"),
        (("blobs", 0, "symbol"), None, r"blobs\[0\].symbol is not a string matching"),
        (("opencl", "devices"), None, "opencl.devices is not a list"),
        (("opencl", "devices"), "0123456789abcdef", "opencl.devices is not a list"),
        (("opencl", "devices", 0), "../gpu", r"opencl.devices\[0\] is not a string matching"),
        (
            ("opencl", "devices"),
            ["0123456789abcdef", "fedcba9876543210"],
            r"opencl.kernels\[0\].binaries has no binary for opencl.devices\[1\] 'fedcba9876543210'",
        ),
        (("opencl", "kernels", 0, "arguments"), None, r"opencl.kernels\[0\].arguments is not a list"),
        (("opencl", "kernels", 0, "arguments"), [16, -4], r"opencl.kernels\[0\].arguments\[1\] is not an integer"),
        (("opencl", "kernels", 0, "arguments"), [2**40], r"opencl.kernels\[0\].arguments\[0\] is not an integer"),
    ],
)
def test_bad_blobs_devices_and_arguments_are_refused_naming_them(
    path: tuple[Any, ...], value: Any, message: str
) -> None:
    with pytest.raises(ArtifactError, match=message):
        check_manifest("a.farm", _edited(path, value))


def test_sizes_built_for_other_devices_are_refused() -> None:
    other = _edited(("opencl", "devices"), ["fedcba9876543210"])
    other["opencl"]["kernels"][0]["binaries"] = {"fedcba9876543210": "opencl/bin/farm_k0.bin"}
    sizes = {"sizes": [{"shapes": {"x": [1, 4]}, **_manifest()}, {"shapes": {"x": [2, 4]}, **other}]}
    with pytest.raises(ArtifactError, match="sizes do not all have the same targets"):
        check_sizes("a.farm", sizes)
