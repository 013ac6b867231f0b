"""pack_weights: a weight's bytes in, the bytes a CPU target's kernels read out (packed in panels when the spec
says so, else as given); and the sweep of older versions' blob scratch."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest
from native_helpers import aarch64, host

from farm.backends.llvm.blobs import STALE_SCRATCH_SECONDS, pack_weights, sweep_stale_scratch
from farm.errors import BuildError
from farm.ir.specs import BlobSpec

TARGETS = [pytest.param(host(), id="host"), pytest.param(aarch64(), id="aarch64")]


@pytest.mark.parametrize("target", TARGETS)
def test_a_plain_weight_is_its_bytes(target):
    data = bytes(range(256)) * 3
    assert pack_weights(BlobSpec(hashlib.sha256(data).hexdigest(), len(data), target.id), target, data) == data


def test_mismatched_size_is_a_build_error():
    data = b"weights"
    spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data) + 1, host().id)
    with pytest.raises(BuildError, match=spec.symbol):
        pack_weights(spec, host(), data)


@pytest.mark.parametrize("target", TARGETS)
def test_a_weight_with_panels_is_the_tensor_pre_packed(target):
    """BlobSpec.panels = (rows, m, k): the float32 tensor in the Gemm's panel layout, per m x k block, made from the
    source bytes inside the pure step; packing twice gives the same bytes."""
    from farm.backends.llvm.packing import pack_panels

    weights = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    data = weights.tobytes()
    spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data), target.id, panels=(2, 5, 3))
    assert pack_weights(spec, target, data) == pack_panels(weights, 2).tobytes() == pack_weights(spec, target, data)
    assert spec.symbol != BlobSpec(spec.data_sha256, len(data), target.id).symbol  # plain and packed never share one


def test_panels_that_do_not_divide_the_weight_are_a_build_error():
    data = np.zeros(7, np.float32).tobytes()
    spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data), host().id, panels=(2, 2, 2))
    with pytest.raises(BuildError, match="not float32 blocks of 2 x 2"):
        pack_weights(spec, host(), data)
    odd = np.zeros(9, np.float32).tobytes()
    for panels in ((0, 3, 3), (2, 3, 3, 2), (2, 3), (3, 3, 1, 0, 1, 1), (-1, 3, 3)):  # as a message might carry them
        spec = BlobSpec(hashlib.sha256(odd).hexdigest(), len(odd), host().id, panels=panels)
        with pytest.raises(BuildError, match="neither"):
            pack_weights(spec, host(), odd)
    for panels in ((16, 3, 12, 0, 1), (16, 4, 9, 1, 0), (16, 4, 16, 0, 2)):  # byte panels: k groups, whole panels
        spec = BlobSpec(hashlib.sha256(odd).hexdigest(), len(odd), host().id, panels=panels)
        with pytest.raises(BuildError, match="not byte panels"):
            pack_weights(spec, host(), odd)


def test_a_weight_with_column_panels_is_b_pre_packed_and_transposed_when_stored_so():
    """BlobSpec.panels = (width, k, n, transposed): B in pack_columns' layout, turned first when stored n x k."""
    from farm.backends.llvm.packing import pack_columns

    weights = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    data = weights.tobytes()
    for transposed in (0, 1):
        spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data), host().id, panels=(2, 3, 5, transposed))
        stored = weights.reshape(2, 5, 3) if transposed else weights
        assert pack_weights(spec, host(), data) == pack_columns(stored, 2, bool(transposed)).tobytes()


# --- older versions' scratch ------------------------------------------------------------------------------------


def old_scratch(folder: Path, name: str, age: float) -> Path:
    """What an older version's crash left: farm-blob-*/blob.bin, `age` seconds old."""
    path = folder / name
    path.mkdir()
    (path / "blob.bin").write_bytes(b"leaked weights")
    then = time.time() - age
    for item in (path / "blob.bin", path):
        os.utime(item, (then, then))
    return path


def test_stale_scratch_of_older_versions_is_swept(tmp_path):
    stale = old_scratch(tmp_path, "farm-blob-old", STALE_SCRATCH_SECONDS + 60)
    fresh = old_scratch(tmp_path, "farm-blob-busy", 1)  # an older process on this host may still be packing it
    other = old_scratch(tmp_path, "not-farm", STALE_SCRATCH_SECONDS + 60)
    assert sweep_stale_scratch([tmp_path]) == [stale]
    assert not stale.exists() and fresh.exists() and other.exists()


def test_the_sweep_never_follows_a_symlink(tmp_path):
    victim = old_scratch(tmp_path, "victim", STALE_SCRATCH_SECONDS + 60)
    scratch = tmp_path / "shm"
    scratch.mkdir()
    (scratch / "farm-blob-planted").symlink_to(victim)
    assert sweep_stale_scratch([scratch], now=time.time() + 10 * STALE_SCRATCH_SECONDS) == []
    assert (victim / "blob.bin").read_bytes() == b"leaked weights"


def test_a_missing_folder_is_nothing_to_sweep(tmp_path):
    assert sweep_stale_scratch([tmp_path / "absent"]) == []
