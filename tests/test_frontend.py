"""Tests of farm.frontend.onnx_import: loading ONNX files (safely) into the Graph IR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.errors import ModelLoadError, UnsupportedError
from farm.frontend.onnx_import import import_model
from farm.frontend.passes import optimize
from farm.frontend.validate import validate
from farm.ir.graph import TensorInfo

RNG = np.random.default_rng(1234)
SUPPORTED = {"Conv", "Relu", "Add", "MaxPool", "Gemm", "Reshape", "Softmax"}


def _model(nodes, inputs, outputs, initializers=(), opset=13, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)


def _conv_relu_model(opset=13):
    """x[1,3,8,8] -> Conv(W, B) -> Relu (unnamed) -> Add(Constant node) -> y."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1], auto_pad="NOTSET"),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32([0.5]))),
        helper.make_node("Add", ["r", "k"], ["y"], name="add"),
    ]
    return (
        _model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
            opset,
        ),
        w,
        b,
    )


def test_import_small_model(onnx_model_path):
    model, w, b = _conv_relu_model()
    graph = import_model(onnx_model_path(model))
    assert graph.opset == 13
    assert graph.inputs == ["x"] and graph.outputs == ["y"]
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "Add"]  # the Constant node became a constant
    assert [n.name for n in graph.nodes] == ["conv", "Relu_1", "add"]
    np.testing.assert_array_equal(graph.constants["W"], w)
    np.testing.assert_array_equal(graph.constants["k"], np.float32([0.5]))
    conv = graph.nodes[0]
    assert conv.attrs == {"pads": [1, 1, 1, 1], "auto_pad": "NOTSET"} and conv.domain == ""
    assert graph.values["x"] == TensorInfo((1, 3, 8, 8), "float32")
    assert graph.values["c"] == TensorInfo((1, 4, 8, 8), "float32")
    assert graph.values["y"] == TensorInfo((1, 4, 8, 8), "float32")  # inferred although the model left it open
    assert graph.values["W"] == TensorInfo((4, 3, 3, 3), "float32")
    validate(graph, SUPPORTED)


def test_tensor_info_of_array_has_python_int_dims_and_the_dtype_name():
    info = TensorInfo.of_array(np.zeros((2, 3), np.int32))
    assert info == TensorInfo((2, 3), "int32") and all(type(dim) is int for dim in info.shape)


def test_onnx_import_does_not_import_the_passes():
    """The passes build on the import; the import standing alone keeps the frontend free of cycles."""
    code = "import sys, farm.frontend.onnx_import; assert 'farm.frontend.passes' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_attribute_kinds_become_python_values(onnx_model_path):
    tensor = numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(2, 3))
    node = helper.make_node(
        "Custom",
        ["x"],
        ["y"],
        domain="ai.onnx",
        i=3,
        f=0.5,
        s="abc",
        ints=[1, 2],
        floats=[0.25],
        strings=["p", "q"],
        t=tensor,
    )
    model = _model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    graph = import_model(onnx_model_path(model))
    attrs = graph.nodes[0].attrs
    assert graph.nodes[0].domain == ""
    assert (attrs["i"], attrs["f"], attrs["s"]) == (3, 0.5, "abc")
    assert (attrs["ints"], attrs["floats"], attrs["strings"]) == ([1, 2], [0.25], ["p", "q"])
    np.testing.assert_array_equal(attrs["t"], np.arange(6).reshape(2, 3))


def test_truncated_file_is_a_load_error(onnx_model_path):
    path = onnx_model_path(_conv_relu_model()[0])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=str(path)):
        import_model(path)


@pytest.mark.parametrize("content", [b"", b"\x00\xffnot a model at all\x13\x37"])
def test_garbage_file_is_a_load_error(tmp_path, content):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="garbage.onnx"):
        import_model(path)


def test_missing_file_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="nope.onnx"):
        import_model(tmp_path / "nope.onnx")


@pytest.mark.parametrize("opset", [5, 29])
def test_opset_outside_range_is_unsupported(onnx_model_path, opset):
    relu = helper.make_node("Relu", ["x"], ["y"])  # Relu changed at opset 6 (and 13, 14)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    with pytest.raises(UnsupportedError, match=f"opset {opset}"):
        import_model(onnx_model_path(_model([relu], [x], [y], opset=opset)))


def _external_model(location: str, offset: int | None = None, length: int | None = None) -> onnx.ModelProto:
    """y = x + W with W stored externally at `location`."""
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2, 3], data_location=TensorProto.EXTERNAL)
    entries = {"location": location, "offset": offset, "length": length}
    for key, value in entries.items():
        if value is not None:
            tensor.external_data.add(key=key, value=str(value))
    add = helper.make_node("Add", ["x", "W"], ["y"], name="add")
    return _model(
        [add],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [tensor],
    )


def test_external_data_inside_folder_loads(tmp_path):
    weights = RNG.standard_normal((2, 3)).astype(np.float32)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "w.bin").write_bytes(b"\x07" * 8 + weights.tobytes() + b"\x09" * 4)
    path = tmp_path / "model.onnx"
    onnx.save(_external_model("data/w.bin", offset=8, length=weights.nbytes), str(path))
    graph = import_model(path)
    np.testing.assert_array_equal(graph.constants["W"], weights)
    assert graph.values["W"] == TensorInfo((2, 3), "float32")


def test_external_data_saved_by_onnx_loads(tmp_path):
    weights = RNG.standard_normal((64, 64)).astype(np.float32)
    add = helper.make_node("Add", ["x", "W"], ["y"])
    model = _model(
        [add],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
        [numpy_helper.from_array(weights, "W")],
    )
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    np.testing.assert_array_equal(import_model(path).constants["W"], weights)


@pytest.mark.parametrize("location", ["../secret.bin", "data/../../secret.bin", "/etc/passwd", "escape/secret.bin"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 24)
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(tmp_path, folder / "escape")  # a link inside the folder that points out of it
    path = folder / "model.onnx"
    onnx.save(_external_model(location), str(path))
    with pytest.raises(ModelLoadError, match="'W'") as info:
        import_model(path)
    assert location in str(info.value)


def test_external_data_missing_file_is_refused(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_external_model("absent.bin"), str(path))
    with pytest.raises(ModelLoadError, match="'W'.*absent.bin"):
        import_model(path)


def test_external_data_of_wrong_size_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\x00" * 10)
    path = tmp_path / "model.onnx"
    onnx.save(_external_model("w.bin"), str(path))
    with pytest.raises(ModelLoadError, match="'W'"):
        import_model(path)


@pytest.mark.parametrize("offset, length", [(0, 2**62), (2**62, None), (8, 24)])
def test_external_data_claiming_more_than_its_file_holds_is_refused_before_reading(tmp_path, offset, length):
    """The offset and length are the model's word: a claim past the file's end (2**62 bytes once ended the build
    in a MemoryError) is refused naming the initializer, the file and both sizes, before anything is read."""
    (tmp_path / "w.bin").write_bytes(b"\x00" * 24)
    path = tmp_path / "model.onnx"
    onnx.save(_external_model("w.bin", offset=offset, length=length), str(path))
    with pytest.raises(ModelLoadError, match="initializer 'W': external data .*w.bin holds 24 bytes, not ") as info:
        import_model(path)
    assert f"at offset {offset}" in str(info.value)


def test_unsorted_nodes_are_ordered(onnx_model_path):
    model, _, _ = _conv_relu_model()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    graph = import_model(onnx_model_path(model))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "Add"]


LIGHT_MODELS = [
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
]


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_import_and_optimize(light_models_dir: Path, name: str):
    graph = import_model(light_models_dir / f"{name}.onnx")
    assert graph.opset == 9 and len(graph.inputs) == 1
    assert any(n.op_type == "ConstantOfShape" for n in graph.nodes)
    graph = optimize(graph)
    ops = {n.op_type for n in graph.nodes}
    assert not ops & {"ConstantOfShape", "Dropout", "Identity", "Unsqueeze"}
    assert any(n.activation is not None for n in graph.nodes)
    validate(graph, ops)  # every value is static and the model's I/O is float32


def test_an_older_opset_is_accepted_when_its_ops_have_not_changed_since(onnx_model_path):
    node = helper.make_node("And", ["a", "b"], ["y"])
    values = [helper.make_tensor_value_info(n, TensorProto.BOOL, [3]) for n in ("a", "b", "y")]
    graph = import_model(onnx_model_path(_model([node], values[:2], values[2:], opset=7)))
    assert graph.opset == 7 and [n.op_type for n in graph.nodes] == ["And"]


# ------------------------------------------------------------------------------------------ declared shapes


def _gemm_declaring(output_shape):
    """x[2,3] -> Gemm(W[4,3], transB) -> y, which computes to [2, 4] whatever the model declares."""
    node = helper.make_node("Gemm", ["x", "W"], ["y"], name="gemm", transB=1)
    return _model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")],
    )


@pytest.mark.parametrize("declared", [[64, 64], [1, 4], [2, 4, 1]])
def test_declared_output_shape_must_match_the_computed_one(onnx_model_path, declared):
    with pytest.raises(UnsupportedError) as info:
        import_model(onnx_model_path(_gemm_declaring(declared)))
    message = str(info.value)
    assert "'gemm'" in message and "'Gemm'" in message and f"'y' is declared with shape {declared}" in message
    assert "[2, 4]" in message


def test_declared_output_shape_that_agrees_is_kept(onnx_model_path):
    assert import_model(onnx_model_path(_gemm_declaring(["N", 4]))).values["y"] == TensorInfo((2, 4))
    assert import_model(onnx_model_path(_gemm_declaring([2, 4]))).values["y"] == TensorInfo((2, 4))


def test_declared_value_info_contradicting_inference_is_refused(onnx_model_path):
    model, _, _ = _conv_relu_model()
    model.graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, 9, 9]))
    with pytest.raises(UnsupportedError, match=r"'conv'.*'c' is declared with shape \[1, 4, 9, 9\]"):
        import_model(onnx_model_path(model))


# ---------------------------------------------------------------------------------------------------- size limits


def test_input_claiming_more_than_the_tensor_limit_is_refused_before_inference(onnx_model_path):
    node = helper.make_node("Add", ["x", "x"], ["y"], name="add")
    model = _model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**20, 2**20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(UnsupportedError, match=r"input 'x' of shape \[1048576, 1048576\] float32 needs 4398046511104"):
        import_model(onnx_model_path(model))


def test_initializer_claiming_more_than_the_tensor_limit_is_refused(onnx_model_path):
    node = helper.make_node("Add", ["x", "W"], ["y"], name="add")
    model = _model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2**32, 2**32])],
    )
    with pytest.raises(UnsupportedError, match=r"initializer 'W' of shape \[4294967296, 4294967296\]"):
        import_model(onnx_model_path(model))


def test_nodes_that_share_a_name_are_refused(onnx_model_path):
    """Two Conv nodes of one name shared one scratch buffer sized for the first, and the second, bigger one wrote
    past it: the output was garbage (issue 13). onnxruntime refuses such a model too."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="same", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w2"], ["y"], name="same", pads=[1, 1, 1, 1]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w1"),
            numpy_helper.from_array(np.ones((16, 4, 3, 3), np.float32), "w2"),
        ],
    )
    with pytest.raises(ModelLoadError, match="two nodes are named 'same'; node names must be unique"):
        import_model(onnx_model_path(model))


def test_a_generated_name_avoids_the_names_the_model_gives(onnx_model_path):
    """An unnamed node is `<op_type>_<index>` unless a node of the model has that name: then it gets a suffix."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"], name="Relu_0")]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    assert [node.name for node in import_model(onnx_model_path(model)).nodes] == ["Relu_0_1", "Relu_0"]


def test_an_empty_dim_is_imported_and_validated(onnx_model_path):
    """A 0 dim makes an empty tensor, which farm computes (the planner decides what each node needs)."""
    nodes = [helper.make_node("Concat", ["x", "a"], ["y"], name="concat", axis=1)]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0]),
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
    ]
    graph = import_model(onnx_model_path(_model(nodes, inputs, [helper.make_tensor_value_info("y", 0, None)])))
    assert graph.values["x"] == TensorInfo((2, 0), "float32") and graph.values["y"] == TensorInfo((2, 3), "float32")
    validate(graph, {"Concat"})
