"""`bench_build.py --iree`: a cold `farm submit` against IREE's import and compile of the same ONNX file, and how long
a `farm` command takes to start when it only prints help or refuses a model.

Each side runs as a user runs it, in a process of its own, and they take turns round by round (`--rounds`), each
figure the median of its rounds:

- farm: `python -m farm submit MODEL -o OUT` with a fresh, empty cache folder (FARM_CACHE_DIR) and no broker: the
  local build, start to exit, imports and the process pool included;
- IREE: `iree-import-onnx MODEL --opset-version 17` (the light models are of old opsets its importer can't lower)
  then `iree-compile` for this host's CPU (`--iree-hal-local-target-device-backends=llvm-cpu
  --iree-llvmcpu-target-cpu=host`), both wall times added. `iree-base-compiler[onnx]` installs from the package
  registry (a virtual environment of its own is fine); `--iree-bin` names the folder of its commands.

Bars (issue 32): cold submit <= 0.35x IREE's import + compile on light_resnet50, mobilenetv2_style and
resnet18_style; `farm --help`, `farm submit --help` and a refused model (a file that is not ONNX) each under 0.3 s.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

IREE_BAR = 0.35
IREE_BAR_MODELS = ("light_resnet50", "mobilenetv2_style", "resnet18_style")
START_BAR_SECONDS = 0.3
IREE_OPSET = 17
IREE_COMPILE_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)


@dataclass(frozen=True)
class CompileResult:
    """One model's medians: farm's cold submit, IREE's import and compile, and their ratio."""

    name: str
    farm_s: float
    iree_import_s: float
    iree_compile_s: float

    @property
    def iree_s(self) -> float:
        return self.iree_import_s + self.iree_compile_s

    @property
    def ratio(self) -> float:
        return self.farm_s / self.iree_s


def iree_tools(folder: str | None) -> tuple[str, str] | None:
    """The paths of iree-import-onnx and iree-compile: in `folder` when given, else on PATH; None when missing."""
    found = [shutil.which(name, path=folder) for name in ("iree-import-onnx", "iree-compile")]
    return (found[0], found[1]) if found[0] and found[1] else None


def _wall(command: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one command, which must succeed (its stderr is shown when it fails)."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])}... exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return seconds


def farm_env(cache: Path) -> dict[str, str]:
    """The environment of a cold local submit: a fresh cache root and no farm to submit to."""
    env = {name: value for name, value in os.environ.items() if name != "FARM_BROKER_URL"}
    return {**env, "FARM_CACHE_DIR": str(cache)}


def farm_cold_submit(model: Path, folder: Path) -> float:
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        command = [sys.executable, "-m", "farm", "submit", str(model), "-o", f"{scratch}/out"]
        return _wall(command, farm_env(Path(scratch) / "cache"))


def iree_import_and_compile(model: Path, tools: tuple[str, str], folder: Path) -> tuple[float, float]:
    importer, compiler = tools
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        mlir, vmfb = f"{scratch}/model.mlir", f"{scratch}/model.vmfb"
        imported = _wall([importer, str(model), "--opset-version", str(IREE_OPSET), "-o", mlir])
        compiled = _wall([compiler, *IREE_COMPILE_FLAGS, mlir, "-o", vmfb])
    return imported, compiled


def compare(name: str, model: Path, tools: tuple[str, str], folder: Path, rounds: int) -> CompileResult:
    """farm and IREE taking turns, `rounds` each; the medians."""
    farm, imports, compiles = [], [], []
    for _ in range(rounds):
        farm.append(farm_cold_submit(model, folder))
        imported, compiled = iree_import_and_compile(model, tools, folder)
        imports.append(imported)
        compiles.append(compiled)
    return CompileResult(name, statistics.median(farm), statistics.median(imports), statistics.median(compiles))


def start_seconds(folder: Path, repeat: int) -> dict[str, float]:
    """Best wall seconds of `farm --help`, `farm submit --help` and `farm submit` of a file that is not ONNX."""
    not_onnx = folder / "not-a-model.onnx"
    not_onnx.write_text("# not a model\n")
    commands = {
        "farm --help": ["--help"],
        "farm submit --help": ["submit", "--help"],
        "farm submit (not ONNX, refused)": ["submit", str(not_onnx), "-o", str(folder / "refused")],
    }
    best = {}
    for label, args in commands.items():
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, env=farm_env(folder / "c"))
            times.append(time.perf_counter() - started)
        best[label] = min(times)
    return best
