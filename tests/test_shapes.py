"""Pinned shapes written into a model (farm.frontend.shapes), and models with dynamic dimensions built with them
(compared with onnxruntime), of one size and of several in one artifact."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from farm import runtime
from farm.build.local import build_model
from farm.errors import BadInputError, UnsupportedError
from farm.frontend.shapes import apply_shapes
from tests.dynamic_models import dynamic_cnn


def test_apply_shapes_pins_every_input_dimension_of_a_name_or_a_whole_input(tmp_path):
    model = dynamic_cnn(tmp_path / "m.onnx")
    apply_shapes(model.graph, {"batch": (3,)}, "m.onnx")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [3, 3, 8, 8]
    model = dynamic_cnn(tmp_path / "m.onnx")
    apply_shapes(model.graph, {"x": (2, 3, 8, 8)}, "m.onnx")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 8, 8]


@pytest.mark.parametrize(
    "shapes, message",
    [
        ({"seq": (1,)}, r"no input or symbolic dimension of that name \(inputs: x \[batch, 3, 8, 8\]\)"),
        ({"x": (2, 3, 8)}, "input 'x' has 4 dimensions"),
        ({"x": (2, 3, 9, 8)}, r"input 'x' is \[batch, 3, 8, 8\]"),
        ({"batch": (1, 2)}, "no input or symbolic dimension"),
    ],
)
def test_apply_shapes_refuses_a_pin_that_does_not_fit_the_model(shapes, message, tmp_path):
    model = dynamic_cnn(tmp_path / "m.onnx")
    with pytest.raises(BadInputError, match=message):
        apply_shapes(model.graph, shapes, "m.onnx")


def test_a_dynamic_model_without_shape_names_the_dimension_and_suggests_the_option(tmp_path):
    dynamic_cnn(tmp_path / "m.onnx")
    with pytest.raises(
        UnsupportedError,
        match=r"model input 'x' has dynamic shape \[batch, 3, 8, 8\]; pin it "
        r"with --shape batch=N or --shape x=Nx3x8x8",
    ):
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
