"""The OpenCL backend's loader (farm/backends/opencl/loader.py: farm.runtime.load(path, device="opencl")) on real OpenCL
(PoCL): numerics, cache -> shipped binary -> source."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest

from farm import runtime
from farm.artifact import open_artifact, write_artifact
from farm.backends.opencl.devices import opencl_devices
from farm.backends.opencl.target import OpenClTarget
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.errors import ArtifactError
from farm.tools import examples


@pytest.fixture(scope="module")
def fingerprint() -> str:
    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    return devices[0]["fingerprint"]


@pytest.fixture(scope="module")
def built(tmp_path_factory, fingerprint):
    """small_cnn built for this host's OpenCL device (and its CPU)."""
    folder = tmp_path_factory.mktemp("cl")
    path = folder / "small_cnn.onnx"
    onnx.save(examples.small_cnn(), path)
    return path, build_model(path, folder, executor=LocalExecutor(1), targets=[OpenClTarget(fingerprint)]).artifact


def _check(model, path, seed=0):
    feeds = examples.random_input(onnx.load(path), seed=seed)
    ours = model.run(feeds)
    reference = onnxruntime.InferenceSession(str(path)).run(None, feeds)
    for got, want in zip(ours.values(), reference):
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize(
    "name", ["mlp", "tiny_cnn", "small_cnn", "mobilenetv2_style", "resnet18_style", "bert_style", "vit_style"]
)
def test_spine_models_match_onnxruntime_on_pocl(name, fingerprint, tmp_path):
    path = tmp_path / f"{name}.onnx"
    onnx.save(examples.EXAMPLES[name](), path)
    with LocalExecutor() as executor:
        artifact = build_model(path, tmp_path, executor=executor, targets=[OpenClTarget(fingerprint)]).artifact
    model = runtime.load(artifact, device="opencl", cache_dir=tmp_path / "cache")
    assert model.source_builds == 0
    _check(model, path)


def _for_another_device(artifact: str, tmp_path) -> str:
    """The same artifact, but with its binaries filed under a fingerprint this host doesn't have."""
    source = open_artifact(artifact)
    manifest = json.loads(json.dumps(source.manifest))
    members = {name: source.read_member(name) for name in manifest.pop("members")}
    part = manifest["opencl"]
    part["devices"] = ["0" * 16]
    for kernel in part["kernels"]:
        kernel["binaries"] = {"0" * 16: next(iter(kernel["binaries"].values()))}
    return write_artifact(tmp_path / "other.farm", manifest, members)


def test_without_a_binary_for_this_device_every_kernel_builds_once_then_comes_from_the_cache(built, tmp_path):
    path, artifact = built
    other = _for_another_device(artifact, tmp_path)
    first = runtime.load(other, device="opencl", cache_dir=tmp_path / "cache")
    kernels = len(open_artifact(other).manifest["opencl"]["kernels"])
    assert first.source_builds == kernels
    _check(first, path)
    second = runtime.load(other, device="opencl", cache_dir=tmp_path / "cache")
    assert second.source_builds == 0
    _check(second, path, seed=1)


def test_a_damaged_cached_binary_falls_back_to_the_source_build(built, tmp_path):
    path, artifact = built
    runtime.load(artifact, device="opencl", cache_dir=tmp_path / "cache")
    cached = sorted((tmp_path / "cache" / "opencl").rglob("*.bin"))
    data = bytearray(cached[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached[0].write_bytes(bytes(data))
    other = _for_another_device(artifact, tmp_path)
    with pytest.warns(UserWarning, match="damaged"):
        model = runtime.load(other, device="opencl", cache_dir=tmp_path / "cache")
    assert model.source_builds == 1
    _check(model, path)


def test_an_artifact_without_an_opencl_part_is_refused(tmp_path):
    path = tmp_path / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    artifact = build_model(path, tmp_path, executor=LocalExecutor(1)).artifact
    with pytest.raises(ArtifactError, match="no OpenCL part"):
        runtime.load(artifact, device="opencl")
    with pytest.raises(ArtifactError, match="unknown device"):
        runtime.load(artifact, device="tpu")


def test_a_cpu_only_host_loads_the_cpu_part_without_pyopencl(built, fingerprint, tmp_path):
    import subprocess
    import sys

    from farm.backends.llvm.target import host_target

    path, _ = built
    artifact = build_model(
        path, tmp_path, [host_target(), OpenClTarget(fingerprint)], executor=LocalExecutor(1)
    ).artifact
    script = (
        "import sys; sys.modules['pyopencl'] = None\n"
        "import numpy as np, onnx\n"
        "from farm import runtime\nfrom farm.tools import examples\n"
        f"model = runtime.load({str(artifact)!r})\n"
        f"out = model.run(examples.random_input(onnx.load({str(path)!r})))\n"
        "assert 'pyopencl' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print(list(out))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "output" in result.stdout


def test_a_model_with_empty_inputs_and_outputs_runs_like_onnxruntime_on_pocl(fingerprint, tmp_path, monkeypatch):
    """test_local's model of empty tensors on the device: launches of no work-items are left out, and no copy of no
    bytes is enqueued (invalid OpenCL, which PoCL lets pass but other drivers refuse)."""
    import pyopencl

    from tests.test_local import assert_same_as_onnxruntime, empty_tensors_feeds, empty_tensors_model

    path = tmp_path / "empty.onnx"
    onnx.save(empty_tensors_model(), path)
    artifact = build_model(path, tmp_path, executor=LocalExecutor(1), targets=[OpenClTarget(fingerprint)]).artifact
    model = runtime.load(artifact, device="opencl", cache_dir=tmp_path / "cache")
    copied, copy = [], pyopencl.enqueue_copy

    def counted_copy(queue, dest, src, **kwargs):
        copied.append(next(a.nbytes for a in (dest, src) if isinstance(a, np.ndarray)))
        return copy(queue, dest, src, **kwargs)

    monkeypatch.setattr(pyopencl, "enqueue_copy", counted_copy)
    assert_same_as_onnxruntime(model, path, empty_tensors_feeds())
    assert copied and 0 not in copied
