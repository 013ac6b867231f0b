"""Tampered-artifact tests of farm.runtime.manifest: a real tiny_cnn artifact whose manifest is rewritten, field kind
by field kind, with and without recomputing its hashes; each is refused with one ArtifactError before loading.

The edits that used to crash the runtime (SIGSEGV, SIGABRT, tracebacks) run through `farm run` in a subprocess, so
that a regression kills that process, not the test's, and shows as a failed assertion on exit 2 and one line.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from farm.build.local import build_model
from farm.errors import ArtifactError
from farm.runtime import load
from farm.runtime.manifest import check_manifest
from farm.tools.examples import EXAMPLES

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    onnx.save(EXAMPLES["tiny_cnn"](), str(folder / "tiny_cnn.onnx"))
    np.save(folder / "input.npy", np.zeros((1, 3, 32, 32), np.float32))
    return Path(build_model(folder / "tiny_cnn.onnx", folder / "out").artifact)


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {info.name: tar.extractfile(info).read() for info in tar.getmembers()}  # type: ignore[union-attr]


def _write(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    return path


def _tampered(built: Path, tmp_path: Path, text: bytes, *, rehash: bool) -> Path:
    """The artifact with manifest.json replaced by `text`; with `rehash`, manifest.sha256 is recomputed too, as an
    attacker who knows the format would."""
    files = _members(built)
    files["manifest.json"] = text
    if rehash:
        files["manifest.sha256"] = hashlib.sha256(text).hexdigest().encode() + b"\n"
    return _write(tmp_path / "tampered.farm", files)


def _edited(built: Path, edit: Edit) -> bytes:
    manifest = json.loads(_members(built)["manifest.json"])
    edit(manifest)
    return json.dumps(manifest).encode()


def _set(path: str, value: Any) -> Edit:
    """An edit setting the field at dotted `path` (list indexes as numbers) to `value`."""
    *parents, last = [int(key) if key.isdigit() else key for key in path.split(".")]

    def edit(manifest: dict[str, Any]) -> None:
        node: Any = manifest
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _both(first: Edit, second: Edit) -> Edit:
    def edit(manifest: dict[str, Any]) -> None:
        first(manifest)
        second(manifest)

    return edit


FIELD_EDITS: list[tuple[str, Edit, str]] = [
    ("model sha256", _set("model.sha256", "zz"), "model.sha256"),
    ("arena size a string", _set("memory_plan.arena_bytes", "x"), "memory_plan.arena_bytes"),
    ("arena of 2**50 bytes", _set("memory_plan.arena_bytes", 2**50), "memory_plan.arena_bytes"),
    ("arena shrunk", _set("memory_plan.arena_bytes", 1000), r"memory_plan.buffers\[1\].offset is not an integer"),
    (
        "arena shrunk below the input",
        _both(_set("memory_plan.arena_bytes", 1000), _set("memory_plan.buffers", [])),
        r"inputs\[0\] \(3072 x float32 at offset 64\) does not fit the 1000-byte arena",
    ),
    ("alignment not a power of two", _set("memory_plan.alignment", 48), "memory_plan.alignment"),
    ("buffer past the arena", _set("memory_plan.buffers.0.bytes", 2**30), r"memory_plan.buffers\[0\].bytes"),
    ("buffers not a list", _set("memory_plan.buffers", {}), "memory_plan.buffers"),
    ("input dtype object", _set("inputs.0.dtype", "object"), r"inputs\[0\].dtype"),
    ("input shape overflowing", _set("inputs.0.shape", [2**32, 2**32]), r"inputs\[0\].shape\[0\]"),
    ("input shape a string", _set("inputs.0.shape", "1x3"), r"inputs\[0\].shape"),
    ("input shape too deep", _set("inputs.0.shape", [1] * 17), r"inputs\[0\].shape"),
    ("input offset negative", _set("inputs.0.offset", -8), r"inputs\[0\].offset"),
    ("input offset a float", _set("inputs.0.offset", 0.5), r"inputs\[0\].offset"),
    ("input pointer unaligned", _set("inputs.0.pointer", 4), r"inputs\[0\].pointer 4 is not a multiple of 8"),
    ("input pointer past the arena", _set("inputs.0.pointer", 2**40), r"inputs\[0\].pointer is not an integer"),
    ("input name empty", _set("inputs.0.name", ""), r"inputs\[0\].name"),
    (
        "input named twice",
        lambda m: m["inputs"].append(dict(m["inputs"][0])),
        r"inputs\[1\].name 'input' is not unique",
    ),
    ("output past the arena", _set("outputs.0.offset", 155_704), r"outputs\[0\] .*does not fit"),
    ("inputs not a list", _set("inputs", {"name": "input"}), "inputs is not a list"),
    ("targets not a list", _set("targets", "cpu"), "targets is not a list"),
    ("target triple injected", _set("targets.0.triple", 'x86_64"\nmodule asm "x'), r"targets\[0\].triple"),
    ("target cpu empty", _set("targets.0.cpu", ""), r"targets\[0\].cpu"),
    ("target features odd", _set("targets.0.features", "avx2;rm"), r"targets\[0\].features"),
    ("target requires missing", _set("targets.0.requires", None), r"targets\[0\].requires is not a list"),
    ("target requires a string", _set("targets.0.requires", "avx2"), r"targets\[0\].requires is not a list"),
    ("target requires injected", _set("targets.0.requires", ["avx2", 'x"; y']), r"targets\[0\].requires\[1\]"),
    ("target id a path", _set("targets.0.id", "../x"), r"targets\[0\].id"),
    ("target library not a member", _set("targets.0.library", "../../lib.so"), r"targets\[0\].library"),
    ("target entry odd", _set("targets.0.entry", "farm run"), r"targets\[0\].entry"),
    ("work entry odd", _set("targets.0.work_entry", 7), r"targets\[0\].work_entry"),
    ("serve entry injected", _set("targets.0.serve_entry", 'x"() {}'), r"targets\[0\].serve_entry"),
    ("post entry odd", _set("targets.0.post_entry", ["farm_post"]), r"targets\[0\].post_entry"),
    ("launches huge", _set("targets.0.launches", [[2**60, 1, 1]]), r"targets\[0\].launches\[0\] extent"),
    ("launch grain zero", _set("targets.0.launches.0.1", 0), r"targets\[0\].launches\[0\] grain"),
    ("launch work negative", _set("targets.0.launches.0.2", -1), r"targets\[0\].launches\[0\] work"),
    ("launch of two numbers", _set("targets.0.launches.0", [3, 1]), r"targets\[0\].launches\[0\] is not a list"),
    ("kernels an object", _set("kernels", {}), "kernels is not a list"),
    ("schedule a number", _set("schedule", 3), "schedule is not a list"),
    ("blobs an object", _set("blobs", {}), "blobs is not a list"),
    ("blob sha256 short", _set("blobs.0.sha256", "ab"), r"blobs\[0\].sha256"),
    ("blob bytes a string", _set("blobs.0.bytes", "12"), r"blobs\[0\].bytes is not an integer"),
    ("blob bytes huge", _set("blobs.0.bytes", 2**50), r"blobs\[0\].bytes is not an integer"),
    ("blob symbol odd", _set("blobs.0.symbol", "farm w"), r"blobs\[0\].symbol"),
]
CASES = [pytest.param(edit, message, id=name) for name, edit, message in FIELD_EDITS]


@pytest.mark.parametrize(("edit", "message"), CASES)
def test_field_edited_and_rehashed_is_refused_naming_it(built: Path, tmp_path: Path, edit: Edit, message: str) -> None:
    path = _tampered(built, tmp_path, _edited(built, edit), rehash=True)
    with pytest.raises(ArtifactError, match=message):
        load(path, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists(), "nothing may be written to the library cache, let alone loaded"


def test_an_input_without_a_pointer_slot_is_copied_as_artifacts_built_before_them_were(
    built: Path, tmp_path: Path
) -> None:
    """An artifact built before inputs were read in place has no `pointer` on its inputs: its run copies each feed
    into the input's buffer, as then; one built since reads the same feed in place, with the same outputs."""

    def unpointed(manifest: dict[str, Any]) -> None:
        for entry in manifest["inputs"]:
            del entry["pointer"]

    old = load(_tampered(built, tmp_path, _edited(built, unpointed), rehash=True), cache_dir=tmp_path / "cache")
    new = load(built, cache_dir=tmp_path / "cache")
    feeds = {new.inputs[0].name: np.random.default_rng(3).standard_normal(new.inputs[0].shape).astype(np.float32)}
    assert [slot for _, _, slot in old._input_views] == [None]
    for name, value in new.run(feeds).items():
        np.testing.assert_array_equal(old.run(feeds)[name], value)


def test_a_model_output_that_is_also_its_input_runs(tmp_path: Path) -> None:
    """ONNX lets a graph output be a graph input: the artifact loads (names are unique within inputs and within
    outputs) and gives that output the feed, beside the computed one, as onnxruntime does."""
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]) for name in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "echo", values[:1], [values[1], values[0]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "echo.onnx")
    loaded = load(build_model(tmp_path / "echo.onnx", tmp_path / "out").artifact, cache_dir=tmp_path / "cache")
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    outputs = loaded.run({"x": x})
    np.testing.assert_array_equal(outputs["x"], x)
    np.testing.assert_array_equal(outputs["y"], np.maximum(x, 0))


@pytest.mark.parametrize(("edit", "message"), CASES)
def test_field_edited_without_rehash_is_tampering(built: Path, tmp_path: Path, edit: Edit, message: str) -> None:
    path = _tampered(built, tmp_path, _edited(built, edit), rehash=False)
    with pytest.raises(ArtifactError, match="manifest.json was tampered with"):
        load(path, cache_dir=tmp_path / "cache")


def _raw(built: Path, old: bytes, new: bytes) -> bytes:
    text = _members(built)["manifest.json"]
    assert old in text
    return text.replace(old, new, 1)


def _arena(built: Path) -> bytes:
    return str(json.loads(_members(built)["manifest.json"])["memory_plan"]["arena_bytes"]).encode()


CRASHES: list[tuple[str, Callable[[Path], bytes], str]] = [
    ("arena shrunk", lambda b: _edited(b, _set("memory_plan.arena_bytes", 1000)), r"buffers\[1\].offset is not"),
    ("launches huge", lambda b: _edited(b, _set("targets.0.launches", [[2**60, 1, 2**60]] * 20)), "extent"),
    (
        "5000-digit number",
        lambda b: _raw(b, b'"arena_bytes": ' + _arena(b), b'"arena_bytes": ' + b"7" * 5000),
        "a number of 5000 characters",
    ),
    (
        "100k-deep nesting",
        lambda b: _raw(b, b'"farm_version"', b'"deep": ' + b"[" * 100_000 + b"]" * 100_000 + b', "farm_version"'),
        "nested deeper than 32 levels",
    ),
    ("arena a string", lambda b: _edited(b, _set("memory_plan.arena_bytes", "x")), "memory_plan.arena_bytes"),
    ("arena of 2**50 bytes", lambda b: _edited(b, _set("memory_plan.arena_bytes", 2**50)), "memory_plan.arena_bytes"),
    ("input dtype object", lambda b: _edited(b, _set("inputs.0.dtype", "object")), r"inputs\[0\].dtype"),
    ("shape [2**32, 2**32]", lambda b: _edited(b, _set("inputs.0.shape", [2**32, 2**32])), r"inputs\[0\].shape"),
]


@pytest.mark.parametrize("rehash", [True, False], ids=["rehashed", "not-rehashed"])
@pytest.mark.parametrize(("make", "message"), [pytest.param(m, s, id=n) for n, m, s in CRASHES])
def test_edits_that_crashed_the_runtime_exit_2_with_one_line(
    built: Path, tmp_path: Path, rehash: bool, make: Callable[[Path], bytes], message: str
) -> None:
    path = _tampered(built, tmp_path, make(built), rehash=rehash)
    result = subprocess.run(
        [sys.executable, "-m", "farm", "run", str(path), "--input", f"input={built.parent.parent / 'input.npy'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert ("tampered with" if not rehash else "") in result.stderr
    if rehash:
        assert re.search(message, result.stderr), result.stderr


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "FARM_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture(scope="module")
def other_library(built: Path) -> bytes:
    """The library of another model (small_cnn) built for the same target."""
    onnx.save(EXAMPLES["small_cnn"](), str(built.parent / "small_cnn.onnx"))
    other = Path(build_model(built.parent / "small_cnn.onnx", built.parent).artifact)
    return next(data for name, data in _members(other).items() if name.endswith(".so"))


def _with_library(built: Path, tmp_path: Path, library: bytes, edit: Edit | None = None) -> Path:
    """The artifact with its library replaced and every sha256 recomputed, as an attacker who knows the format
    would (only a signature tells this apart); `edit` changes the manifest as well."""
    files = _members(built)
    manifest = json.loads(files["manifest.json"])
    member = manifest["targets"][0]["library"]
    files[member] = library
    manifest["members"][member] = hashlib.sha256(library).hexdigest()
    if edit:
        edit(manifest)
    files["manifest.json"] = json.dumps(manifest).encode()
    files["manifest.sha256"] = hashlib.sha256(files["manifest.json"]).hexdigest().encode()
    return _write(tmp_path / "swapped.farm", files)


def test_another_models_library_is_refused_before_loading(built: Path, tmp_path: Path, other_library: bytes) -> None:
    """It used to abort the runtime (SIGABRT): its kernels are not the manifest's."""
    path = _with_library(built, tmp_path, other_library)
    result = subprocess.run(
        [sys.executable, "-m", "farm", "run", str(path), "--input", f"input={built.parent.parent / 'input.npy'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert re.search(r"kernel \w+ symbol farm_k_\w+ is not defined by its library", result.stderr), result.stderr
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("targets.0.entry", "system"), r"entry 'system' is not defined by its library"),
        (_set("targets.0.serve_entry", "system"), r"serve_entry 'system' is not defined by its library"),
        (
            lambda m: m["targets"][0]["launches"].append([1, 1, 1]),
            r"launches number \d+, but its schedule's kernels "
            r"define \d+",
        ),
        (_set("schedule.0.kernel", "0123"), r"schedule\[0\].kernel 0123 is not a kernel of target"),
        (
            lambda m: m["kernels"].append({**m["kernels"][0], "kernel": "k2", "symbol": "farm_k_absent"}),
            "symbol farm_k_absent is not defined by its library",
        ),
    ],
)
def test_manifest_disagreeing_with_its_library_is_refused(
    built: Path, tmp_path: Path, edit: Edit, message: str
) -> None:
    library = next(data for name, data in _members(built).items() if name.endswith(".so"))
    with pytest.raises(ArtifactError, match=message):
        load(_with_library(built, tmp_path, library, edit), cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_untampered_artifact_still_runs(built: Path, tmp_path: Path) -> None:
    model = load(built, cache_dir=tmp_path / "cache")
    assert model.run({"input": np.zeros((1, 3, 32, 32), np.float32)})["output"].shape == (1, 10)


@pytest.fixture(scope="module")
def opencl_manifest(built: Path) -> tuple[str, dict[str, Any]]:
    """The checked manifest of tiny_cnn built for this host's OpenCL device."""
    from farm.artifact import verify
    from farm.backends.opencl.devices import opencl_devices
    from farm.backends.opencl.target import OpenClTarget
    from farm.build.executor import LocalExecutor

    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    path = build_model(
        built.parent.parent / "tiny_cnn.onnx",
        built.parent.parent / "cl",
        executor=LocalExecutor(1),
        targets=[OpenClTarget(devices[0]["fingerprint"])],
    ).artifact
    manifest = verify(path).manifest
    check_manifest(path, manifest)
    return path, manifest


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("opencl.buffers.input", 2**50), r"opencl.buffers\['input'\]"),
        (_set("opencl.kernels.0.source", "../x.cl"), r"opencl.kernels\[0\].source is not a member"),
        (_set("opencl.kernels.0.launches.0.1", [2**40]), r"opencl.kernels\[0\].launches\[0\] size\[0\]"),
        (_set("opencl.kernels.0.launches.0.1", [1, 1, 1, 1]), r"opencl.kernels\[0\].launches\[0\] size is not a list"),
        (_set("opencl.schedule.0.kernel", "farm_k_other"), r"opencl.schedule\[0\].kernel is not one of"),
        (_set("opencl.schedule.0.args.0", "arena:nowhere"), r"opencl.schedule\[0\].args\[0\] names no buffer or blob"),
        (_set("opencl.schedule.0.args.0", 7), r"opencl.schedule\[0\].args\[0\] names no buffer or blob"),
        (_set("opencl.devices", None), "opencl.devices is not a list"),
        (_set("opencl.devices.0", "../gpu"), r"opencl.devices\[0\] is not a string matching"),
        (_set("opencl.devices.0", "0" * 16), r"opencl.kernels\[0\].binaries has no binary for opencl.devices\[0\]"),
        (_set("opencl.kernels.0.arguments", None), r"opencl.kernels\[0\].arguments is not a list"),
        (_set("opencl.kernels.0.arguments.0", 2**50), r"opencl.kernels\[0\].arguments\[0\] is not an integer"),
        (_set("opencl.kernels.0.arguments.0", "4"), r"opencl.kernels\[0\].arguments\[0\] is not an integer"),
    ],
)
def test_opencl_part_out_of_bounds_is_refused(
    opencl_manifest: tuple[str, dict[str, Any]], edit: Edit, message: str
) -> None:
    path, manifest = opencl_manifest
    edited = json.loads(json.dumps(manifest))
    edit(edited)
    with pytest.raises(ArtifactError, match=message):
        check_manifest(path, edited)
