"""farm.distributed.uploads: what a submitting machine remembers of its uploads, and reading members locally."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from farm import defaults
from farm.distributed import uploads
from farm.frontend.split import BlobSource, SplitModel


@pytest.fixture
def blob(tmp_path: Path) -> tuple[str, BlobSource]:
    path = tmp_path / "w.bin"
    path.write_bytes(b"head" + b"weights!" * 100 + b"tail")
    return hashlib.sha256(b"weights!" * 100).hexdigest(), BlobSource(str(path), 4, 800)


def test_a_submitted_jobs_blobs_are_read_from_their_files_and_the_rest_fetched(blob) -> None:
    key, source = blob
    uploads.remember("a" * 16, SplitModel(b"graph", "0" * 64, {key: source}), sent_bytes=800)
    fetched: list[str] = []
    read = uploads.local_first(uploads.recall("a" * 16), lambda k: fetched.append(k) or b"from the farm")
    assert read(key) == b"weights!" * 100 and fetched == []
    assert read("f" * 64) == b"from the farm" and fetched == ["f" * 64]


def test_a_file_changed_since_the_submit_is_fetched_instead(blob) -> None:
    key, source = blob
    uploads.remember("b" * 16, SplitModel(b"graph", "0" * 64, {key: source}), sent_bytes=0)
    Path(source.path).write_bytes(b"head" + b"changed!" * 100 + b"tail")
    assert uploads.local_first(uploads.recall("b" * 16), lambda k: b"fetched")(key) == b"fetched"
    os.unlink(source.path)
    assert uploads.local_first(uploads.recall("b" * 16), lambda k: b"fetched")(key) == b"fetched"


def test_a_job_this_machine_did_not_submit_or_an_unreadable_record_has_no_local_blobs(blob) -> None:
    assert uploads.recall("c" * 16) == {}
    uploads.uploads_dir().mkdir(parents=True, exist_ok=True)
    (uploads.uploads_dir() / f"{'d' * 16}.json").write_text('{"blobs": {"../x": [1, 2]}}')
    assert uploads.recall("d" * 16) == {}


def test_records_older_than_a_jobs_time_to_live_go_at_the_next_submit(blob) -> None:
    key, source = blob
    uploads.remember("e" * 16, SplitModel(b"graph", "0" * 64, {key: source}), sent_bytes=0)
    old = time.time() - defaults.JOB_TTL_SECONDS - 60
    os.utime(uploads.uploads_dir() / f"{'e' * 16}.json", (old, old))
    uploads.remember("f" * 16, SplitModel(b"graph", "0" * 64, {}), sent_bytes=0)
    assert uploads.recall("e" * 16) == {} and not (uploads.uploads_dir() / f"{'e' * 16}.json").exists()


def test_weights_over_the_stores_cap_are_refused_naming_both_sizes() -> None:
    assert uploads.over_the_cap("m.onnx", 2 << 30, 2 << 30) is None
    refusal = uploads.over_the_cap("big.onnx", 2_900_000_000, 2 << 30)
    assert refusal and refusal.startswith(
        "big.onnx: its weights are 2.70 GiB (2900000000 bytes), over the farm's store cap of 2.00 GiB (2147483648 bytes"
    )
    assert "3.0 MiB" in (uploads.over_the_cap("m.onnx", 3 << 20, 1 << 20) or "")
