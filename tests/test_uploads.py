"""farm.distributed.uploads: what a submitting machine remembers of its uploads, and reading members locally."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest

from farm import defaults
from farm.backends.llvm.blobs import pack_weights
from farm.backends.llvm.target import host_target
from farm.distributed import recipes, uploads
from farm.frontend.split import BlobSource, SplitModel
from farm.ir.specs import BlobSpec


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
    assert refusal and refusal.startswith("big.onnx: its weights are 2.70 GiB (2900000000 bytes), over the farm's "
                                          "store cap of 2.00 GiB (2147483648 bytes")
    assert "3.0 MiB" in (uploads.over_the_cap("m.onnx", 3 << 20, 1 << 20) or "")


def _weight_and_its_packing(tmp_path: Path) -> tuple[str, BlobSource, recipes.Derivation]:
    """A 16 x 16 float32 weight in a file, and how a CPU target's Gemm packs it (columns of 4)."""
    values = np.arange(256, dtype=np.float32).tobytes()
    path = tmp_path / "model.onnx.data"
    path.write_bytes(values)
    key = hashlib.sha256(values).hexdigest()
    spec = BlobSpec(key, len(values), host_target().id, (4, 16, 16, 0))
    return key, BlobSource(str(path), 0, len(values)), recipes.Derivation(spec, host_target())


def test_a_packed_weight_of_a_held_weight_is_made_here_and_checked_by_its_key(tmp_path: Path) -> None:
    """The recipe says how a packed weight is made (recipes.Derivation); the machine that holds the weight makes it
    with the workers' own step instead of fetching it, and uses it only when it hashes to the member's key."""
    key, source, derivation = _weight_and_its_packing(tmp_path)
    packed = pack_weights(derivation.spec, derivation.target, Path(source.path).read_bytes())
    packed_key = hashlib.sha256(packed).hexdigest()
    fetched: list[str] = []
    read = uploads.local_first({key: source}, lambda k: fetched.append(k) or b"from the farm",
                               {packed_key: derivation})
    assert read(packed_key) == packed and fetched == []
    assert uploads.make_held({key: source}, derivation) == packed

    wrong = uploads.local_first({key: source}, lambda k: b"from the farm", {"e" * 64: derivation})
    assert wrong("e" * 64) == b"from the farm"  # made, but another key: never used
    assert uploads.local_first({}, lambda k: b"from the farm", {packed_key: derivation})(packed_key) == b"from the farm"
    Path(source.path).write_bytes(b"\0" * source.length)  # the weight changed since the submit
    assert uploads.make_held({key: source}, derivation) is None
