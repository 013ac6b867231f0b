"""Tests of farm.frontend.wire: cutting big initializers' raw bytes out of a model file, and import mapping them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.errors import ModelLoadError
from farm.frontend import wire
from farm.frontend.onnx_import import import_model
from farm.tools import examples

RNG = np.random.default_rng(7)


def _matmul_model(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x[1, 128] through a MatMul per weight (each 128 x 128), the last one's output is y."""
    names = list(weights)
    nodes = [
        helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", name], [f"h{i + 1}" if i < len(names) - 1 else "y"])
        for i, name in enumerate(names)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cut_leaves_the_rest_of_the_model_byte_for_byte():
    big = RNG.standard_normal((256, 128)).astype(np.float32)
    small = RNG.standard_normal((4, 4)).astype(np.float32)
    model = _matmul_model({"big": big[:128], "small": np.pad(small, ((0, 124), (0, 124)))})
    model.graph.initializer.append(numpy_helper.from_array(small, "tiny"))
    data = model.SerializeToString()
    stripped, spans = wire.cut_raw_initializers(memoryview(data))
    assert set(spans) == {0, 1}  # both 128 x 128 floats (64 KB); "tiny" stays
    assert bytes(data[spans[0].offset : spans[0].offset + spans[0].length]) == big[:128].tobytes()
    assert spans[0].data_type == TensorProto.FLOAT
    parsed = onnx.ModelProto.FromString(stripped)
    expected = onnx.ModelProto.FromString(data)
    for index in spans:
        assert not parsed.graph.initializer[index].raw_data
        expected.graph.initializer[index].ClearField("raw_data")
    assert parsed == expected
    assert numpy_helper.to_array(parsed.graph.initializer[2]).tolist() == small.tolist()


def test_a_threshold_keeps_smaller_initializers():
    data = _matmul_model({"w": RNG.standard_normal((128, 128)).astype(np.float32)}).SerializeToString()
    assert wire.cut_raw_initializers(memoryview(data), min_bytes=1 << 20)[1] == {}
    assert list(wire.cut_raw_initializers(memoryview(data), min_bytes=1)[1]) == [0]


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-3],  # the graph's length runs past the end
        lambda data: data + b"\x80",  # a varint never ends
        lambda data: data + b"\x0b",  # field 1 as a group
        lambda data: data + b"\x00",  # field number 0
    ],
)
def test_malformed_bytes_raise_wire_error(damage):
    data = _matmul_model({"w": RNG.standard_normal((128, 128)).astype(np.float32)}).SerializeToString()
    with pytest.raises(wire.WireError):
        wire.cut_raw_initializers(memoryview(damage(data)))


def test_import_maps_big_initializers_read_only_without_a_copy(tmp_path):
    weights = {
        "w1": RNG.standard_normal((128, 128)).astype(np.float32),
        "w2": RNG.standard_normal((128, 128)).astype(np.float32),
    }
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_model(weights), path)
    graph = import_model(path)
    for name, expected in weights.items():
        array = graph.constants[name]
        np.testing.assert_array_equal(array, expected)
        assert not array.flags.writeable and not array.flags.owndata


def test_import_of_a_cut_initializer_of_the_wrong_size_names_it(tmp_path):
    model = _matmul_model({"w": RNG.standard_normal((128, 128)).astype(np.float32)})
    model.graph.initializer[0].dims[0] = 129
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelLoadError, match=r"initializer 'w': data in .*m\.onnx has 65536 bytes, expected 66048"):
        import_model(path)


def test_a_file_that_cannot_be_walked_still_gets_protobufs_error(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_matmul_model({"w": np.ones((128, 128), np.float32)}).SerializeToString()[:-3])
    with pytest.raises(ModelLoadError, match="can't read ONNX model"):
        import_model(path)


def _protobuf_refuses(data: bytes) -> bool:
    try:
        onnx.ModelProto.FromString(data)
    except Exception:  # noqa: BLE001 - protobuf raises several unrelated types for bytes it can't parse
        return True
    return False


GROUP = bytes([(15 << 3) | 3, (1 << 3) | 0, 5, (15 << 3) | 4])
"""An unknown field 15 as a group holding one varint: protobuf keeps it as an unknown field."""
WIRE_CASES = {
    "a model": (_matmul_model({"w": np.ones((128, 128), np.float32)}).SerializeToString(), True),
    "a model with an unknown group": (GROUP + examples.tiny_cnn().SerializeToString(), True),
    "a text file": (b"# not a model\nhello\n", False),
    "random bytes": (bytes(np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8)), False),
    "a length past the end": (examples.tiny_cnn().SerializeToString()[:-3], False),
    "a group never closed": (GROUP[:-1], False),
    "a group closed by another's end": (GROUP[:-1] + bytes([(14 << 3) | 4]), False),
    "an end with no group": (bytes([(15 << 3) | 4]), False),
    "field number 0": (bytes([0, 1]), False),
}


@pytest.mark.parametrize("case", WIRE_CASES)
def test_the_top_level_walk_refuses_exactly_what_protobuf_refuses(case: str) -> None:
    data, valid = WIRE_CASES[case]
    assert _protobuf_refuses(data) is not valid
    if valid:
        wire.check_message(data)
    else:
        with pytest.raises(wire.WireError):
            wire.check_message(data)


def test_a_file_that_is_not_a_message_is_refused_by_name_without_the_parser(tmp_path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("# not a model\n")
    with pytest.raises(
        ModelLoadError, match=r"can't read ONNX model .*notes\.onnx: not a protobuf message \(wire type"
    ):
        wire.check_model_file(path)
    (tmp_path / "empty.onnx").write_bytes(b"")
    wire.check_model_file(tmp_path / "empty.onnx")  # an empty message parses: the import names what it lacks
