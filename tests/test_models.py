"""End to end: whole models built by farm match onnxruntime (and the onnx package's stored reference outputs).

The farm.tools.examples models are built once per module; the nine onnx "light" models (real architectures whose
weights are ConstantOfShape nodes, up to ~550 MB once folded) share one process-pool executor and have their
artifacts deleted after each test.
"""

from __future__ import annotations

import platform
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import build_and_load, compare_outputs, run_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import farm.runtime.model
from farm.artifact import read_manifest
from farm.backends.llvm.target import parse_target
from farm.build.executor import LocalExecutor
from farm.build.local import BuildResult, build_model
from farm.runtime import Model
from farm.runtime.host import this_host
from farm.tools.examples import EXAMPLES, random_input

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


@pytest.fixture(scope="module")
def executor() -> Iterator[LocalExecutor]:
    """One process pool (one worker per CPU) for every build in this module."""
    with LocalExecutor() as local:
        yield local


# ------------------------------------------------------------------------------------------- farm.tools.examples

Built = tuple[onnx.ModelProto, Path, BuildResult, Model]


@pytest.fixture(scope="module")
def built_example(
    tmp_path_factory: pytest.TempPathFactory, executor: LocalExecutor
) -> Iterator[Callable[[str], Built]]:
    """name -> (model, its .onnx path, BuildResult, loaded farm Model), each example built at most once."""
    root = tmp_path_factory.mktemp("examples")
    built: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in built:
            model = EXAMPLES[name]()
            path = root / f"{name}.onnx"
            onnx.save(model, str(path))
            built[name] = (model, path, *build_and_load(path, root / name, executor))
        return built[name]

    yield get
    built.clear()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_matches_onnxruntime(name: str, built_example: Callable[[str], Built]) -> None:
    model, path, result, farm_model = built_example(name)
    assert Path(result.artifact).name == f"{name}.farm"
    for seed in (0, 1):
        feeds = random_input(model, seed=seed)
        compare_outputs(farm_model.run(feeds), run_onnxruntime(path, feeds), f"{name} seed {seed}")


THREADED_EXAMPLES = ("resnet18_style", "mobilenetv2_style", "bert_style", "vit_style")


@pytest.mark.parametrize("name", THREADED_EXAMPLES)
def test_example_with_two_threads_matches_one_thread_and_onnxruntime(
    name: str, built_example: Callable[[str], Built], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """threads=2 splits every parallel launch (the work threshold lowered to 1, so every op's launches run as
    ranges on two threads): the single native call's results and onnxruntime's numerics. (Not always the same
    bits: where a range boundary moves iterations between a vectorised loop body and its scalar remainder,
    fast-math reassociation may change the last bits.)"""
    model, path, result, _ = built_example(name)
    single = farm.runtime.load(result.artifact, cache_dir=tmp_path, threads=1)
    monkeypatch.setattr(farm.runtime.model, "MIN_WORK_PER_RANGE", 1)
    monkeypatch.setattr(farm.runtime.model, "MIN_SPLIT_WORK_FOR_THREADS", 1)
    threaded = farm.runtime.load(result.artifact, cache_dir=tmp_path, threads=2)
    launches = read_manifest(result.artifact)["targets"][0]["launches"]
    assert threaded._plan is not None and sum(len(ranges) > 1 for _, ranges in threaded._plan) == sum(
        extent > 1 and work > 1 for extent, _, work in launches
    )
    for seed in (0, 1):
        feeds = random_input(model, seed=seed)
        outputs = threaded.run(feeds)
        for output, expected in single.run(feeds).items():
            np.testing.assert_allclose(
                outputs[output], expected, rtol=1e-4, atol=1e-5, err_msg=f"{name} seed {seed} {output}"
            )
        compare_outputs(outputs, run_onnxruntime(path, feeds), f"{name} seed {seed} threads=2")


def test_more_threads_than_cpus_give_the_same_numbers(
    built_example: Callable[[str], Built], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five threads on this machine's CPUs (fewer than five here and in CI): helpers are descheduled in the middle
    of launches and wake late, the case the native wait (spin, then sched_yield) and the per-run counters are for.
    Range boundaries depend on the thread count, so results are compared with one thread to the threaded
    tolerance, and with onnxruntime."""
    model, path, result, _ = built_example("resnet18_style")
    monkeypatch.setattr(farm.runtime.model, "MIN_WORK_PER_RANGE", 1)
    monkeypatch.setattr(farm.runtime.model, "MIN_SPLIT_WORK_FOR_THREADS", 1)
    threaded = farm.runtime.load(result.artifact, cache_dir=tmp_path, threads=5)
    single = farm.runtime.load(result.artifact, cache_dir=tmp_path, threads=1)
    feeds = random_input(model, seed=3)
    expected = single.run(feeds)
    for attempt in range(20):
        for output, values in threaded.run(feeds).items():
            np.testing.assert_allclose(values, expected[output], rtol=1e-4, atol=1e-5, err_msg=f"run {attempt}")
    compare_outputs(threaded.run(feeds), run_onnxruntime(path, feeds), "resnet18_style threads=5")


def test_single_thread_runs_one_native_call(built_example: Callable[[str], Built], tmp_path: Path) -> None:
    _, _, result, _ = built_example("bert_style")
    single = farm.runtime.load(result.artifact, cache_dir=tmp_path, threads=1)
    assert single.threads == 1 and single._plan is None


def test_resnet18_identical_layers_compile_once(built_example: Callable[[str], Built]) -> None:
    """ResNet-18's repeated blocks have equal convolutions: one kernel serves them all, so the build compiles
    fewer Conv kernels than the model has Conv nodes, and fewer kernels than it schedules calls.

    (Counting every kernel, 23 = 15 Conv + 4 Add+Relu + MaxPool, GlobalAveragePool, Flatten and Gemm, which is
    more than the 20 Conv nodes: the all-kernels count is compared with the schedule instead.)"""
    model, _, result, _ = built_example("resnet18_style")
    manifest = read_manifest(result.artifact)
    convs = sum(1 for node in model.graph.node if node.op_type == "Conv")
    conv_kernels = [k for k in manifest["kernels"] if k["op"] == "Conv"]
    assert convs == 20
    assert result.kernels >= len(manifest["kernels"])  # units: a kernel in parts is one unit per part
    assert 0 < len(conv_kernels) < convs
    assert sum(len(k["nodes"]) for k in conv_kernels) == convs
    assert max(len(k["nodes"]) for k in conv_kernels) >= 2
    assert len(manifest["kernels"]) < len(manifest["schedule"])


NARROWER_CPUS = {
    "x86_64": {"avx2": "x86-64-v3:+avx,+avx2,+fma,+f16c", "baseline": "x86-64"},
    "aarch64": {"baseline": "generic"},
}
"""CPU targets below the best one a host of each architecture may have, as `cpu:TRIPLE:` suffixes. farm's code
differs per instruction set (vector width, FMA contraction, the GEMM tile: 8 rows x 3 vectors of 16 lanes with
AVX-512, 4 x 3 of 8 lanes with AVX2, 4 lanes without AVX), so a host with AVX-512 builds and runs the AVX2 and the
baseline (SSE2) code too, which hosts without it run."""
NARROWER_EXAMPLES = ("resnet18_style", "bert_style")
"""Convolutions and a classifier GEMM; attention, LayerNorm and Gelu: the numerics that vector width changes."""


def narrower_cases() -> list:
    """(example, CPU) for this host's architecture; none elsewhere, which pytest reports as a skip (a failure under
    CI), so no host passes without running them."""
    cpus = NARROWER_CPUS.get(platform.machine(), {})
    return [pytest.param(name, cpu, id=f"{name}-{level}") for level, cpu in cpus.items() for name in NARROWER_EXAMPLES]


@pytest.mark.parametrize(("name", "cpu"), narrower_cases())
def test_example_built_for_a_narrower_cpu_matches_onnxruntime(
    name: str, cpu: str, executor: LocalExecutor, tmp_path: Path
) -> None:
    """An example built for `cpu` alone runs that code on this host and matches onnxruntime. A host without the
    target's features (an x86-64 host without AVX2) can't check that code: it skips, saying so, and under CI that
    skip fails the run."""
    host = this_host()
    target = parse_target(f"cpu:{host.triple}:{cpu}")
    lacking = sorted({item[1:] for item in target.features.split(",") if item.startswith("+")} - host.features)
    if lacking:
        pytest.skip(f"this host ({host.describe()}) lacks {', '.join(lacking)}: it can't run {cpu} code")
    model = EXAMPLES[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    result = build_model(path, tmp_path / "out", [target], executor=executor)
    narrower = farm.runtime.load(result.artifact, cache_dir=tmp_path / "cache")
    assert narrower.target["id"] == target.id
    for seed in (0, 1):
        feeds = random_input(model, seed=seed)
        compare_outputs(narrower.run(feeds), run_onnxruntime(path, feeds), f"{name} built for {cpu}, seed {seed}")


# --------------------------------------------------------------------------------------- onnx light models


def runner_dummy_input(value: onnx.ValueInfoProto) -> np.ndarray:
    """onnx.backend.test.runner's generate_dummy_data(x, seed=0, name=..., random=False), which made the inputs of
    the stored light_<name>_output_<i>.pb: arange(n).reshape(shape) / n as float32, unknown dims taken as 1."""
    tensor_type = value.type.tensor_type
    assert tensor_type.elem_type == TensorProto.FLOAT, "the runner generates float inputs only"
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in tensor_type.shape.dim)
    n = np.prod(shape)
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def runner_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    initializers = {t.name for t in model.graph.initializer}
    return {v.name: runner_dummy_input(v) for v in model.graph.input if v.name not in initializers}


def stored_outputs(folder: Path, name: str, model: onnx.ModelProto) -> dict[str, np.ndarray] | None:
    """The stored reference outputs by output name, or None unless every output has one (as in the runner)."""
    files = [folder / f"light_{name}_output_{i}.pb" for i in range(len(model.graph.output))]
    if not all(f.is_file() for f in files):
        return None
    return {out.name: numpy_helper.to_array(onnx.load_tensor(str(f))) for out, f in zip(model.graph.output, files)}


def with_feature_output(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """A copy of `model` that also outputs its features: the input of its first Gemm/MatMul, or of its last Conv
    where it has neither (a 1x1-conv classifier).

    The light models' weights are constants, so their final softmax is the same uniform 1/1000 for any input;
    the features before the classifier vary, and checking them catches wrong arithmetic on the way."""
    dense = [n for n in model.graph.node if n.op_type in ("Gemm", "MatMul")]
    classifier = dense[0] if dense else [n for n in model.graph.node if n.op_type == "Conv"][-1]
    feature = classifier.input[0]
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.append(helper.make_tensor_value_info(feature, TensorProto.FLOAT, None))
    return copy, feature


def test_light_model_list_is_complete(light_models_dir: Path) -> None:
    found = sorted(p.name[len("light_") : -len(".onnx")] for p in light_models_dir.glob("light_*.onnx"))
    assert found == sorted(LIGHT_MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime_and_stored_output(
    name: str, light_models_dir: Path, executor: LocalExecutor, tmp_path: Path
) -> None:
    original = onnx.load(str(light_models_dir / f"light_{name}.onnx"))
    model, feature = with_feature_output(original)
    path = tmp_path / f"light_{name}.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "out"
    try:
        result, farm_model = build_and_load(path, out, executor)
        assert [spec.name for spec in farm_model.outputs] == [o.name for o in model.graph.output]
        assert result.kernels > 0 and result.blobs > 0

        feeds = random_input(model, seed=0)
        random_out = farm_model.run(feeds)
        compare_outputs(random_out, run_onnxruntime(path, feeds), f"{name} (random input, seed 0)")

        dummy = runner_feeds(model)
        dummy_out = farm_model.run(dummy)
        compare_outputs(dummy_out, run_onnxruntime(path, dummy), f"{name} (runner's input)")
        stored = stored_outputs(light_models_dir, name, original)
        if stored is not None:
            compare_outputs({k: dummy_out[k] for k in stored}, stored, f"{name} vs stored output")

        # Not vacuous: the features differ between elements or between the two inputs.
        features = (random_out[feature], dummy_out[feature])
        assert np.ptp(features[0]) > 0 or not np.array_equal(*features), f"{name}: features {feature!r} constant"
    finally:
        shutil.rmtree(out, ignore_errors=True)
