"""Artifacts of several sizes (`--shape batch=1,3`, farm.runtime.sized): one artifact, a schedule and library per
size over weight members every size shares; each size matches onnxruntime on CPU and OpenCL, a feed that fits no
size is refused naming the sizes, and a hostile `sizes` list is refused before anything loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from farm import runtime
from farm.artifact import FORMAT_VERSION, SIZED_FORMAT_VERSION, open_artifact
from farm.backends.llvm.target import host_target
from farm.backends.opencl.devices import opencl_devices
from farm.backends.opencl.target import OpenClTarget
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.cli.inspect import describe, format_description
from farm.errors import ArtifactError, BadInputError, RunInputError
from farm.ir.shapes import parse_sizes
from farm.runtime.sized import SizedModel
from tests.dynamic_models import dynamic_cnn
from tests.test_manifest import _edited, _tampered

SIZES = [{"batch": (1,)}, {"batch": (3,)}]


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the dynamic model, its artifact of batch 1 and 3 for this CPU and PoCL, its artifact of batch 1 alone)."""
    folder = tmp_path_factory.mktemp("sized")
    dynamic_cnn(folder / "m.onnx")
    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    targets = [host_target(), OpenClTarget(devices[0]["fingerprint"])]
    with LocalExecutor(1) as executor:
        both = build_model(folder / "m.onnx", folder / "both", targets, executor=executor, sizes=SIZES).artifact
        one = build_model(folder / "m.onnx", folder / "one", targets, executor=executor, sizes=SIZES[:1]).artifact
    return folder / "m.onnx", Path(both), Path(one)


def _expected(model: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_each_size_has_its_own_library_and_every_size_maps_the_same_weight_members(sized):
    _, both, one = sized
    manifest = open_artifact(both).manifest
    assert manifest["format_version"] == SIZED_FORMAT_VERSION and [size["shapes"] for size in manifest["sizes"]] == [
        {"batch": [1]},
        {"batch": [3]},
    ]
    libraries = [size["targets"][0]["library"] for size in manifest["sizes"]]
    assert libraries[0].startswith("sizes/0/targets/") and libraries[1].startswith("sizes/1/targets/")
    weights = lambda members: {name for name in members if "weights/" in name}  # noqa: E731
    assert weights(manifest["members"]) == weights(open_artifact(one).manifest["members"])
    assert {m for size in manifest["sizes"] for m in size["targets"][0]["weights"]} <= weights(manifest["members"])


@pytest.mark.parametrize("device", ["cpu", "opencl"])
def test_the_runtime_runs_the_size_that_fits_the_feeds(sized, device, tmp_path):
    model, both, _ = sized
    loaded = runtime.load(both, device=device, threads=1, cache_dir=tmp_path / "cache")
    assert isinstance(loaded, SizedModel) and [pins for pins, _ in loaded.sizes] == SIZES
    for batch in (3, 1):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(loaded.run({"x": x})["y"], _expected(model, x), rtol=1e-4, atol=1e-4)
    if device == "opencl":  # the sizes' weights are on the device once
        weights = [
            {key: buffer for key, buffer in size._buffers.items() if key.startswith("blob:")}
            for _, size in loaded.sizes
        ]
        assert weights[0] and all(
            w.keys() == weights[0].keys() and all(w[k] is weights[0][k] for k in w) for w in weights
        )


def test_a_feed_that_fits_no_size_is_refused_naming_the_sizes(sized, tmp_path):
    _, both, _ = sized
    loaded = runtime.load(both, threads=1, cache_dir=tmp_path / "cache")
    with pytest.raises(
        RunInputError,
        match=r"inputs x 2x3x8x8 fit none of the artifact's sizes: batch=1 \(x "
        r"1x3x8x8\); batch=3 \(x 3x3x8x8\)",
    ):
        loaded.run({"x": np.zeros((2, 3, 8, 8), np.float32)})
    with pytest.raises(RunInputError, match="expected dtype float32"):
        loaded.run({"x": np.zeros((3, 3, 8, 8), np.float64)})
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 8, 8), np.float32))
    result = subprocess.run(
        [sys.executable, "-m", "farm", "run", str(both), "--input", f"x={tmp_path / 'x.npy'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "fit none of the artifact's sizes" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_inspect_lists_every_size(sized):
    _, both, _ = sized
    description = describe(both)
    assert [(size["shapes"], size["inputs"][0]["shape"]) for size in description["sizes"]] == [
        ({"batch": [1]}, [1, 3, 8, 8]),
        ({"batch": [3]}, [3, 3, 8, 8]),
    ]
    assert description["inputs"][0]["shape"] == [1, 3, 8, 8]
    text = format_description(description)
    assert "size     batch=1" in text and "size     batch=3" in text and "x: float32 3x3x8x8" in text


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(sizes=[]), "manifest sizes is not a list of 1 to 16"),
        (lambda m: m.update(sizes=["x"]), r"manifest sizes\[0\] is not an object"),
        (lambda m: m["sizes"][1].update(shapes={"batch": [1]}), "sizes has malformed pins"),
        (lambda m: m["sizes"][1].update(shapes={"batch": [0]}), "sizes has malformed pins"),
        (lambda m: m["sizes"][1]["targets"][0].update(id="cpu-other"), "sizes do not all have the same targets"),
        (lambda m: m["sizes"][1]["targets"][0].update(library="sizes/9/model.so"), "is not a member of the artifact"),
        (lambda m: m.update(format_version=FORMAT_VERSION), f"format_version {FORMAT_VERSION} is not supported"),
    ],
    ids=["empty", "not-object", "duplicate", "bad-pin", "other-targets", "library", "version"],
)
def test_a_hostile_sizes_list_is_refused_before_loading(sized, tmp_path, edit, message):
    _, both, _ = sized
    with pytest.raises(ArtifactError, match=message):
        runtime.load(
            _tampered(both, tmp_path, _edited(both, edit), rehash=True), threads=1, cache_dir=tmp_path / "cache"
        )


def test_an_opencl_only_artifact_of_sizes_runs_on_opencl(sized, tmp_path):
    model, _, _ = sized
    artifact = build_model(
        model, tmp_path, [OpenClTarget(opencl_devices()[0]["fingerprint"])], executor=LocalExecutor(1), sizes=SIZES
    ).artifact
    loaded = runtime.load(artifact, device="opencl", cache_dir=tmp_path / "cache")
    x = np.ones((3, 3, 8, 8), np.float32)
    np.testing.assert_allclose(loaded.run({"x": x})["y"], _expected(model, x), rtol=1e-4, atol=1e-4)


def test_a_size_that_does_not_plan_is_named_and_nothing_is_written(tmp_path):
    """Sizes of a model whose later layers fix the spatial size: the size that breaks them is named, and why
    (ONNX's inference left the MatMul's output unknown), exit 2."""
    model = dynamic_cnn(tmp_path / "m.onnx")
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("h", "w")):
        dim.dim_param = name
    onnx.save(model, tmp_path / "m.onnx")
    expected = (
        r"node .fc. .*static inputs \(flat \[1, 196\], fc \[144, 5\]\): check that they fit MatMul "
        r"\(at --shape batch=1 h=9 w=9\)$"
    )
    with pytest.raises(BadInputError, match=expected) as refused:
        build_model(tmp_path / "m.onnx", tmp_path / "out", sizes=parse_sizes(["batch=1", "h=8,9", "w=8,9"])[::3])
    assert refused.value.exit_status == 2 and not (tmp_path / "out").exists()
