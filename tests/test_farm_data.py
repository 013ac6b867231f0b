"""The farm's data path end to end (docs/architecture.md, "Submitting by digest" and "The store's cap"): real
redis-server, real `farm worker` processes, the real CLI in other processes; weights by digest, external data, a
file blob store and streamed uploads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.distributed import recipes
from farm.distributed.client import FarmClient
from tests.farm_services import farm_cli, farm_factory_fixture  # noqa: F401
from tests.test_farm import _sha, _submit


def _embedding_model(folder: Path) -> Path:
    """A dynamo-style export: every weight in `model.onnx.data` beside the graph; a 2 MB embedding table that the
    artifact holds as the model has it, and a MatMul weight packed for the target."""
    rng = np.random.default_rng(5)
    table = numpy_helper.from_array(rng.standard_normal((8192, 64)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("MatMul", ["e", "W"], ["y"])],
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])],
        [table, weight],
    )
    path = folder / "model.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        path,
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return path


def test_an_external_data_model_builds_as_locally_and_its_own_weights_are_not_downloaded(farm_factory, tmp_path):
    """The client uploads the graph and each weight by digest; the artifact equals the local build byte for byte,
    and a download on the submitting machine reads the model's own weights from its files and packs them (only a
    machine that didn't submit it fetches them, and packs them too: the farm keeps no packed copy)."""
    model = _embedding_model(tmp_path)
    local = build_model(model, tmp_path / "local", executor=LocalExecutor(1)).artifact
    farm = farm_factory(workers=1)
    job = _submit(farm, model, tmp_path)
    assert job["state"] == "done" and _sha(job["artifact"]) == _sha(local)
    redis = farm.redis.client()

    def download(folder: str, **env: str) -> int:
        sent = redis.info("stats")["total_net_output_bytes"]
        result = farm_cli(
            "download", job["job_id"], "-o", str(tmp_path / folder), broker=farm.url, cwd=tmp_path, env=env
        )
        assert result.returncode == 0 and _sha(result.stdout.strip()) == _sha(local), result.stderr
        return redis.info("stats")["total_net_output_bytes"] - sent

    table_bytes = 8192 * 64 * 4
    assert download("here") < table_bytes // 2
    assert download("elsewhere", FARM_CACHE_DIR=str(tmp_path / "another-machine")) > table_bytes
    store = FarmClient(farm.url).store
    packed = recipes.read_recipe(store.peek(FarmClient(farm.url).record(job["job_id"]).artifact_key)).derived
    assert len(packed) == 1 and store.missing(packed) == list(packed)  # the packed W: made by each download


def _folding_model(folder: Path) -> Path:
    """Two MatMuls with weights in `model.onnx.data`: a 1 MB W that the target packs as the model has it, and a
    W2 that the plan transposes first (folded: a weight the farm made, which the submitter doesn't hold). W2 has 80
    rows: a B exactly one panel wide (64 columns, one 6 x 4 tile on AVX-512) packs to its own bytes, so its packed
    weight would be its source and the farm would make nothing for it."""
    rng = np.random.default_rng(6)
    weight = numpy_helper.from_array(rng.standard_normal((64, 4096)).astype(np.float32), "W")
    turned = numpy_helper.from_array(rng.standard_normal((80, 4096)).astype(np.float32), "W2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["y"]),
            helper.make_node("Transpose", ["W2"], ["W2t"], perm=[1, 0]),
            helper.make_node("MatMul", ["y", "W2t"], ["z"]),
        ],
        "fold",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [16, 80])],
        [weight, turned],
    )
    path = folder / "model.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        path,
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return path


def test_a_waiting_client_makes_the_packed_weights_from_its_own_weights_and_the_folded_ones_it_reads(
    farm_factory, tmp_path, monkeypatch
):
    """The farm keeps a packed weight as its key and how it is made (recipes.Derivation), never its bytes. Once the
    job names its link plan, a client that waits to download packs the weight it submitted from the model's file,
    and the weight the plan folded (W2 transposed, which it doesn't hold) from the store; its download after the
    link then writes the local artifact byte for byte, and no packed weight was ever read from the farm."""
    from farm.backends.llvm.target import host_target

    model = _folding_model(tmp_path)
    local = build_model(model, tmp_path / "local", executor=LocalExecutor(1)).artifact
    farm = farm_factory(workers=1)
    client = FarmClient(farm.url)
    read_from_farm: list[str] = []
    peek = client.store.peek
    monkeypatch.setattr(client.store, "peek", lambda key: read_from_farm.append(key) or peek(key))
    job_id = client.submit(model, [host_target()], no_cache=True)
    assert client.wait(job_id, timeout=120, prefetch=True)["state"] == "done", farm.logs()
    packed = recipes.read_recipe(peek(client.record(job_id).artifact_key)).derived
    assert len(packed) == 2 and sorted(client._prefetched[job_id]) == sorted(packed)
    assert client.store.missing(packed) == sorted(packed) and not set(read_from_farm) & set(packed)
    assert len({derivation.source for derivation in packed.values()} & set(read_from_farm)) == 1  # the folded one
    assert _sha(client.download(job_id, tmp_path / "out")) == _sha(local)
    waiter = FarmClient(farm.url)  # `farm wait`, which downloads nothing, makes nothing
    assert waiter.wait(job_id, timeout=5)["state"] == "done" and not waiter._prefetched.get(job_id)


def test_with_a_file_blob_store_redis_holds_no_weight_and_the_artifact_is_the_local_one(farm_factory, tmp_path):
    """FARM_BLOB_STORE on the workers: every entry's bytes are files of the shared folder, Redis keeps the queues
    and the metadata; the client reads the folder the workers published to download."""
    model = _embedding_model(tmp_path)
    local = build_model(model, tmp_path / "local", executor=LocalExecutor(1)).artifact
    cas = tmp_path / "cas"
    farm = farm_factory(workers=1, env={"FARM_BLOB_STORE": f"file://{cas}"})
    job = _submit(farm, model, tmp_path)
    assert job["state"] == "done" and _sha(job["artifact"]) == _sha(local)
    redis = farm.redis.client()
    headers = redis.keys("farm:store:obj:*")
    assert headers and all(redis.get(name).endswith(b":file") for name in headers)
    assert len(list((cas / "objects").rglob("*"))) > len(headers)  # every entry's file (and the fan-out folders)
    assert int(redis.info("memory")["used_memory"]) < 8 << 20  # the 2 MB table and friends are not in Redis


def test_with_a_blob_redis_the_durable_redis_holds_no_weight_and_what_the_cache_loses_is_built_again(
    farm_factory, tmp_path
):
    """FARM_BLOB_STORE=redis://... on the workers (deploy/: a Redis run as a cache): the submitter stages there and
    downloads from there with its own user, the durable Redis keeps the queues and the metadata only (its
    append-only file never sees a weight), and the artifact is the local one. A cache that loses everything (a
    restart without persistence) costs a rebuild, never a failed or wrong job."""
    model = _embedding_model(tmp_path)
    local = build_model(model, tmp_path / "local", executor=LocalExecutor(1)).artifact
    farm = farm_factory(workers=1, blob_redis=True)
    job = _submit(farm, model, tmp_path)
    assert job["state"] == "done" and _sha(job["artifact"]) == _sha(local)
    durable, cache = farm.redis.client(), farm.blobs.client()
    headers = durable.keys("farm:store:obj:*")
    assert headers and all(durable.get(name).endswith(b":file") for name in headers)
    assert int(durable.info("memory")["used_memory"]) < 8 << 20  # the 2 MB table and friends are in the cache
    assert cache.keys("farm:store:obj:*:*") and not cache.keys("farm:store:staged:*")

    cache.flushall()
    (tmp_path / "again").mkdir()
    again = _submit(farm, model, tmp_path / "again")
    assert again["state"] == "done" and _sha(again["artifact"]) == _sha(local), farm.logs()


def test_a_model_bigger_than_the_upload_window_streams_through_redis_into_the_file_blob_store(farm_factory, tmp_path):
    """With a file blob store each staged weight is admitted as soon as it is staged (the intake reads it, checks
    its sha256 and writes its file), and the client keeps at most FARM_UPLOAD_WINDOW_BYTES waiting: Redis' peak
    stays near that window, not the model's size."""
    rng = np.random.default_rng(9)
    weights = [
        numpy_helper.from_array(rng.standard_normal((512, 1024)).astype(np.float32), f"w{i}") for i in range(16)
    ]  # 2 MiB each, 32 MiB in all
    nodes = [helper.make_node("Gather", [f"w{i}", "ids"], [f"g{i}"]) for i in range(16)]
    nodes.append(helper.make_node("Sum", [f"g{i}" for i in range(16)], ["y"]))
    graph = helper.make_graph(
        nodes,
        "tables",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1024])],
        weights,
    )
    model = tmp_path / "tables.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        model,
        save_as_external_data=True,
        location="tables.onnx.data",
        size_threshold=0,
    )
    local = build_model(model, tmp_path / "local", executor=LocalExecutor(1)).artifact
    farm = farm_factory(workers=1, env={"FARM_BLOB_STORE": f"file://{tmp_path / 'cas'}"})
    base = int(farm.redis.client().info("memory")["used_memory"])
    result = farm_cli(
        "submit",
        str(model),
        "--json",
        "-o",
        str(tmp_path / "out"),
        broker=farm.url,
        cwd=tmp_path,
        env={"FARM_UPLOAD_WINDOW_BYTES": str(2 << 20)},
    )
    assert result.returncode == 0, result.stderr + farm.logs()
    assert _sha(json.loads(result.stdout)["artifact"]) == _sha(local)
    peak = int(farm.redis.client().info("memory")["used_memory_peak"]) - base
    assert peak < 16 << 20, f"Redis grew by {peak / 2**20:.1f} MiB for a 32 MiB model through a 2 MiB window"
