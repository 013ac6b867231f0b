"""The timing harness (farm/tuning/harness.py): every candidate timed, the default never beaten by a slower one,
a variant whose numbers differ rejected, and the agreement check."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.kernel import compile_cpu_kernel, default_blocking
from farm.backends.llvm.render import render_kernel
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import compile_ir
from farm.errors import BuildError
from farm.ir.graph import Activation
from farm.ir.specs import KernelSpec
from farm.ops import lower_kernel
from farm.tuning import harness
from farm.tuning.space import candidate_variants
from tests.test_tuning_space import CASES, HOST, save, tunable_specs

QUICK = "0.001"  # FARM_TUNE_SECONDS_PER_VARIANT in these tests: a few rounds of each variant, not a benchmark


@pytest.fixture(autouse=True)
def quick_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TUNE_SECONDS_PER_VARIANT", QUICK)


def test_time_variants_times_every_candidate_and_never_chooses_a_slower_one(tmp_path: Path) -> None:
    spec = tunable_specs(save(CASES["conv3x3"], tmp_path))[0]
    result = harness.time_variants(spec.to_json(), HOST.to_json())
    names = [v.name for v in candidate_variants(HOST)]
    assert sorted(result["seconds"]) == sorted(names) and result["rejected"] == []
    chosen = GemmBlocking.from_json(result["variant"]).name
    assert result["seconds"][chosen] <= result["default_seconds"] == result["seconds"][names[0]]
    assert result["default"] == default_blocking(HOST).to_json()
    only = harness.time_variants(spec.to_json(), HOST.to_json(), [GemmBlocking(8, 2, 16)], seconds_per_variant=0)
    assert sorted(only["seconds"]) == sorted([names[0], "8x2x16"])  # the default is always timed


def test_a_variant_whose_numbers_differ_is_rejected_never_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tunable_specs(save(CASES["conv1x1"], tmp_path))[0]
    wrong = GemmBlocking(8, 2, 16)

    def compile_wrongly(variant: KernelSpec, target: CpuTarget) -> bytes:
        """`wrong`'s code computes relu(conv): fast or not, its numbers differ."""
        if variant.variant != wrong.to_json():
            return compile_cpu_kernel(variant, target)
        module = ir.Module(name=variant.symbol)
        module.triple = target.triple
        relu = dataclasses.replace(variant, activation=Activation("relu"))
        render_kernel(module, variant.symbol, lower_kernel(relu), wrong)
        return compile_ir(str(module), target, "wrong kernel")

    monkeypatch.setattr(harness, "compile_cpu_kernel", compile_wrongly)
    result = harness.time_variants(spec.to_json(), HOST.to_json(), [wrong, GemmBlocking(6, 2, 16)])
    assert result["rejected"] == ["8x2x16"] and "8x2x16" not in result["seconds"]
    assert result["variant"] != wrong.to_json()


def test_agreement_is_within_1e_4_of_the_reference_scale() -> None:
    reference = [np.array([100.0, -3.0, np.nan], np.float32)]
    assert harness._agrees([np.array([100.009, -3.0, np.nan], np.float32)], reference)
    assert not harness._agrees([np.array([100.02, -3.0, np.nan], np.float32)], reference)
    assert not harness._agrees([np.array([100.0, -3.0, 0.0], np.float32)], reference)


# --- the host's tuning lock ----------------------------------------------------------------------------------------

LOCK_HOLDER = """
import sys
from farm.tuning.harness import host_lock
with host_lock():
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture(name="temp_folder")
def temp_folder_fixture(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The shared temp folder of these tests (tempfile's, here and in child processes)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@contextlib.contextmanager
def lock_held_by_another_process(temp: Path) -> Iterator[None]:
    """A real child process holding the host's tuning lock until the block ends."""
    child = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER],
        env={**os.environ, "TMPDIR": str(temp)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "held\n"
        yield
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def test_the_lock_is_in_a_folder_private_to_this_user(temp_folder: Path) -> None:
    with harness.host_lock():
        folder = temp_folder / f"farm-{os.getuid()}"
        assert harness.lock_folder() == folder
        assert stat.S_IMODE(folder.lstat().st_mode) == 0o700 and folder.lstat().st_uid == os.getuid()
        assert stat.S_IMODE((folder / harness.LOCK_FILE).lstat().st_mode) == 0o600


def test_a_symlink_planted_as_the_lock_file_is_not_followed(temp_folder: Path) -> None:
    victim, missing = temp_folder / "victim", temp_folder / "would-be-created"
    victim.write_text("precious")
    for target in (victim, missing):
        lock = harness.lock_folder() / harness.LOCK_FILE
        lock.symlink_to(target)
        with pytest.raises(BuildError, match=rf"tuning lock {lock}: .*\(a link is never followed\)"):
            with harness.host_lock():
                pass
        lock.unlink()
    assert victim.read_text() == "precious" and not missing.exists()


def test_a_lock_folder_planted_by_someone_else_is_refused(temp_folder: Path) -> None:
    folder = temp_folder / f"farm-{os.getuid()}"
    planted = temp_folder / "attackers"
    planted.mkdir()
    folder.symlink_to(planted)
    with pytest.raises(BuildError, match=rf"tuning lock folder {folder}: .*\(a link is never followed\)"):
        with harness.host_lock():
            pass
    assert list(planted.iterdir()) == []
    folder.unlink()
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)  # anyone could swap the lock file
    with pytest.raises(BuildError, match=rf"tuning lock folder {folder}: not private to this user .*mode 777"):
        with harness.host_lock():
            pass


def test_a_held_lock_times_out_with_a_clear_error(temp_folder: Path) -> None:
    lock = temp_folder / f"farm-{os.getuid()}" / harness.LOCK_FILE
    with lock_held_by_another_process(temp_folder):
        started = time.monotonic()
        with pytest.raises(BuildError) as raised:
            with harness.host_lock(timeout=0.5):
                pass
        assert time.monotonic() - started >= 0.5
    assert str(raised.value) == (
        f"tuning lock {lock}: still held by another tuning process after 0.5 s (FARM_TUNE_LOCK_TIMEOUT)"
    )
    with harness.host_lock(timeout=0.5):  # free again once its holder has gone
        pass
