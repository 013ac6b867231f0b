"""The runtime cache's records: an artifact file verified once per identity, a cached library trusted while its
stat matches the marker written with it (farm.runtime.cache)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

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


def test_a_stored_library_is_found_until_its_file_is_replaced(tmp_path: Path) -> None:
    data = b"\x7fELF library bytes"
    sha = hashlib.sha256(data).hexdigest()
    assert cached_library(sha, tmp_path) is None
    path = store_library(sha, data, tmp_path)
    assert path == runtime_folder(tmp_path) / f"{sha}.so" and cached_library(sha, tmp_path) == path
    path.unlink()
    path.write_bytes(b"something else")
    assert cached_library(sha, tmp_path) is None
    (runtime_folder(tmp_path) / f"{sha}.so.stat").write_text("not json")
    assert cached_library(sha, tmp_path) is None
