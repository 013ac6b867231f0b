"""`farm inspect`: an artifact's inputs, outputs, targets, sizes and the toolchain that built it, from its verified
manifest; refusals as `farm run` refuses, in one line."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import onnx
import pytest

from farm.artifact import open_artifact, sign_artifact, write_artifact
from farm.backends.llvm.target import host_target
from farm.backends.opencl.target import OpenClTarget
from farm.build.local import build_model
from farm.cli.inspect import INSPECT_SCHEMA, describe, format_description
from farm.errors import ArtifactError, ExitStatus
from farm.tools import examples
from tests.test_cli import farm


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """bert_style (two integer inputs) built for this host."""
    folder = tmp_path_factory.mktemp("inspect")
    onnx.save(examples.bert_style(layers=1), folder / "bert_style.onnx")
    return folder, build_model(folder / "bert_style.onnx", folder / "out").artifact


def test_describe_names_inputs_outputs_targets_sizes_and_the_toolchain(built):
    folder, artifact = built
    found = describe(artifact)
    assert found["schema"] == INSPECT_SCHEMA and found["model"]["name"] == "bert_style" and not found["signed"]
    assert found["inputs"] == [
        {"name": "input_ids", "dtype": "int64", "shape": [1, 32]},
        {"name": "attention_mask", "dtype": "int64", "shape": [1, 32]},
    ]
    assert found["outputs"] == [{"name": "output", "dtype": "float32", "shape": [1, 32, 128]}]
    [target] = found["targets"]
    assert target["id"] == host_target().id and target["kind"] == "cpu" and target["member_bytes"] > 0
    assert found["kernels"] > 0 and found["blobs"] > 0 and 0 < found["blob_bytes"] < found["bytes"]
    assert set(found["toolchain"]) == {"llvmlite", "llvm", "linker"} and found["farm_version"]
    text = format_description(found)
    assert "inputs   input_ids: int64 1x32" in text and "         attention_mask: int64 1x32" in text
    assert "outputs  output: float32 1x32x128" in text and f"targets  {host_target().id}" in text


def test_describe_lists_each_opencl_device_class_with_its_binaries(fingerprint, tmp_path):
    onnx.save(examples.tiny_cnn(), tmp_path / "tiny_cnn.onnx")
    artifact = build_model(
        tmp_path / "tiny_cnn.onnx", tmp_path / "out", [host_target(), OpenClTarget(fingerprint)]
    ).artifact
    targets = describe(artifact)["targets"]
    assert [(t["kind"], t["id"]) for t in targets] == [("cpu", host_target().id), ("opencl", f"opencl:{fingerprint}")]
    assert all(t["member_bytes"] > 0 for t in targets) and describe(artifact)["opencl_kernels"] > 0


def test_a_tampered_artifact_is_refused_and_a_hostile_string_is_printed_escaped(built, tmp_path):
    folder, artifact = built
    opened = open_artifact(artifact)
    library = describe(artifact)["targets"][0]["id"]
    name = next(member for member in opened.manifest["members"] if library in member)
    offset = Path(artifact).read_bytes().index(opened.read_member(name)[:4096])
    data = bytearray(Path(artifact).read_bytes())
    data[offset + 100] ^= 0xFF
    (tmp_path / "flipped.farm").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="tampered"):
        describe(tmp_path / "flipped.farm")
    manifest = {**opened.manifest, "toolchain": {"llvmlite": "\x1b[2J", "llvm": "1", "linker": "ld"}}
    members = {name: opened.read_member(name) for name in opened.manifest["members"]}
    forged = write_artifact(
        str(tmp_path / "forged.farm"), {k: v for k, v in manifest.items() if k != "members"}, members
    )
    text = format_description(describe(forged))
    assert "\x1b" not in text and "\\x1b[2J" in text


def _signed_copy(artifact: str, path: Path) -> str:
    """Copy `artifact` to `path` and sign it there with a fresh Ed25519 key (as `farm sign` does); the key's hex."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    shutil.copy(artifact, path)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return sign_artifact(path, pem)


def with_signature(artifact: Path, record: bytes, path: Path) -> Path:
    """`artifact` written to `path` with its manifest.sig replaced by `record`, every other member as it was."""
    with tarfile.open(artifact) as tar:
        files = {info.name: tar.extractfile(info).read() for info in tar.getmembers()}  # type: ignore[union-attr]
    files["manifest.sig"] = record
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _tampered(record: bytes) -> bytes:
    """The signature record with the signature's last hex digit changed: well formed, but it no longer verifies."""
    fields = json.loads(record)
    fields["signature"] = fields["signature"][:-1] + ("1" if fields["signature"][-1] == "0" else "0")
    return json.dumps(fields).encode()


@pytest.mark.parametrize("forgery", ["tampered", "malformed"])
def test_a_signature_is_reported_once_it_verifies_and_an_invalid_one_exits_2(built, tmp_path, forgery):
    """`signed` used to mean only that manifest.sig was there: now the signature is checked against the key it names
    first, and one that doesn't verify is refused as `farm run --trust` refuses it, exit 2, one line."""
    folder, artifact = built
    key = _signed_copy(artifact, tmp_path / "signed.farm")
    found = describe(tmp_path / "signed.farm")
    assert found["signed"] and found["signer"] == key
    assert f"; signed by key {key[:16]}..." in format_description(found)
    record = open_artifact(tmp_path / "signed.farm").signature
    assert record is not None
    forged = with_signature(
        tmp_path / "signed.farm", _tampered(record) if forgery == "tampered" else b"{}", tmp_path / "forged.farm"
    )
    with pytest.raises(ArtifactError, match="signature invalid"):
        describe(forged)
    text = farm("inspect", forged, cwd=tmp_path)
    assert text.returncode == ExitStatus.BAD_INPUT and text.stdout == ""
    assert text.stderr.startswith(f"farm: error: {forged}: signature invalid: ") and text.stderr.count("\n") == 1
    as_json = farm("inspect", forged, "--json", cwd=tmp_path)
    failure = json.loads(as_json.stdout)
    assert as_json.returncode == ExitStatus.BAD_INPUT and failure["state"] == "failed"
    assert "signature invalid" in failure["error"] and failure["exit_status"] == ExitStatus.BAD_INPUT


def test_the_cli_prints_text_or_json_and_refuses_bad_paths_in_one_line(built, tmp_path):
    folder, artifact = built
    text = farm("inspect", artifact, cwd=tmp_path)
    assert text.returncode == 0 and "input_ids: int64 1x32" in text.stdout
    as_json = farm("inspect", artifact, "--json", cwd=tmp_path)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["inputs"][0]["name"] == "input_ids"
    for bad in (tmp_path / "missing.farm", folder / "bert_style.onnx"):
        result = farm("inspect", bad, cwd=tmp_path)
        assert result.returncode == ExitStatus.BAD_INPUT and result.stderr.startswith("farm: error: ")
        assert result.stderr.count("\n") == 1
