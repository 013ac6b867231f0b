"""Whole local builds: reproducible artifacts, a complete manifest, cross-compiled targets, nothing partial."""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from farm import runtime
from farm.artifact import FORMAT_VERSION, open_artifact
from farm.backends.llvm.blobs import STALE_SCRATCH_SECONDS
from farm.backends.llvm.target import host_target, parse_target
from farm.build.assembly import compile_units, plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.errors import UnsupportedError
from farm.store import FileStore
from farm.tools import examples
from tests.test_blobs import old_scratch

ELF_MACHINE_AARCH64 = 183


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_two_builds_are_byte_identical_in_process_and_in_a_pool(small_cnn_path, tmp_path):
    with LocalExecutor(1) as inline, LocalExecutor(2) as pool:
        first = build_model(small_cnn_path, tmp_path / "a", executor=inline, no_cache=True)
        second = build_model(small_cnn_path, tmp_path / "b", executor=pool, no_cache=True)
    assert _sha(first.artifact) == _sha(second.artifact)
    assert first.job_id == second.job_id


def _plan(path):
    return plan_model(path)


def test_manifest_describes_the_artifact(small_cnn_path, tmp_path):
    result = build_model(small_cnn_path, tmp_path, executor=LocalExecutor(1))
    manifest = open_artifact(result.artifact).manifest
    assert manifest["format_version"] == FORMAT_VERSION and manifest["farm_version"]
    assert manifest["model"]["sha256"] == _sha(small_cnn_path)
    assert [i["name"] for i in manifest["inputs"]] == ["input"]
    assert manifest["outputs"][0]["shape"] == [1, 10]
    assert manifest["targets"][0]["id"] == host_target().id
    built_plan = _plan(small_cnn_path)
    kernels = [u.spec for u in compile_units(built_plan, [host_target()]) if u.kind == "kernel"]
    assert len({k["kernel"] for k in manifest["kernels"]}) == len({spec.whole for spec in kernels}) == len(
        built_plan.kernels()
    ) and result.kernels == len(kernels)  # a kernel in parts is a unit per part
    from farm.build.assembly import plan_model

    assert len(manifest["blobs"]) == len(plan_model(small_cnn_path).blobs)
    assert result.blobs == sum("/weights/" in member for member in manifest["targets"][0]["weights"])
    assert [s["node"] for s in manifest["schedule"]]
    assert manifest["memory_plan"]["arena_bytes"] > 0
    with tarfile.open(result.artifact) as tar:
        assert sorted(manifest["members"]) == sorted(
            n for n in tar.getnames() if n not in ("manifest.json", "manifest.sha256")
        )
    assert result.artifact.endswith("small_cnn.farm")


def test_cross_compiled_target_is_an_aarch64_library_next_to_the_host_one(small_cnn_path, tmp_path):
    targets = [host_target(), parse_target("cpu:aarch64-linux-gnu")]
    result = build_model(small_cnn_path, tmp_path, targets, executor=LocalExecutor(1))
    artifact = open_artifact(result.artifact)
    aarch64 = next(t for t in artifact.manifest["targets"] if t["triple"].startswith("aarch64"))
    library = artifact.read_member(aarch64["library"])
    assert library[:4] == b"\x7fELF" and library[4] == 2
    assert int.from_bytes(library[18:20], "little") == ELF_MACHINE_AARCH64
    model = runtime.load(result.artifact)
    assert model.target["triple"] == host_target().triple


def test_unsupported_op_fails_before_compiling_and_writes_nothing(tmp_path):
    node = helper.make_node("RandomNormalLike", ["x"], ["y"], name="hm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    calls, phases = [], []
    with pytest.raises(UnsupportedError, match="'hm'.*RandomNormalLike"):
        build_model(
            path,
            tmp_path / "out",
            executor=LocalExecutor(1),
            progress=lambda d, t: calls.append(d),
            phase=phases.append,
        )
    assert calls == [] and phases == ["planning"] and not (tmp_path / "out").exists()


def test_built_model_runs_like_onnxruntime(small_cnn_path, tmp_path):
    import onnxruntime

    result = build_model(small_cnn_path, tmp_path, executor=LocalExecutor(1))
    feeds = examples.random_input(onnx.load(small_cnn_path), seed=3)
    ours = runtime.load(result.artifact).run(feeds)["output"]
    reference = onnxruntime.InferenceSession(str(small_cnn_path)).run(None, feeds)[0]
    assert np.abs(ours - reference).max() <= 1e-4 * max(1.0, np.abs(reference).max())


def test_progress_reports_its_phases_and_every_compile_step(small_cnn_path, tmp_path):
    """The phases in order; the compile count's total first, then every kernel (packed weights are made as the
    artifact is written: build.local._packed_when_written)."""
    seen, phases = [], []
    result = build_model(
        small_cnn_path,
        tmp_path,
        executor=LocalExecutor(1),
        no_cache=True,
        progress=lambda d, t: seen.append((d, t)),
        phase=phases.append,
    )
    total = result.kernels
    assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) == total + 1
    assert phases == ["planning", "compiling", "linking", "writing", "done"]
    assert json.loads(json.dumps(result.to_json()))["state"] == "done"


def test_constant_weights_are_pre_packed_for_the_kernels_tiles(small_cnn_path, tmp_path):
    """Each Conv's constant weights get a BlobSpec with panels: the kernel's tile rows, out channels and taps
    where the weights are the GEMM's A, or the tile's width, taps, out channels and transposed where they are its
    transposed B (an implicit GEMM or a small plane's transposed one); the Gemm's constant B (stored transposed:
    transB) column panels (the tile's width, k, n, transposed); other constants (biases) stay plain."""
    from farm.backends.llvm.kernel import default_blocking
    from farm.backends.llvm.part import blob_args
    from farm.build.assembly import compile_units, plan_model

    plan, target = plan_model(small_cnn_path), host_target()
    blocking = default_blocking(target)
    for step, blobs in zip(plan.steps, blob_args(plan, target)):
        packed = [blob.panels for blob in blobs.values() if blob.panels]
        if step.spec.op == "Conv":
            out_channels, taps = step.spec.inputs[1].shape[0], int(np.prod(step.spec.inputs[1].shape[1:]))
            assert packed in ([(blocking.rows, out_channels, taps)], [(blocking.tile_columns, taps, out_channels, 1)])
        elif step.spec.op == "Gemm":
            n, k = step.spec.inputs[1].shape
            assert packed == [(blocking.tile_columns, k, n, 1)]
        else:
            assert packed == []
    units = [unit.spec for unit in compile_units(plan, [target]) if unit.kind == "blob"]
    assert all(spec.panels is not None for spec in units)  # plain weights need no unit: they are the model's bytes
    assert len(units) == sum(s.spec.op in ("Conv", "Gemm") for s in plan.steps)


def test_a_local_build_sweeps_the_blob_scratch_older_versions_leaked(small_cnn_path, tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    leaked = old_scratch(temp, "farm-blob-crashed", STALE_SCRATCH_SECONDS + 60)
    build_model(small_cnn_path, tmp_path / "out", executor=LocalExecutor(1))
    assert not leaked.exists()


def empty_tensors_model() -> onnx.ModelProto:
    """Empty graph inputs (x float32 [2, 0, 4], xi int64 [0, 3]) and a full one (a [2, 3, 4]) through reductions
    over nothing, Concats with empty inputs, a Split with a zero-size part, and empty model outputs (one a node's
    that needs no kernel, one an empty part of the Split); an empty intermediate (s2 * s2) folds away."""
    nodes = [
        helper.make_node("ReduceSum", ["x", "axis1"], ["sum"], keepdims=1),
        helper.make_node("ReduceMax", ["x"], ["max"], axes=[1], keepdims=0),
        helper.make_node("ReduceLogSumExp", ["x"], ["lse"], axes=[1]),
        helper.make_node("ReduceProd", ["xi"], ["prod"], axes=[0]),
        helper.make_node("ReduceMin", ["xi"], ["min"], axes=[0]),
        helper.make_node("Concat", ["a", "x"], ["cat"], axis=1),
        helper.make_node("Relu", ["x"], ["relu"]),
        helper.make_node("Split", ["a", "parts"], ["s1", "s2"], axis=1),
        helper.make_node("Mul", ["s2", "s2"], ["s2sq"]),
        helper.make_node("Concat", ["s2sq", "s1", "x"], ["cat2"], axis=1),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 4]),
        helper.make_tensor_value_info("xi", TensorProto.INT64, [0, 3]),
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4]),
    ]
    outputs = ["sum", "max", "lse", "prod", "min", "cat", "relu", "s2", "cat2"]
    graph = helper.make_graph(
        nodes,
        "empty",
        inputs,
        [helper.make_tensor_value_info(n, 0, None) for n in outputs],
        [
            helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
            helper.make_tensor("parts", TensorProto.INT64, [2], [3, 0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)  # types the outputs, as onnxruntime needs


def empty_tensors_feeds() -> dict[str, np.ndarray]:
    return {
        "x": np.zeros((2, 0, 4), np.float32),
        "xi": np.zeros((0, 3), np.int64),
        "a": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32),
    }


def assert_same_as_onnxruntime(model, path, feeds: dict[str, np.ndarray]) -> None:
    """Every output of `model` (farm's) equals onnxruntime's exactly: shape, dtype and every value (the identities
    of reductions over nothing, -inf included, and copies)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path))
    names = [output.name for output in session.get_outputs()]
    ours = model.run(feeds)
    for name, want in zip(names, session.run(names, feeds)):
        assert ours[name].shape == want.shape and ours[name].dtype == want.dtype, name
        np.testing.assert_array_equal(ours[name], want, err_msg=name)


def test_a_model_with_empty_inputs_and_outputs_runs_like_onnxruntime(tmp_path):
    path = tmp_path / "empty.onnx"
    onnx.save(empty_tensors_model(), path)
    result = build_model(path, tmp_path, executor=LocalExecutor(1))
    manifest = open_artifact(result.artifact).manifest
    assert {step["op"] for step in manifest["schedule"]} == {
        "ReduceSum",
        "ReduceMax",
        "ReduceLogSumExp",
        "ReduceProd",
        "ReduceMin",
        "Concat",
        "Split",
    }  # no Relu, no Mul
    assert [o["shape"] for o in manifest["outputs"] if o["name"] in ("relu", "s2")] == [[2, 0, 4], [2, 0, 4]]
    assert_same_as_onnxruntime(runtime.load(result.artifact), path, empty_tensors_feeds())


def test_a_model_whose_every_node_is_empty_has_an_empty_schedule(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["x"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 3])],
        [helper.make_tensor_value_info(n, 0, None) for n in "yz"],
    )
    path = tmp_path / "nothing.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    result = build_model(path, tmp_path, executor=LocalExecutor(1))
    assert open_artifact(result.artifact).manifest["schedule"] == []
    outputs = runtime.load(result.artifact).run({"x": np.zeros((0, 3), np.float32)})
    assert {name: (array.shape, array.dtype) for name, array in outputs.items()} == {
        "y": ((0, 3), np.float32),
        "z": ((0, 3), np.float32),
    }


# -- the compile cache (the local store, with the farm's refs) -----------------------------------------------------


def _kernel_refs(model_path) -> list[str]:
    """The cache refs of the model's kernel units for this host, as a build names them."""
    return [unit.cache_ref for unit in compile_units(plan_model(model_path), [host_target()]) if unit.kind == "kernel"]


def test_a_warm_build_compiles_nothing_and_writes_the_cold_builds_bytes(small_cnn_path, tmp_path):
    store, seen = FileStore(tmp_path / "store"), []
    cold = build_model(small_cnn_path, tmp_path / "cold", executor=LocalExecutor(1), store=store)
    warm = build_model(
        small_cnn_path,
        tmp_path / "warm",
        executor=LocalExecutor(1),
        store=store,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert (cold.compiled, cold.cached) == (cold.kernels + cold.blobs, 0)
    assert (warm.compiled, warm.cached) == (warm.blobs, warm.kernels)  # weights are always packed
    assert seen == [(warm.kernels, warm.kernels)]  # the cached units, done at once
    assert _sha(cold.artifact) == _sha(warm.artifact)
    assert {"compiled": warm.blobs, "cached": warm.kernels}.items() <= warm.to_json().items()


def test_no_cache_compiles_every_unit_and_caches_it_again(small_cnn_path, tmp_path):
    store = FileStore(tmp_path / "store")
    cold = build_model(small_cnn_path, tmp_path / "cold", executor=LocalExecutor(1), store=store)
    for ref in _kernel_refs(small_cnn_path):
        store.delete(store.get_ref(ref))
    again = build_model(small_cnn_path, tmp_path / "again", executor=LocalExecutor(1), store=store, no_cache=True)
    assert (again.compiled, again.cached) == (again.kernels + again.blobs, 0)
    assert all(store.has(store.get_ref(ref)) for ref in _kernel_refs(small_cnn_path))
    assert _sha(cold.artifact) == _sha(again.artifact)


def test_a_corrupt_or_foreign_cache_entry_is_rebuilt_not_trusted(small_cnn_path, tmp_path):
    """One entry's bytes damaged on disk (store.get finds another sha256 and deletes it), another ref pointed at
    bytes that hash right but are no object (verify_cached refuses them): both units are compiled again, the rest
    is taken from the cache, and the artifact is the cold build's."""
    store = FileStore(tmp_path / "store")
    cold = build_model(small_cnn_path, tmp_path / "cold", executor=LocalExecutor(1), store=store)
    damaged, foreign = _kernel_refs(small_cnn_path)[:2]
    damaged_key, foreign_key = store.get_ref(damaged), store.get_ref(foreign)
    path = store.object_path(damaged_key)
    path.write_bytes(bytes(len(path.read_bytes())))
    store.set_ref(foreign, store.put(b"not an object"))
    again = build_model(small_cnn_path, tmp_path / "again", executor=LocalExecutor(1), store=store)
    assert (again.compiled - again.blobs, again.cached) == (2, again.kernels - 2)
    assert _sha(cold.artifact) == _sha(again.artifact)
    assert (store.get_ref(damaged), store.get_ref(foreign)) == (damaged_key, foreign_key)
    assert store.get(damaged_key)  # put back whole


def test_a_build_evicts_the_store_down_to_its_cap(small_cnn_path, tmp_path):
    """The published cap (as `farm worker` publishes the farm's) bounds the local store too: the least recently
    used entry goes once the artifact is written, and a later build compiles just that one, to the same bytes."""
    store = FileStore(tmp_path / "store")
    cold = build_model(small_cnn_path, tmp_path / "cold", executor=LocalExecutor(1), store=store)
    cap = store.stats().bytes - 1
    store.set_max_bytes(cap)
    again = build_model(small_cnn_path, tmp_path / "again", executor=LocalExecutor(1), store=store, no_cache=True)
    assert store.stats().entries == again.kernels - 1 and store.stats().bytes <= cap
    last = build_model(small_cnn_path, tmp_path / "last", executor=LocalExecutor(1), store=store)
    assert last.compiled - last.blobs == 1 and store.stats().bytes <= cap
    assert _sha(cold.artifact) == _sha(again.artifact) == _sha(last.artifact)


def _submit(folder: Path, *options: str) -> subprocess.Popen:
    """`farm submit small_cnn.onnx --json` started in `folder`, whose cache/ is the local store's root."""
    env = {
        **os.environ,
        "FARM_CACHE_DIR": str(folder / "cache"),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH")) if p
        ),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "farm", "submit", "small_cnn.onnx", "--json", "--workers", "1", *options],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finished(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    return json.loads(stdout)


def test_two_submits_at_once_share_the_store_and_later_ones_hit_it(small_cnn_path, tmp_path):
    """Two builds writing the same entries and refs at once (atomic writes: either copy serves) both succeed; then
    a submit takes every kernel from the cache, and --no-cache compiles every one, all to the same bytes."""
    (tmp_path / "small_cnn.onnx").write_bytes(small_cnn_path.read_bytes())
    first, second = [_submit(tmp_path, "-o", folder) for folder in ("a", "b")]
    both = [_finished(first), _finished(second)]
    warm = _finished(_submit(tmp_path, "-o", "warm"))
    rebuilt = _finished(_submit(tmp_path, "-o", "rebuilt", "--no-cache"))
    assert (warm["compiled"], warm["cached"]) == (warm["blobs"], warm["kernels"])
    assert (rebuilt["compiled"], rebuilt["cached"]) == (rebuilt["kernels"] + rebuilt["blobs"], 0)
    assert len({_sha(job["artifact"]) for job in [*both, warm, rebuilt]}) == 1
