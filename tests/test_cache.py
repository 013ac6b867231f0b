"""The runtime cache's records: an artifact file verified once per identity, a cached library trusted while its
stat matches the marker written with it (farm.runtime.cache)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from farm.runtime.cache import cached_library, is_verified, mark_verified, runtime_folder, store_library


def test_a_verified_artifact_stays_verified_until_its_file_or_manifest_changes(tmp_path: Path) -> None:
    artifact, cache = tmp_path / "m.farm", tmp_path / "cache"
    artifact.write_bytes(b"artifact bytes")
    assert not is_verified(str(artifact), "a" * 64, cache)
    mark_verified(str(artifact), "a" * 64, cache)
    assert is_verified(str(artifact), "a" * 64, cache) and not is_verified(str(artifact), "b" * 64, cache)
    os.utime(artifact, ns=(5, 5))
    assert not is_verified(str(artifact), "a" * 64, cache)
    moved = tmp_path / "moved.farm"
    mark_verified(str(artifact), "a" * 64, cache)
    artifact.rename(moved)
    assert not is_verified(str(moved), "a" * 64, cache) and not is_verified(str(artifact), "a" * 64, cache)


def test_a_library_refused_while_it_is_written_or_checked_leaves_nothing(tmp_path: Path) -> None:
    def refuse(_: object) -> None:
        raise ValueError("refused")

    for write, check in ((refuse, lambda mapped: None), (lambda file: file.write(b"bytes"), refuse)):
        with pytest.raises(ValueError, match="refused"):
            store_library("a" * 64, write, check, tmp_path)
        assert not runtime_folder(tmp_path).exists()


def test_a_stored_library_is_found_until_its_file_is_replaced(tmp_path: Path) -> None:
    data = b"\x7fELF library bytes"
    sha = hashlib.sha256(data).hexdigest()
    assert cached_library(sha, tmp_path) is None
    checked = []
    path = store_library(sha, lambda file: file.write(data), lambda mapped: checked.append(mapped[:4]), tmp_path)
    assert checked == [b"\x7fELF"]
    assert path == runtime_folder(tmp_path) / f"{sha}.so" and cached_library(sha, tmp_path) == path
    path.unlink()
    path.write_bytes(b"something else")
    assert cached_library(sha, tmp_path) is None
    (runtime_folder(tmp_path) / f"{sha}.so.stat").write_text("not json")
    assert cached_library(sha, tmp_path) is None
