"""End to end on another kind of x86-64 host: farm itself run under QEMU user-mode emulation of an AMD EPYC Zen 3
(`qemu-x86_64-static -cpu EPYC-Milan`: AVX2, no AVX-512, no VNNI), whatever CPU runs the suite.

Issue 28: an artifact built for a CPU with AVX-512 died of SIGILL (exit 132) in `farm run` on a Zen 3, because only
the target's explicit features were checked. Under the emulated Zen 3 (whose TCG has no AVX-512 instructions, so the
old code did die there), the runtime now refuses that target in one line, and picks the AVX2 target of an artifact
that has both. Python under TCG is slow (some 10 s of CPU a command), so the module runs two commands.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import assert_close, run_onnxruntime

from farm.tools import examples

EMULATED_ZEN3 = ["qemu-x86_64-static", "-cpu", "EPYC-Milan"]
CHECKOUT = str(Path(__file__).resolve().parent.parent)
AVX512 = "cpu:x86_64-linux-gnu:x86-64-v4"
AVX2 = "cpu:x86_64-linux-gnu:x86-64-v3"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates an x86-64 CPU on an x86-64 host"),
]


def _farm(*args: str, cwd: Path, emulated: bool = False) -> subprocess.CompletedProcess:
    """`farm ARGS`, natively or on the emulated Zen 3; QEMU's warnings about CPUID bits TCG lacks are dropped."""
    if emulated and not shutil.which(EMULATED_ZEN3[0]):
        pytest.fail("qemu-x86_64-static is missing: install Debian's qemu-user-static (scripts/setup.sh does)")
    command = [*(EMULATED_ZEN3 if emulated else []), sys.executable, "-m", "farm", *args]
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": CHECKOUT}
    )
    result.stderr = "".join(
        line for line in result.stderr.splitlines(keepends=True) if "TCG doesn't support requested feature" not in line
    )
    return result


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_cnn built for AVX-512 alone (avx512/) and for AVX-512 and AVX2 (both/), with an input."""
    folder = tmp_path_factory.mktemp("hosts")
    model = examples.tiny_cnn()
    onnx.save(model, folder / "tiny_cnn.onnx")
    np.save(folder / "x.npy", examples.random_input(model)["input"])
    for output, targets in (("avx512", [AVX512]), ("both", [AVX512, AVX2])):
        built = _farm(
            "submit", "tiny_cnn.onnx", *[arg for t in targets for arg in ("--target", t)], "-o", output, cwd=folder
        )
        assert built.returncode == 0, built.stderr
    return folder


def test_an_avx512_artifact_is_refused_on_a_zen3_in_one_line(folder: Path) -> None:
    refused = _farm("run", "avx512/tiny_cnn.farm", "--input", "input=x.npy", cwd=folder, emulated=True)
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert refused.stderr.startswith("farm: error: avx512/tiny_cnn.farm: no target for this host (")
    assert "cpu znver3" in refused.stderr and "cpu x86-64-v4: host lacks +avx512" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr


def test_a_zen3_runs_the_avx2_target_of_an_artifact_that_has_both(folder: Path) -> None:
    """Only the AVX2 target can have run: the AVX-512 one would have died of SIGILL under TCG."""
    ran = _farm("run", "both/tiny_cnn.farm", "--input", "input=x.npy", "-o", "zen3.npz", cwd=folder, emulated=True)
    assert ran.returncode == 0, ran.stderr
    feeds = {"input": np.load(folder / "x.npy")}
    assert_close(np.load(folder / "zen3.npz")["output"], run_onnxruntime(folder / "tiny_cnn.onnx", feeds)["output"])
