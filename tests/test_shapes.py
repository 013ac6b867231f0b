"""Pinned shapes (`--shape`): parsing, their JSON form, writing them into a model, and models with dynamic
dimensions built with them (compared with onnxruntime), of one size and of several in one artifact."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from farm import runtime
from farm.build.local import build_model
from farm.errors import BadInputError, UnsupportedError
from farm.frontend.shapes import (
    MAX_PINS,
    MAX_SIZES,
    apply_shapes,
    describe_size,
    parse_sizes,
    shapes_from_json,
    shapes_to_json,
    sizes_from_json,
    sizes_to_json,
)
from tests.dynamic_models import dynamic_cnn


def test_parse_sizes_takes_dimensions_and_whole_inputs():
    assert parse_sizes(["batch=2", "input_ids=1x128"]) == [{"batch": (2,), "input_ids": (1, 128)}]
    assert parse_sizes([]) == [{}]


def test_parse_sizes_builds_every_combination_of_the_values_first_pin_slowest():
    assert parse_sizes(["batch=1,8", "seq=64,128"]) == [
        {"batch": (1,), "seq": (64,)}, {"batch": (1,), "seq": (128,)},
        {"batch": (8,), "seq": (64,)}, {"batch": (8,), "seq": (128,)}]
    assert parse_sizes(["input_ids=1x128,8x128"]) == [{"input_ids": (1, 128)}, {"input_ids": (8, 128)}]
    assert describe_size({"batch": (8,), "input_ids": (8, 128)}) == "batch=8 input_ids=8x128"


@pytest.mark.parametrize("spec, message", [
    ("batch", "expected NAME=SIZE"), ("=3", "expected NAME=SIZE"), ("batch=", "positive integers"),
    ("batch=two", "positive integers"), ("batch=-1", "positive integers"), ("batch=0", "from 1 to"),
    ("x=1x0x3", "from 1 to"), ("batch=1,,32", "positive integers"), ("batch=1,8,1", "a size is given twice"),
    ("x=1x２", "positive integers"), (f"batch={1 << 40}", "from 1 to"), ("bad\nname=1", "printable"),
])
def test_parse_sizes_names_the_malformed_spec(spec, message):
    with pytest.raises(BadInputError, match=message):
        parse_sizes([spec])


def test_parse_sizes_refuses_a_name_pinned_twice_too_many_pins_and_too_many_sizes():
    with pytest.raises(BadInputError, match="'batch' is pinned twice"):
        parse_sizes(["batch=1", "batch=2"])
    with pytest.raises(BadInputError, match=f"at most {MAX_PINS}"):
        parse_sizes([f"d{i}=1" for i in range(MAX_PINS + 1)])
    with pytest.raises(BadInputError, match=f"20 sizes .* at most {MAX_SIZES}"):
        parse_sizes(["batch=1,2,3,4,5", "seq=1,2,3,4"])


def test_shapes_json_round_trips_in_name_order_and_refuses_what_a_job_record_must_not_hold():
    shapes = {"seq": (128,), "batch": (1,), "x": (1, 3, 8, 8)}
    data = shapes_to_json(shapes)
    assert list(data) == ["batch", "seq", "x"] and shapes_from_json(data) == shapes
    for bad in ([1], {"batch": 1}, {"batch": [1.5]}, {"batch": [0]}, {"": [1]}, {"batch": [True]}):
        with pytest.raises(BadInputError):
            shapes_from_json(bad)


def test_sizes_json_round_trips_and_refuses_duplicates_mixed_names_and_too_many():
    sizes = parse_sizes(["batch=1,8", "seq=16"])
    assert sizes_from_json(sizes_to_json(sizes)) == sizes
    for bad in ([], {"batch": [1]}, [{"batch": [1]}, {"batch": [1]}], [{"batch": [1]}, {"seq": [1]}],
                [{"batch": [n]} for n in range(1, MAX_SIZES + 2)]):
        with pytest.raises(BadInputError):
            sizes_from_json(bad)


def test_apply_shapes_pins_every_input_dimension_of_a_name_or_a_whole_input(tmp_path):
    model = dynamic_cnn(tmp_path / "m.onnx")
    apply_shapes(model.graph, {"batch": (3,)}, "m.onnx")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [3, 3, 8, 8]
    model = dynamic_cnn(tmp_path / "m.onnx")
    apply_shapes(model.graph, {"x": (2, 3, 8, 8)}, "m.onnx")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 8, 8]


@pytest.mark.parametrize("shapes, message", [
    ({"seq": (1,)}, r"no input or symbolic dimension of that name \(inputs: x \[batch, 3, 8, 8\]\)"),
    ({"x": (2, 3, 8)}, "input 'x' has 4 dimensions"),
    ({"x": (2, 3, 9, 8)}, r"input 'x' is \[batch, 3, 8, 8\]"),
    ({"batch": (1, 2)}, "no input or symbolic dimension"),
])
def test_apply_shapes_refuses_a_pin_that_does_not_fit_the_model(shapes, message, tmp_path):
    model = dynamic_cnn(tmp_path / "m.onnx")
    with pytest.raises(BadInputError, match=message):
        apply_shapes(model.graph, shapes, "m.onnx")


def test_a_dynamic_model_without_shape_names_the_dimension_and_suggests_the_option(tmp_path):
    dynamic_cnn(tmp_path / "m.onnx")
    with pytest.raises(UnsupportedError, match=r"model input 'x' has dynamic shape \[batch, 3, 8, 8\]; pin it "
                                                r"with --shape batch=N or --shape x=Nx3x8x8"):
        build_model(tmp_path / "m.onnx", tmp_path / "out")
    assert not (tmp_path / "out" / "m.farm").exists()


@pytest.mark.parametrize("shapes", [{"batch": (2,)}, {"x": (2, 3, 8, 8)}], ids=["dimension", "whole-input"])
def test_a_dynamic_model_built_with_pinned_shapes_matches_onnxruntime(shapes, tmp_path):
    """The exporter's flatten chain folds once the batch is pinned: the artifact has static shapes and the
    outputs of onnxruntime on the dynamic model."""
    dynamic_cnn(tmp_path / "m.onnx")
    result = build_model(tmp_path / "m.onnx", tmp_path / "out", sizes=[shapes])
    model = runtime.load(result.artifact, threads=1)
    assert [(i.name, tuple(i.shape)) for i in model.inputs] == [("x", (2, 3, 8, 8))]
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(model.run({"x": x})["y"], expected[0], rtol=1e-4, atol=1e-4)
