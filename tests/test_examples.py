"""farm.tools.examples builds valid, deterministic models that onnxruntime runs; the bundled example files are current."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from farm.tools.examples import EXAMPLES, random_input, tiny_cnn

# The inputs (name, shape, dtype) and output shape each builder documents (farm/tools/examples.py's table).
IMAGE = [("input", (1, 3, 32, 32), np.float32)]
DOCUMENTED = {
    "mlp": ([("input", (1, 784), np.float32)], (1, 10)),
    "small_cnn": (IMAGE, (1, 10)),
    "tiny_cnn": (IMAGE, (1, 10)),
    "resnet18_style": ([("input", (1, 3, 64, 64), np.float32)], (1, 1000)),
    "mobilenetv2_style": ([("input", (1, 3, 64, 64), np.float32)], (1, 1000)),
    "bert_style": ([("input_ids", (1, 32), np.int64), ("attention_mask", (1, 32), np.int64)], (1, 32, 128)),
    "vit_style": (IMAGE, (1, 10)),
}
PROBABILITIES = {"mlp", "tiny_cnn"}  # these end in Softmax


def test_integer_inputs_draw_from_their_documented_range() -> None:
    feeds = random_input(EXAMPLES["bert_style"](), seed=1)
    assert 0 <= feeds["input_ids"].min() and feeds["input_ids"].max() < 1000 and feeds["input_ids"].max() > 100
    assert set(np.unique(feeds["attention_mask"])) == {0, 1}


EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def _shape(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value.type.tensor_type.shape.dim)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (output,) = session.run(["output"], feeds)
    return output


def test_registry_matches_documentation() -> None:
    assert set(EXAMPLES) == set(DOCUMENTED)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_is_valid_and_runs(name: str) -> None:
    model = EXAMPLES[name]()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]

    inputs, output_shape = DOCUMENTED[name]
    assert [v.name for v in model.graph.input] == [input_name for input_name, _, _ in inputs]
    assert [v.name for v in model.graph.output] == ["output"]
    assert [_shape(v) for v in model.graph.input] == [shape for _, shape, _ in inputs]
    assert _shape(model.graph.output[0]) == output_shape
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT

    feeds = random_input(model, seed=0)
    assert [(k, v.shape, v.dtype) for k, v in feeds.items()] == [(n, shape, np.dtype(t)) for n, shape, t in inputs]
    output = _run(model, feeds)
    assert output.shape == output_shape
    assert output.dtype == np.float32
    assert np.isfinite(output).all()
    assert 0 < np.abs(output).max() < 1e3, "weights should keep outputs moderate"
    if name in PROBABILITIES:
        np.testing.assert_allclose(output.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_is_deterministic(name: str) -> None:
    assert EXAMPLES[name]().SerializeToString() == EXAMPLES[name]().SerializeToString()


def test_random_input_is_seeded() -> None:
    model = tiny_cnn()
    np.testing.assert_array_equal(random_input(model, seed=3)["input"], random_input(model, seed=3)["input"])
    assert not np.array_equal(random_input(model, seed=3)["input"], random_input(model, seed=4)["input"])


def test_resnet18_repeats_identical_blocks() -> None:
    """Blocks of the same shape have the same ops and attributes, so a compiler can build their kernels once."""

    def signature(model: onnx.ModelProto, prefix: str) -> list[tuple[str, str, list[tuple[int, ...]]]]:
        shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
        return [
            (n.op_type, str(list(n.attribute)), [shapes[i] for i in n.input if i in shapes])
            for n in model.graph.node
            if n.name.startswith(prefix)
        ]

    model = EXAMPLES["resnet18_style"]()
    assert signature(model, "layer1.0.") == signature(model, "layer1.1.")
    for stage in (2, 3, 4):
        assert signature(model, f"layer{stage}.0.") != signature(model, f"layer{stage}.1.")  # block 0 downsamples
    assert signature(model, "layer2.1.") != signature(model, "layer3.1.")  # different channel counts
    assert len([n for n in model.graph.node if n.op_type == "Conv"]) == 20  # stem + 16 in blocks + 3 downsample
    assert len([n for n in model.graph.node if n.op_type == "Add"]) == 8


def test_mobilenetv2_uses_depthwise_and_clip_inputs() -> None:
    model = EXAMPLES["mobilenetv2_style"]()
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    depthwise = [n for n in model.graph.node if n.op_type == "Conv" and n.name.endswith(".depthwise")]
    assert depthwise and all(
        onnx.helper.get_attribute_value(a) > 1 for n in depthwise for a in n.attribute if a.name == "group"
    )
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert clips and all(len(n.input) == 3 for n in clips)
    assert {float(initializers[n.input[1]]) for n in clips} == {0.0}
    assert {float(initializers[n.input[2]]) for n in clips} == {6.0}
    assert any(n.op_type == "Add" for n in model.graph.node)
    strides = {tuple(onnx.helper.get_attribute_value(a)) for n in depthwise for a in n.attribute if a.name == "strides"}
    assert strides == {(1, 1), (2, 2)}


def test_bundled_example_files() -> None:
    """examples/ holds tiny_cnn() and an input for it (regenerate with scripts/make_examples.py)."""
    committed = onnx.load(str(EXAMPLES_DIR / "tiny_cnn.onnx"))
    onnx.checker.check_model(committed, full_check=True)
    fresh = tiny_cnn()
    assert [(n.op_type, n.name, list(n.input)) for n in committed.graph.node] == [
        (n.op_type, n.name, list(n.input)) for n in fresh.graph.node
    ]
    assert [(t.name, tuple(t.dims)) for t in committed.graph.initializer] == [
        (t.name, tuple(t.dims)) for t in fresh.graph.initializer
    ]
    image = np.load(EXAMPLES_DIR / "tiny_cnn_input.npy")
    assert image.shape == (1, 3, 32, 32) and image.dtype == np.float32
    output = _run(committed, {"input": image})
    assert output.shape == (1, 10)
    np.testing.assert_allclose(output.sum(), 1.0, rtol=1e-5)
