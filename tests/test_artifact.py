"""Tests of the artifact file: deterministic writing, atomicity and every refusal of a damaged or unsafe artifact."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from farm.artifact import (
    COPY_BYTES,
    FORMAT_VERSION,
    LazyMember,
    _write_tar,
    artifact_bytes,
    open_artifact,
    read_manifest,
    verify,
    write_artifact,
)
from farm.errors import ArtifactError, BadInputError

MEMBERS = {"targets/cpu-a/model.so": b"\x7fELF library bytes", "blobs/w0.bin": bytes(range(256)) * 4}
MANIFEST = {"format_version": FORMAT_VERSION, "farm_version": "0.1.0", "model": {"name": "m", "sha256": "0" * 64}}


def _write(tmp_path: Path, name: str = "m.farm") -> Path:
    return Path(write_artifact(tmp_path / name, MANIFEST, MEMBERS))


def _manifest_members(manifest: bytes) -> dict[str, bytes]:
    """manifest.json and the manifest.sha256 that covers it."""
    return {"manifest.json": manifest, "manifest.sha256": hashlib.sha256(manifest).hexdigest().encode()}


def _craft(path: Path, files: dict[str, bytes], *, listed: dict[str, bytes] | None = None) -> Path:
    """A tar made by hand whose manifest lists `listed` (default: `files`) with their true hashes."""
    listed = files if listed is None else listed
    manifest = {**MANIFEST, "members": {n: hashlib.sha256(d).hexdigest() for n, d in listed.items()}}
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in {**_manifest_members(json.dumps(manifest).encode()), **files}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path)
    manifest = read_manifest(path)
    assert manifest["model"] == MANIFEST["model"]
    assert manifest["members"] == {n: hashlib.sha256(d).hexdigest() for n, d in MEMBERS.items()}
    artifact = verify(path)
    assert {name: artifact.read_member(name) for name in MEMBERS} == MEMBERS


def test_layout_is_deterministic_payload_sorted_then_the_manifest(tmp_path: Path) -> None:
    """Payload members in name order, each hashed as it is written, then manifest.json and its digest."""
    first, second = _write(tmp_path, "a.farm"), _write(tmp_path, "b.farm")
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == [*sorted(MEMBERS), "manifest.json", "manifest.sha256"]
    assert all((i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) == (0, 0, 0, "", "", 0o644) for i in infos)
    text = open_artifact(first).manifest
    assert first.read_bytes().count(json.dumps(text, sort_keys=True, indent=2).encode() + b"\n") == 1


def test_flipped_byte_is_tampered_naming_the_member(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[data.index(b"library bytes")] ^= 1
    path.write_bytes(bytes(data))
    artifact = open_artifact(path)
    assert artifact.read_member("blobs/w0.bin") == MEMBERS["blobs/w0.bin"]
    with pytest.raises(ArtifactError, match=r"tampered") as caught:
        artifact.read_member("targets/cpu-a/model.so")
    assert "targets/cpu-a/model.so" in str(caught.value) and str(path) in str(caught.value)
    with pytest.raises(ArtifactError, match="tampered"):
        verify(path)


@pytest.mark.parametrize("where", ["in the first header", "in a member", "before the end marker", "in the end marker"])
def test_truncated_file_is_refused(tmp_path: Path, where: str) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    end = -(-(last.offset_data + last.size) // 512) * 512
    cut = {"in the first header": 100, "in a member": end - 700, "before the end marker": end}.get(where, end + 512)
    path.write_bytes(data[:cut])
    with pytest.raises(ArtifactError, match=str(path)):
        verify(path)


def test_not_a_tar_and_errors_are_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "junk.farm"
    path.write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(ArtifactError, match="not a valid artifact") as caught:
        open_artifact(path)
    assert isinstance(caught.value, BadInputError)


@pytest.mark.parametrize("name", ["../evil", "/abs", "targets/../../evil", "./x"])
def test_member_leaving_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    path = _craft(tmp_path / "evil.farm", {name: b"payload"})
    with pytest.raises(ArtifactError, match="leaves its folder") as caught:
        open_artifact(path)
    assert repr(name) in str(caught.value)


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.DIRTYPE])
def test_link_device_or_folder_member_is_refused(tmp_path: Path, kind: bytes) -> None:
    path = tmp_path / "link.farm"
    manifest = json.dumps({**MANIFEST, "members": {}}).encode()
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in _manifest_members(manifest).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("targets/cpu-a/model.so")
        link.type, link.linkname = kind, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(ArtifactError, match=r"'targets/cpu-a/model.so' leaves its folder.*refused"):
        open_artifact(path)


def test_unlisted_member_is_refused(tmp_path: Path) -> None:
    path = _craft(tmp_path / "extra.farm", {"a.bin": b"a", "extra.bin": b"x"}, listed={"a.bin": b"a"})
    with pytest.raises(ArtifactError, match=r"'extra.bin' is not listed in the manifest"):
        open_artifact(path)


def test_listed_but_missing_member_is_refused(tmp_path: Path) -> None:
    path = _craft(tmp_path / "missing.farm", {"a.bin": b"a"}, listed={"a.bin": b"a", "gone.bin": b"g"})
    with pytest.raises(ArtifactError, match=r"lists member 'gone.bin' but the artifact lacks it"):
        open_artifact(path)


def test_duplicate_member_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.farm"
    _craft(path, {"a.bin": b"a"})
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("a.bin")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"b"))
    with pytest.raises(ArtifactError, match="appears twice"):
        open_artifact(path)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "has no manifest.json"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"format_version": 99, "members": {}}).encode(), "format_version 99 is not supported"),
        (json.dumps({"format_version": FORMAT_VERSION}).encode(), "no valid 'members'"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 32 levels"),
        (b'{"format_version": ' + b"9" * 5000 + b"}", "a number of 5000 characters"),
        (b'{"format_version": NaN}', "format_version nan is not supported"),
    ],
)
def test_bad_manifest_is_refused(tmp_path: Path, manifest: bytes | None, message: str) -> None:
    path = tmp_path / "bad.farm"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        files = _manifest_members(manifest) if manifest is not None else {"other.json": b"{}"}
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ArtifactError, match=message):
        read_manifest(path)


@pytest.mark.parametrize("name", ["../evil", "/abs", "a/./b", "a//b", "", "manifest.json", "manifest.sha256", "a\\b"])
def test_invalid_member_path_is_refused_when_writing(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="artifact member path"):
        write_artifact(tmp_path / "m.farm", MANIFEST, {name: b"x"})
    assert os.listdir(tmp_path) == []


def test_failed_write_leaves_no_partial_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    path = _write(tmp_path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="too long"):
        write_artifact(path, MANIFEST, {"x" * 200: b"a name ustar can't hold"})
    assert os.listdir(tmp_path) == ["m.farm"]
    assert path.read_bytes() == before


def test_wrong_format_version_is_refused_when_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format_version"):
        write_artifact(tmp_path / "m.farm", {**MANIFEST, "format_version": 7}, MEMBERS)


def test_manifest_edited_without_rehash_is_refused(tmp_path: Path) -> None:
    """manifest.sha256 covers the manifest: an edit that forgets to recompute it is refused before parsing."""
    path = tmp_path / "edited.farm"
    with tarfile.open(_write(tmp_path)) as tar:
        files = {info.name: tar.extractfile(info).read() for info in tar.getmembers()}
    files["manifest.json"] = files["manifest.json"].replace(b'"m"', b'"x"')
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ArtifactError, match=r"manifest.json was tampered with"):
        open_artifact(path)


def test_a_lazy_member_is_made_as_it_is_written_and_must_have_its_announced_size(tmp_path: Path) -> None:
    """A LazyMember's bytes exist only while the archive writes them; the archive is byte for byte the one its
    bytes would give, and a member made with another size than announced is refused (no artifact written)."""
    made = []

    def produce() -> bytes:
        made.append(1)
        return b"packed weights"

    eager = artifact_bytes({"model": {}}, {"w.bin": b"packed weights"})
    assert artifact_bytes({"model": {}}, {"w.bin": LazyMember(14, produce)}) == eager and made == [1]
    with pytest.raises(ValueError, match="made with 14 bytes, 15 were announced"):
        write_artifact(tmp_path / "bad.farm", {"model": {}}, {"w.bin": LazyMember(15, produce)})
    assert not (tmp_path / "bad.farm").exists()


def test_a_lazy_member_whose_bytes_were_checked_is_not_hashed_again() -> None:
    """`checked`: the sha256 its producer checked the bytes against (a store read, a made packed weight): the
    archive lists it as it is, which is why only readers that check may give it (recipes.write_artifact_from)."""
    digest = hashlib.sha256(b"packed weights").hexdigest()
    checked = artifact_bytes({"model": {}}, {"w.bin": LazyMember(14, lambda: b"packed weights", digest)})
    assert checked == artifact_bytes({"model": {}}, {"w.bin": b"packed weights"})
    assert b"e" * 64 in artifact_bytes({"model": {}}, {"w.bin": LazyMember(14, lambda: b"packed weights", "e" * 64)})


class _RecordedWrites(io.BytesIO):
    """A file that keeps the size of each write it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, data: Any) -> int:
        self.sizes.append(memoryview(data).nbytes)
        return super().write(data)


def test_a_big_member_goes_to_the_file_in_one_write() -> None:
    """Each member is one write of views of its bytes (COPY_BYTES), so that a file system with large folios caches
    its 2 MB stretches as 2 MB folios, which the runtime then maps as huge pages (loader.map_weights)."""
    weights = np.random.default_rng(0).bytes(24 << 20)
    recorded = _RecordedWrites()
    _write_tar(recorded, {"blobs/w.bin": weights}, MANIFEST)
    assert COPY_BYTES >= 1 << 30 and len(weights) in recorded.sizes
    assert sum(size for size in recorded.sizes if size >= 2 << 20) == len(weights)
