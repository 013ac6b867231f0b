"""Tests of farm.runtime against a real native library compiled here from LLVM IR: y = 2*x + 1 on 4 floats."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numpy as np
import onnx
import pytest
from llvmlite import ir

from farm import defaults
from farm.artifact import FORMAT_VERSION, Artifact, open_artifact, write_artifact
from farm.backends.llvm.loader import map_weights
from farm.backends.registry import BACKENDS
from farm.errors import ArtifactError, RunInputError
from farm.runtime import TensorSpec, load, loader_of
from farm.runtime import model as model_module
from farm.runtime.host import Host, choose_target, this_host
from farm.runtime.manifest_types import CpuTargetEntry, Launch
from farm.runtime.model import (
    HEAD_SHARE,
    MIN_WORK_PER_RANGE,
    RANGES_PER_THREAD,
    launch_plan,
    shares_range,
    split_range,
    work_table,
)

IN_OFFSET, OUT_OFFSET, COUNT = 0, 64, 4
HOST = this_host()


def _affine_module() -> str:
    """IR of `void farm_run(i8* arena)`: arena floats [64:80] = 2 * arena floats [0:16] + 1."""
    module = ir.Module(name="affine")
    module.triple = llvm.get_process_triple()
    f32, i8p = ir.FloatType(), ir.IntType(8).as_pointer()
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p]), name="farm_run")
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    arena = function.args[0]
    for i in range(COUNT):
        src = builder.bitcast(builder.gep(arena, [ir.Constant(ir.IntType(64), IN_OFFSET + 4 * i)]), f32.as_pointer())
        dst = builder.bitcast(builder.gep(arena, [ir.Constant(ir.IntType(64), OUT_OFFSET + 4 * i)]), f32.as_pointer())
        value = builder.fadd(builder.fmul(builder.load(src), ir.Constant(f32, 2.0)), ir.Constant(f32, 1.0))
        builder.store(value, dst)
    builder.ret_void()
    return str(module)


def _compile_shared_library(ir_text: str, folder: Path) -> bytes:
    """Compile IR to a position-independent object for this host and link it with `ld -shared`."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(ir_text)
    module.verify()
    machine = llvm.Target.from_triple(module.triple).create_target_machine(reloc="pic", codemodel="default")
    (folder / "obj.o").write_bytes(machine.emit_object(module))
    subprocess.run(["ld", "-shared", "-o", str(folder / "lib.so"), str(folder / "obj.o")], check=True)
    return (folder / "lib.so").read_bytes()


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _compile_shared_library(_affine_module(), tmp_path_factory.mktemp("native"))


def _target(
    target_id: str, triple: str, *, cpu: str = HOST.cpu, features: str = "", requires: list[str] | None = None
) -> dict[str, Any]:
    """A CPU target's manifest entry; its `requires` are its explicit +features unless given."""
    return {
        "id": target_id,
        "kind": "cpu",
        "triple": triple,
        "cpu": cpu,
        "features": features,
        "requires": requires if requires is not None else [f[1:] for f in features.split(",") if f.startswith("+")],
        "library": f"targets/{target_id}/model.so",
        "entry": "farm_run",
    }


def _entries(*targets: dict[str, Any]) -> list[CpuTargetEntry]:
    """The targets' manifest entries as a checked manifest gives them to the runtime."""
    return [CpuTargetEntry.from_json(target) for target in targets]


def _host_target() -> dict[str, Any]:
    """A target for this host requiring a few features the host really has, as the build would record them."""
    features = ",".join(f"+{name}" for name in sorted(HOST.features)[:3])
    return _target("cpu-host", llvm.get_process_triple(), features=features)


def _write(path: Path, library: bytes, targets: list[dict[str, Any]]) -> Path:
    manifest = {
        "format_version": FORMAT_VERSION,
        "farm_version": "0.1.0",
        "model": {"name": "affine", "sha256": "0" * 64},
        "inputs": [{"name": "x", "shape": [1, COUNT], "dtype": "float32", "offset": IN_OFFSET}],
        "outputs": [{"name": "y", "shape": [1, COUNT], "dtype": "float32", "offset": OUT_OFFSET}],
        "memory_plan": {"arena_bytes": 128, "alignment": 64, "buffers": []},
        "targets": targets,
        "kernels": [],
        "blobs": [],
        "schedule": [],
    }
    return Path(write_artifact(path, manifest, {target["library"]: library for target in targets}))


@pytest.fixture
def artifact(tmp_path: Path, library: bytes) -> Path:
    return _write(tmp_path / "affine.farm", library, [_host_target()])


def test_every_backend_brings_its_loader_and_an_unknown_device_is_refused(artifact: Path) -> None:
    for kind, backend in BACKENDS.items():
        assert callable(loader_of(kind)) and loader_of(kind).__module__ == f"{backend.package}.loader"
    with pytest.raises(ArtifactError, match="unknown device 'tpu': expected 'cpu' or 'opencl'"):
        load(artifact, device="tpu")


def test_run_computes_outputs(artifact: Path, tmp_path: Path) -> None:
    model = load(artifact, cache_dir=tmp_path / "cache")
    assert model.inputs == [TensorSpec("x", (1, COUNT), "float32")]
    assert model.outputs == [TensorSpec("y", (1, COUNT), "float32")]
    assert model.target["id"] == "cpu-host"
    x = np.array([[0.0, 1.0, -2.5, 3.25]], dtype=np.float32)
    first = model.run({"x": x})
    np.testing.assert_array_equal(first["y"], 2 * x + 1)
    second = model.run({"x": np.asfortranarray(x + 1)})
    np.testing.assert_array_equal(second["y"], 2 * (x + 1) + 1)
    np.testing.assert_array_equal(first["y"], 2 * x + 1)


LOADS_WITHOUT_ML_DTYPES = """
import sys
from farm.runtime import load
model = load(sys.argv[1], cache_dir=sys.argv[2])
assert "ml_dtypes" not in sys.modules, "ml_dtypes imported for a float32 model"
from farm.runtime.model import registered_dtype
assert registered_dtype("bfloat16").name == "bfloat16" and "ml_dtypes" in sys.modules
"""


def test_a_model_without_bfloat16_loads_without_importing_ml_dtypes(artifact: Path, tmp_path: Path) -> None:
    """ml_dtypes (0.6 s to import under numpy 2.4) is imported only for a model that has a bfloat16 tensor
    (model.registered_dtype), not for every `farm run`."""
    command = [sys.executable, "-c", LOADS_WITHOUT_ML_DTYPES, str(artifact), str(tmp_path / "cache")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_run_is_thread_safe(artifact: Path, tmp_path: Path) -> None:
    model = load(artifact, cache_dir=tmp_path / "cache")
    failures: list[int] = []

    def worker(seed: int) -> None:
        x = np.full((1, COUNT), seed, dtype=np.float32)
        for _ in range(200):
            if not np.array_equal(model.run({"x": x})["y"], 2 * x + 1):
                failures.append(seed)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({}, r"missing input 'x'; the model's inputs are \['x'\]"),
        ({"x": np.zeros((1, COUNT), np.float32), "z": np.zeros(1)}, r"unknown input 'z'"),
        ({"x": np.zeros((COUNT,), np.float32)}, r"input 'x': expected shape \(1, 4\), got \(4,\)"),
        ({"x": np.zeros((1, COUNT), np.float64)}, r"input 'x': expected dtype float32, got float64"),
        ({"x": [[0.0] * COUNT]}, r"input 'x': expected a numpy array, got list"),
        (np.zeros((1, COUNT), np.float32), r"feeds must map input names to arrays, got ndarray"),
    ],
)
def test_bad_feeds_are_refused(artifact: Path, tmp_path: Path, feeds: dict[str, Any], message: str) -> None:
    model = load(artifact, cache_dir=tmp_path / "cache")
    with pytest.raises(RunInputError, match=message):
        model.run(feeds)


def test_tampered_library_is_refused_at_load(artifact: Path, library: bytes, tmp_path: Path) -> None:
    data = bytearray(artifact.read_bytes())
    data[data.index(library[:64]) + 40] ^= 0xFF
    artifact.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"'targets/cpu-host/model.so' was tampered"):
        load(artifact, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_no_target_for_this_host(tmp_path: Path, library: bytes) -> None:
    foreign = "aarch64" if HOST.arch != "aarch64" else "x86_64"
    path = _write(tmp_path / "foreign.farm", library, [_target("cpu-foreign", f"{foreign}-unknown-linux-gnu")])
    with pytest.raises(ArtifactError, match=r"no target for this host") as caught:
        load(path, cache_dir=tmp_path / "cache")
    assert "'cpu-foreign'" in str(caught.value) and HOST.triple in str(caught.value)


def test_second_load_reuses_the_cached_library(artifact: Path, tmp_path: Path) -> None:
    load(artifact, cache_dir=tmp_path / "cache")
    (cached,) = (tmp_path / "cache" / "runtime").glob("*.so")
    before = cached.stat()
    model = load(artifact, cache_dir=tmp_path / "cache")
    after = cached.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert list((tmp_path / "cache" / "runtime").glob("*.so")) == [cached]
    np.testing.assert_array_equal(model.run({"x": np.ones((1, COUNT), np.float32)})["y"], np.full((1, COUNT), 3.0))


def test_a_second_load_of_the_same_file_hashes_nothing_and_reads_no_member(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The artifact file was verified and its library cached by the first load (farm.runtime.cache): the second
    reads the manifest only."""
    load(artifact, cache_dir=tmp_path / "cache")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a second load read a member")

    monkeypatch.setattr(Artifact, "read_member", refuse)
    model = load(artifact, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(model.run({"x": np.ones((1, COUNT), np.float32)})["y"], np.full((1, COUNT), 3.0))


def test_an_artifact_rewritten_after_a_good_load_is_verified_again(
    artifact: Path, library: bytes, tmp_path: Path
) -> None:
    """A file rewritten in place (another mtime or size) is another identity: a member tampered after the first
    load is refused, even though the cache holds the good library."""
    load(artifact, cache_dir=tmp_path / "cache")
    data = bytearray(artifact.read_bytes())
    data[data.index(library[:64]) + 40] ^= 0xFF
    artifact.write_bytes(bytes(data))
    os.utime(artifact, ns=(1, 1))
    with pytest.raises(ArtifactError, match="was tampered"):
        load(artifact, cache_dir=tmp_path / "cache")


def test_a_cached_library_replaced_behind_the_runtime_is_written_again(
    artifact: Path, library: bytes, tmp_path: Path
) -> None:
    load(artifact, cache_dir=tmp_path / "cache")
    (cached,) = (tmp_path / "cache" / "runtime").glob("*.so")
    cached.unlink()
    cached.write_bytes(b"\x7fELF replaced by something else")
    model = load(artifact, cache_dir=tmp_path / "cache")
    assert cached.read_bytes() == library
    np.testing.assert_array_equal(model.run({"x": np.zeros((1, COUNT), np.float32)})["y"], np.ones((1, COUNT)))


def test_cache_dir_defaults_to_farm_cache_dir(artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_CACHE_DIR", str(tmp_path / "env-cache"))
    load(artifact)
    assert len(list((tmp_path / "env-cache" / "runtime").glob("*.so"))) == 1


def test_damaged_cached_library_is_rewritten(artifact: Path, library: bytes, tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "runtime" / f"{hashlib.sha256(library).hexdigest()}.so"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"garbage left by an interrupted copy")
    model = load(artifact, cache_dir=tmp_path / "cache")
    assert cached.read_bytes() == library
    np.testing.assert_array_equal(model.run({"x": np.zeros((1, COUNT), np.float32)})["y"], np.ones((1, COUNT)))


def test_choose_target_prefers_exact_cpu_and_skips_missing_features() -> None:
    host = Host(
        "x86_64-unknown-linux-gnu",
        "znver4",
        frozenset({"avx2", "fma"}),
        frozenset({"avx2", "fma", "avx512f", "avx512fp16"}),
    )
    generic = _target("generic", "x86_64-pc-linux-gnu", cpu="x86-64-v3", features="+avx2,+fma,-avx512f")
    exact = _target("exact", "x86_64-unknown-linux-gnu", cpu="znver4", features="+avx2")
    too_new = _target("too-new", "x86_64-unknown-linux-gnu", cpu="znver4", features="+avx512f")
    assert choose_target(_entries(generic, exact), host, "a.farm").id == "exact"
    assert choose_target(_entries(too_new, generic), host, "a.farm").id == "generic"
    with pytest.raises(
        ArtifactError, match=r"'too-new' \(x86_64-unknown-linux-gnu, cpu znver4: host lacks \+avx512f\)"
    ):
        choose_target(_entries(too_new), host, "a.farm")


def test_a_cpu_names_implied_features_are_checked_not_only_its_explicit_ones() -> None:
    """A graniterapids target spells out no feature, yet its code uses AVX-512 FP16: the manifest's `requires` says
    so, and a host without it is refused by name (it died of SIGILL when only the explicit features were read)."""
    host = Host(
        "x86_64-unknown-linux-gnu",
        "znver3",
        frozenset({"avx2", "fma"}),
        frozenset({"avx2", "fma", "avx512f", "avx512fp16"}),
    )
    granite = _target(
        "granite",
        "x86_64-unknown-linux-gnu",
        cpu="graniterapids",
        requires=["avx2", "avx512f", "avx512fp16", "fma", "fuse-aes"],
    )
    with pytest.raises(ArtifactError, match=r"cpu graniterapids: host lacks \+avx512f,\+avx512fp16\)$"):
        choose_target(_entries(granite), host, "a.farm")  # fuse-aes, which no host reports, is no instruction set


def test_a_host_whose_features_llvm_cannot_read_runs_only_targets_requiring_none() -> None:
    host = Host("x86_64-unknown-linux-gnu", "generic", frozenset(), frozenset())
    plain = _target("plain", "x86_64-unknown-linux-gnu", requires=[])
    assert (
        choose_target(_entries(_target("avx2", "x86_64-unknown-linux-gnu", features="+avx2"), plain), host, "a.farm").id
        == "plain"
    )
    with pytest.raises(ArtifactError, match="LLVM can't read this host's CPU features"):
        choose_target(_entries(_target("avx2", "x86_64-unknown-linux-gnu", features="+avx2")), host, "a.farm")


# -- threads: how a run splits its launches -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extent", "grain", "parts", "expected"),
    [
        (7, 1, 3, [(0, 2), (2, 4), (4, 7)]),
        (13, 4, 2, [(0, 8), (8, 13)]),
        (13, 4, 4, [(0, 4), (4, 8), (8, 12), (12, 13)]),
        (13, 4, 8, [(0, 4), (4, 8), (8, 12), (12, 13)]),
        (5, 1, 1, [(0, 5)]),
        (1, 1, 4, [(0, 1)]),
    ],
)
def test_split_range_cuts_contiguous_ranges_at_multiples_of_the_grain(extent, grain, parts, expected) -> None:
    ranges = split_range(extent, grain, parts)
    assert ranges == expected
    assert all(begin % grain == 0 for begin, _ in ranges)


@pytest.mark.parametrize("threads", [2, 3, 8, 16])
def test_shares_range_gives_each_thread_a_head_then_a_tail_range(threads) -> None:
    """Each thread's slice is a head range (the heads hold HEAD_SHARE of the blocks together) then a tail range:
    contiguous, whole grains, covering the launch; a launch too small for tail ranges of MIN_WORK_PER_RANGE gets
    near-equal ranges instead."""
    for extent, grain, worth in [(3136, 1, 500), (1000, 8, 60), (17, 1, 40), (64, 4, 16)]:
        ranges = shares_range(extent, grain, threads, worth)
        assert ranges[0][0] == 0 and ranges[-1][1] == extent
        assert all(end == begin for (_, end), (begin, _) in zip(ranges, ranges[1:]))
        assert all(end > begin and begin % grain == 0 for begin, end in ranges)  # none empty, even for 16 threads
        blocks = -(-extent // grain)
        heads = [-(-(end - begin) // grain) for begin, end in ranges[0::2]]
        if len(ranges) == 2 * threads:
            assert heads == [int(blocks * HEAD_SHARE / threads)] * threads
        else:
            parts = min(threads * RANGES_PER_THREAD, worth, blocks)
            assert ranges == split_range(extent, grain, parts - parts % threads if parts >= threads else parts)
    assert len(shares_range(3136, 1, threads, 500)) == 2 * threads


def test_a_column_split_gemm_is_cut_at_whole_blocks() -> None:
    """16 vector units in blocks of 3 (a 14x14 conv's 256 channels, loopir._gemm_range) on two threads: heads and
    tails end at vectors 6, 9 and 15, never inside a block (6, 8 and 14 ran ResNet-50's 3x3 convs as pieces of one
    and two vectors, 17% more work than whole)."""
    assert shares_range(16, 3, 2, 1445) == [(0, 6), (6, 9), (9, 15), (15, 16)]


def test_near_equal_ranges_come_in_whole_turns_of_the_threads() -> None:
    """A launch too small for tail ranges is cut into a multiple of the thread count where it has that many
    blocks: 8 units for 2 threads with work for 3 ranges are 2 ranges of 4, not 3, 3 and 2 (one thread doing
    twice the other's)."""
    assert shares_range(8, 1, 2, 3) == [(0, 4), (4, 8)]
    assert shares_range(8, 1, 3, 5) == [(0, 2), (2, 5), (5, 8)]
    assert shares_range(2, 1, 4, 9) == [(0, 1), (1, 2)]


def test_launch_plan_splits_only_parallel_launches_with_enough_work() -> None:
    """A head range per thread and a tail range per thread where the tail ranges have MIN_WORK_PER_RANGE work,
    else up to RANGES_PER_THREAD near-equal ranges per thread, each with at least that work."""
    big = MIN_WORK_PER_RANGE * 100
    launches = [
        Launch(1, 1, big),
        Launch(64, 1, big),
        Launch(64, 1, MIN_WORK_PER_RANGE * 2 - 1),
        Launch(64, 4, MIN_WORK_PER_RANGE * 2),
        Launch(7, 1, big),
        Launch(100, 1, MIN_WORK_PER_RANGE * 6),
    ]
    plan = launch_plan(launches, 2)
    assert [index for index, _ in plan] == [0, 1, 2, 3, 4, 5]
    assert [len(ranges) for _, ranges in plan] == [1, 4, 1, 2, 4, 2 * 3]
    assert plan[1][1] == [(0, 25), (25, 32), (32, 57), (57, 64)]
    assert plan[3][1] == [(0, 32), (32, 64)]
    assert len(plan[5][1]) <= 2 * RANGES_PER_THREAD
    for launch, (_, ranges) in zip(launches, plan):
        assert ranges[0][0] == 0 and ranges[-1][1] == launch.extent
        assert all(end == begin for (_, end), (begin, _) in zip(ranges, ranges[1:]))
    assert all(len(ranges) == 1 for _, ranges in launch_plan(launches, 1))


def test_work_table_lists_each_launch_as_a_group_of_ranges() -> None:
    """The layout farm_work reads: group count, each group's first range and the end, then (launch, begin, end)."""
    table = work_table([(0, [(0, 5)]), (1, [(0, 4), (4, 8), (8, 9)]), (2, [(0, 1)])])
    assert table.dtype == np.int64 and table.flags.c_contiguous
    assert table.tolist() == [3, 0, 1, 4, 5, 0, 0, 5, 1, 0, 4, 1, 4, 8, 1, 8, 9, 2, 0, 1]


def test_small_models_run_as_one_native_call_whatever_the_threads(tmp_path: Path) -> None:
    """A model whose split launches hold less than MIN_SPLIT_WORK_FOR_THREADS work in all gains nothing from
    waking helper threads: threads=2 keeps it one farm_run call."""
    from farm.build.local import build_model
    from farm.tools.examples import EXAMPLES

    path = tmp_path / "tiny_cnn.onnx"
    onnx.save(EXAMPLES["tiny_cnn"](), str(path))
    model = load(build_model(path, tmp_path / "out").artifact, cache_dir=tmp_path / "cache", threads=2)
    assert model.threads == 2 and model._pool is None


@pytest.fixture(scope="module")
def small_cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """small_cnn's artifact and an input."""
    from farm.build.local import build_model
    from farm.tools.examples import EXAMPLES

    folder = tmp_path_factory.mktemp("small_cnn")
    onnx.save(EXAMPLES["small_cnn"](), str(folder / "small_cnn.onnx"))
    artifact = build_model(folder / "small_cnn.onnx", folder / "out").artifact
    (spec,) = load(artifact, cache_dir=folder / "cache", threads=1).inputs
    return artifact, {spec.name: np.random.default_rng(0).standard_normal(spec.shape).astype(spec.dtype)}


def test_a_run_reads_a_contiguous_feed_in_place_and_copies_any_other(
    small_cnn: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A C-contiguous feed's address goes into the input's pointer slot and the kernels read it there, leaving it
    as it was; a feed laid out otherwise (Fortran order) is copied into the input's buffer, its slot 0; a feed
    changed between runs gives the new outputs; on one thread and on split launches alike."""
    artifact, feeds = small_cnn
    ((name, feed),) = feeds.items()
    kept, expected = feed.copy(), load(artifact, cache_dir=tmp_path, threads=1).run(feeds)
    for threads in (1, 2):
        if threads == 2:
            _split_everything(monkeypatch)
        model = load(artifact, cache_dir=tmp_path, threads=threads)
        ((_, _, slot),) = model._input_views
        outputs = model.run(feeds)
        assert int(slot[0]) == feed.ctypes.data and np.array_equal(feed, kept)
        for output, value in outputs.items():
            np.testing.assert_allclose(value, expected[output], rtol=1e-5, atol=1e-6)
        for output, value in model.run({name: np.asfortranarray(feed)}).items():
            np.testing.assert_allclose(value, expected[output], rtol=1e-5, atol=1e-6)
        assert int(slot[0]) == 0
        changed = feed * 2
        doubled = model.run({name: changed})
        assert int(slot[0]) == changed.ctypes.data
        assert any(not np.allclose(doubled[output], expected[output]) for output in expected)


def _split_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every launch with more than one iteration split and a pool for any model (small_cnn's work is too little
    for either under the defaults)."""
    monkeypatch.setattr(model_module, "MIN_WORK_PER_RANGE", 1)
    monkeypatch.setattr(model_module, "MIN_SPLIT_WORK_FOR_THREADS", 1)


def test_helpers_wait_for_runs_natively_and_wake_from_sleep(
    small_cnn: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Linux the helpers live in farm_serve: back-to-back runs find them spinning, and after an idle spell
    (longer than IDLE_SPINS spin-waits) they sleep in the futex, counted in the state, until the next run's post
    wakes them. Results equal one thread's, and a run's counters are freed once every helper is past it."""
    artifact, feeds = small_cnn
    expected = load(artifact, cache_dir=tmp_path, threads=1).run(feeds)
    _split_everything(monkeypatch)
    model = load(artifact, cache_dir=tmp_path, threads=3)
    pool = model._pool
    assert isinstance(pool, model_module._NativePool)
    for spell in (0.0, 0.2, 0.0, 0.2):
        for _ in range(20):
            for name, value in model.run(feeds).items():
                np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
        time.sleep(spell)
    # Every helper catches up with the last run (on 2 cores three threads take turns), then sleeps in the futex.
    deadline = time.monotonic() + 10
    while (pool._finished.min() < pool._state[0] or pool._state[8] < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool._state[8] == 2 and pool._finished.tolist() == [pool._state[0]] * 2
    model.run(feeds)
    assert list(pool._kept) == [int(pool._state[0])]


def test_helpers_end_with_their_model(
    small_cnn: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropping a model sets its pool's stop flag and wakes its helpers, which return from farm_serve: a process
    that loads and drops models keeps no threads."""
    artifact, feeds = small_cnn
    _split_everything(monkeypatch)
    model = load(artifact, cache_dir=tmp_path, threads=3)
    model.run(feeds)
    helpers = model._pool.helpers
    time.sleep(0.2)  # asleep in the futex, so the stop must wake them
    assert len(helpers) == 2 and all(thread.is_alive() and thread.name == "farm-runtime" for thread in helpers)
    del model
    gc.collect()
    for thread in helpers:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in helpers)


LOAD_AND_DROP = """
import gc, sys
import numpy as np
import farm.runtime.model as model_module
from farm.runtime import load

model_module.MIN_WORK_PER_RANGE = model_module.MIN_SPLIT_WORK_FOR_THREADS = 1
for _ in range(100):
    model = load(sys.argv[1], cache_dir=sys.argv[2], threads=3)
    feeds = {spec.name: np.ones(spec.shape, spec.dtype) for spec in model.inputs}
    for _ in range(3):
        model.run(feeds)
    del model
    gc.collect()
    reused = [np.full(64, 2, np.int64) for _ in range(500)]  # freed memory handed out again, as a run's words
"""


def test_models_dropped_while_their_helpers_wind_down_leave_nothing_to_crash_on(
    small_cnn: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    """Each helper's thread holds the pool's state, table and kept counters until farm_serve returns: a model
    dropped while a helper still wakes from the futex or passes over a finished run frees none of them under it
    (one of the suite's worker processes died of that). A hundred models loaded, run and dropped in a row."""
    artifact, _ = small_cnn
    script = tmp_path / "load_and_drop.py"
    script.write_text(LOAD_AND_DROP)
    done = subprocess.run([sys.executable, str(script), str(artifact), str(tmp_path / "cache")], timeout=300)
    assert done.returncode == 0


def test_a_forked_child_runs_a_model_whose_helpers_stayed_behind(
    small_cnn: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process forked from one whose model has a native pool gets none of its helper threads: its runs do every
    range on the calling thread, and the counters no helper will finish are freed once KEPT_RUNS_MAX pile up."""
    artifact, feeds = small_cnn
    expected = load(artifact, cache_dir=tmp_path, threads=1).run(feeds)
    _split_everything(monkeypatch)
    model = load(artifact, cache_dir=tmp_path, threads=2)
    model.run(feeds)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status
        status = 1
        try:
            for _ in range(model_module.KEPT_RUNS_MAX + 20):
                outputs = model.run(feeds)
            same = all(np.allclose(outputs[name], expected[name], rtol=1e-5, atol=1e-6) for name in expected)
            status = 0 if same and len(model._pool._kept) <= model_module.KEPT_RUNS_MAX + 1 else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_pool_needs_enough_work_in_launches_big_enough_to_pay_for_their_barrier(
    small_cnn: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    """Only split launches of at least POOL_LAUNCH_MIN_WORK count toward MIN_SPLIT_WORK_FOR_THREADS: many small
    split launches (each ends at a barrier) keep a run one native call, as few big ones don't."""
    artifact, _ = small_cnn
    model = load(artifact, cache_dir=tmp_path, threads=2)
    small, big = model_module.POOL_LAUNCH_MIN_WORK - 1, model_module.POOL_LAUNCH_MIN_WORK
    count = model_module.MIN_SPLIT_WORK_FOR_THREADS // big
    for work, launches, pooled in ((small, 2 * count, False), (big, count, True), (big, count - 1, False)):
        target = dataclasses.replace(CpuTargetEntry.from_json(model.target), launches=(Launch(64, 1, work),) * launches)
        assert all(len(ranges) > 1 for _, ranges in launch_plan(target.launches, 2))
        assert (model._thread_pool(model.path, target) is not None) == pooled, (work, launches)


def test_libraries_without_farm_serve_hand_runs_to_helpers_through_queues(
    small_cnn: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library built before farm_serve (its manifest names no serve_entry) keeps Python helper threads that
    block on a queue between runs, with the same results."""
    artifact, feeds = small_cnn
    expected = load(artifact, cache_dir=tmp_path, threads=1).run(feeds)
    _split_everything(monkeypatch)
    model = load(artifact, cache_dir=tmp_path, threads=2)
    target = CpuTargetEntry.from_json(
        {key: value for key, value in model.target.items() if key not in ("serve_entry", "post_entry")},
        arena_bytes=0,
    )
    pool = model._thread_pool(model.path, target)
    assert isinstance(pool, model_module._Pool)
    model._pool = pool
    for _ in range(5):
        for name, value in model.run(feeds).items():
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


def test_threads_default_to_every_cpu(artifact: Path, tmp_path: Path) -> None:
    assert defaults.cpu_count() == len(os.sched_getaffinity(0))
    assert load(artifact, cache_dir=tmp_path / "cache").threads == defaults.cpu_count()
    assert load(artifact, cache_dir=tmp_path / "cache", threads=1).threads == 1
    assert load(artifact, cache_dir=tmp_path / "cache", threads=0).threads == defaults.cpu_count()


def test_threads_fall_back_to_farm_run_without_launches(artifact: Path, tmp_path: Path) -> None:
    """This artifact's target (an older layout) names no launches: any thread count runs farm_run."""
    model = load(artifact, cache_dir=tmp_path / "cache", threads=4)
    assert model.threads == 4
    x = np.array([[0.0, 1.0, -2.5, 3.25]], dtype=np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], 2 * x + 1)


def _key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """An Ed25519 private key (PEM, as openssl genpkey writes it) and its public key (PEM) in `folder`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def _farm(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "farm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_signed_artifact_runs_only_for_its_trusted_key(artifact: Path, tmp_path: Path) -> None:
    """farm sign adds manifest.sig; a runtime given trusted keys (--trust, FARM_TRUSTED_KEYS) runs what they signed
    and refuses an unsigned or foreign-signed artifact before loading anything (exit 2, one line)."""
    private, public = _key_pair(tmp_path, "ours")
    _, foreign = _key_pair(tmp_path, "theirs")
    x = tmp_path / "x.npy"
    np.save(x, np.ones((1, COUNT), np.float32))
    cache = {"FARM_CACHE_DIR": str(tmp_path / "cache")}
    unsigned = _farm("run", artifact, "--input", f"x={x}", "--trust", public, env=cache)
    assert unsigned.returncode == 2 and "not signed" in unsigned.stderr and len(unsigned.stderr.splitlines()) == 1
    assert not (tmp_path / "cache").exists()
    signed = _farm("sign", artifact, "--key", private)
    assert signed.returncode == 0, signed.stderr
    assert _farm("run", artifact, "--input", f"x={x}", "--trust", public, env=cache).returncode == 0
    trusted = {**cache, "FARM_TRUSTED_KEYS": str(public)}
    assert _farm("run", artifact, "--input", f"x={x}", env=trusted).returncode == 0
    refused = _farm(
        "run", artifact, "--input", f"x={x}", "--trust", foreign, env={"FARM_CACHE_DIR": str(tmp_path / "c2")}
    )
    assert refused.returncode == 2 and "which is not trusted" in refused.stderr
    assert not (tmp_path / "c2").exists()
    assert _farm("run", artifact, "--input", f"x={x}", env=cache).returncode == 0, "no keys: no signature needed"


def test_signature_covers_every_member(artifact: Path, tmp_path: Path, library: bytes) -> None:
    """A signed artifact whose library is swapped and every sha256 recomputed (manifest and manifest.sha256 too)
    no longer matches its signature."""
    import tarfile

    from farm.artifact import public_key_hex, sign_artifact

    private, public = _key_pair(tmp_path, "ours")
    sign_artifact(artifact, private.read_bytes())
    with tarfile.open(artifact) as tar:
        files = {info.name: tar.extractfile(info).read() for info in tar.getmembers()}  # type: ignore[union-attr]
    manifest = json.loads(files["manifest.json"])
    member = next(iter(manifest["members"]))
    files[member] = library + b"\0"
    manifest["members"][member] = hashlib.sha256(files[member]).hexdigest()
    files["manifest.json"] = json.dumps(manifest).encode()
    files["manifest.sha256"] = hashlib.sha256(files["manifest.json"]).hexdigest().encode()
    swapped = tmp_path / "swapped.farm"
    with tarfile.open(swapped, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    key = public_key_hex(public.read_bytes())
    with pytest.raises(ArtifactError, match="does not match the manifest"):
        load(swapped, cache_dir=tmp_path / "cache", trust=[key])
    assert load(artifact, cache_dir=tmp_path / "cache", trust=[key]).outputs


def test_bad_signing_or_trusted_key_is_bad_input(artifact: Path, tmp_path: Path) -> None:
    from farm.artifact import sign_artifact

    (tmp_path / "junk.pem").write_bytes(b"not a key")
    with pytest.raises(ArtifactError, match="not an unencrypted PEM private key"):
        sign_artifact(artifact, b"not a key")
    with pytest.raises(ArtifactError, match="neither a PEM public key nor 64 hex digits"):
        load(artifact, cache_dir=tmp_path / "cache", trust=[str(tmp_path / "junk.pem")])
    with pytest.raises(ArtifactError, match="can't read trusted key"):
        load(artifact, cache_dir=tmp_path / "cache", trust=[str(tmp_path / "missing.pub")])


@pytest.mark.parametrize(
    "record", [b"[" * 500 + b"]" * 500, b"x" * 2000, b"{}", b'{"key": "00", "signature": "zz"}', b"\xff"]
)
def test_malformed_signature_is_refused(artifact: Path, tmp_path: Path, record: bytes) -> None:
    from farm.artifact import public_key_hex
    from tests.test_inspect import with_signature

    _, public = _key_pair(tmp_path, "ours")
    with_signature(artifact, record, artifact)
    with pytest.raises(ArtifactError, match="manifest.sig is (malformed|over 1024 bytes)|which is not trusted"):
        load(artifact, cache_dir=tmp_path / "cache", trust=[public_key_hex(public.read_bytes())])


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        start, dash, end = line.partition(" ")[0].partition("-")
        if dash and all(c in "0123456789abcdef" for c in start + end):
            inside = int(start, 16) <= address < int(end, 16)
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="no /proc (not Linux)")
def test_the_weights_map_asks_for_huge_pages(tmp_path: Path) -> None:
    """The map of an artifact's weights is advised MADV_HUGEPAGE (VmFlags 'hg') where the kernel has transparent
    huge pages: big weights stream once a run, and on 4 KB pages each page costs a page walk."""
    path = write_artifact(tmp_path / "w.farm", {"model": {}}, {"blobs/w.bin": bytes(4 << 20)})
    addresses, view = map_weights(open_artifact(path), ["blobs/w.bin"])
    huge_pages = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    assert view is not None and ("hg" in _vm_flags(addresses["blobs/w.bin"])) == huge_pages
