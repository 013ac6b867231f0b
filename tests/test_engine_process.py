"""benchmarks/engine_process.py: each engine a benchmark times runs in a process of its own and answers on command,
and the engines take turns."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.tools import examples

ENGINE_PROCESS = Path(__file__).resolve().parent.parent / "benchmarks" / "engine_process.py"


@pytest.fixture(scope="module")
def engine_process() -> ModuleType:
    spec = importlib.util.spec_from_file_location("engine_process", ENGINE_PROCESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """tiny_cnn's .onnx, its artifact for this host and its feeds as the children read them."""
    folder = tmp_path_factory.mktemp("engines")
    model = examples.tiny_cnn()
    path = folder / "tiny_cnn.onnx"
    onnx.save(model, path)
    artifact = build_model(path, folder / "out", executor=LocalExecutor(1)).artifact
    feeds = folder / "feeds.npz"
    np.savez(feeds, **examples.random_input(model))
    return path, artifact, feeds


def test_farm_and_onnxruntime_each_in_a_process_agree_and_take_turns(engine_process, built, tmp_path) -> None:
    path, artifact, feeds = built
    with (
        engine_process.EngineProcess("farm", artifact, feeds, 1, tmp_path / "cache") as farm,
        engine_process.EngineProcess("ort", path, feeds, 1, tmp_path / "cache") as ort,
    ):
        assert farm.loaded == {"ready": True, "threads": 1} and ort.loaded["ready"]
        assert farm.process.pid != ort.process.pid
        ours, reference = farm.outputs(tmp_path / "farm.npz"), ort.outputs(tmp_path / "ort.npz")
        assert ours.keys() == reference.keys()
        for name, value in reference.items():
            np.testing.assert_allclose(ours[name], value, rtol=1e-4, atol=1e-5)
        seconds = engine_process.alternating_latency({"farm_1": farm, "ort_1": ort}, rounds=2, runs=3)
    assert set(seconds) == {"farm_1", "ort_1"} and all(0 < value < 1 for value in seconds.values())
    assert farm.process.returncode == 0 and ort.process.returncode == 0


def test_a_child_that_cannot_load_its_model_is_an_error_naming_it(engine_process, built, tmp_path) -> None:
    _, _, feeds = built
    with pytest.raises(RuntimeError, match="the farm engine process for .*missing.farm died"):
        engine_process.EngineProcess("farm", tmp_path / "missing.farm", feeds, 1, tmp_path / "cache")
