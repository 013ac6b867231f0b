"""Cross-compiled targets executed (farm.runtime.emulation): every farm.tools.examples model built for aarch64 and
riscv64 runs under qemu with onnxruntime's outputs, an artifact of several sizes too; the C ABI of each target is
the one its libc calls with; a crash, a missing import, a run that takes too long, a missing qemu or libc, an
architecture farm can't emulate: each one error line naming the target and what to do.

Each example is built once per module, for both targets in one artifact, on one shared process pool.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from numerics import compare_outputs, run_onnxruntime

import farm.runtime
from farm.backends.llvm.driver import CrossLibc
from farm.backends.llvm.link import find_linker, link_library
from farm.backends.llvm.target import CpuTarget, parse_target
from farm.backends.llvm.toolchain import compile_ir
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.errors import EmulationError, ExitStatus
from farm.ir.shapes import parse_sizes
from farm.runtime.emulation import EMULATORS, EmulatedModel, emulator_for
from farm.runtime.host import this_host
from farm.runtime.manifest_types import CpuTargetEntry, Manifest
from farm.runtime.sized import SizedModel
from farm.tools.examples import EXAMPLES, random_input
from tests.dynamic_models import dynamic_cnn

TARGETS = {"aarch64": "cpu:aarch64-linux-gnu", "riscv64": "cpu:riscv64-linux-gnu"}


@pytest.fixture(scope="module")
def executor() -> Iterator[LocalExecutor]:
    """One process pool (one worker per CPU) for every build in this module."""
    with LocalExecutor() as local:
        yield local


@pytest.fixture(scope="module")
def cross_built(
    tmp_path_factory: pytest.TempPathFactory, executor: LocalExecutor
) -> Iterator[Callable[[str], tuple[onnx.ModelProto, Path, str]]]:
    """name -> (model, its .onnx path, its artifact for both targets), each example built at most once."""
    root = tmp_path_factory.mktemp("cross")
    built: dict[str, tuple[onnx.ModelProto, Path, str]] = {}

    def get(name: str) -> tuple[onnx.ModelProto, Path, str]:
        if name not in built:
            model = EXAMPLES[name]()
            path = root / f"{name}.onnx"
            onnx.save(model, path)
            targets = [parse_target(target) for target in TARGETS.values()]
            built[name] = (model, path, build_model(path, root / "out", targets, executor=executor).artifact)
        return built[name]

    yield get
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(TARGETS))
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_matches_onnxruntime_under_emulation(name: str, arch: str, cross_built, tmp_path: Path) -> None:
    model, path, artifact = cross_built(name)
    emulated = farm.runtime.load(artifact, target=TARGETS[arch], cache_dir=tmp_path)
    assert isinstance(emulated, EmulatedModel) and emulated.threads == 1
    assert emulated.target["triple"].startswith(arch)
    feeds = random_input(model, seed=0)
    compare_outputs(emulated.run(feeds), run_onnxruntime(path, feeds), f"{name} on {arch}")


def test_an_artifact_of_several_sizes_runs_each_size_under_emulation(executor: LocalExecutor, tmp_path: Path) -> None:
    dynamic_cnn(tmp_path / "m.onnx")
    artifact = build_model(
        tmp_path / "m.onnx",
        tmp_path / "out",
        [parse_target(TARGETS["riscv64"])],
        executor=executor,
        sizes=parse_sizes(["batch=1,3"]),
    ).artifact
    sized = farm.runtime.load(artifact, target=TARGETS["riscv64"], cache_dir=tmp_path / "cache")
    assert isinstance(sized, SizedModel) and all(isinstance(size, EmulatedModel) for _, size in sized.sizes)
    rng = np.random.default_rng(0)
    for batch in (3, 1):
        feeds = {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)}
        compare_outputs(sized.run(feeds), run_onnxruntime(tmp_path / "m.onnx", feeds), f"batch {batch}")


# ---------------------------------------------------------------------------------- libraries made for a check

FLOAT_CALLS = """
declare float @floorf(float)
declare double @floor(double)

define void @farm_run(ptr %arena) {
  %x = load float, ptr %arena
  %floor_x = call float @floorf(float %x) nobuiltin
  %floor_x_at = getelementptr i8, ptr %arena, i64 8
  store float %floor_x, ptr %floor_x_at
  %a_at = getelementptr i8, ptr %arena, i64 16
  %a = load double, ptr %a_at
  %floor_a = call double @floor(double %a) nobuiltin
  %floor_a_at = getelementptr i8, ptr %arena, i64 32
  store double %floor_a, ptr %floor_a_at
  ret void
}
"""
"""A library whose entry calls libm with a float and a double, which the C ABI passes in float registers (nobuiltin:
LLVM would otherwise round with an instruction of its own; floor and floorf are what kernels may import from libm,
farm.backends.llvm.link.ALLOWED_IMPORTS)."""

FLOAT_CALLS_MANIFEST = {
    "memory_plan": {"arena_bytes": 64},
    "inputs": [
        {"name": "x", "shape": [1], "dtype": "float32", "offset": 0},
        {"name": "a", "shape": [1], "dtype": "float64", "offset": 16},
    ],
    "outputs": [
        {"name": "floor_x", "shape": [1], "dtype": "float32", "offset": 8},
        {"name": "floor_a", "shape": [1], "dtype": "float64", "offset": 32},
    ],
}

WRITES_THROUGH_A_POINTER = """
define void @farm_run(ptr %arena) {
  %pointer = load volatile ptr, ptr %arena
  store volatile i32 1, ptr %pointer
  ret void
}
"""
"""A library that writes where the arena's first 8 bytes point (16: a crash)."""

CALLS_A_MISSING_FUNCTION = """
declare void @farm_test_missing()

define void @farm_run(ptr %arena) {
  call void @farm_test_missing()
  ret void
}
"""

ONE_POINTER = {
    "memory_plan": {"arena_bytes": 8},
    "inputs": [{"name": "p", "shape": [1], "dtype": "int64", "offset": 0}],
    "outputs": [],
}


def emulated_library(
    ir_text: str,
    manifest: dict[str, Any],
    arch: str,
    folder: Path,
    link: Callable[[list[bytes], CpuTarget], bytes] = link_library,
) -> EmulatedModel:
    """`ir_text` compiled by farm's toolchain for the architecture's default target, linked by farm's linker (or by
    `link`) and loaded to run under qemu (the library's own file stands for the artifact: it has no weights)."""
    target = parse_target(TARGETS[arch])
    library = folder / f"{arch}.so"
    library.write_bytes(link([compile_ir(ir_text, target, "check")], target))
    emulator = EMULATORS[arch]
    arena = manifest["memory_plan"]["arena_bytes"]
    entry = {**target.to_json(), "requires": [], "library": library.name, "entry": "farm_run", "weights_offset": arena}
    checked = Manifest.from_json({"model": {"sha256": "0" * 64}, "targets": [entry], **manifest})
    return EmulatedModel(
        str(library), checked, CpuTargetEntry.from_json(entry), library, [], emulator, emulator.driver(folder / "cache")
    )


@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_calls_with_float_arguments_reach_libm_in_float_registers(arch: str, tmp_path: Path) -> None:
    """A soft-float library (lp64 on riscv64) would pass these in integer registers and read back garbage."""
    model = emulated_library(FLOAT_CALLS, FLOAT_CALLS_MANIFEST, arch, tmp_path)
    outputs = model.run({"x": np.array([-1.5], np.float32), "a": np.array([-1e10 - 0.5])})
    np.testing.assert_array_equal(outputs["floor_x"], np.array([-2.0], np.float32))
    np.testing.assert_array_equal(outputs["floor_a"], [-1e10 - 1])


def test_a_crash_is_one_error_naming_the_target_and_the_signal(tmp_path: Path) -> None:
    model = emulated_library(WRITES_THROUGH_A_POINTER, ONE_POINTER, "aarch64", tmp_path)
    with pytest.raises(EmulationError) as failure:
        model.run({"p": np.array([16], np.int64)})
    message = str(failure.value)
    assert f"target {model.target['id']!r} under qemu-aarch64-static" in message
    assert "killed by SIGSEGV" in message and "\n" not in message
    assert failure.value.exit_status == ExitStatus.BAD_INPUT


def linked_unchecked(objects: list[bytes], target: CpuTarget) -> bytes:
    """The objects linked by ld.lld as link_library links them, without its check of the imports: a library that
    imports what no libc has, as an older farm could make, which only its load can refuse."""
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / f"{index}.o" for index in range(len(objects))]
        for path, data in zip(paths, objects):
            path.write_bytes(data)
        subprocess.run([find_linker(target), "-shared", "-o", f"{folder}/lib.so", *map(str, paths)], check=True)
        return Path(folder, "lib.so").read_bytes()


def test_an_import_the_targets_libc_lacks_is_named(tmp_path: Path) -> None:
    model = emulated_library(CALLS_A_MISSING_FUNCTION, ONE_POINTER, "riscv64", tmp_path, linked_unchecked)
    with pytest.raises(EmulationError, match=r"can't load the library \(.*undefined symbol: farm_test_missing\)"):
        model.run({"p": np.array([0], np.int64)})


def test_an_emulated_model_cannot_be_timed(tmp_path: Path) -> None:
    model = emulated_library(WRITES_THROUGH_A_POINTER, ONE_POINTER, "aarch64", tmp_path)
    with pytest.raises(EmulationError, match="emulation here, whose timing says nothing of the target's"):
        model.time_steps({"p": np.array([16], np.int64)})


# ------------------------------------------------------------------------------------------ what a host lacks


def test_a_run_that_takes_too_long_is_stopped(cross_built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, artifact = cross_built("tiny_cnn")
    emulated = farm.runtime.load(artifact, target=TARGETS["aarch64"], cache_dir=tmp_path)
    monkeypatch.setenv("FARM_EMULATION_TIMEOUT", "0.01")
    with pytest.raises(EmulationError, match=r"no result after 0\.01 s \(FARM_EMULATION_TIMEOUT\); stopped"):
        emulated.run(random_input(model))


def test_without_qemu_the_error_names_its_package(cross_built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, artifact = cross_built("tiny_cnn")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmulationError) as failure:
        farm.runtime.load(artifact, target=TARGETS["riscv64"], cache_dir=tmp_path)
    assert "qemu-riscv64-static is not installed" in str(failure.value)
    assert str(failure.value).endswith("apt-get install qemu-user-static")


def test_without_the_targets_libc_the_error_names_its_package(tmp_path: Path) -> None:
    emulator = EMULATORS["riscv64"]
    bare = dataclasses.replace(emulator, libc=CrossLibc(tmp_path, emulator.libc.loader))
    with pytest.raises(
        EmulationError,
        match=rf"the riscv64 C library is not installed \(no {tmp_path}/libc\.so\.6\): "
        r"apt-get install libc6-riscv64-cross$",
    ):
        bare.check_installed("a.farm: target 'x'")


def test_an_architecture_without_emulator_is_refused() -> None:
    mips = CpuTargetEntry("cpu-mips64", "mips64-unknown-linux-gnuabi64", "generic")
    with pytest.raises(EmulationError, match=r"farm emulates only Linux GNU targets of aarch64, riscv64"):
        emulator_for(mips, this_host(), "a.farm")
    darwin = CpuTargetEntry("cpu-arm-mac", "aarch64-apple-darwin", "generic")
    with pytest.raises(EmulationError, match="only Linux GNU targets"):
        emulator_for(darwin, this_host(), "a.farm")


def test_the_driver_is_built_once_per_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator = EMULATORS["aarch64"]
    first = emulator.driver(tmp_path)
    written = first.stat().st_mtime_ns
    assert emulator.driver(tmp_path) == first and first.stat().st_mtime_ns == written
    assert first.stat().st_mode & 0o777 == 0o755 and first.parent == tmp_path / "runtime" / "drivers"
    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "another")
    assert emulator.driver(tmp_path) != first
