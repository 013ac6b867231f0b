"""Atomic writes: the whole file or the old one, never a partial file or a leftover temporary."""

import os

import pytest

from farm.atomic import write_atomically


def test_writes_the_bytes_with_mode_0644_creating_the_folder(tmp_path):
    target = tmp_path / "a" / "b" / "file.bin"
    write_atomically(target, b"hello", fsync=True)
    assert target.read_bytes() == b"hello"
    assert os.stat(target).st_mode & 0o777 == 0o644


def test_replaces_an_existing_file(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old")
    write_atomically(target, memoryview(b"new bytes"))
    assert target.read_bytes() == b"new bytes"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomically(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]
