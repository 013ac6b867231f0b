"""farm.frontend.split: a model as its graph and one blob per weight, read back by a worker as the same model."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.build import assembly
from farm.errors import ModelLoadError
from farm.frontend import wire
from farm.frontend.external import ExternalDataError, StoredBlobs
from farm.frontend.onnx_import import import_model
from farm.frontend.split import SplitError, split_model, stored_blob_keys
from farm.ir.graph import DeferredArray

RNG = np.random.default_rng(7)


def _mlp() -> onnx.ModelProto:
    """y = relu(x @ W + b) @ V: W and V are big enough to be blobs, b isn't."""
    weights = {
        "W": RNG.standard_normal((128, 256)).astype(np.float32),
        "b": RNG.standard_normal(256).astype(np.float32),
        "V": RNG.standard_normal((256, 64)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "V"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _worker_import(split, folder: Path):
    """What a worker imports: the graph alone in a folder of its own, blobs read by key."""
    folder.mkdir()
    path = folder / "model.onnx"
    path.write_bytes(split.graph)
    blobs = {key: source.read() for key, source in split.blobs.items()}
    return path, StoredBlobs(lambda key, name: blobs[key])


def _same_graph(ours, theirs) -> None:
    assert ours.inputs == theirs.inputs and ours.outputs == theirs.outputs and ours.values == theirs.values
    assert sorted(ours.constants) == sorted(theirs.constants)
    for name, array in theirs.constants.items():
        np.testing.assert_array_equal(ours.constants[name], array)


def test_big_initializers_become_blobs_named_by_sha256_and_the_rest_stays(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), path)
    split = split_model(path)
    model = onnx.load(path)
    big = {numpy_helper.to_array(t).tobytes() for t in model.graph.initializer if len(t.raw_data) >= 64 * 1024}
    assert {hashlib.sha256(data).hexdigest() for data in big} == set(split.blobs) and len(split.blobs) == 2
    assert split.model_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(split.graph) < 4096 and stored_blob_keys(split.graph) == list(split.blobs)
    parsed = onnx.load_from_string(split.graph)
    stored = {
        t.name: {e.key: e.value for e in t.external_data}
        for t in parsed.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    }
    assert sorted(stored) == ["V", "W"] and stored["W"]["location"].startswith("sha256:")
    assert stored["W"]["length"] == str(128 * 256 * 4)
    model_path, external = _worker_import(split, tmp_path / "worker")
    _same_graph(import_model(model_path, external=external), import_model(path))


def test_external_data_is_read_from_its_files_and_plans_as_the_local_model(tmp_path: Path) -> None:
    """torch's dynamo exporter writes `model.onnx.data` beside the graph: every initializer is a blob."""
    path = tmp_path / "model.onnx"
    onnx.save(_mlp(), path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    split = split_model(path)
    assert len(split.blobs) == 3 and split.blob_bytes == os.path.getsize(tmp_path / "model.onnx.data")
    assert {source.path for source in split.blobs.values()} == {str(tmp_path / "model.onnx.data")}
    model_path, external = _worker_import(split, tmp_path / "worker")
    ours, theirs = assembly.plan_model(model_path, external=external), assembly.plan_model(path)
    assert list(ours.blobs) == list(theirs.blobs) and ours.kernels() == theirs.kernels()


def test_a_blob_two_initializers_share_is_one_blob(tmp_path: Path) -> None:
    model = _mlp()
    same = numpy_helper.from_array(numpy_helper.to_array(model.graph.initializer[0]), "W2")
    model.graph.initializer.append(same)
    path = tmp_path / "twice.onnx"
    onnx.save(model, path)
    split = split_model(path)
    assert len(split.blobs) == 2 and stored_blob_keys(split.graph) == list(split.blobs)


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "absent.bin"])
def test_external_data_that_leaves_the_folder_or_is_absent_is_refused_naming_it(tmp_path: Path, location: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    folder = tmp_path / "model"
    folder.mkdir()
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value=location)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [tensor],
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(SplitError, match=f"'W'.*{location}"):
        split_model(path)


def test_external_data_past_its_file_end_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, value in {"location": "w.bin", "offset": "4", "length": "16"}.items():
        tensor.external_data.add(key=key, value=value)
    graph = helper.make_graph([], "g", [], [helper.make_tensor_value_info("W", TensorProto.FLOAT, [4])], [tensor])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), path)
    with pytest.raises(SplitError, match="holds 8 bytes, not 16 at offset 4"):
        split_model(path)


def test_a_file_that_is_not_a_model_is_sent_whole_for_the_worker_to_refuse(tmp_path: Path) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\xff\xff\xff\xff not protobuf")
    split = split_model(path)
    assert split.graph == path.read_bytes() and split.blobs == {}
    with pytest.raises(wire.WireError):
        stored_blob_keys(split.graph)


def test_a_worker_names_external_data_that_was_not_uploaded(tmp_path: Path) -> None:
    """A Constant node's external tensor is not a main-graph initializer, so it is never a blob."""
    tensor = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value="c.bin")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=tensor)],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ModelLoadError, match="'c'.*was not uploaded"):
        import_model(path, external=StoredBlobs(lambda key, name: b""))


def _read_by_key(split) -> tuple[dict[str, bytes], list[str]]:
    return {key: source.read() for key, source in split.blobs.items()}, []


def test_a_worker_reads_a_big_weight_only_if_a_pass_asks_for_its_values(tmp_path: Path) -> None:
    """With `present`, big weights (farm.frontend.external.DEFERRED_MIN_BYTES) are deferred: planning the mlp reads
    neither W nor V (their blobs stay unread handles, by digest) and plans what the local model plans; a weight the
    plan folds (a transposed V) is read, once. Reading a deferred weight later gives its bytes."""
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), path)
    split = split_model(path)
    blobs, reads = _read_by_key(split)
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "model.onnx").write_bytes(split.graph)
    external = StoredBlobs(lambda key, name: reads.append(name) or blobs[key], lambda key, name: key in blobs)
    ours, theirs = assembly.plan_model(tmp_path / "worker" / "model.onnx", external=external), assembly.plan_model(path)
    assert reads == [] and list(ours.blobs) == list(theirs.blobs) and ours.kernels() == theirs.kernels()
    deferred = [blob for blob in ours.blobs.values() if isinstance(blob, DeferredArray)]
    assert len(deferred) == 2 and {blob.nbytes for blob in deferred} == {128 * 256 * 4, 256 * 64 * 4}
    assert all(blob.load().tobytes() == blobs[blob.digest] for blob in deferred) and sorted(reads) == ["V", "W"]

    model = _mlp()
    model.graph.node[3].input[1] = "Vt"
    model.graph.node.insert(3, helper.make_node("Transpose", ["Vt0"], ["Vt"], perm=[1, 0]))
    model.graph.initializer[2].CopyFrom(
        numpy_helper.from_array(RNG.standard_normal((64, 256)).astype(np.float32), "Vt0")
    )
    onnx.save(model, tmp_path / "folded.onnx")
    split = split_model(tmp_path / "folded.onnx")
    blobs, reads = _read_by_key(split)
    (tmp_path / "folded").mkdir()
    (tmp_path / "folded" / "model.onnx").write_bytes(split.graph)
    external = StoredBlobs(lambda key, name: reads.append(name) or blobs[key], lambda key, name: key in blobs)
    plan = assembly.plan_model(tmp_path / "folded" / "model.onnx", external=external)
    assert reads == ["Vt0"] and plan.kernels() == assembly.plan_model(tmp_path / "folded.onnx").kernels()


def test_a_worker_names_a_deferred_weight_that_is_not_on_the_farm(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), path)
    split = split_model(path)
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "model.onnx").write_bytes(split.graph)

    def present(key: str, name: str) -> bool:
        raise ExternalDataError(f"initializer {name!r}: its bytes (blob {key}) are not on the farm")

    with pytest.raises(ModelLoadError, match="initializer 'W': its bytes .* are not on the farm"):
        import_model(tmp_path / "worker" / "model.onnx", external=StoredBlobs(lambda key, name: b"", present))
